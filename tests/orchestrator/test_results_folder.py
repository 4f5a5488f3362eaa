"""A results folder stands alone (issue 20): every run's per-window series is in it, and every figure is redrawn from
a copy of the folder (no database) to the same bytes; the heat map shows the window of the CSV's peak."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest

from services.cli import main as cli_main
from services.metrics.plots import KINDS, heatmap_frames
from services.metrics.series import load_plot_request
from services.orchestrator.local import run_local
from services.orchestrator.settings import OrchestratorSettings
from shared.errors import BadInput
from shared.series_table import read_series_table, series_path
from tests.conftest import CONFIGS

SCEN = ("baseline", "taps", "tacs", "tas")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("folder")
    # the real services (the power breakdown and the DRAM maps are theirs), on threads of this process
    settings = OrchestratorSettings(results_dir=tmp / "results", configs_dir=CONFIGS, pool="thread")
    res = run_local(arch=CONFIGS / "arch_8x8_32x32x8.yaml", workload=CONFIGS / "workload_mixtral_8x7b.yaml",
                    tas=CONFIGS / "tas_params.yaml", out=tmp / "out", windows=7, settings=settings,
                    database_url=f"sqlite:///{tmp / 'db.sqlite3'}")
    assert res.ok, res.errors
    # the copy a researcher takes home: no database, no run directories
    copy = tmp / "copy"
    shutil.copytree(tmp / "out", copy, ignore=shutil.ignore_patterns("runs"))
    (tmp / "db.sqlite3").unlink()
    return copy


def _row(folder: Path, scenario: str) -> dict[str, str]:
    with (folder / scenario / "mixtral-8x7b.csv").open() as f:
        return next(csv.DictReader(f))


def test_series_table_holds_every_window_and_agrees_with_the_row(folder: Path) -> None:
    for s in SCEN:
        t = read_series_table(series_path(folder, s, "mixtral-8x7b"))
        row = _row(folder, s)
        assert t["window"].tolist() == list(range(7))
        assert {f"T_core_{i}" for i in range(64)} <= t.keys()
        assert {"T_dram_0_max", "T_dram_7_mean", "power_dram_refresh_w", "power_die_logic_w"} <= t.keys()
        assert t["T_peak_logic"].max() == pytest.approx(float(row["T_peak_logic"]), abs=1e-4)
        assert t["T_peak_dram"].max() == pytest.approx(float(row["T_peak_dram"]), abs=1e-4)
        assert int(t["tokens_completed"].sum()) == int(row["tokens"])
        # energy (J) = sum of mean power (W) x window length (ms) / 1000
        assert float(t["power_w"] @ t["dt_ms"]) / 1e3 == pytest.approx(float(row["energy_j"]), rel=1e-5)
        comps = [k for k in t if k.startswith("power_") and not k.startswith("power_die_") and k != "power_w"]
        assert np.allclose(sum(t[k] for k in comps), t["power_w"], rtol=1e-5)
        cores = np.stack([t[f"T_core_{i}"] for i in range(64)])
        assert np.all(cores.max(axis=0) <= t["T_peak_logic"] + 1e-4)  # a core's mean never beats the hottest cell


@pytest.mark.parametrize("kind", KINDS)
def test_every_figure_is_redrawn_from_the_folder_alone(folder: Path, kind: str, tmp_path: Path) -> None:
    out = tmp_path / f"{kind}.png"
    assert cli_main(["plot", kind, "--results", str(folder), "--out", str(out)]) == 0
    assert out.read_bytes() == (folder / "plots" / f"{kind}.png").read_bytes()


def test_heatmap_shows_the_window_of_the_csv_peak(folder: Path) -> None:
    fr = heatmap_frames(load_plot_request(folder, None))
    for s in SCEN:
        row = _row(folder, s)
        assert fr.window[s].T_peak_logic == pytest.approx(float(row["T_peak_logic"]), abs=1e-6)
        assert fr.window_dram[s].T_peak_dram == pytest.approx(float(row["T_peak_dram"]), abs=1e-6)


def test_a_broken_series_table_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "x.series.csv.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(BadInput) as ei:
        read_series_table(bad)
    assert ei.value.field == "series"
