"""Cluster mode with a real Celery worker (Redis broker, PostgreSQL run state): the same experiment gives byte-identical
files to embedded mode, and a worker killed with -9 mid-scenario is replaced by a new one that finishes the run.

The worker reaches the compute services in-process (``TASMOE_WORKER_SERVICES=tests.orchestrator.fakes:build_apps``)
so these tests exercise Celery, the broker, leases and the database, not the simulation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from services.orchestrator import repository as repo
from services.orchestrator import window_store
from services.orchestrator.celery_app import CeleryDispatcher
from services.orchestrator.models import RunStatus, ScenarioRun
from services.orchestrator.run_files import run_dir_for
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.settings import OrchestratorSettings
from services.orchestrator.window_loop import run_scenario
from shared.client import ServiceClients
from shared.series_table import SUFFIX as SERIES_SUFFIX
from shared.settings import Settings
from shared.window_series import WINDOWS_SUFFIX
from tests.conftest import CONFIGS, REPO
from tests.orchestrator import fakes
from tests.orchestrator.conftest import Db, sqlite_db
from tests.orchestrator.test_window_loop import small_request

pytestmark = [pytest.mark.slow, pytest.mark.services]


def _pg_url(db: Db) -> str:
    return f"{db.url}?options=-csearch_path%3D{db.schema}"


@pytest.fixture()
def queue(redis_url: str) -> Iterator[str]:
    name = f"tasmoe-test-{uuid.uuid4().hex[:8]}"
    yield name
    redis.Redis.from_url(redis_url).delete(name)


def _worker(db: Db, redis_url: str, queue: str, log: Path, lease_s: float = 1.0) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TASMOE_DATABASE_URL": _pg_url(db), "TASMOE_REDIS_URL": redis_url,
           "TASMOE_CELERY_QUEUE": queue, "TASMOE_WORKER_SERVICES": "tests.orchestrator.fakes:build_apps",
           "TASMOE_LEASE_S": str(lease_s), "TASMOE_LOG_LEVEL": "WARNING", "TASMOE_MODE": "cluster",
           "TASMOE_EPOCH_WINDOWS": "2"}  # a kill between epochs, mid-run
    cmd = [sys.executable, "-m", "celery", "-A", "services.orchestrator.celery_app", "worker", "-Q", queue,
           "--concurrency", "1", "-n", f"{queue}-{uuid.uuid4().hex[:4]}@%h", "--without-gossip", "--without-mingle",
           "--loglevel", "WARNING"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(p: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if p.poll() is None:
        os.killpg(p.pid, sig)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def _wait_run(db: Db, run_id: str, pred: Any, timeout: float, log: Path) -> ScenarioRun:
    deadline = time.monotonic() + timeout
    while True:
        with db.sessions() as s:
            run = s.get(ScenarioRun, run_id)
            assert run is not None
            if pred(run):
                return run
        assert time.monotonic() < deadline, f"run {run_id} stuck; worker log:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def _tree(root: Path) -> dict[str, bytes]:
    """The run files under ``root`` (not run.log, not the experiment's finalize outputs: the cluster finalizes after
    its last run, the embedded reference here does not)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.name != "run.log" and SERIES_SUFFIX not in p.name and WINDOWS_SUFFIX not in p.name and p.is_file()}


def _spec(steps: int, scenarios: list[str]) -> Any:
    req = small_request(scenarios=scenarios, plots=False)
    wl = req.workload.model_copy(update={"sequence": req.workload.sequence.model_copy(  # type: ignore[union-attr]
        update={"steps": steps})})
    return resolve_spec(req.model_copy(update={"workload": wl}), configs_dir=CONFIGS)


def test_embedded_and_cluster_give_identical_files(pg: Db, redis_url: str, queue: str, settings: Settings,
                                                   tmp_path: Path) -> None:
    spec = _spec(24, ["baseline", "tas"])
    # embedded: SQLite, in-process pool
    (tmp_path / "emb").mkdir()
    emb_db = next(sqlite_db(tmp_path / "emb"))
    emb_id, _ = create_experiment(sessions=emb_db.sessions, spec=spec, settings=settings, out_dir=tmp_path / "e")
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    for sc in spec.scenarios:
        assert run_scenario(repo.run_id_for(emb_id, sc), clients, emb_db.sessions).status == "succeeded"
    clients.close()
    # cluster: PostgreSQL, Celery worker, Redis broker
    osettings = OrchestratorSettings(redis_url=redis_url, celery_queue=queue, results_dir=settings.results_dir)
    exp_id, _ = create_experiment(sessions=pg.sessions, spec=spec, settings=settings, out_dir=tmp_path / "c")
    worker = _worker(pg, redis_url, queue, tmp_path / "worker.log")
    try:
        disp = CeleryDispatcher(osettings, pg.sessions)
        disp.submit_experiment(exp_id)
        for sc in spec.scenarios:
            run = _wait_run(pg, repo.run_id_for(exp_id, sc), lambda r: r.status not in
                            {RunStatus.queued, RunStatus.running}, 180, tmp_path / "worker.log")
            assert run.status == RunStatus.succeeded, run.error
        disp.shutdown()
    finally:
        _stop(worker)
    for sub in ("runs", "traces", "baseline", "tas"):
        assert _tree(tmp_path / "c" / sub) == _tree(tmp_path / "e" / sub)


