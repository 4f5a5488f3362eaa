"""Submissions and the broker (with Redis away, a submission used to answer 500 yet leave the experiment created,
without a hand-off): an experiment is committed with its runs' hand-offs (the outbox) in one transaction, and a
relay sends them to Celery when the broker can take them. With a Redis server of the test's own stopped, a
submission answers 202 at once, a retry with the same Idempotency-Key returns the same experiment, and the runs
reach the queue within seconds of Redis coming back, then run once each on a real Celery worker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from fastapi.testclient import TestClient

from services.orchestrator import repository as repo
from services.orchestrator.app import create_app
from services.orchestrator.models import Experiment, Handoff, RunStatus, ScenarioRun, utcnow
from services.orchestrator.outbox import relay_once
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.settings import OrchestratorSettings
from shared.client import ServiceClients
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator import fakes
from tests.orchestrator.conftest import Db
from tests.orchestrator.instances import RedisServer, own_redis
from tests.orchestrator.test_cluster_celery import _pg_url, _stop, _wait_run, _worker
from tests.orchestrator.test_window_loop import small_request

__all__ = ["own_redis"]  # a fixture


def _exp(db: Db, settings: Settings, scenarios: list[str]) -> str:
    spec = resolve_spec(small_request(scenarios=scenarios, plots=False), configs_dir=CONFIGS)
    exp_id, created = create_experiment(sessions=db.sessions, spec=spec, settings=settings)
    assert created
    return exp_id


def _handoffs(db: Db) -> list[str]:
    with db.sessions() as s:
        return list(s.scalars(sa.select(Handoff.run_id).order_by(Handoff.id)))


class Broker:
    """A stand-in for Celery's send: records what it took; ``down`` refuses everything, ``fail_at`` one run."""

    def __init__(self) -> None:
        self.took: list[str] = []
        self.down = False
        self.fail_at: str | None = None

    def __call__(self, run_id: str) -> None:
        if self.down or run_id == self.fail_at:
            raise ConnectionError("broker unreachable")
        self.took.append(run_id)


def test_an_experiment_is_committed_with_its_hand_offs_and_the_relay_sends_them(db: Db, settings: Settings) -> None:
    exp = _exp(db, settings, ["baseline", "taps", "tas"])
    ids = {sc: repo.run_id_for(exp, sc) for sc in ("baseline", "taps", "tas")}
    assert _handoffs(db) == [ids["tas"], ids["taps"], ids["baseline"]]  # the most expensive first
    broker = Broker()
    broker.down = True
    out = relay_once(sessions=db.sessions, send=broker)
    assert out.sent == [] and out.waiting == 3 and isinstance(out.error, ConnectionError)
    assert len(_handoffs(db)) == 3  # nothing lost while the broker is away
    broker.down, broker.fail_at = False, ids["taps"]
    out = relay_once(sessions=db.sessions, send=broker)  # the broker fails mid-batch: the rest waits, in order
    assert out.sent == [ids["tas"]] and _handoffs(db) == [ids["taps"], ids["baseline"]]
    with db.sessions.begin() as s:  # a run cancelled meanwhile is not sent
        s.execute(sa.update(ScenarioRun).where(ScenarioRun.id == ids["baseline"]).values(status=RunStatus.cancelled))
    broker.fail_at = None
    out = relay_once(sessions=db.sessions, send=broker)
    assert out.sent == [ids["taps"]] and out.error is None and _handoffs(db) == []
    assert broker.took == [ids["tas"], ids["taps"]]
    with db.sessions() as s:
        enq = {r.scenario: r.enqueued_at for r in repo.runs_of(session=s, exp_id=exp)}
    assert enq["tas"] is not None and enq["taps"] is not None and enq["baseline"] is None
    assert relay_once(sessions=db.sessions, send=broker).sent == []


def test_a_pending_hand_off_is_the_relays_not_the_reapers(db: Db, settings: Settings) -> None:
    exp = _exp(db, settings, ["baseline"])
    with db.sessions() as s:  # long past the hand-off grace: still the relay's, while its hand-off waits
        assert repo.runs_to_redeliver(session=s, handoff_grace_s=0.0, requeue_after_s=3600,
                                      now=utcnow() + timedelta(hours=1)) == []
    repo.drop_handoffs_of(sessions=db.sessions, run_ids=[repo.run_id_for(exp, "baseline")])
    with db.sessions() as s:  # a run with neither a hand-off nor a delivery (made before the outbox): the reaper's
        assert repo.runs_to_redeliver(session=s, handoff_grace_s=0.0, requeue_after_s=3600,
                                      now=utcnow() + timedelta(hours=1)) == [repo.run_id_for(exp, "baseline")]


