"""Cross-field config checks at submission: an unknown model, arrivals the trace cannot give, Thot not above the
ambient, Thot not below Temg: one error naming the field, once, before anything is created (CLI exit 2 with one line;
HTTP 422)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.cli import main as cli_main
from services.orchestrator.schemas import ExperimentRequest
from services.orchestrator.service import resolve_spec
from shared.errors import BadInput
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator.conftest import SMALL_WL


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_cli_config_refuses_an_unknown_model_and_unordered_thresholds(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    wl = tmp_path / "wl.yaml"
    wl.write_text("model: mixtral-8x8b\n")
    _one_line_exit_2(capsys, ["config", "workload", str(wl)], "model: unknown model 'mixtral-8x8b'")
    wl.write_text("model: Mixtral_8x7B\n")  # names are normalised as the zoo does
    assert cli_main(["config", "workload", str(wl)]) == 0
    tas = tmp_path / "tas.yaml"
    for thot, temg in ((95, 90), (90, 90)):
        tas.write_text(f"tacs:\n  thresholds: {{Thot: {thot}, Temg: {temg}}}\n")
        _one_line_exit_2(capsys, ["config", "tas", str(tas)], "Temg must be > thresholds.Thot")


@pytest.mark.parametrize("thot", [-80.0, 45.0])
def test_thot_must_be_above_the_ambient(thot: float) -> None:
    req = ExperimentRequest(workload="workload_mixtral_8x7b.yaml", arch="arch_8x8_32x32x8.yaml",
                            tas={"tacs": {"thresholds": {"Thot": thot, "Temg": 90.0}}})
    with pytest.raises(BadInput) as ei:
        resolve_spec(req, configs_dir=CONFIGS)
    assert ei.value.field == "tas.tacs.thresholds.Thot" and "ambient" in ei.value.message
    ok = ExperimentRequest(workload="workload_mixtral_8x7b.yaml", tas={"tacs": {"thresholds": {"Thot": 45.5}}})
    assert resolve_spec(ok, configs_dir=CONFIGS).tas.tacs.thresholds.Thot == 45.5


def test_http_submission_refuses_before_creating_anything(api: TestClient) -> None:
    bad_model = {"workload": {**SMALL_WL, "model": "mixtral-8x8b"}}
    cold_thot = {"workload": SMALL_WL, "tas": {"tacs": {"thresholds": {"Thot": -80.0}}}}
    for body, field in ((bad_model, "workload.model"), (cold_thot, "tas.tacs.thresholds.Thot")):
        r = api.post("/v1/experiments", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] == field
    sweep = {"base": {"workload": SMALL_WL}, "grid": {"tas.tacs.thresholds.Thot": [60.0, 30.0]}}
    r = api.post("/v1/sweeps", json=sweep)
    assert r.status_code == 422 and r.json()["error"]["field"] == "tas.tacs.thresholds.Thot", r.text
    assert api.get("/v1/experiments").json()["total"] == 0


def test_tasmoe_run_refuses_an_unknown_model_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TASMOE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("TASMOE_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite3'}")
    wl = tmp_path / "wl.yaml"
    wl.write_text((CONFIGS / "workload_mixtral_8x7b.yaml").read_text().replace("mixtral-8x7b", "mixtral-8x8b"))
    _one_line_exit_2(capsys, ["--log-level", "ERROR", "run", "--workload", str(wl), "--windows", "2", "--quiet",
                              "--out", str(tmp_path / "o")], "workload.model: ")
    assert not (tmp_path / "o").exists()


def _serving(**serving: object) -> dict[str, object]:
    return {"model": "mixtral-8x7b", "serving": {"duration_ms": 1000.0, "rate_rps": 2.0, **serving}}


def test_http_submission_refuses_arrivals_the_trace_cannot_give(settings: Settings) -> None:
    """A serving workload whose trace cannot give its arrivals is a 422 naming the field at submission, an experiment
    or a sweep, and nothing is created (the workload service's own check, asked before anything exists)."""
    from services.orchestrator.app import create_app
    from services.workload.app import create_app as workload_app
    from shared.client import ServiceClients
    from tests.orchestrator import fakes

    clients = ServiceClients(settings, asgi_apps={**fakes.build_apps(settings), "workload": workload_app(settings)})
    with TestClient(create_app(settings, clients=clients)) as api:
        for serving, field in (({"start_s": 99_999.0}, "workload.serving.start_s"),
                               ({"trace": "no_such_trace"}, "workload.serving.trace"),
                               ({"rate_rps": 1e5}, "workload.serving.rate_rps")):
            r = api.post("/v1/experiments", json={"workload": _serving(**serving)})
            assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
        assert "azure_llm_inference_2023_conv" in api.post("/v1/experiments", json={"workload": _serving(
            trace="nope")}).json()["error"]["message"]  # the trace is named with the ones there are
        r = api.post("/v1/sweeps", json={"base": {"workload": _serving()},
                                          "grid": {"workload.serving.rate_rps": [2.0, 1e5]}})
        assert r.status_code == 422 and r.json()["error"]["field"] == "workload.serving.rate_rps", r.text
        assert r.json()["error"]["message"].startswith("grid point 1 (")
        assert api.get("/v1/experiments").json()["total"] == 0
    clients.close()


def test_tasmoe_run_refuses_arrivals_the_trace_cannot_give_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TASMOE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("TASMOE_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite3'}")
    wl = tmp_path / "wl.yaml"
    wl.write_text("model: mixtral-8x7b\nserving: {trace: my_trace, duration_ms: 1000.0}\n")
    _one_line_exit_2(capsys, ["--log-level", "ERROR", "run", "--workload", str(wl), "--quiet",
                              "--out", str(tmp_path / "o")], "serving.trace 'my_trace': no such arrival trace")
    assert not (tmp_path / "o").exists()


def test_a_control_window_the_trace_refuses_is_named_as_the_request_names_it(settings: Settings) -> None:
    from services.orchestrator.pipeline_clients import Pipeline
    from services.workload.app import create_app as workload_app
    from shared.client import ServiceClients
    from shared.configs import WorkloadConfig

    clients = ServiceClients(settings, asgi_apps={"workload": workload_app(settings)})
    wl = WorkloadConfig.model_validate(_serving(duration_ms=1e5))
    with pytest.raises(BadInput) as exc:  # 10^7 windows of 10 us: more than a trace may have
        Pipeline(clients).check_workload(wl, 0.01)
    assert exc.value.field == "tas.tacs.window_ms"
    Pipeline(clients).check_workload(wl, 3.0)
    clients.close()


def test_a_sweep_checks_each_model_once_and_each_trace_reading_workload_once(sqlite: Any,
                                                                             settings: Settings) -> None:
    from services.orchestrator.schemas import SweepRequest
    from services.orchestrator.service import create_sweep
    from shared.configs import WorkloadConfig

    seen: list[tuple[str, float]] = []

    def check(wl: WorkloadConfig, ms: float) -> None:
        seen.append((wl.canonical_json(), ms))

    fixed = SweepRequest.model_validate({"base": {"workload": SMALL_WL, "scenarios": ["baseline"]},
                                         "grid": {"workload.sequence.micro_batch": [2, 4, 8],
                                                  "arch.geometry.cooling.h_wmk2k": [5000.0, 10000.0]}})
    create_sweep(sessions=sqlite.sessions, req=fixed, settings=settings, check_workload=check)
    assert len(seen) == 1  # one model: a workload that reads no trace is checked for its model alone
    seen.clear()
    served = SweepRequest.model_validate({"base": {"workload": _serving(), "scenarios": ["baseline"]},
                                          "grid": {"workload.serving.rate_rps": [1.0, 2.0],
                                                   "arch.geometry.cooling.h_wmk2k": [5000.0, 10000.0]}})
    create_sweep(sessions=sqlite.sessions, req=served, settings=settings, check_workload=check)
    assert len(seen) == 2 and len(set(seen)) == 2  # each rate once, not once per cooling value


def test_a_workload_service_out_of_reach_skips_the_checks_once(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Cluster: with the workload service down, a submission is accepted unchecked (the run checks again when it
    starts), and a sweep stops asking after the first refused connection."""
    from services.orchestrator.app import create_app
    from tests.orchestrator.fakes import RecordingDispatcher

    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS, workload_url="http://127.0.0.1:9")
    disp = RecordingDispatcher()
    with TestClient(create_app(settings, dispatcher=disp)) as api, caplog.at_level("WARNING"):
        r = api.post("/v1/experiments", json={"workload": _serving(start_s=99_999.0), "scenarios": ["baseline"]})
        assert r.status_code == 202, r.text
        r = api.post("/v1/sweeps", json={"base": {"workload": _serving(), "scenarios": ["baseline"]},
                                          "grid": {"workload.serving.rate_rps": [1.0, 2.0, 3.0]}})
        assert r.status_code == 202, r.text
    assert len(disp.submitted) == 4
    assert sum("not checked at submission" in rec.getMessage() for rec in caplog.records) == 2
