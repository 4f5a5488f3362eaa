"""The best-spread bound of a results folder (``tasmoe bound``): read a scenario's power report, compute
`services.thermal.spread_bound`, write it as ``spread_bound.json`` and as a few lines of text."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from services.thermal.spread_bound import RunPower, SpreadBound, spread_bound
from shared.configs import load_arch
from shared.contracts.metrics import PowerReport
from shared.errors import BadInput

BOUND_FILE = "spread_bound.json"


def power_report_of(results: Path, scenario: str) -> tuple[Path, PowerReport]:
    """The one power report of ``scenario`` in ``results`` (``<results>/<scenario>/<workload>.power.json``)."""
    if not results.is_dir():
        raise BadInput(f"--results: {results} is not a folder", field="results")
    folder = results / scenario
    if not folder.is_dir():
        raise BadInput(f"--scenario: {folder} is not a folder (no run of {scenario!r} in {results})",
                       field="scenario")
    found = sorted(folder.glob("*.power.json"))
    if len(found) != 1:
        raise BadInput(f"--results: {folder} holds {len(found)} power reports (*.power.json), need one",
                       field="results")
    try:
        return found[0], PowerReport.model_validate_json(found[0].read_bytes())
    except (OSError, ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise BadInput(f"--results: {found[0]} is not a power report: {first}", field="results") from None


def bound_of_results(results: Path, scenario: str, *, arch_path: Path, under_c: float | None) -> dict[str, Any]:
    """The bound of ``scenario``'s power in ``results`` on the chip of ``arch_path``, as the JSON object written."""
    path, report = power_report_of(results, scenario)
    run = RunPower.of_components({k: v.mean_w for k, v in report.components.items()})
    arch = load_arch(arch_path)
    return bound_json(spread_bound(arch, run, under_c=under_c), scenario=scenario, source=path.name,
                      arch=arch_path.as_posix())


def bound_json(b: SpreadBound, *, scenario: str, source: str, arch: str) -> dict[str, Any]:
    """The JSON form: inputs (W), the two spreads' hottest core (°C) and the share of the work held (None: all of
    it, whatever the load)."""
    return {
        "scenario": scenario, "power_report": source, "arch": arch,
        "logic_dynamic_w": round(b.run.logic_dynamic_w, 6), "dram_access_w": round(b.run.dram_access_w, 6),
        "run_logic_leakage_w": round(b.run.logic_leakage_w, 6), "dram_static_w": round(b.run.dram_static_w, 6),
        "best_peak_c": round(b.best.peak_c, 4), "best_logic_leakage_w": round(float(b.best.core_leakage_w.sum()), 6),
        "uniform_peak_c": round(b.uniform.peak_c, 4),
        "under_c": b.under_c,
        "max_share": None if math.isinf(b.max_scale) else round(b.max_scale, 6),
        "best_core_dynamic_w": [round(float(x), 6) for x in b.best.core_dynamic_w],
        "best_vault_access_w": [round(float(x), 6) for x in b.best.vault_access_w],
    }


def write_bound(path: Path, bound: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(bound, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"--out: cannot write {path}: {exc.strerror or exc}", field="out") from None


def bound_text(b: dict[str, Any]) -> str:
    """What ``tasmoe bound`` prints (and docs/results.md quotes)."""
    share = b["max_share"]
    held = ("all of it, at any load the cores and vaults can draw" if share is None
            else f"all of it, and up to {100 * share:.1f} % of it" if share >= 1 else f"{100 * share:.1f} % of it")
    return (f"{b['scenario']}'s movable power: logic dynamic {b['logic_dynamic_w']:.1f} W, DRAM access "
            f"{b['dram_access_w']:.1f} W (besides: logic leakage {b['run_logic_leakage_w']:.1f} W in the run, "
            f"DRAM refresh and leakage {b['dram_static_w']:.1f} W)\n"
            f"hottest core, steady: best spread {b['best_peak_c']:.1f} °C, uniform spread "
            f"{b['uniform_peak_c']:.1f} °C; to hold: {b['under_c']:.1f} °C\n"
            f"the most of this work any placement holds at {b['under_c']:.1f} °C (steady): {held}\n")


__all__ = ["BOUND_FILE", "bound_json", "bound_of_results", "bound_text", "power_report_of", "write_bound"]