def test_a_dead_workers_run_is_re_enqueued_once_per_hand_off_grace(db: Db, settings: Settings) -> None:
    exp = _exp(db, settings, ["baseline"])
    run_id = repo.run_id_for(exp, "baseline")
    relay_once(sessions=db.sessions, send=Broker())
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=1).ok  # w1 dies holding it

    def picked(after_s: float) -> list[str]:
        with db.sessions() as s:
            return repo.runs_to_redeliver(session=s, handoff_grace_s=4.0, requeue_after_s=3600,
                                          now=utcnow() + timedelta(seconds=after_s))

    assert picked(0.0) == []  # its lease is live
    assert picked(5.0) == [run_id]  # expired, handed long enough ago: re-enqueued
    repo.mark_enqueued(sessions=db.sessions, run_ids=[run_id], now=utcnow() + timedelta(seconds=5.0))
    assert picked(6.0) == []  # the next passes leave the new worker time to claim it ...
    assert picked(9.5) == [run_id]  # ... and re-enqueue it if no worker did


def test_a_retry_queues_its_hand_offs_with_the_runs(db: Db, settings: Settings) -> None:
    exp = _exp(db, settings, ["baseline", "tas"])
    relay_once(sessions=db.sessions, send=Broker())
    with db.sessions.begin() as s:
        s.execute(sa.update(ScenarioRun).where(ScenarioRun.experiment_id == exp).values(status=RunStatus.failed))
        assert sorted(repo.retry_experiment(session=s, exp_id=exp)) == sorted(repo.run_id_for(exp, sc)
                                                                             for sc in ("baseline", "tas"))
    assert _handoffs(db) == [repo.run_id_for(exp, "tas"), repo.run_id_for(exp, "baseline")]


def test_two_relays_at_once_send_each_hand_off_once(db: Db, settings: Settings) -> None:
    for _ in range(6):
        _exp(db, settings, ["baseline", "tas"])
    took: list[str] = []
    lock = threading.Lock()

    def slow(run_id: str) -> None:
        time.sleep(0.02)
        with lock:
            took.append(run_id)

    relays = [threading.Thread(target=relay_once, kwargs={"sessions": db.sessions, "send": slow, "limit": 4})
              for _ in range(4)]
    for t in relays:
        t.start()
    for t in relays:
        t.join()
    while _handoffs(db):
        relay_once(sessions=db.sessions, send=slow)
    assert len(took) == 12 and len(set(took)) == 12


def test_the_embedded_pool_takes_its_runs_directly(api: TestClient) -> None:
    from tests.orchestrator.conftest import SMALL_WL

    exp = api.post("/v1/experiments", json={"workload": SMALL_WL, "scenarios": ["baseline"]}).json()["id"]
    rt = api.app.state.rt  # type: ignore[attr-defined]
    with rt.sessions() as s:
        assert repo.count_handoffs(session=s, exp_id=exp) == 0


@pytest.fixture()
def queue() -> Iterator[str]:
    yield f"tasmoe-test-{uuid.uuid4().hex[:8]}"


@pytest.mark.services
def test_a_submission_across_a_broker_outage(pg: Db, own_redis: RedisServer, queue: str, tmp_path: Path) -> None:
    settings = OrchestratorSettings(mode="cluster", database_url=_pg_url(pg), redis_url=own_redis.url,
                                    celery_queue=queue, results_dir=tmp_path / "results", configs_dir=CONFIGS)
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))  # the submission's checks
    body = {"workload": {"model": "mixtral-8x7b", "sequence": {"steps": 24, "micro_batch": 4}},
            "scenarios": ["baseline", "tas"], "plots": False}
    key = {"Idempotency-Key": "k-broker-outage"}
    worker = None
    try:
        with TestClient(create_app(settings, clients=clients)) as c:
            own_redis.stop()
            t0 = time.monotonic()
            first = c.post("/v1/experiments", json=body, headers=key)
            assert first.status_code == 202 and first.json()["created"] is True, first.text
            assert time.monotonic() - t0 < 5.0  # never waits on the broker
            exp = first.json()["id"]
            again = c.post("/v1/experiments", json=body, headers=key)  # a client retry: the same experiment
            assert again.status_code == 202 and again.json()["id"] == exp and again.json()["created"] is False
            time.sleep(1.5)  # relay passes meet the broker away: the hand-offs wait
            with pg.sessions() as s:
                assert s.scalar(sa.select(sa.func.count()).select_from(Experiment)) == 1
                assert repo.count_handoffs(session=s, exp_id=exp) == 2
            own_redis.start()
            t1 = time.monotonic()
            while True:
                with pg.sessions() as s:
                    if repo.count_handoffs(session=s, exp_id=exp) == 0:
                        break
                assert time.monotonic() - t1 < 10.0, "the hand-offs did not reach the broker"
                time.sleep(0.05)
            relayed_s = time.monotonic() - t1
            assert redis.Redis.from_url(own_redis.url).llen(queue) == 2  # both tasks wait in the queue
            log = tmp_path / "worker.log"
            worker = _worker(pg, own_redis.url, queue, log)
            for sc in ("baseline", "tas"):
                run = _wait_run(pg, repo.run_id_for(exp, sc), lambda r: r.status == RunStatus.succeeded, 120, log)
                assert run.deliveries == 1 and run.attempts == 1
            deadline = time.monotonic() + 60
            while c.get(f"/v1/experiments/{exp}").json()["status"] != "succeeded":
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        if worker is not None:
            _stop(worker)
        clients.close()
    assert relayed_s < 3.0, relayed_s  # within a relay pass or two of the broker's return
