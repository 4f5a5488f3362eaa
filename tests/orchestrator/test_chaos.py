"""Chaos: one experiment through a PostgreSQL restart, a Redis restart, a Celery worker killed with -9 and a compute
service killed with -9, in one run, on servers of the test's own (tests/orchestrator/instances.py). The run finishes
with the files of an undisturbed run; the only attempt it spends beyond its first is the killed worker's (a worker
that dies cannot be told from a run that kills its worker: the attempts cap exists for the latter): the database
restart, the broker restart and the compute service's death are waited out on the same claim.

The experiment is submitted to the orchestrator's API in cluster mode (its hand-offs relayed to Celery through the
outbox); the worker reaches the fake compute services in-process, but the thermal one over HTTP, served by uvicorn in
a process of its own (paced, so that the run is long enough for four faults)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from services.orchestrator import repository as repo
from services.orchestrator.app import create_app
from services.orchestrator.models import Experiment, RunStatus, ScenarioRun
from services.orchestrator.run_files import run_dir_for
from services.orchestrator.service import create_experiment
from services.orchestrator.settings import OrchestratorSettings
from services.orchestrator.window_loop import run_scenario
from shared.client import IDEMPOTENCY_HEADER, ServiceClients
from shared.settings import Settings
from tests.conftest import CONFIGS, REPO
from tests.orchestrator import fakes
from tests.orchestrator.conftest import Db, sqlite_db
from tests.orchestrator.instances import PgServer, RedisServer, free_port, outage_db, own_pg, own_redis
from tests.orchestrator.test_cluster_celery import _spec, _stop, _tree

pytestmark = [pytest.mark.slow, pytest.mark.services]
__all__ = ["own_pg", "own_redis"]  # fixtures

STEPS = 600  # 200 windows of 3 ms
THERMAL_DELAY_S = 0.1  # per epoch call of the served thermal service: ~10 windows a second in epochs of 2
FAULTS_AT = (30, 70, 110, 150)  # the frontier at which each fault strikes: database, broker, worker, thermal


def thermal_app() -> Any:
    """The fake thermal service (uvicorn --factory), each epoch call of the run proper delayed by
    CHAOS_THERMAL_DELAY_S (not the warm-up's: its calls' idempotency keys say ``warmstep``, not ``step``)."""
    app = fakes.thermal_app(Settings())
    delay = float(os.environ.get("CHAOS_THERMAL_DELAY_S", "0"))

    async def paced(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/step/epoch":
            key = dict(scope["headers"]).get(IDEMPOTENCY_HEADER.lower().encode(), b"").decode()
            if "step" in key.split(":"):
                await asyncio.sleep(delay)
        await app(scope, receive, send)

    return paced


def apps_but_thermal(settings: Settings) -> dict[str, Any]:
    """The worker's in-process services; thermal is reached at TASMOE_THERMAL_URL."""
    return {k: v for k, v in fakes.build_apps(settings).items() if k != "thermal"}


