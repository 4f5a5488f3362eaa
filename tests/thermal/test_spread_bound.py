"""The best spread (services/thermal/spread_bound.py): a lower bound on the hottest core that no distribution of the
same movable power beats, that conserves the power it spreads and keeps every core and vault within what it can draw,
and the share of the work it holds under a temperature; ``tasmoe bound`` on a results folder."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from services.thermal.spread_bound import RunPower, _Chip, _spread, spread_bound
from shared.configs import ArchConfig
from shared.contracts.metrics import PowerReport, PowerStat
from tests.thermal.conftest import small_arch

RUN = RunPower(logic_dynamic_w=20.0, logic_leakage_w=3.0, dram_access_w=4.0, dram_static_w=0.5)


def _arch() -> ArchConfig:
    return small_arch()


def _fixed_point_peak(chip: _Chip, run: RunPower, p: np.ndarray, q: np.ndarray) -> float:
    """The hottest core of a given map of the movable power, its leakage at its own temperatures."""
    n = p.size
    s = np.full(n, run.dram_static_w / n)
    leak = np.zeros(n)
    for _ in range(60):
        leak = chip.leakage(chip.temps(p, leak, q, s))
    return float(chip.temps(p, leak, q, s).max())


def test_no_distribution_of_the_same_power_is_cooler_than_the_best_spread() -> None:
    arch = _arch()
    chip = _Chip.of(arch)
    b = spread_bound(arch, RUN, under_c=60.0)
    assert b.best.peak_c <= b.uniform.peak_c + 1e-9
    rng = np.random.default_rng(7)
    n = chip.H.shape[0]
    for _ in range(20):
        p = rng.dirichlet(np.ones(n)) * RUN.logic_dynamic_w
        q = rng.dirichlet(np.ones(n)) * RUN.dram_access_w
        if np.all(p <= chip.core_cap_w) and np.all(q <= chip.vault_cap_w):
            assert b.best.peak_c <= _fixed_point_peak(chip, RUN, p, q) + 1e-6


def test_the_best_spread_conserves_the_power_and_respects_the_caps() -> None:
    arch = _arch()
    chip = _Chip.of(arch)
    b = spread_bound(arch, RUN, under_c=60.0)
    assert b.best.core_dynamic_w.sum() == pytest.approx(RUN.logic_dynamic_w, rel=1e-9)
    assert b.best.vault_access_w.sum() == pytest.approx(RUN.dram_access_w, rel=1e-9)
    assert np.all(b.best.core_dynamic_w <= chip.core_cap_w * (1 + 1e-9))
    assert np.all(b.best.vault_access_w <= chip.vault_cap_w * (1 + 1e-9))
    # the leakage is the chip's own at the spread's temperatures
    assert np.allclose(b.best.core_leakage_w, chip.leakage(b.best.core_c), atol=2e-3)


def test_with_nothing_to_move_both_spreads_are_the_same_field() -> None:
    run = replace(RUN, logic_dynamic_w=0.0, dram_access_w=0.0)
    b = spread_bound(_arch(), run, under_c=60.0)
    assert b.best.peak_c == pytest.approx(b.uniform.peak_c, abs=1e-6)


def test_the_share_held_peaks_at_the_temperature_and_grows_with_it() -> None:
    arch = _arch()
    chip = _Chip.of(arch)
    b = spread_bound(arch, RUN, under_c=60.0)
    assert 0 < b.max_scale < np.inf
    held = _spread(chip, RUN, b.max_scale, best=True)
    assert held.peak_c == pytest.approx(60.0, abs=0.01)
    assert spread_bound(arch, RUN, under_c=70.0).max_scale > b.max_scale
    assert spread_bound(arch, RUN, under_c=40.0).max_scale == 0.0  # ambient is 45 degC: nothing holds 40
    assert spread_bound(arch, RUN, under_c=1000.0).max_scale == np.inf  # full load holds 1000 degC


def test_more_power_than_the_cores_draw_is_refused_naming_the_field() -> None:
    from shared.errors import BadInput

    chip = _Chip.of(_arch())
    with pytest.raises(BadInput) as exc:
        spread_bound(_arch(), replace(RUN, logic_dynamic_w=float(chip.core_cap_w.sum()) * 2), under_c=60.0)
    assert exc.value.field == "logic_dynamic_w"
    with pytest.raises(BadInput) as exc:
        spread_bound(_arch(), replace(RUN, dram_access_w=-1.0), under_c=60.0)
    assert exc.value.field == "dram_access_w"


def _results(tmp_path: Path, arch: ArchConfig) -> tuple[Path, Path]:
    means = {"logic_dynamic": 14.0, "spm": 4.0, "noc": 2.0, "logic_leakage": 3.0, "dram_access": 4.0,
             "dram_refresh": 0.2, "dram_leakage": 0.3}
    comps = {k: PowerStat(energy_j=v, mean_w=v, peak_w=v) for k, v in means.items()}
    comps["total"] = PowerStat(energy_j=27.5, mean_w=27.5, peak_w=27.5)
    report = PowerReport(interval_ms=(0.0, 1000.0), components=comps, layers={})
    (tmp_path / "res" / "unthrottled").mkdir(parents=True)
    (tmp_path / "res" / "unthrottled" / "w.power.json").write_text(report.model_dump_json(), encoding="utf-8")
    arch_file = tmp_path / "arch.json"
    arch_file.write_text(arch.model_dump_json(), encoding="utf-8")
    return tmp_path / "res", arch_file


def _tasmoe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=120)


def test_tasmoe_bound_writes_the_bound_of_a_results_folder(tmp_path: Path) -> None:
    arch = _arch()
    res, arch_file = _results(tmp_path, arch)
    done = _tasmoe("bound", "--arch", str(arch_file), "--results", str(res), "--under", "60")
    assert done.returncode == 0, done.stderr
    written = json.loads((res / "spread_bound.json").read_text(encoding="utf-8"))
    b = spread_bound(arch, RUN, under_c=60.0)  # the report's movable power is RUN's (14 + 4 + 2, 4)
    assert written["best_peak_c"] == pytest.approx(b.best.peak_c, abs=1e-3)
    assert written["max_share"] == pytest.approx(b.max_scale, rel=1e-5)
    assert "best spread" in done.stdout and "uniform spread" in done.stdout


@pytest.mark.parametrize(("args", "field"), [
    (["--scenario", "nope"], "--scenario"),
    (["--under", "hot"], "--under"),
    (["--results", "/nonexistent-results-folder"], "--results"),
])
def test_tasmoe_bound_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str], field: str) -> None:
    res, arch_file = _results(tmp_path, _arch())
    done = _tasmoe("bound", "--arch", str(arch_file), "--results", str(res), *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in done.stderr


def test_the_text_says_how_much_of_the_work_is_held() -> None:
    from services.thermal.spread_bound_files import bound_text

    base = {"scenario": "unthrottled", "logic_dynamic_w": 1.0, "dram_access_w": 1.0, "run_logic_leakage_w": 1.0,
            "dram_static_w": 1.0, "best_peak_c": 70.0, "uniform_peak_c": 72.0, "under_c": 80.0}
    assert "holds at 80.0 °C (steady): 94.9 % of it" in bound_text({**base, "max_share": 0.9486})
    assert "all of it, and up to 140.3 % of it" in bound_text({**base, "max_share": 1.403})
    assert "all of it, at any load" in bound_text({**base, "max_share": None})

