"""How much a placement could take off the peak: each scenario's mean power map against the same power spread evenly.

A placement moves power within a die: which core runs an expert, which bank holds its weights. It does not change
(much) how much power each die dissipates, nor the bursts of decode (one layer's experts at a time). This script
splits a scenario's peak into three parts, on the thermal service's own model (`services/thermal/`):

- the **even field**: the steady state of the scenario's mean power with each die's power spread evenly over it (the
  logic die's over its cores, each DRAM die's over its banks);
- the **pattern**: the steady state of the mean power map as the scenario dissipates it, minus the even field: what
  the unevenness of the mean map costs, and so (about) what any placement could take off the mean field;
- the **bursts**: the run's peak minus the mean map's steady peak: the windows' excursions above their mean, which a
  static placement can shape but not remove (decode works through the layers in series), and any drift of the run
  away from the warm-up's mean (its leakage was taken at the pass's own temperatures).

The mean power map is the warm-up pass's (the thermal service accumulates each core's and bank's energy over
``thermal.warmup_ms``, leakage and refresh at the pass's own temperatures; `services/thermal/service.py`,
``warm_state``): each scenario runs embedded for as many windows as its warm-up, and the script reads the map the
warm start is solved from. The even spread is a reference, not a bound: the minimum-peak map of a die is not even
(a die's edge and its centre cool differently), and a placement can move only the experts' share of the power.
Also reported: the field with only the logic die spread evenly, and with only the DRAM dies.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m scripts.headroom                          # default chip, ~3 min
    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m scripts.headroom --arch configs/arch_seed.yaml
    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m scripts.headroom --workload configs/workload_quick.yaml \\
        --warmup-ms 300 --scenarios baseline                                             # a quick check
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in {None, ""}:  # `python scripts/headroom.py` as well as `python -m scripts.headroom`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from services.orchestrator.local import run_local, with_warmup
from services.orchestrator.schemas import Scenario
from services.orchestrator.worker import compute_clients
from services.thermal import service as thermal
from services.thermal import solvers
from services.thermal.model import StackModel, get_model
from shared.configs import ArchConfig, load_arch, load_tas
from shared.contracts.thermal import ThermalState
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class MeanMap:
    """A warm-up pass's mean power (W): ``core_w`` (cores,), ``bank_w`` (DRAM dies, banks per die)."""

    core_w: np.ndarray
    bank_w: np.ndarray

    @classmethod
    def of_state(cls, model: StackModel, state: ThermalState) -> MeanMap:
        """``P̄ = E / t_warm`` per core and per bank from the warm-up's last state (``thermal.mean_power_map``, the
        map ``thermal.warm_state`` solves)."""
        core_w, bank_w = thermal.mean_power_map(model, state)
        return cls(core_w=core_w, bank_w=bank_w)

    def spread(self, *, logic: bool, dram: bool) -> MeanMap:
        """The same power with the logic die's (``logic``) and/or each DRAM die's (``dram``) spread evenly."""
        core = np.full_like(self.core_w, self.core_w.mean()) if logic else self.core_w
        bank = np.repeat(self.bank_w.mean(axis=1, keepdims=True), self.bank_w.shape[1], axis=1) if dram \
            else self.bank_w
        return MeanMap(core_w=core, bank_w=bank)


def steady_peaks(model: StackModel, m: MeanMap) -> tuple[float, float]:
    """(logic, DRAM) peak °C of the steady state of ``m``: the hottest cell of the logic die and of any DRAM die, as
    the metrics' ``T_peak_logic`` / ``T_peak_dram`` read a window's field."""
    T = solvers.steady(model.solver, model.node_power(m.core_w, m.bank_w))
    peak, _ = thermal.layer_stats(model, np.asarray(T, dtype=np.float64))
    logic = peak[model.layer_names[model.logic_layer]]
    dram = max(peak[model.layer_names[i]] for i in model.dram_layers)
    return logic, dram


@contextmanager
def captured_warm_states(into: list[tuple[ArchConfig, ThermalState]]) -> Iterator[None]:
    """Record the (arch, state) of every warm start the thermal service solves in this process."""
    original = thermal.warm_state

    def recording(arch: ArchConfig, state: ThermalState) -> ThermalState:
        into.append((arch, state))
        return original(arch, state)

    thermal.warm_state = recording  # warm_start_request looks it up at call time
    try:
        yield
    finally:
        thermal.warm_state = original


def _run_peaks(csv_path: Path) -> tuple[float, float]:
    """(T_peak_logic, T_peak_dram) °C of a run's result CSV."""
    with csv_path.open(encoding="utf-8") as fh:
        row = next(csv.DictReader(fh))
    return float(row["T_peak_logic"]), float(row["T_peak_dram"])


