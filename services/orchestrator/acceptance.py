"""The science acceptance checks of an experiment's result CSVs (seed 001 §9.2–§9.3, §15; issue 8):

- every scenario's ``<out>/<scenario>/<workload>.csv`` exists with non-empty ``T_peak_logic``, ``T_peak_dram``, ``ips``;
- no NaN or infinite value, no temperature below ambient;
- ``T_peak_logic(tas) < T_peak_logic(baseline)`` and ``T_peak_logic(taps) < T_peak_logic(baseline)``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

TEMPERATURE_COLUMNS = ("T_peak_logic", "T_peak_dram", "T_avg")
REQUIRED = ("T_peak_logic", "T_peak_dram", "ips")


def read_rows(out_dir: Path, workload: str, scenarios: tuple[str, ...]) -> dict[str, dict[str, str]]:
    rows: dict[str, dict[str, str]] = {}
    for sc in scenarios:
        path = out_dir / sc / f"{workload}.csv"
        if path.is_file():
            with path.open(encoding="utf-8", newline="") as fh:
                found = list(csv.DictReader(fh))
            if found:
                rows[sc] = found[0]
    return rows


def check_results(out_dir: Path, *, workload: str, ambient_c: float,
                  scenarios: tuple[str, ...] = ("baseline", "taps", "tacs", "tas")) -> list[str]:
    """The problems found (empty list: all checks pass)."""
    problems: list[str] = []
    rows = read_rows(out_dir, workload, scenarios)
    for sc in scenarios:
        row = rows.get(sc)
        if row is None:
            problems.append(f"{sc}: {out_dir / sc / (workload + '.csv')} missing or empty")
            continue
        for col in REQUIRED:
            if not (row.get(col) or "").strip():
                problems.append(f"{sc}: {col} is empty")
        for col, text in row.items():
            if col in {"scenario", "workload"} or text is None or not text.strip():
                continue
            try:
                value = float(text)
            except ValueError:
                continue
            if not math.isfinite(value):
                problems.append(f"{sc}: {col} = {text}")
            elif col in TEMPERATURE_COLUMNS and value < ambient_c:
                problems.append(f"{sc}: {col} = {value} °C is below ambient {ambient_c} °C")
    base = rows.get("baseline")
    for sc in ("tas", "taps"):
        if base is not None and sc in rows:
            try:
                if not float(rows[sc]["T_peak_logic"]) < float(base["T_peak_logic"]):
                    problems.append(f"T_peak_logic({sc}) = {rows[sc]['T_peak_logic']} is not below baseline's "
                                    f"{base['T_peak_logic']}")
            except (KeyError, ValueError):
                problems.append(f"{sc}: T_peak_logic not comparable with baseline")
    return problems
