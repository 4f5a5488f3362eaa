"""The science acceptance checks of an experiment's result CSVs (seed 001 §9.2–§9.3, §15):

- every scenario's ``<out>/<scenario>/<workload>.csv`` exists with non-empty ``T_peak_logic``, ``T_peak_dram``, ``ips``;
- no NaN or infinite value, no temperature below ambient;
- a served run's tokens balance (offered = served + queued + shed, window by window): the row's ``tokens_unbalanced``
  is 0; when it is not, `check_token_balance_columns` (shared/token_balance.py) over the run's series table names
  the windows that do not balance.

Whether a policy lowers the peak (the seed's ``T_peak_logic(tas|taps) < T_peak_logic(baseline)``) is a finding, not a
check: ``policy_findings`` reports each policy's peaks and throughput against baseline, and docs/results.md states
them, whatever they are (a check that a policy helps would turn a measured result into a pass/fail).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from shared.series_table import read_series_table, series_path
from shared.token_balance import check_token_balance_columns

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
        problems += [f"{sc}: {p}" for p in check_token_balance_of(out_dir, sc, workload, row)]
    return problems


def check_token_balance_of(out_dir: Path, scenario: str, workload: str, row: dict[str, str]) -> list[str]:
    """The token balance problems of a scenario's run: the result row's ``tokens_unbalanced`` (the sum over windows
    of each one's error) when it is not 0, with the windows of its series table (``<out>/<scenario>/<workload>
    .series.csv.gz``, when written) that do not balance. A row without the column (fixed arrival, or written before
    it existed) has nothing to balance."""
    unbalanced = (row.get("tokens_unbalanced") or "").strip()
    if unbalanced in ("", "0"):
        return []
    problems = [f"tokens_unbalanced = {unbalanced}: offered tokens != served + queued + shed"]
    path = series_path(out_dir, scenario, workload)
    if path.is_file():
        problems += [f"{path.name}: {p}" for p in check_token_balance_columns(read_series_table(path))]
    return problems


def policy_findings(out_dir: Path, *, workload: str,
                    scenarios: tuple[str, ...] = ("taps", "tacs", "tas")) -> list[str]:
    """Each policy's logic/DRAM peak and ips against baseline, one readable line per scenario."""
    rows = read_rows(out_dir, workload, ("baseline", *scenarios))
    base = rows.get("baseline")
    out: list[str] = []
    if base is None:
        return out
    for sc in scenarios:
        row = rows.get(sc)
        if row is None:
            continue
        try:
            d_logic = float(row["T_peak_logic"]) - float(base["T_peak_logic"])
            d_dram = float(row["T_peak_dram"]) - float(base["T_peak_dram"])
            ips, ips_b = float(row["ips"]), float(base["ips"])
        except (KeyError, ValueError):
            out.append(f"{sc}: not comparable with baseline")
            continue
        d_ips = f"{(ips / ips_b - 1) * 100:+.1f} %" if ips_b > 0 else f"{ips:g} vs {ips_b:g} tok/s"
        out.append(f"{sc}: logic peak {d_logic:+.2f} K, DRAM peak {d_dram:+.2f} K, ips {d_ips} vs baseline")
    return out
