"""Kill -9 a compute service process (the real thermal service under uvicorn) in the middle of a run and start it
again 20 s later (issue 17, item 5): the run waits the outage out (status waiting, the client's own retries long
spent), resumes at its frontier when the service answers, and its files are byte-identical to a run that never lost
the service (the service is stateless: the state travels with each request)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from services.orchestrator import repository as repo
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.settings import OrchestratorSettings
from services.orchestrator.window_loop import run_scenario
from services.orchestrator.worker import compute_clients
from shared.client import ServiceClients
from shared.settings import Settings
from tests.conftest import CONFIGS, REPO
from tests.orchestrator import fakes
from tests.orchestrator.conftest import Db
from tests.orchestrator.test_window_loop import _tree, small_request

DOWN_S = 20.0  # the thermal service is down this long (issue 17's acceptance)


def apps_with_real_thermal(settings: Settings) -> dict[str, Any]:
    from services.thermal.app import create_app

    return {**fakes.build_apps(settings), "thermal": create_app(settings)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_thermal(port: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "services.cli", "serve", "thermal", "--port", str(port)],
                            cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "TASMOE_LOG_LEVEL": "WARNING"})


def _wait_up(port: int, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"thermal did not come up on port {port}")


@pytest.mark.slow
def test_thermal_killed_and_restarted_mid_run(sqlite: Db, settings: Settings, tmp_path: Path) -> None:
    spec = resolve_spec(small_request(scenarios=["baseline"], plots=False), configs_dir=CONFIGS)
    ref_id, _ = create_experiment(sessions=sqlite.sessions, spec=spec, settings=settings, out_dir=tmp_path / "ref")
    with compute_clients(settings, "tests.orchestrator.test_service_restart:apps_with_real_thermal") as clients:
        assert run_scenario(repo.run_id_for(ref_id, "baseline"), clients, sqlite.sessions).status == "succeeded"

    port = _free_port()
    log = tmp_path / "thermal.log"
    procs = [_serve_thermal(port, log)]
    _wait_up(port)
    s2 = OrchestratorSettings(**{**settings.model_dump(), "thermal_url": f"http://127.0.0.1:{port}",
                                 "http_retries": 2, "http_backoff_s": 0.1, "outage_budget_s": 300.0,
                                 "outage_backoff_max_s": 2.0})
    apps = {k: v for k, v in fakes.build_apps(s2).items() if k != "thermal"}
    clients = ServiceClients(s2, asgi_apps=apps)
    restarted: list[int] = []
    timers: list[threading.Timer] = []

    def kill_and_restart(_r: str, k: int, _n: int) -> bool:
        if k == 2:
            os.killpg(procs[0].pid, signal.SIGKILL)
            procs[0].wait(10)
            timer = threading.Timer(DOWN_S, lambda: procs.append(_serve_thermal(port, log)))
            timer.start()  # down for DOWN_S: window 3 waits it out
            timers.append(timer)
            restarted.append(k)
        return True

    exp_id, _ = create_experiment(sessions=sqlite.sessions, spec=spec, settings=settings, out_dir=tmp_path / "kill")
    try:
        out = run_scenario(repo.run_id_for(exp_id, "baseline"), clients, sqlite.sessions,
                           on_window=kill_and_restart)
    finally:
        clients.close()
        for t in timers:
            t.join()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)
    assert restarted == [2]
    assert out.status == "succeeded", (out.error, log.read_text()[-2000:])
    run_log = (tmp_path / "kill" / "runs" / "baseline" / "run.log").read_text()
    assert "waiting: thermal: unreachable" in run_log  # it waited the outage out, not the client's retries
    for sub in ("runs", "baseline"):
        assert _tree(tmp_path / "kill" / sub) == _tree(tmp_path / "ref" / sub)
