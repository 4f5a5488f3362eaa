"""Embedded experiment hygiene (issue 20): an experiment another process left unfinished is listed as abandoned,
can be cancelled or cleaned up from the CLI, and the API server does not resume it unless told to."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from services.cli import main as cli_main
from services.orchestrator import repository as repo
from services.orchestrator.app import create_app
from services.orchestrator.db import open_database, upgrade
from services.orchestrator.models import RunStatus, ScenarioRun, utcnow
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.settings import OrchestratorSettings
from shared.client import ServiceClients
from tests.conftest import CONFIGS
from tests.orchestrator import fakes
from tests.orchestrator.test_window_loop import small_request


def _abandoned_experiment(tmp: Path) -> tuple[OrchestratorSettings, str]:
    """An experiment as an interrupted `tasmoe run` leaves it: one run 'running' with an expired lease (killed before
    its first window committed), one queued."""
    s = OrchestratorSettings(results_dir=tmp / "results", configs_dir=CONFIGS,
                             database_url=f"sqlite:///{tmp / 'db.sqlite3'}")
    engine, sessions = open_database(s.effective_database_url)
    upgrade(engine)
    spec = resolve_spec(small_request(scenarios=["baseline", "tas"], plots=False), configs_dir=CONFIGS)
    exp_id, _ = create_experiment(sessions=sessions, spec=spec, settings=s, out_dir=tmp / "out")
    with sessions.begin() as ses:
        ses.execute(sa.update(ScenarioRun).where(ScenarioRun.id == repo.run_id_for(exp_id, "baseline"))
                    .values(status=RunStatus.running, lease_owner="dead-host:1", next_window=0, n_windows=8,
                            lease_expires_at=utcnow() - timedelta(seconds=5)))
        repo.refresh_experiment_status(session=ses, exp_id=exp_id)
    engine.dispose()
    return s, exp_id


def _statuses(s: OrchestratorSettings, exp_id: str) -> dict[str, str]:
    engine, sessions = open_database(s.effective_database_url)
    try:
        with sessions() as ses:
            return {r.scenario: r.status.value for r in repo.runs_of(session=ses, exp_id=exp_id)}
    finally:
        engine.dispose()


def test_list_clean_and_cancel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s, exp_id = _abandoned_experiment(tmp_path)
    db = ["--db", s.effective_database_url]
    assert cli_main(["--log-level", "ERROR", "experiments", "list", *db]) == 0
    out = capsys.readouterr().out
    assert exp_id in out and "(abandoned)" in out and "baseline:running@0/8" in out
    assert cli_main(["--log-level", "ERROR", "experiments", "clean", "--dry-run", *db]) == 0
    assert f"{exp_id}: would cancel" in capsys.readouterr().out
    assert _statuses(s, exp_id) == {"baseline": "running", "tas": "queued"}
    assert cli_main(["--log-level", "ERROR", "experiments", "clean", *db]) == 0
    assert f"{exp_id}: cancelled" in capsys.readouterr().out
    assert _statuses(s, exp_id) == {"baseline": "cancelled", "tas": "cancelled"}
    assert cli_main(["--log-level", "ERROR", "experiments", "clean", *db]) == 0
    assert "0 abandoned" in capsys.readouterr().out
    assert cli_main(["--log-level", "ERROR", "experiments", "cancel", "exp-nope", *db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exp-nope" in err[0]


def test_cancel_one_experiment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s, exp_id = _abandoned_experiment(tmp_path)
    assert cli_main(["--log-level", "ERROR", "experiments", "cancel", exp_id, "--db", s.effective_database_url]) == 0
    assert "2 unfinished run(s) cancelled" in capsys.readouterr().out
    assert set(_statuses(s, exp_id).values()) == {"cancelled"}


@pytest.mark.parametrize("resume", [False, True])
def test_the_server_resumes_someone_elses_runs_only_when_told(tmp_path: Path, resume: bool,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    s, exp_id = _abandoned_experiment(tmp_path)
    s = s.model_copy(update={"resume_stale": resume})
    clients = ServiceClients(s, asgi_apps=fakes.build_apps(s))
    caplog.set_level(logging.WARNING, logger="services.orchestrator.runtime")
    try:
        with TestClient(create_app(s, clients=clients)) as api:
            verb = "resuming" if resume else "not resuming"
            assert any(verb in r.getMessage() and exp_id in r.getMessage() for r in caplog.records)
            if resume:
                t0 = time.monotonic()
                while (view := api.get(f"/v1/experiments/{exp_id}").json())["status"] in {"running", "queued"}:
                    assert time.monotonic() - t0 < 60, view
                    time.sleep(0.05)
                assert view["status"] == "succeeded", view
            else:
                time.sleep(0.5)  # a wrong rule would have submitted the runs at start-up already
                assert api.get(f"/v1/experiments/{exp_id}").json()["status"] == "running"
    finally:
        clients.close()
    if not resume:
        assert _statuses(s, exp_id) == {"baseline": "running", "tas": "queued"}


def test_prune_deletes_old_finished_experiments_and_keeps_their_files(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``tasmoe experiments prune --older-than DAYS`` deletes finished experiments last updated before then (their
    runs and placement job rows too) and leaves unfinished ones and every results folder; ``TASMOE_RETENTION_DAYS``
    does the same at the API server's start."""
    s, running = _abandoned_experiment(tmp_path)
    engine, sessions = open_database(s.effective_database_url)
    spec = resolve_spec(small_request(scenarios=["baseline"], plots=False), configs_dir=CONFIGS)
    old, _ = create_experiment(sessions=sessions, spec=spec, settings=s, out_dir=tmp_path / "old")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.csv").write_text("kept\n")
    with sessions.begin() as ses:
        repo.cancel_experiment(session=ses, exp_id=old)
        repo.add_job(session=ses, job_id=f"plc-{repo.run_id_for(old, 'baseline')}", kind="placement", payload={})
        ses.execute(sa.text("UPDATE experiments SET updated_at = :t WHERE id = :id"),
                    {"t": utcnow() - timedelta(days=40), "id": old})
    engine.dispose()
    db = ["--db", s.effective_database_url]
    assert cli_main(["--log-level", "ERROR", "experiments", "prune", "--older-than", "30", "--dry-run", *db]) == 0
    assert f"{old}: would delete" in capsys.readouterr().out
    assert cli_main(["--log-level", "ERROR", "experiments", "prune", "--older-than", "50", *db]) == 0
    assert "0 finished experiment(s)" in capsys.readouterr().out
    assert cli_main(["--log-level", "ERROR", "experiments", "prune", "--older-than", "30", *db]) == 0
    assert f"{old}: deleted" in capsys.readouterr().out
    engine, sessions = open_database(s.effective_database_url)
    with sessions() as ses:
        assert repo.get_experiment(session=ses, exp_id=old) is None
        assert repo.get_job(session=ses, job_id=f"plc-{repo.run_id_for(old, 'baseline')}") is None
        assert repo.get_experiment(session=ses, exp_id=running) is not None  # unfinished: never pruned
    engine.dispose()
    assert (tmp_path / "old" / "summary.csv").read_text() == "kept\n"
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error: exit 2, one line
        cli_main(["--log-level", "ERROR", "experiments", "prune", "--older-than", "x", *db])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("expected a number of days, got 'x'")
