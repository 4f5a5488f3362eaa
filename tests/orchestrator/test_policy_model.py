"""Science III: TAPS predicts per-core power with the simulator's own energy model. On the default
experiment cut to eight micro-batches (`tasmoe run --quick`'s configs, ``workload_quick.yaml``, with ``steps: 8``),
the placement's predicted mean power of each core's area of the logic die (``meta.predicted_core_power_w``:
leakage, its share of the non-expert work, its instances' MACs, scratchpad and DRAM-controller share) is within 10 %
of the simulated one (the run's ``P_core_<i>_w`` columns, time-weighted over its windows), core by core; and its
mean field's hottest core is the simulated mean field's hottest within 0.2 K. TAPS predicts the mean over many
micro-batches, so the simulated side needs more than two: with two, the routing of 64 tokens per layer decides a
core's MACs (per core −8.5..+11 %, mean |error| 2.5 %), with eight −2.6..+2.6 % (0.7 %). On it, and on two
micro-batches under other routing, taps is not hotter than baseline at the same throughput. The real services, in
process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from services.orchestrator.local import run_local
from services.orchestrator.worker import compute_clients
from shared.series_table import read_series_table
from shared.settings import Settings
from tests.conftest import CONFIGS, REPO

# the reference chip's quick workload (two micro-batches of its Mixtral experiment, a 300 ms warm-up: one arrival
# interval of a workload that repeats every 300 ms)
QUICK_WORKLOAD = "configs/workload_quick.yaml"
QUICK_WARMUP_MS = 300.0


def test_taps_predicts_the_simulated_per_core_power(tmp_path: Path) -> None:
    text = (REPO / QUICK_WORKLOAD).read_text(encoding="utf-8")
    assert "steps: 2," in text
    wl = tmp_path / "workload_8.yaml"
    wl.write_text(text.replace("steps: 2,", "steps: 8,"), encoding="utf-8")
    out = _baseline_and_taps(tmp_path, REPO / "configs/arch_8x8_32x32x8.yaml", wl)
    _not_hotter_at_the_same_throughput(out)
    table, meta, err = _predicted_power_error(out)
    assert len(err) == 64
    assert np.all(np.abs(err) <= 0.10), {int(i): round(float(err[i]), 3) for i in np.flatnonzero(np.abs(err) > 0.1)}
    assert abs(max(meta["predicted_core_temps_c"]) - _simulated_mean_field(table).max()) <= 0.2


def test_taps_is_not_hotter_than_baseline_under_other_routing(tmp_path: Path) -> None:
    """Science III's acceptance on a variant of the default experiment (two micro-batches, routing seed 3 and a Zipf
    skew of 1.5 instead of 42 and 1.2): taps is not hotter than baseline at the logic or the DRAM peak, and its
    throughput is within 1 % of baseline's. A bound, not the size of the benefit (the measured numbers:
    docs/results.md)."""
    text = (REPO / QUICK_WORKLOAD).read_text(encoding="utf-8")
    assert "seed: 42, zipf_s: 1.2" in text
    wl = tmp_path / "workload_variant.yaml"
    wl.write_text(text.replace("seed: 42, zipf_s: 1.2", "seed: 3, zipf_s: 1.5"), encoding="utf-8")
    out = _baseline_and_taps(tmp_path, REPO / "configs/arch_8x8_32x32x8.yaml", wl)
    _not_hotter_at_the_same_throughput(out)


def test_taps_is_not_hotter_than_baseline_under_replayed_routing(tmp_path: Path) -> None:
    """The same bound under recorded routing (``configs/workload_mixtral_8x7b_replay.yaml``, the shipped synthetic
    sample replayed, cut to two micro-batches): skew and expert reuse unlike Zipf's. TAPS before the slot model was
    0.63 K hotter than baseline here (measured on these two micro-batches)."""
    text = (REPO / "configs/workload_mixtral_8x7b_replay.yaml").read_text(encoding="utf-8")
    assert "steps: 100," in text
    wl = tmp_path / "workload_replay.yaml"
    wl.write_text(text.replace("steps: 100,", "steps: 2,"), encoding="utf-8")
    out = _baseline_and_taps(tmp_path, REPO / "configs/arch_8x8_32x32x8.yaml", wl)
    _not_hotter_at_the_same_throughput(out)


def _not_hotter_at_the_same_throughput(out: Path) -> None:
    """taps is not hotter than baseline at the logic or the DRAM peak, at ``ips`` within 1 % (summary.csv)."""
    import csv

    with (out / "summary.csv").open(encoding="utf-8") as f:
        rows = {r["scenario"]: r for r in csv.DictReader(f)}
    base, taps = rows["baseline"], rows["taps"]
    assert float(taps["T_peak_logic"]) <= float(base["T_peak_logic"]), (taps["T_peak_logic"], base["T_peak_logic"])
    assert float(taps["T_peak_dram"]) <= float(base["T_peak_dram"]), (taps["T_peak_dram"], base["T_peak_dram"])
    assert abs(float(taps["ips"]) / float(base["ips"]) - 1) <= 0.01


def test_on_the_seed_chip_taps_is_not_hotter_and_predicts_the_throttled_power(tmp_path: Path) -> None:
    """The seed's chip (``configs/arch_seed.yaml``: DRAM dies at 2 W/(m·K), every core throttled to 1.2 GHz at
    ~120 °C) cut to two micro-batches: taps is not hotter than baseline at the logic or the DRAM peak at the same
    throughput (with an expert's shards filled from the die next to the logic, it was 4.8 K hotter at the logic
    peak), and TAPS's predicted power of each core's area of the logic die is within 25 % of the simulated one
    (priced at V0 and 2.0 GHz it was +64..+110 %; now −12..+13 %, two micro-batches' routing included), and its
    mean field's hottest core within 5 K of the simulated one's (+1.5 K; with the instances' weight reads spread
    evenly over a vault's eight dies instead of the dies the bank book fills, +9.5 K: measured on this run)."""
    out = _baseline_and_taps(tmp_path, REPO / "configs/arch_seed.yaml", REPO / QUICK_WORKLOAD)
    _not_hotter_at_the_same_throughput(out)
    table, meta, err = _predicted_power_error(out)
    assert np.all(np.abs(err) <= 0.25), {int(i): round(float(err[i]), 3) for i in np.flatnonzero(np.abs(err) > 0.25)}
    assert abs(max(meta["predicted_core_temps_c"]) - _simulated_mean_field(table).max()) <= 5.0


def _baseline_and_taps(tmp_path: Path, arch: Path, workload: Path) -> Path:
    """Run baseline and taps of ``arch`` and ``workload`` (the default TAS parameters, a 300 ms warm-up) on the real
    services in process; the results folder."""
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    out = tmp_path / "out"
    with compute_clients(settings) as clients:
        res = run_local(arch=arch, workload=workload, tas=REPO / "configs/tas_params.yaml", out=out,
                        scenarios=["baseline", "taps"], settings=settings, clients=clients, traces=False,
                        warmup_ms=QUICK_WARMUP_MS, database_url=f"sqlite:///{tmp_path / 'runs.sqlite3'}")
    assert res.status == {"baseline": "succeeded", "taps": "succeeded"}, res.errors
    return out


def _simulated_mean_field(table: dict[str, Any]) -> np.ndarray:
    """(cores,) °C: each core's temperature time-weighted over the run's windows (its series table)."""
    t_cols = sorted((c for c in table if c.startswith("T_core_")), key=lambda c: int(c.split("_")[2]))
    dt = np.asarray(table["dt_ms"])
    return np.array([np.asarray(table[c]) @ dt / dt.sum() for c in t_cols])


def _predicted_power_error(out: Path) -> tuple[dict[str, Any], dict[str, Any], np.ndarray]:
    """(taps's series table, its placement's meta, predicted / simulated − 1 of each core's logic-die power,
    the simulated side time-weighted over the run's windows)."""
    table = read_series_table(next((out / "taps").glob("*.series.csv.gz")))
    cols = sorted((c for c in table if c.startswith("P_core_")), key=lambda c: int(c.split("_")[2]))
    dt = np.asarray(table["dt_ms"])
    sim = np.array([np.asarray(table[c]) @ dt / dt.sum() for c in cols])
    meta = json.loads((out / "runs" / "taps" / "mapping" / "placement.json").read_text())["meta"]
    return table, meta, np.asarray(meta["predicted_core_power_w"]) / sim - 1
