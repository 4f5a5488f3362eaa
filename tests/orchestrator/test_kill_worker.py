"""kill -9 a worker process in the middle of a scenario, start a new one: the run finishes, every window exists exactly
once, and the files are byte-identical to an uninterrupted run with the same seed (SQLite and PostgreSQL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from services.orchestrator import repository as repo
from services.orchestrator import window_store
from services.orchestrator.finalize import finalize_experiment
from services.orchestrator.models import RunStatus, ScenarioRun
from services.orchestrator.run_files import run_dir_for
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.window_loop import run_scenario
from shared.client import ServiceClients
from shared.settings import Settings
from tests.conftest import CONFIGS, REPO
from tests.orchestrator import fakes
from tests.orchestrator.conftest import Db
from tests.orchestrator.test_window_loop import small_request

STEPS = 90  # 30 windows of 3 ms


def _spec() -> Any:
    req = small_request(scenarios=["tas"], plots=False)
    wl = req.workload.model_copy(update={"sequence": req.workload.sequence.model_copy(update={"steps": STEPS})})  # type: ignore[union-attr]
    return resolve_spec(req.model_copy(update={"workload": wl}), configs_dir=CONFIGS)


def _worker(db: Db, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "services.orchestrator.worker", "--database-url", db.url, "--apps",
           "tests.orchestrator.fakes:build_apps", "--lease-s", "1", "--workers", "1", "--until-idle"]
    if db.schema:
        cmd += ["--schema", db.schema]
    env = {**os.environ, "TASMOE_LOG_LEVEL": "WARNING", "TASMOE_EPOCH_WINDOWS": "2"}  # killed between epochs
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run.log"}


@pytest.mark.slow
def test_kill_9_worker_mid_scenario_then_resume(db: Db, settings: Settings, tmp_path: Path) -> None:
    spec = _spec()
    # the uninterrupted reference, in this process
    ref_id, _ = create_experiment(sessions=db.sessions, spec=spec, settings=settings, out_dir=tmp_path / "ref")
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    assert run_scenario(repo.run_id_for(ref_id, "tas"), clients, db.sessions).status == "succeeded"
    finalize_experiment(sessions=db.sessions, clients=clients, exp_id=ref_id)  # the series files, as the worker does
    clients.close()

    exp_id, _ = create_experiment(sessions=db.sessions, spec=spec, settings=settings, out_dir=tmp_path / "crash")
    run_id = repo.run_id_for(exp_id, "tas")
    w1 = _worker(db, tmp_path / "w1.log")
    try:
        deadline = time.monotonic() + 60
        while True:  # wait until worker 1 is in the middle of the run
            with db.sessions() as s:
                run = s.get(ScenarioRun, run_id)
                k = run.next_window if run is not None else 0
            if k >= 5:
                break
            assert w1.poll() is None, (tmp_path / "w1.log").read_text()
            assert time.monotonic() < deadline, "worker 1 made no progress"
            time.sleep(0.02)
        os.kill(w1.pid, signal.SIGKILL)
        w1.wait(10)
    finally:
        if w1.poll() is None:
            w1.kill()
    with db.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.status == RunStatus.running and 5 <= run.next_window < 30
        killed_at = run.next_window

    w2 = _worker(db, tmp_path / "w2.log")
    assert w2.wait(120) == 0, (tmp_path / "w2.log").read_text()
    with db.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.status == RunStatus.succeeded, run.error if run else None
        assert run.attempts == 2
    rd = run_dir_for(tmp_path / "crash", "tas")
    assert [w["window"] for w in window_store.read(rd)] == list(range(30))  # each window exactly once
    assert f"resuming at window {killed_at} of 30" in (rd / "run.log").read_text()
    # every per-window file, the result CSV and the run's series table (the worker also wrote plots)
    assert (tmp_path / "crash" / "tas" / "mixtral-8x7b.series.csv.gz").is_file()
    for sub in ("runs", "traces", "tas"):  # traces: the experiment's logical trace (its first scenario writes it)
        assert _tree(tmp_path / "crash" / sub) == _tree(tmp_path / "ref" / sub)
    assert (tmp_path / "crash" / "traces" / "logical_compute.csv.gz").is_file()
    assert (tmp_path / "crash" / "tas" / "mixtral-8x7b.csv").read_bytes() == \
        (tmp_path / "ref" / "tas" / "mixtral-8x7b.csv").read_bytes()
