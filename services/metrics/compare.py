"""Scenario comparison: the four-scenario table of one workload with deltas against baseline.

For each metric of `COMPARE_METRICS` and each scenario ``s``: the value, and its delta against ``baseline`` of the
same workload — in °C (``x_s − x_baseline``) for temperatures, in % (``100·(x_s − x_baseline)/x_baseline``) for the
other rates and times, and as a plain difference for counts that are zero in baseline by construction (migrations,
time above Thot). A % delta against a zero baseline is undefined: empty in the CSV, ``n/a`` in Markdown. A value
that is empty in the result row (the serving columns of a fixed-arrival run, or of a run given no SLO) is empty in
the CSV with an empty delta, ``n/a`` in Markdown; a metric empty in every scenario is left out of the Markdown.

Outputs: CSV (one line per scenario: values then ``<metric>_delta_c`` / ``_delta_pct`` / ``_delta`` columns) and a
Markdown table (one line per metric, one column per scenario, ``value (delta)`` cells). Values are taken at the
unified CSV's precision (9 significant digits), so rows in memory and rows read back from their CSVs compare
identically. Scenarios appear in the canonical order baseline, taps, tacs, tas, unthrottled; baseline is required,
the others optional.

With the ``unthrottled`` reference in the table, the Markdown also says what throttling costs and what each policy
recovers of it (`throttling`): loss = ``x_unthrottled − x_baseline`` of the served rate (`served_metric`:
``goodput_tok_s`` when both rows have it and one meets its SLO, else ``ips``), recovered = ``(x_s − x_baseline) /
loss``.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from services.metrics.reduce import format_value, read_result_csv
from shared.contracts.metrics import SCENARIOS, ResultRow
from shared.errors import BadInput, NotFound

log = logging.getLogger(__name__)

DeltaKind = Literal["c", "pct", "abs"]

# (column, unit shown in Markdown, delta kind)
COMPARE_METRICS: tuple[tuple[str, str, DeltaKind], ...] = (
    ("T_peak_logic", "°C", "c"),
    ("T_peak_dram", "°C", "c"),
    ("T_avg", "°C", "c"),
    ("ips", "tokens/s", "pct"),
    ("lat_ms", "ms", "pct"),
    ("lat_p99_ms", "ms", "pct"),
    ("bw_util", "fraction", "pct"),
    ("refresh_mhz", "MHz", "pct"),
    ("noc_load", "fraction", "pct"),
    ("energy_j", "J", "pct"),
    ("T_var_logic", "°C²", "pct"),
    ("migrations", "count", "abs"),
    ("time_above_thot_ms", "ms", "abs"),
    ("ttft_p99_ms", "ms", "pct"),
    ("tpot_p99_ms", "ms", "pct"),
    ("goodput_tok_s", "tokens/s", "pct"),
)
_SUFFIX = {"c": "_delta_c", "pct": "_delta_pct", "abs": "_delta"}


def delta_column(metric: str, kind: DeltaKind) -> str:
    return metric + _SUFFIX[kind]


COMPARE_CSV_COLUMNS: tuple[str, ...] = (
    "scenario", "workload", *(m for m, _, _ in COMPARE_METRICS),
    *(delta_column(m, k) for m, _, k in COMPARE_METRICS),
)


@dataclass(frozen=True)
class CompareTable:
    workload: str
    scenarios: tuple[str, ...]  # canonical order, baseline first
    values: dict[str, dict[str, float | None]]  # scenario -> metric -> value (None: empty in the row)
    deltas: dict[str, dict[str, float | None]]  # scenario -> metric -> delta (None: undefined)
    slo_met: dict[str, int | None]  # scenario -> the row's slo_met (not a row of the table: the served metric's)


def _delta(x: float | None, base: float | None, kind: DeltaKind) -> float | None:
    if x is None or base is None:
        return None
    if kind in ("c", "abs"):
        return x - base
    if base == 0.0:
        return 0.0 if x == 0.0 else None
    return 100.0 * (x - base) / base


def _value(v: float | None) -> float | None:
    """A row's value at the unified CSV's precision (None: empty in the row)."""
    return None if v is None else float(format_value(float(v)))


def compare(rows: Sequence[ResultRow], *, positions: Sequence[int] | None = None) -> CompareTable:
    """The comparison table of one workload (rows of several scenarios, baseline among them).

    ``positions``: the index of each row in the caller's list, used in error field paths (default 0, 1, ...)."""
    if not rows:
        raise BadInput("rows: need at least the baseline row", field="rows")
    pos = list(positions) if positions is not None else list(range(len(rows)))
    workload = rows[0].workload
    by_scn: dict[str, ResultRow] = {}
    for i, r in zip(pos, rows, strict=True):
        if r.scenario not in SCENARIOS:
            raise BadInput(f"rows[{i}].scenario: unknown scenario {r.scenario!r}; known: {', '.join(SCENARIOS)}",
                           field=f"rows[{i}].scenario")
        if r.workload != workload:
            raise BadInput(f"rows[{i}].workload: {r.workload!r} differs from rows[{pos[0]}] ({workload!r}); compare "
                           "one workload at a time", field=f"rows[{i}].workload")
        if r.scenario in by_scn:
            raise BadInput(f"rows[{i}].scenario: {r.scenario!r} appears twice for workload {workload!r}",
                           field=f"rows[{i}].scenario")
        by_scn[r.scenario] = r
    if "baseline" not in by_scn:
        raise BadInput(f"rows: no baseline row for workload {workload!r} (deltas are against baseline)", field="rows")
    order = tuple(s for s in SCENARIOS if s in by_scn)
    # values at CSV precision, so comparing in-memory rows and rows read back from their CSVs gives the same bytes
    values = {s: {m: _value(getattr(by_scn[s], m)) for m, _, _ in COMPARE_METRICS} for s in order}
    base = values["baseline"]
    deltas = {s: {m: _delta(values[s][m], base[m], k) for m, _, k in COMPARE_METRICS} for s in order}
    return CompareTable(workload=workload, scenarios=order, values=values, deltas=deltas,
                        slo_met={s: by_scn[s].slo_met for s in order})


