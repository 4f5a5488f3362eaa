"""`tasmoe sweep`: every bad input is one line and exit 2 naming the field; a tiny sweep (2 points x 2 scenarios of
the fake services, three windows) run embedded and on an orchestrator app writes sweep.csv and the Pareto figure."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from services.cli import main as cli_main
from services.orchestrator import cli as orchestrator_cli
from services.orchestrator.settings import OrchestratorSettings
from services.orchestrator.sweep import (
    SweepOutcome,
    load_sweep_request,
    parse_set,
    run_sweep_local,
    run_sweep_remote,
    sweep_progress_printer,
)
from shared.client import ServiceClients
from shared.contracts.metrics import COOLING_KEY, LIMIT_KEY
from shared.settings import Settings
from tests.conftest import CONFIGS, REPO
from tests.metrics.test_plots import png_size
from tests.orchestrator import fakes
from tests.orchestrator.conftest import SMALL_WL

TINY: dict[str, Any] = {
    "name": "tiny",
    "base": {"arch": "arch_hbm_on_logic.yaml", "workload": SMALL_WL, "tas": "tas_params_hbm_on_logic.yaml",
             "scenarios": ["baseline", "unthrottled"], "windows": 3, "traces": False, "plots": False},
    "grid": {COOLING_KEY: [5000, 10000], LIMIT_KEY: [89]},
}
FAKES = "tests.orchestrator.fakes:build_apps"


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TASMOE_CONFIGS_DIR", str(CONFIGS))
    monkeypatch.setenv("TASMOE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("TASMOE_HTTP_RETRIES", "0")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tasmoe(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        rc = cli_main(argv)
    except SystemExit as exc:  # argparse's usage errors
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err.strip().splitlines()


def _file(tmp: Path, text: str, name: str = "sweep.yaml") -> str:
    (tmp / name).write_text(text, encoding="utf-8")
    return str(tmp / name)


SWEEP_FILE = str(REPO / "configs" / "sweep_cooling_limit.yaml")


@pytest.mark.parametrize(("argv", "says"), [
    (["missing.yaml"], "sweep file: missing.yaml: file not found"),
    (["{bad}"], "not YAML or JSON"),
    (["{list}"], "a mapping with base, grid and name"),
    (["{extra}"], "bogus: unknown key"),
    (["{nogrid}"], "grid: required"),
    ([SWEEP_FILE, "--set", "nokey"], "expected KEY=V1,V2"),
    ([SWEEP_FILE, "--set", f"{COOLING_KEY}="], "expected KEY=V1,V2"),
    ([SWEEP_FILE, "--points", f"{COOLING_KEY}=5000,,6000"], "an empty value"),
    ([SWEEP_FILE, "--duration-ms", "-5"], "--duration-ms: must be > 0"),
    ([SWEEP_FILE, "--warmup-ms", "x"], "--warmup-ms: expected a number"),
    ([SWEEP_FILE, "--scenarios", "fast"], "--scenarios: invalid choice"),
    ([SWEEP_FILE, "--poll-s", "0"], "--poll-s: must be > 0"),
    ([SWEEP_FILE, "--attach", "swp-1"], "--attach: follows a sweep on a running orchestrator"),
    ([SWEEP_FILE, "--set", "arch.package.h_wmk2k=5000,10000"], "grid: 'arch.package.h_wmk2k': 'package' is not"),
    ([SWEEP_FILE, "--set", f"{LIMIT_KEY}=hot"], "arch.dtm.limit_c: Input should be a valid number"),
    ([SWEEP_FILE, "--set", f"{COOLING_KEY}=0"], "h_wmk2k"),
    ([SWEEP_FILE, "--set", f"{COOLING_KEY}=5000", "--set", f"{COOLING_KEY}=6000"], "given twice"),
    ([SWEEP_FILE, "--set", "workload.serving.duration_ms=100", "--set", "tas.tacs.thresholds.Thot=20"],
     "tas.tacs.thresholds.Thot"),
    ([SWEEP_FILE, "--url", "http://127.0.0.1:9"], "orchestrator: unreachable"),
])
def test_bad_input_is_one_line_exit_2(argv: list[str], says: str, env: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    files = {"{bad}": "grid: [1, 2\n", "{list}": "- 1\n- 2\n",
             "{extra}": yaml.safe_dump({**TINY, "bogus": 1}), "{nogrid}": yaml.safe_dump({"base": TINY["base"]})}
    argv = [_file(env, files[a], f"{a.strip('{}')}.yaml") if a in files else a for a in argv]
    rc, err = _tasmoe(["sweep", *argv, "--out", str(env / "out")], capsys)
    assert rc == 2 and len(err) == 1, err
    assert says in err[0], err[0]
    assert not (env / "out").exists()  # nothing written, nothing started


def test_parse_set_reads_numbers() -> None:
    assert parse_set(f"{COOLING_KEY}=5000, 1e4") == (COOLING_KEY, [5000, 10000.0])
    assert parse_set("base.name=a,b") == ("base.name", ["a", "b"])


def test_overrides_reach_the_grid(tmp_path: Path) -> None:
    req = load_sweep_request(_file(tmp_path, yaml.safe_dump(TINY)), grid={LIMIT_KEY: [85, 95]}, duration_ms=500,
                             warmup_ms=0, scenarios=["tas"])
    assert req.grid == {COOLING_KEY: [5000, 10000], LIMIT_KEY: [85, 95], "workload.serving.duration_ms": [500],
                        "arch.thermal.warmup_ms": [0]}
    assert req.base.scenarios == ["tas"]
    default = load_sweep_request(SWEEP_FILE)
    assert set(default.grid) == {COOLING_KEY, LIMIT_KEY} and len(default.base.scenarios) == 5


def test_progress_lines_are_few(capsys: pytest.CaptureFixture[str]) -> None:
    now = [0.0]
    show = sweep_progress_printer(every_s=60.0, clock=lambda: now[0])
    lines = ["sweep s: running; 0 of 4 runs succeeded (0 of 2 points with results); running (...): 000 tas 1/9; 0.0 "
             "min", "sweep s: running; 0 of 4 runs succeeded (0 of 2 points with results); running (...): 000 tas 5/9; "
             "0.1 min", "sweep s: running; 1 of 4 runs succeeded (1 of 2 points with results); 0.1 min"]
    for line in lines:
        show(line)
        now[0] += 1.0
    now[0] += 60.0
    show(lines[2])  # nothing new, but a minute passed
    err = capsys.readouterr().err.splitlines()
    assert err == [lines[0], lines[2], lines[2]]


def _check_outputs(res: SweepOutcome, out: Path) -> list[dict[str, str]]:
    assert res.status == "succeeded" and res.runs == 4 and res.table_rows == 4
    assert [p.name for p in res.files] == ["sweep.csv", "sweep.json", "pareto.svg", "pareto.png"]
    with (out / "sweep.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4
    assert {(r[f"param:{COOLING_KEY}"], r["scenario"]) for r in rows} == {
        (h, s) for h in ("5000", "10000") for s in ("baseline", "unthrottled")}
    assert all(r[f"param:{LIMIT_KEY}"] == "89" and float(r["ips"]) > 0 for r in rows)
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["id"] == res.sweep_id and meta["status"] == "succeeded" and len(meta["points"]) == 2
    assert png_size((out / "pareto.png").read_bytes()) == (1900, 600)
    assert (out / "pareto.svg").read_bytes().lstrip().startswith(b"<?xml")
    return rows


def test_embedded_sweep_writes_the_table_and_the_figure(tmp_path: Path) -> None:
    s = OrchestratorSettings(results_dir=tmp_path / "results", configs_dir=CONFIGS, pool="thread")
    clients = ServiceClients(s, asgi_apps=fakes.build_apps(s))
    try:
        req = load_sweep_request(_file(tmp_path, yaml.safe_dump(TINY)))
        res = run_sweep_local(req, out=tmp_path / "out", settings=s, clients=clients,
                              database_url=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    finally:
        clients.close()
    _check_outputs(res, tmp_path / "out")
    # each point's experiment folder, as create_sweep lays them out under the sweep's
    assert (tmp_path / "out" / "p000" / "summary.csv").is_file() and (tmp_path / "out" / "p001").is_dir()


def test_the_command_embedded(env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`tasmoe sweep FILE --set ...` embedded: the overrides reach the sweep, the files and one summary line."""
    s = OrchestratorSettings(results_dir=env / "results", configs_dir=CONFIGS, pool="thread")
    clients = ServiceClients(s, asgi_apps=fakes.build_apps(s))
    real = run_sweep_local

    def on_fakes(req: Any, **kw: Any) -> SweepOutcome:
        return real(req, **{**kw, "settings": s, "clients": clients,
                            "database_url": f"sqlite:///{env / 'db.sqlite3'}"})

    monkeypatch.setattr(orchestrator_cli, "run_sweep_local", on_fakes)
    try:
        rc = cli_main(["sweep", _file(env, yaml.safe_dump(TINY)), "--set", f"{COOLING_KEY}=5000,10000",
                       "--out", str(env / "out"), "--quiet"])
    finally:
        clients.close()
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(out) == 1 and out[0].startswith("sweep swp-") and "succeeded, 4 of 4 runs" in out[0]
    _check_outputs(SweepOutcome(out[0].split()[1].rstrip(":"), "succeeded", 4, env / "out",
                                [env / "out" / n for n in ("sweep.csv", "sweep.json", "pareto.svg", "pareto.png")],
                                4), env / "out")


def test_on_an_orchestrator(api: TestClient, settings: Settings, tmp_path: Path) -> None:
    """The --url path against the orchestrator's app (runs on its embedded pool over the fake services): posted
    once, polled to the end; --attach redraws the same table."""
    req = load_sweep_request(_file(tmp_path, yaml.safe_dump(TINY)))
    res = run_sweep_remote(req, url="http://orchestrator", out=tmp_path / "out", settings=settings, poll_s=0.05,
                           apps=FAKES, app=api.app)
    rows = _check_outputs(res, tmp_path / "out")
    assert len(api.get(f"/v1/sweeps/{res.sweep_id}").json()["table"]) == len(rows)
    again = run_sweep_remote(None, url="http://orchestrator", out=tmp_path / "again", settings=settings,
                             attach=res.sweep_id, apps=FAKES, app=api.app)
    assert again.status == "succeeded" and again.runs == 4
    assert (tmp_path / "again" / "sweep.csv").read_bytes() == (tmp_path / "out" / "sweep.csv").read_bytes()
