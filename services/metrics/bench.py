"""Metrics benchmarks (``make bench``): reducing a long run, comparing, rendering each plot. No goals are asserted."""

from __future__ import annotations

from services.metrics.compare import compare_all, compare_csv
from services.metrics.plots import KINDS, render_plot
from services.metrics.reduce import reduce_window_metrics, row_csv
from services.metrics.synthetic import synthetic_runs, synthetic_windows
from shared.bench import BenchRow, fmt_s, time_call
from shared.contracts.metrics import PlotRequest, WindowMetrics


def bench() -> list[BenchRow]:
    rows: list[BenchRow] = []
    for n in (100, 1000):
        ws = synthetic_windows(n, "tas", seed=1)

        def run(ws: list[WindowMetrics] = ws) -> str:
            return row_csv(reduce_window_metrics(ws, scenario="tas", workload="w", thot_c=80.0))

        med, _ = time_call(run, repeat=5, warmup=1)
        rows.append(BenchRow(f"reduce + CSV, {n} windows (64 cores, 8 DRAM layers, 112 links, 64 tokens/window)",
                             f"{fmt_s(med)} median of 5", note=f"{fmt_s(med / n)} per window"))
    runs = synthetic_runs(24, seed=1)
    results = [reduce_window_metrics(ws, scenario=s, workload="w", thot_c=80.0) for s, ws in runs.items()]
    med, _ = time_call(lambda: compare_csv(compare_all(results)), repeat=20)
    rows.append(BenchRow("compare, 4 scenarios (CSV)", f"{fmt_s(med)} median of 20"))
    req = PlotRequest(workload="w", rows=results, windows=runs, thot_c=80.0)
    for kind in KINDS:
        for fmt in ("png", "svg"):

            def draw(kind: str = kind, fmt: str = fmt) -> bytes:
                return render_plot(kind, req, fmt)

            med, _ = time_call(draw, repeat=3, warmup=1)
            rows.append(BenchRow(f"render {kind} {fmt}, 4 scenarios x 24 windows", f"{fmt_s(med)} median of 3"))
    return rows