# a throttling loss below this fraction of the unthrottled rate is within a run's own noise: nothing to recover
NO_LOSS_FRACTION = 0.005


@dataclass(frozen=True)
class Throttling:
    """What throttling costs in served tokens per second and what each policy recovers of it (fractions)."""

    metric: str  # goodput_tok_s or ips
    unthrottled: float
    baseline: float
    recovered: dict[str, float | None]  # policy -> (x - baseline) / loss; None: no loss to recover

    @property
    def loss(self) -> float:
        return self.unthrottled - self.baseline

    @property
    def loss_fraction(self) -> float:
        return self.loss / self.unthrottled if self.unthrottled else 0.0


ServedMetric = Literal["goodput_tok_s", "ips"]


def served_metric(values: Iterable[Mapping[str, float | None]]) -> ServedMetric:
    """The served rate a throttling loss is measured in: ``goodput_tok_s`` (output tokens/s within the SLO) when
    every one of ``values`` (``goodput_tok_s`` and ``slo_met`` of rows) has it and one of them meets the SLO
    (``slo_met`` 1, shared/slo.py), else ``ips``: a run given no SLO, or a fixed-arrival run, has no goodput, and
    runs that all miss their SLO (overloaded: their queue grows) are measured by what they serve, not by the few
    requests that happened to finish within the limits."""
    values = list(values)
    goodputs = [v.get("goodput_tok_s") for v in values]
    met = any(v.get("slo_met") in (1, 1.0, "1") for v in values)  # a row, or a row read back from its CSV
    return "goodput_tok_s" if all(g is not None for g in goodputs) and met else "ips"


def throttling(t: CompareTable, *, metric: ServedMetric | None = None) -> Throttling | None:
    """The throttling loss and recoveries of a table with the ``unthrottled`` reference (None without it).

    ``metric``: the served rate to measure them in; default `served_metric` of the unthrottled and baseline rows
    (a caller comparing several tables on one axis passes the metric it chose for all of them)."""
    if "unthrottled" not in t.scenarios:
        return None
    ref, base = t.values["unthrottled"], t.values["baseline"]
    metric = metric or served_metric({**t.values[s], "slo_met": t.slo_met.get(s)} for s in ("unthrottled", "baseline"))
    y, x = ref[metric], base[metric]
    if y is None or x is None:
        return None
    lossy = y - x > NO_LOSS_FRACTION * abs(y)
    recovered: dict[str, float | None] = {}
    for s in t.scenarios:
        v = t.values[s][metric]
        if s not in ("baseline", "unthrottled"):
            recovered[s] = (v - x) / (y - x) if lossy and v is not None else None
    return Throttling(metric=metric, unthrottled=y, baseline=x, recovered=recovered)


def _throttling_text(th: Throttling) -> str:
    unit = "tokens/s within the SLO" if th.metric == "goodput_tok_s" else "tokens/s"
    head = (f"Throttling ({th.metric}, {unit}): unthrottled {_num(th.unthrottled)}, baseline {_num(th.baseline)}: "
            f"DVFS and the DTM limit cost {_num(th.loss)} ({100 * th.loss_fraction:.1f} % of unthrottled).")
    if th.loss <= NO_LOSS_FRACTION * abs(th.unthrottled):
        return head + f" Below {100 * NO_LOSS_FRACTION:g} % of unthrottled: nothing to recover."
    if not th.recovered:
        return head
    parts = [f"{s} {100 * v:.0f} %" for s, v in th.recovered.items() if v is not None]
    return head + " Recovered of that loss: " + ", ".join(parts) + "."