def _serve_thermal(port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "tests.orchestrator.test_chaos:thermal_app", "--host",
           "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    env = {**os.environ, "CHAOS_THERMAL_DELAY_S": str(THERMAL_DELAY_S)}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_port(port: int, timeout: float = 60.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def _db_url(db: Db) -> str:
    return f"{db.url}?options=-csearch_path%3D{db.schema}"


def _worker(db: Db, redis_url: str, queue: str, thermal_port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TASMOE_DATABASE_URL": _db_url(db), "TASMOE_REDIS_URL": redis_url,
           "TASMOE_CELERY_QUEUE": queue, "TASMOE_WORKER_SERVICES": "tests.orchestrator.test_chaos:apps_but_thermal",
           "TASMOE_THERMAL_URL": f"http://127.0.0.1:{thermal_port}", "TASMOE_LEASE_S": "2",
           "TASMOE_LOG_LEVEL": "WARNING", "TASMOE_MODE": "cluster", "TASMOE_EPOCH_WINDOWS": "2",
           "TASMOE_HTTP_RETRIES": "1", "TASMOE_HTTP_BACKOFF_S": "0.05", "TASMOE_OUTAGE_BACKOFF_MAX_S": "1",
           "TASMOE_OUTAGE_BUDGET_S": "300"}
    cmd = [sys.executable, "-m", "celery", "-A", "services.orchestrator.celery_app", "worker", "-Q", queue,
           "--concurrency", "1", "-n", f"{queue}-{uuid.uuid4().hex[:4]}@%h", "--without-gossip", "--without-mingle",
           "--loglevel", "WARNING"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


@pytest.fixture()
def chaos_db(own_pg: PgServer) -> Iterator[Db]:
    yield from outage_db(own_pg)


def _frontier(db: Db, run_id: str) -> ScenarioRun | None:
    """The run as the database has it, None while the database is away."""
    try:
        with db.sessions() as s:
            return s.get(ScenarioRun, run_id)
    except sa.exc.OperationalError:
        return None


def _until(what: str, pred: Callable[[], bool], timeout: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.05)


def test_one_run_through_a_database_restart_a_broker_restart_a_worker_kill_and_a_service_kill(
        own_pg: PgServer, own_redis: RedisServer, chaos_db: Db, tmp_path: Path) -> None:
    t_start = time.monotonic()
    spec = _spec(STEPS, ["tas"])
    base = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    # the undisturbed reference, in this process
    (tmp_path / "ref-db").mkdir()
    ref_db = next(sqlite_db(tmp_path / "ref-db"))
    ref_settings = OrchestratorSettings(**{**base.model_dump(), "epoch_windows": 2})
    clients = ServiceClients(ref_settings, asgi_apps=fakes.build_apps(ref_settings))
    ref_id, _ = create_experiment(sessions=ref_db.sessions, spec=spec, settings=base, out_dir=tmp_path / "ref")
    assert run_scenario(repo.run_id_for(ref_id, "tas"), clients, ref_db.sessions).status == "succeeded"
    clients.close()

    queue = f"tasmoe-chaos-{uuid.uuid4().hex[:8]}"
    thermal_port = free_port()
    logs = {name: tmp_path / f"{name}.log" for name in ("thermal", "w1", "w2")}
    procs: dict[str, subprocess.Popen[bytes]] = {"thermal": _serve_thermal(thermal_port, logs["thermal"])}
    settings = OrchestratorSettings(mode="cluster", database_url=_db_url(chaos_db), redis_url=own_redis.url,
                                    celery_queue=queue, results_dir=tmp_path / "results", configs_dir=CONFIGS)
    check_clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))  # the submission's checks
    seen_503 = False
    try:
        _wait_port(thermal_port)
        procs["w1"] = _worker(chaos_db, own_redis.url, queue, thermal_port, logs["w1"])
        with TestClient(create_app(settings, clients=check_clients)) as api:
            body = {**spec.model_dump(mode="json", exclude={"seed", "name", "thermal_init"}), "seed": spec.seed}
            r = api.post("/v1/experiments", json=body, headers={"Idempotency-Key": "chaos"})
            assert r.status_code == 202, r.text
            exp_id = r.json()["id"]
            run_id = repo.run_id_for(exp_id, "tas")
            logl = list(logs.values())

            def past(k: int) -> Callable[[], bool]:
                return lambda: (run := _frontier(chaos_db, run_id)) is not None and run.next_window >= k

            # 1. PostgreSQL restarts (3 s down; the run's lease is 2 s)
            _until(f"window {FAULTS_AT[0]}", past(FAULTS_AT[0]), 120, logl)
            own_pg.stop()
            seen_503 = api.get(f"/v1/experiments/{exp_id}").status_code == 503
            time.sleep(3.0)
            own_pg.start()
            # 2. Redis restarts (2 s down; it keeps nothing)
            _until(f"window {FAULTS_AT[1]}", past(FAULTS_AT[1]), 120, logl)
            own_redis.stop()
            time.sleep(2.0)
            own_redis.start()
            # 3. the worker is killed (-9, its pool child too) and another one started
            _until(f"window {FAULTS_AT[2]}", past(FAULTS_AT[2]), 120, logl)
            _stop(procs.pop("w1"), signal.SIGKILL)
            killed_at = _frontier(chaos_db, run_id)
            assert killed_at is not None and killed_at.status == RunStatus.running
            procs["w2"] = _worker(chaos_db, own_redis.url, queue, thermal_port, logs["w2"])
            # 4. the thermal service is killed (-9) and started again 2 s later, on the same port
            _until(f"window {FAULTS_AT[3]}", past(FAULTS_AT[3]), 180, logl)
            _stop(procs.pop("thermal"), signal.SIGKILL)
            time.sleep(2.0)
            procs["thermal"] = _serve_thermal(thermal_port, logs["thermal"])
            _until("the run's end", lambda: (run := _frontier(chaos_db, run_id)) is not None
                   and run.status != RunStatus.running, 240, logl)
            _until("the experiment's files", lambda: api.get(f"/v1/experiments/{exp_id}").json()["status"]
                   in {"succeeded", "failed"}, 120, logl)
            view = api.get(f"/v1/experiments/{exp_id}").json()
    finally:
        for p in procs.values():
            _stop(p, signal.SIGKILL)
        check_clients.close()
    elapsed = time.monotonic() - t_start
    assert view["status"] == "succeeded", view
    with chaos_db.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.status == RunStatus.succeeded, run.error if run else None
        assert run.attempts == 2  # the first, and the one after the killed worker: no other fault spent one
        assert run.deliveries == 2  # the first, and the reaper's once the killed worker's lease expired
        assert s.scalar(sa.select(sa.func.count()).select_from(Experiment)) == 1
    assert seen_503
    log = (run_dir_for(tmp_path / "results" / exp_id, "tas") / "run.log").read_text()
    assert "waiting: the run-state database is unreachable" in log
    assert "waiting: thermal" in log
    assert f"attempt 2 starting at window {killed_at.next_window}" in log
    for sub in ("runs", "traces", "tas"):
        assert _tree(tmp_path / "results" / exp_id / sub) == _tree(tmp_path / "ref" / sub), sub
    print(f"chaos test: {elapsed:.1f} s")