def test_kill_9_celery_worker_new_worker_finishes(pg: Db, redis_url: str, queue: str, settings: Settings,
                                                  tmp_path: Path) -> None:
    spec = _spec(90, ["tas"])
    ref_id, _ = create_experiment(sessions=pg.sessions, spec=spec, settings=settings, out_dir=tmp_path / "ref")
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    assert run_scenario(repo.run_id_for(ref_id, "tas"), clients, pg.sessions).status == "succeeded"
    clients.close()

    osettings = OrchestratorSettings(redis_url=redis_url, celery_queue=queue)
    exp_id, _ = create_experiment(sessions=pg.sessions, spec=spec, settings=settings, out_dir=tmp_path / "crash")
    run_id = repo.run_id_for(exp_id, "tas")
    w1 = _worker(pg, redis_url, queue, tmp_path / "w1.log")
    try:
        CeleryDispatcher(osettings, pg.sessions).submit_experiment(exp_id)
        _wait_run(pg, run_id, lambda r: r.next_window >= 5, 120, tmp_path / "w1.log")
        _stop(w1, signal.SIGKILL)  # the whole worker (main process and its pool child)
    finally:
        _stop(w1, signal.SIGKILL)
    with pg.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.status == RunStatus.running and run.next_window < 30
        killed_at = run.next_window
    w2 = _worker(pg, redis_url, queue, tmp_path / "w2.log")  # its reaper re-enqueues the expired run
    try:
        run = _wait_run(pg, run_id, lambda r: r.status != RunStatus.running, 180, tmp_path / "w2.log")
    finally:
        _stop(w2)
    assert run.status == RunStatus.succeeded, run.error
    rd = run_dir_for(tmp_path / "crash", "tas")
    assert [w["window"] for w in window_store.read(rd)] == list(range(30))  # each window exactly once
    assert f"resuming at window {killed_at} of 30" in (rd / "run.log").read_text()
    for sub in ("runs", "traces", "tas"):
        assert _tree(tmp_path / "crash" / sub) == _tree(tmp_path / "ref" / sub)


def test_an_undisturbed_experiment_runs_each_task_once_and_finalises_once(pg: Db, redis_url: str, queue: str,
                                                                         settings: Settings, tmp_path: Path) -> None:
    """Issue 17, item 6. One worker, a 2 s lease (its reaper passes every second; with 1 s, one clean-clone run on a
    machine loaded by other jobs saw a live run re-delivered once, not reproduced since, even under CPU load; the
    heartbeat renews every lease / 3): the runs waiting their turn in the
    queue are not re-enqueued (each run's task is delivered once), the experiment's files are written once, and the
    experiment reads "succeeded" only once they exist."""
    from services.orchestrator.models import Experiment

    spec = _spec(200, ["baseline", "taps", "tas"])
    osettings = OrchestratorSettings(redis_url=redis_url, celery_queue=queue)
    exp_id, _ = create_experiment(sessions=pg.sessions, spec=spec, settings=settings, out_dir=tmp_path / "x")
    log = tmp_path / "worker.log"
    worker = _worker(pg, redis_url, queue, log, lease_s=2.0)
    seen: list[str] = []
    try:
        CeleryDispatcher(osettings, pg.sessions).submit_experiment(exp_id)
        deadline = time.monotonic() + 240
        while True:
            with pg.sessions() as s:
                exp = s.get(Experiment, exp_id)
                assert exp is not None
                status = exp.status
            seen.append(status.value)
            if status == RunStatus.succeeded:
                # the moment it reads "succeeded", the files are there
                assert (tmp_path / "x" / "summary.csv").is_file() and (tmp_path / "x" / "comparison.csv").is_file()
                break
            assert status in {RunStatus.queued, RunStatus.running}, (status, exp.error)
            assert time.monotonic() < deadline, f"stuck at {status}; worker log:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
        time.sleep(4.0)  # four more reaper passes: nothing may be re-enqueued or finalised again
    finally:
        _stop(worker)
    with pg.sessions() as s:
        runs = list(s.scalars(sa.select(ScenarioRun).where(ScenarioRun.experiment_id == exp_id)))
        exp = s.get(Experiment, exp_id)
        assert exp is not None
        assert {r.scenario: r.deliveries for r in runs} == {sc: 1 for sc in spec.scenarios}
        assert all(r.attempts == 1 and r.enqueued_at is not None for r in runs)
        assert exp.finalizations == 1 and exp.finalized_at is not None
    assert "running" in seen  # it was watched while it ran, not only at the end