def compare_all(rows: Sequence[ResultRow]) -> list[CompareTable]:
    """One table per workload (sorted by workload name)."""
    if not rows:
        raise BadInput("rows: need at least the baseline row", field="rows")
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.workload, []).append(i)
    return [compare([rows[i] for i in groups[wl]], positions=groups[wl]) for wl in sorted(groups)]


# --- rendering ------------------------------------------------------------------------------------------------------

def compare_csv(tables: Sequence[CompareTable]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COMPARE_CSV_COLUMNS)
    for t in tables:
        for s in t.scenarios:
            w.writerow([s, t.workload]
                       + [format_value(t.values[s][m]) for m, _, _ in COMPARE_METRICS]
                       + [format_value(t.deltas[s][m]) for m, _, _ in COMPARE_METRICS])
    return buf.getvalue()


def _num(x: float) -> str:
    """Readable number: 2 decimals around 1-100, fewer for large values, significant digits for small ones."""
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    if a >= 0.01:
        return f"{x:.4f}"
    return f"{x:.3g}"


def _delta_text(d: float | None, kind: DeltaKind, unit: str) -> str:
    if d is None:
        return "n/a"
    if kind == "c":
        return f"{d:+.2f} °C"
    if kind == "pct":
        return f"{d:+.1f} %"
    return f"{d:+g} {unit}" if unit != "count" else f"{d:+g}"


def compare_markdown(tables: Sequence[CompareTable]) -> str:
    parts = []
    for t in tables:
        lines = [f"### {t.workload}: scenarios vs baseline", "",
                 "Cells: value (delta vs baseline: °C for temperatures, plain difference for migrations and time above "
                 "Thot, % for the others).", "",
                 "| metric | unit | " + " | ".join(t.scenarios) + " |",
                 "|---|---|" + "---:|" * len(t.scenarios)]
        for m, unit, kind in COMPARE_METRICS:
            if all(t.values[s][m] is None for s in t.scenarios):
                continue
            cells = []
            for s in t.scenarios:
                x = t.values[s][m]
                v = "n/a" if x is None else f"{x:g}" if unit == "count" else _num(x)
                cells.append(v if s == "baseline" or x is None
                             else f"{v} ({_delta_text(t.deltas[s][m], kind, unit)})")
            lines.append(f"| {m} | {unit} | " + " | ".join(cells) + " |")
        th = throttling(t)
        if th is not None:
            lines += ["", _throttling_text(th)]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


# --- results directories --------------------------------------------------------------------------------------------

def collect_result_rows(results_dir: Path, *, workload: str | None = None,
                        scenarios: Sequence[str] | None = None) -> list[ResultRow]:
    """Rows of ``<results_dir>/<scenario>/<workload>.csv`` for the known scenarios (other folders — plots, traces,
    mapping — are not scenarios and are skipped). A file whose ``scenario``/``workload`` columns disagree with its
    path is an error."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise NotFound(f"results: {results_dir} is not a directory", field="results")
    wanted = tuple(scenarios) if scenarios else SCENARIOS
    for s in wanted:
        if s not in SCENARIOS:
            raise BadInput(f"scenarios: unknown scenario {s!r}; known: {', '.join(SCENARIOS)}", field="scenarios")
    rows: list[ResultRow] = []
    for s in wanted:
        d = results_dir / s
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.csv")):
            if workload is not None and path.stem != workload:
                continue
            for r in read_result_csv(path):
                if r.scenario != s:
                    raise BadInput(f"{path}: scenario column says {r.scenario!r} but the file is under {s}/",
                                   field="scenario")
                if r.workload != path.stem:
                    raise BadInput(f"{path}: workload column says {r.workload!r} but the file is {path.name}",
                                   field="workload")
                rows.append(r)
    if not rows:
        what = f"{workload}.csv" if workload else "<workload>.csv"
        raise NotFound(f"results: no {{{','.join(wanted)}}}/{what} under {results_dir}", field="results")
    return rows


def write_compare(tables: Sequence[CompareTable], out_dir: Path) -> tuple[Path, Path]:
    """Write ``comparison.csv`` and ``comparison.md`` into ``out_dir`` (the names the orchestrator gives them)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "comparison.csv", out_dir / "comparison.md"
    csv_path.write_bytes(compare_csv(tables).encode("utf-8"))
    md_path.write_bytes(compare_markdown(tables).encode("utf-8"))
    return csv_path, md_path
