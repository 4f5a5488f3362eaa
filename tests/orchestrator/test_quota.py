"""A principal's run quota under concurrent submissions, on SQLite and on the real PostgreSQL: experiments with and
without an Idempotency-Key, replays of a used key, sweeps (all their runs), finished runs freeing their share; then
the HTTP wiring (429, its error body and Retry-After)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from services.orchestrator import repository as repo
from services.orchestrator.app import create_app
from services.orchestrator.models import Experiment, Job, RunStatus, ScenarioRun
from services.orchestrator.schemas import ExperimentRequest, ExperimentSpec, SweepRequest
from services.orchestrator.service import RunQuota, create_experiment, create_sweep, resolve_spec
from services.orchestrator.settings import OrchestratorSettings
from shared.client import ServiceClients
from shared.errors import QuotaExceeded
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator import fakes
from tests.orchestrator.conftest import SMALL_WL, Db

T = TypeVar("T")
OWNER = "alice"


def _spec(scenarios: list[str]) -> ExperimentSpec:
    req = ExperimentRequest.model_validate({"workload": SMALL_WL, "scenarios": scenarios})
    return resolve_spec(req, configs_dir=CONFIGS)


def _sweep(seeds: list[int], scenarios: list[str]) -> SweepRequest:
    return SweepRequest.model_validate({"base": {"workload": SMALL_WL, "scenarios": scenarios},
                                        "grid": {"seed": seeds}})


def _at_once(n: int, submit: Callable[[int], T]) -> list[T | QuotaExceeded]:
    """``submit(i)`` for i < n on n threads released together; a quota refusal is returned, anything else raised."""
    start = threading.Barrier(n)

    def one(i: int) -> T | QuotaExceeded:
        start.wait()
        try:
            return submit(i)
        except QuotaExceeded as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def _active(db: Db, owner: str = OWNER) -> int:
    with db.sessions() as s:
        return repo.active_runs_of_owner(session=s, owner=owner)


def _count(db: Db, table: type[Experiment] | type[Job]) -> int:
    with db.sessions() as s:
        return int(s.scalar(sa.select(sa.func.count()).select_from(table)) or 0)


@pytest.mark.parametrize("keys", ["without", "fresh", "mixed"])
def test_concurrent_submissions_accept_exactly_the_quota(db: Db, settings: Settings, keys: str) -> None:
    spec = _spec(["baseline", "tas"])
    quota = RunQuota(limit=10, retry_after_s=60)

    def submit(i: int) -> tuple[str, bool]:
        key = None if keys == "without" or (keys == "mixed" and i % 2) else f"key-{i}"
        return create_experiment(sessions=db.sessions, spec=spec, settings=settings, idempotency_key=key,
                                 owner=OWNER, quota=quota)

    outcomes = _at_once(32, submit)
    accepted = [o for o in outcomes if not isinstance(o, QuotaExceeded)]
    refused = [o for o in outcomes if isinstance(o, QuotaExceeded)]
    assert len(accepted) == 5 and all(created for _, created in accepted)  # 5 x 2 runs = the quota
    assert len(refused) == 27 and all(r.retry_after_s == 60 and r.field == "scenarios" for r in refused)
    assert _active(db) == 10 and _count(db, Experiment) == 5
    # another principal has its own quota
    assert create_experiment(sessions=db.sessions, spec=spec, settings=settings, owner="bob", quota=quota)[1]


def test_a_replayed_key_is_not_charged_and_a_fresh_one_is(db: Db, settings: Settings) -> None:
    spec = _spec(["baseline", "tas"])
    quota = RunQuota(limit=2, retry_after_s=60)

    def submit(_: int) -> tuple[str, bool]:
        return create_experiment(sessions=db.sessions, spec=spec, settings=settings, idempotency_key="same",
                                 owner=OWNER, quota=quota)

    outcomes = _at_once(12, submit)  # the first fills the quota; the others are replays of it, never refused
    assert not any(isinstance(o, QuotaExceeded) for o in outcomes)
    ids = {o[0] for o in outcomes if not isinstance(o, QuotaExceeded)}
    assert len(ids) == 1 and sum(1 for o in outcomes if not isinstance(o, QuotaExceeded) and o[1]) == 1
    assert submit(0) == (ids.pop(), False)  # at the quota, a replay still answers
    for key in ("fresh", None):
        with pytest.raises(QuotaExceeded, match="2 queued or running runs; 2 more would pass the quota of 2"):
            create_experiment(sessions=db.sessions, spec=spec, settings=settings, idempotency_key=key, owner=OWNER,
                              quota=quota)
    assert _active(db) == 2 and _count(db, Experiment) == 1


def test_a_sweep_counts_as_all_its_runs(db: Db, settings: Settings) -> None:
    quota = RunQuota(limit=8, retry_after_s=60)
    sweep = _sweep([1, 2], ["baseline", "tas"])  # 2 points x 2 scenarios = 4 runs

    outcomes = _at_once(8, lambda _: create_sweep(sessions=db.sessions, req=sweep, settings=settings, owner=OWNER,
                                                  quota=quota))
    accepted = [o for o in outcomes if not isinstance(o, QuotaExceeded)]
    assert len(accepted) == 2 and all(len(exps) == 2 for _, exps in accepted)
    assert _active(db) == 8 and _count(db, Experiment) == 4 and _count(db, Job) == 2
    # a refused sweep leaves nothing behind: no experiment, no job row
    with pytest.raises(QuotaExceeded, match="2 more would pass"):
        create_sweep(sessions=db.sessions, req=_sweep([3], ["baseline", "tas"]), settings=settings, owner=OWNER,
                     quota=quota)
    with pytest.raises(QuotaExceeded):
        create_experiment(sessions=db.sessions, spec=_spec(["baseline"]), settings=settings, owner=OWNER,
                          quota=quota)
    assert _count(db, Experiment) == 4 and _count(db, Job) == 2


def test_sweeps_and_experiments_at_once_share_one_quota(db: Db, settings: Settings) -> None:
    quota = RunQuota(limit=10, retry_after_s=60)
    sweep, spec = _sweep([1, 2], ["baseline", "tas"]), _spec(["baseline", "tas"])

    def submit(i: int) -> int:  # the runs queued
        if i % 2:
            return 2 * len(create_sweep(sessions=db.sessions, req=sweep, settings=settings, owner=OWNER,
                                        quota=quota)[1])
        create_experiment(sessions=db.sessions, spec=spec, settings=settings, owner=OWNER, quota=quota)
        return 2

    queued = sum(o for o in _at_once(12, submit) if not isinstance(o, QuotaExceeded))
    # every size is even and the six experiments' 12 runs alone pass 10, so one of them was refused at > 8, i.e. 10
    assert queued == 10 and _active(db) == 10


def test_finished_runs_free_their_share(db: Db, settings: Settings) -> None:
    quota = RunQuota(limit=2, retry_after_s=60)
    one, two = _spec(["baseline"]), _spec(["baseline", "tas"])
    exp_id, _ = create_experiment(sessions=db.sessions, spec=two, settings=settings, owner=OWNER, quota=quota)
    with pytest.raises(QuotaExceeded):
        create_experiment(sessions=db.sessions, spec=one, settings=settings, owner=OWNER, quota=quota)
    for scenario, status in (("baseline", RunStatus.succeeded), ("tas", RunStatus.failed)):
        with db.sessions.begin() as s:
            run = repo.get_run(session=s, run_id=repo.run_id_for(exp_id, scenario))
            assert run is not None
            run.status = status
    assert _active(db) == 0
    second, _ = create_experiment(sessions=db.sessions, spec=two, settings=settings, owner=OWNER, quota=quota)
    with db.sessions.begin() as s:
        assert repo.cancel_experiment(session=s, exp_id=second) == 2
    assert create_experiment(sessions=db.sessions, spec=two, settings=settings, owner=OWNER, quota=quota)[1]
    with db.sessions() as s:
        statuses = s.scalars(sa.select(ScenarioRun.status)).all()
    assert sorted(statuses) == sorted([RunStatus.succeeded, RunStatus.failed, RunStatus.cancelled,
                                       RunStatus.cancelled, RunStatus.queued, RunStatus.queued])


# ------------------------------------------------------------------------------------------------------ HTTP wiring


@pytest.fixture()
def quota_api(db: Db, tmp_path: Path) -> Iterator[tuple[TestClient, fakes.RecordingDispatcher]]:
    """The orchestrator app on ``db`` (both backends) with a quota of 4 runs; runs are recorded, not run."""
    url = db.url if db.schema is None else f"{db.url}?options=-csearch_path%3D{db.schema}"
    settings = OrchestratorSettings(results_dir=tmp_path / "results", configs_dir=CONFIGS, database_url=url,
                                    quota_active_runs=4, lease_s=60)
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    dispatcher = fakes.RecordingDispatcher()
    with TestClient(create_app(settings, clients=clients, dispatcher=dispatcher)) as tc:
        yield tc, dispatcher
    clients.close()


def _assert_quota_refusal(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == "60"
    error = r.json()["error"]
    assert set(error) == {"code", "message", "field"}
    assert error["code"] == "quota" and error["field"] == "scenarios"
    assert "TASMOE_QUOTA_ACTIVE_RUNS" in error["message"]


def test_http_concurrent_posts_hold_the_quota(quota_api: tuple[TestClient, fakes.RecordingDispatcher]) -> None:
    api, dispatcher = quota_api
    body = {"workload": SMALL_WL, "scenarios": ["baseline"]}

    def post(i: int) -> httpx.Response:
        headers = {"Idempotency-Key": f"k-{i}"} if i % 2 else {}
        return api.post("/v1/experiments", json=body, headers=headers)

    answers = [r for r in _at_once(12, post) if isinstance(r, httpx.Response)]  # a refusal is an answer here
    assert len(answers) == 12
    accepted = [r for r in answers if r.status_code == 202]
    assert len(accepted) == 4, [r.status_code for r in answers]
    for r in answers:
        if r.status_code != 202:
            _assert_quota_refusal(r)
    assert len(dispatcher.submitted) == 4
    # which four won the race is the scheduler's: free one share and take it with a known key, deterministically
    assert api.post(f"/v1/experiments/{accepted[0].json()['id']}/cancel").status_code == 200
    keyed = api.post("/v1/experiments", json=body, headers={"Idempotency-Key": "known"})
    assert keyed.status_code == 202 and keyed.json()["created"] is True
    # a replay of a key that was accepted answers its experiment; a fresh key, a sweep, a plain POST are refused
    replay = api.post("/v1/experiments", json=body, headers={"Idempotency-Key": "known"})
    assert replay.status_code == 202 and replay.json()["created"] is False
    assert replay.json()["id"] == keyed.json()["id"]
    _assert_quota_refusal(api.post("/v1/experiments", json=body, headers={"Idempotency-Key": "fresh"}))
    _assert_quota_refusal(api.post("/v1/experiments", json=body))
    sweep = {"base": body, "grid": {"seed": [1]}}
    _assert_quota_refusal(api.post("/v1/sweeps", json=sweep))
    # a cancelled run frees its share: the sweep's one run now fits
    assert api.post(f"/v1/experiments/{accepted[1].json()['id']}/cancel").status_code == 200
    assert api.post("/v1/sweeps", json=sweep).status_code == 202
    assert len(dispatcher.submitted) == 6
