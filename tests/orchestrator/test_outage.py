"""Runs survive an outage of a compute service (issue 17, item 5): the thermal service goes away mid-run (every
request refused, as a killed process refuses connections, then 503s), the run shows ``waiting`` with the reason,
tries again with capped backoff and resumes at its frontier; its files are byte-identical to an undisturbed run. An
outage longer than the budget fails the run; ``POST .../retry`` resumes it at its frontier, again byte-identical."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from services.orchestrator import repository as repo
from services.orchestrator import service
from services.orchestrator.models import RunStatus, ScenarioRun
from services.orchestrator.service import create_experiment
from services.orchestrator.settings import OrchestratorSettings
from services.orchestrator.window_loop import run_scenario
from shared.client import IDEMPOTENCY_HEADER, ServiceClients
from shared.settings import Settings
from tests.orchestrator import fakes
from tests.orchestrator.conftest import Db
from tests.orchestrator.test_kill_worker import _spec, _tree


class FlakyApp:
    """An ASGI app that passes requests to ``app`` except during an outage: from the run's first thermal epoch at or
    past window ``after`` (the run proper, not its warm-up: by the call's idempotency key), for ``down_s`` seconds,
    every request is refused (a connection error, as from a killed process)."""

    def __init__(self, app: Any, *, after: int, down_s: float) -> None:
        self.app, self.after, self.down_s = app, after, down_s
        self.down_until: float | None = None
        self.refused = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/step/epoch" and self.down_until is None:
            key = dict(scope["headers"]).get(IDEMPOTENCY_HEADER.lower().encode(), b"").decode()
            parts = key.split(":")  # <run>:step:<window>:<windows>:<until_event>
            if "step" in parts and int(parts[parts.index("step") + 1]) >= self.after:
                self.down_until = time.monotonic() + self.down_s
        if scope["type"] == "http" and self.down_until is not None and time.monotonic() < self.down_until:
            self.refused += 1
            raise httpx.ConnectError("connection refused (thermal is down)")
        await self.app(scope, receive, send)


def _settings(settings: Settings, budget_s: float) -> OrchestratorSettings:
    return OrchestratorSettings(**{**settings.model_dump(), "http_retries": 1, "http_backoff_s": 0.01,
                                   "outage_budget_s": budget_s, "outage_backoff_max_s": 0.2, "epoch_windows": 4})


def _reference(sqlite: Db, settings: Settings, tmp_path: Path) -> dict[str, bytes]:
    ref_id, _ = create_experiment(sessions=sqlite.sessions, spec=_spec(), settings=settings, out_dir=tmp_path / "ref")
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    assert run_scenario(repo.run_id_for(ref_id, "tas"), clients, sqlite.sessions).status == "succeeded"
    clients.close()
    return _tree(tmp_path / "ref")


def _disturbed(sqlite: Db, settings: Settings, tmp_path: Path, *, budget_s: float,
               down_s: float) -> tuple[FlakyApp, ServiceClients, str, str]:
    """An experiment whose thermal service goes down for ``down_s`` at window 10, with an outage budget."""
    osettings = _settings(settings, budget_s=budget_s)
    apps = fakes.build_apps(osettings)
    flaky = FlakyApp(apps["thermal"], after=10, down_s=down_s)
    clients = ServiceClients(osettings, asgi_apps={**apps, "thermal": flaky})
    exp_id, _ = create_experiment(sessions=sqlite.sessions, spec=_spec(), settings=settings, out_dir=tmp_path / "x")
    return flaky, clients, exp_id, repo.run_id_for(exp_id, "tas")


def test_an_outage_mid_run_is_waited_out_and_the_results_are_identical(sqlite: Db, settings: Settings,
                                                                       tmp_path: Path) -> None:
    ref = _reference(sqlite, settings, tmp_path)
    flaky, clients, exp_id, run_id = _disturbed(sqlite, settings, tmp_path, budget_s=60, down_s=2.0)
    seen: list[tuple[str, str | None]] = []
    done = threading.Event()

    def watch() -> None:  # what a client polling GET /v1/experiments/{id} sees
        while not done.is_set():
            with sqlite.sessions() as s:
                view = service.experiment_view(session=s, exp_id=exp_id)
            seen.append((view.runs[0].status, view.runs[0].waiting))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out = run_scenario(run_id, clients, sqlite.sessions, lease_s=1.0)
    finally:
        done.set()
        watcher.join()
        clients.close()
    assert out.status == "succeeded", out.error
    assert flaky.refused > 0  # the outage happened
    waiting = [w for st, w in seen if st == "waiting"]
    assert waiting and "thermal" in (waiting[0] or "") and "unreachable" in (waiting[0] or "")
    # one stretch of "waiting" through the whole outage, however many tries it took: no flip back to "running"
    # at each try (the mark stays until the next committed epoch)
    stretches = [st for i, (st, _) in enumerate(seen) if i == 0 or seen[i - 1][0] != st]
    assert stretches.count("waiting") == 1, stretches
    assert "trying again" in (tmp_path / "x" / "runs" / "tas" / "run.log").read_text()
    with sqlite.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.waiting_reason is None and run.attempts == 1
    assert "waiting: thermal" in (tmp_path / "x" / "runs" / "tas" / "run.log").read_text()
    assert _tree(tmp_path / "x") == ref


def test_an_outage_past_the_budget_fails_and_retry_resumes_it(sqlite: Db, settings: Settings,
                                                              tmp_path: Path) -> None:
    ref = _reference(sqlite, settings, tmp_path)
    flaky, clients, exp_id, run_id = _disturbed(sqlite, settings, tmp_path, budget_s=0.5, down_s=3600.0)
    out = run_scenario(run_id, clients, sqlite.sessions, lease_s=1.0)
    assert out.status == "failed" and "TASMOE_OUTAGE_BUDGET_S" in (out.error or "") and "retry" in (out.error or "")
    with sqlite.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.status == RunStatus.failed
        frontier = run.next_window
    assert 0 < frontier < 30  # it committed windows before the outage; they stay
    flaky.down_until = 0.0  # the service is back
    with sqlite.sessions.begin() as s:
        assert repo.retry_experiment(session=s, exp_id=exp_id) == [run_id]
        assert repo.retry_experiment(session=s, exp_id=exp_id) == []  # nothing failed any more
    out = run_scenario(run_id, clients, sqlite.sessions, lease_s=1.0)
    clients.close()
    assert out.status == "succeeded", out.error
    assert out.windows_run == 30 - frontier  # resumed at its frontier, not from scratch
    assert _tree(tmp_path / "x") == ref


def test_the_retry_endpoint(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from services.orchestrator.app import create_app
    from tests.conftest import CONFIGS

    disp = fakes.RecordingDispatcher()
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    with TestClient(create_app(settings, dispatcher=disp)) as c:
        exp = c.post("/v1/experiments", json={"workload": "workload_quick.yaml", "scenarios": ["baseline", "tas"]}
                     ).json()["id"]
        r = c.post(f"/v1/experiments/{exp}/retry")
        assert r.status_code == 409 and r.json()["error"]["code"] == "nothing_to_retry"
        assert c.post("/v1/experiments/exp-000000000000/retry").status_code == 404
        rt = c.app.state.rt  # type: ignore[attr-defined]
        with rt.sessions.begin() as s:  # one run failed (say, an outage past the budget) at window 7
            run = s.get(ScenarioRun, repo.run_id_for(exp, "tas"))
            run.status, run.error, run.next_window, run.attempts = RunStatus.failed, "thermal: unreachable", 7, 3
            repo.refresh_experiment_status(session=s, exp_id=exp)
        assert c.get(f"/v1/experiments/{exp}").json()["status"] == "running"  # baseline is still queued
        r = c.post(f"/v1/experiments/{exp}/retry")
        assert r.status_code == 202
        tas = next(x for x in r.json()["runs"] if x["scenario"] == "tas")
        assert (tas["status"], tas["window"], tas["attempts"], tas["error"]) == ("queued", 7, 0, None)
        assert disp.submitted == [exp, exp]


def test_a_finalisation_that_fails_ends_visibly_and_once(sqlite: Db, settings: Settings, tmp_path: Path,
                                                         monkeypatch: Any) -> None:
    """Files that cannot be written must not leave an experiment "running" forever: it ends with the reason shown,
    and nobody finalises it again."""
    from services.orchestrator import jobs
    from services.orchestrator.models import Experiment

    exp_id, _ = create_experiment(sessions=sqlite.sessions, spec=_spec(), settings=settings, out_dir=tmp_path / "x")
    with sqlite.sessions.begin() as s:
        run = s.get(ScenarioRun, repo.run_id_for(exp_id, "tas"))
        assert run is not None
        run.status = RunStatus.succeeded
        repo.refresh_experiment_status(session=s, exp_id=exp_id)
    with sqlite.sessions() as s:
        assert service.experiment_view(session=s, exp_id=exp_id).status == "running"  # files not written yet

    def broken(**_: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(jobs, "finalize_experiment", broken)
    assert jobs.finalize_once(sessions=sqlite.sessions, clients=None, exp_id=exp_id)  # type: ignore[arg-type]
    assert not jobs.finalize_once(sessions=sqlite.sessions, clients=None, exp_id=exp_id)  # type: ignore[arg-type]
    with sqlite.sessions() as s:
        exp = s.get(Experiment, exp_id)
        assert exp is not None and exp.status == RunStatus.succeeded and exp.finalizations == 1
        assert "finalisation failed" in (exp.error or "") and "disk full" in (exp.error or "")