def measure(arch: Path, workload: Path, tas: Path, scenarios: Sequence[Scenario],
            warmup_ms: float | None) -> list[dict[str, Any]]:
    """One row per scenario: the run's peaks over as many windows as its warm-up, and the steady peaks of its mean
    power map as dissipated and spread evenly (logic die, DRAM dies, both)."""
    arch_cfg = load_arch(arch) if warmup_ms is None else with_warmup(load_arch(arch), warmup_ms)
    window_ms = load_tas(tas).tacs.window_ms  # the run's window (the orchestrator's, from the TAS parameters)
    n_warm = arch_cfg.thermal.warmup_windows(window_ms)
    if n_warm < 1:
        raise SystemExit("the arch config has no warm-up pass (thermal.warmup_ms 0): nothing to read the mean from")
    rows: list[dict[str, Any]] = []
    for scenario in scenarios:
        tmp = Path(tempfile.mkdtemp(prefix="tasmoe-headroom-"))
        seen: list[tuple[ArchConfig, ThermalState]] = []
        try:
            settings = Settings(results_dir=tmp / "results", configs_dir=REPO / "configs")
            with compute_clients(settings) as clients, captured_warm_states(seen):
                res = run_local(arch=arch, workload=workload, tas=tas, out=tmp / "out", scenarios=[scenario],
                                windows=n_warm, settings=settings, clients=clients, traces=False,
                                warmup_ms=warmup_ms, database_url=f"sqlite:///{tmp / 'db.sqlite3'}")
            if not res.ok:
                raise SystemExit(f"{scenario}: " + "; ".join(f"{k}: {v}" for k, v in res.errors.items()))
            if len(seen) != 1:
                raise SystemExit(f"{scenario}: {len(seen)} warm starts seen, expected 1")
            run_logic, run_dram = _run_peaks(res.csvs[scenario])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        warm_arch, state = seen[0]
        model = get_model(warm_arch)
        m = MeanMap.of_state(model, state)
        row: dict[str, Any] = {"scenario": scenario, "windows": n_warm, "run_logic": run_logic,
                               "run_dram": run_dram, "power_w": float(m.core_w.sum() + m.bank_w.sum())}
        for name, mm in (("mean", m), ("logic_even", m.spread(logic=True, dram=False)),
                         ("dram_even", m.spread(logic=False, dram=True)),
                         ("even", m.spread(logic=True, dram=True))):
            row[f"{name}_logic"], row[f"{name}_dram"] = steady_peaks(model, mm)
        rows.append(row)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of `measure` as a Markdown table (°C logic / DRAM; pattern and bursts in K)."""
    head = ("| scenario | run peak logic / DRAM °C | mean map, steady | logic die even | DRAM dies even | both even "
            "| pattern (mean − even) K | bursts (run − mean) K | power W |")
    out = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    def pair(r: dict[str, Any], k: str) -> str:
        """``k``'s logic / DRAM peaks of row ``r``."""
        return f"{r[k + '_logic']:.2f} / {r[k + '_dram']:.2f}"

    for r in rows:
        out.append(f"| {r['scenario']} | {r['run_logic']:.2f} / {r['run_dram']:.2f} | {pair(r, 'mean')} | "
                   f"{pair(r, 'logic_even')} | {pair(r, 'dram_even')} | {pair(r, 'even')} | "
                   f"{r['mean_logic'] - r['even_logic']:.2f} / {r['mean_dram'] - r['even_dram']:.2f} | "
                   f"{r['run_logic'] - r['mean_logic']:.2f} / {r['run_dram'] - r['mean_dram']:.2f} | "
                   f"{r['power_w']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--arch", type=Path, default=REPO / "configs/arch_8x8_32x32x8.yaml")
    ap.add_argument("--workload", type=Path, default=REPO / "configs/workload_mixtral_8x7b.yaml")
    ap.add_argument("--tas", type=Path, default=REPO / "configs/tas_params.yaml")
    ap.add_argument("--scenarios", nargs="+", default=["baseline", "taps"],
                    choices=["baseline", "taps", "tacs", "tas"])
    ap.add_argument("--warmup-ms", type=float, default=None, help="replace the arch config's thermal.warmup_ms")
    args = ap.parse_args(argv)
    rows = measure(args.arch, args.workload, args.tas, args.scenarios, args.warmup_ms)
    print(f"run peaks over the first {rows[0]['windows']} windows after the warm start; steady peaks of the "
          "warm-up's mean power map (°C, logic / DRAM)")
    print(table(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
