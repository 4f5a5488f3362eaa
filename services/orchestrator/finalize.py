"""After the last scenario of an experiment: ``summary.csv`` (the scenario rows under one header), the comparison
against baseline (``comparison.csv`` / ``comparison.md``), each run's per-window series (``<scenario>/<workload>
.series.csv.gz``, every window: shared/series_table.py; ``<scenario>/<workload>.windows.jsonl.gz``, the windows the
figures are drawn from, at most MAX_PLOT_WINDOWS merged ones: shared/window_series.py) and the plots
(``plots/<kind>.png``; drawn from a coarser copy of those windows where they would not fit one plot request).
``tasmoe plot KIND --results <out>`` redraws every figure from the folder alone. Best effort: a figure the metrics
service cannot draw is logged; the results stand."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator import window_store
from services.orchestrator.models import RunStatus
from services.orchestrator.pipeline_clients import Pipeline
from services.orchestrator.run_files import power_reports, run_dir_for
from services.orchestrator.schemas import ExperimentSpec
from services.orchestrator.service import results_csv
from shared.client import ServiceClients
from shared.errors import Conflict, TasmoeError
from shared.series_table import SeriesTableWriter, series_path
from shared.window_series import FIGURE_ARGS_FILE, WINDOWS_SUFFIX, coarsen, write_windows_jsonl

log = logging.getLogger(__name__)
T = TypeVar("T")

PLOT_KINDS = ("temperature", "performance", "heatmap", "power")
# windows per scenario in the figures' copy: ~15 kB of JSON each on the reference chip (64 cores, 64 x 8 vault
# temperatures, 224 links), four scenarios near 18 MB; a larger chip or more scenarios are merged further
# (fit_plot_windows) to stay inside TASMOE_MAX_BODY_MB
MAX_PLOT_WINDOWS = 300


def fit_plot_windows(windows: dict[str, list[dict[str, Any]]], budget_bytes: float,
                     ) -> dict[str, list[dict[str, Any]]]:
    """The figures' windows merged further (dt-weighted, as `coarsen` merges: merging merged windows is exact) until
    their JSON takes at most ``budget_bytes``: a window's size grows with the chip (vaults, DRAM dies, links) and a
    request's count with the scenarios, so MAX_PLOT_WINDOWS alone cannot keep a plot request under the body limit.
    Unchanged when it fits; a scenario keeps at least one window. Best effort: the request lists (latencies, finished
    requests) are concatenated, not merged, so where they alone exceed the budget the result stays over it (said in
    the log; the metrics service then refuses the figure, and the results stand)."""
    out = windows
    for _ in range(16):
        size = len(json.dumps(out, separators=(",", ":")))
        if size <= budget_bytes:
            return out
        if all(len(ws) <= 1 for ws in out.values()):
            break
        factor = math.ceil(size / budget_bytes)
        out = {sc: list(coarsen([ws], n_windows=len(ws), max_windows=max(1, len(ws) // factor)))
               for sc, ws in out.items()}
    log.warning("the figures' windows take %d bytes merged as far as they go, over the %d bytes of one plot request",
                len(json.dumps(out, separators=(",", ":"))), int(budget_bytes))
    return out


def warmup_ms(spec: ExperimentSpec, n_windows: int) -> float:
    """The warm-up the metrics exclude (ms): the warm-up pass's windows (arch thermal.init steady; at most the run's
    own ``n_windows``, as window_loop runs it) times the window."""
    window_ms = spec.tas.tacs.window_ms
    return min(spec.arch.thermal.warmup_windows(window_ms), n_windows) * window_ms


def _tap(chunks: Iterable[T], sink: Callable[[T], None]) -> Iterator[T]:
    """``chunks`` unchanged, each also handed to ``sink`` first."""
    for c in chunks:
        sink(c)
        yield c


class _NoBaseline(Exception):
    pass


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a finalisation file whole or not at all (a reader never sees half a file): a temporary file beside it,
    then an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if isinstance(data, str):
        tmp.write_text(data, encoding="utf-8")
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def finalize_experiment(*, sessions: sessionmaker[Session], clients: ServiceClients, exp_id: str,
                        plots: bool = True) -> Path | None:
    """Write the experiment's summary files (summary.csv, series, comparison, power table, plots); the summary's
    path, or None when there is nothing to write (no such experiment, or no scenario with results)."""
    with sessions() as s:
        exp = repo.get_experiment(session=s, exp_id=exp_id)
        if exp is None:
            return None
        spec = ExperimentSpec.model_validate(exp.configs)
        plots = plots and spec.plots
        out = Path(exp.out_dir)
        try:
            table = results_csv(session=s, exp_id=exp_id)
        except Conflict:  # no scenario has results (every run failed): nothing to summarise; each run has its error
            return None
        runs = [r for r in repo.runs_of(session=s, exp_id=exp_id) if r.status == RunStatus.succeeded]
        rows: list[dict[str, Any]] = [r.result_row for r in runs if r.result_row is not None]
        run_windows = {r.scenario: r.next_window for r in runs}
    out.mkdir(parents=True, exist_ok=True)
    label = spec.workload.label
    # one pass over each run's windows, read in chunks (a long run's windows never sit in memory or in one request
    # at once): every window into the series table, and the figures' copy merged to at most MAX_PLOT_WINDOWS windows
    # (shared/window_series.py)
    windows: dict[str, list[dict[str, Any]]] = {}
    for sc, n in run_windows.items():
        with SeriesTableWriter(series_path(out, sc, label)) as table_w:
            chunks = window_store.iter_chunks(run_dir_for(out, sc))
            windows[sc] = list(coarsen(_tap(chunks, table_w.add), n_windows=n, max_windows=MAX_PLOT_WINDOWS))
        write_windows_jsonl(out / sc / f"{label}{WINDOWS_SUFFIX}", windows[sc])
    warm_ms = warmup_ms(spec, max(run_windows.values(), default=0))
    figure_args = {"workload": label, "mesh": list(spec.arch.mesh.cores), "thot_c": spec.tas.tacs.thresholds.Thot,
                   "warmup_ms": warm_ms}
    summary = out / "summary.csv"
    atomic_write(summary, table)
    if not rows:
        return summary
    pipe = Pipeline(clients, run_key=exp_id)
    try:
        if not any(r.get("scenario") == "baseline" for r in rows):
            raise _NoBaseline
        cmp_csv, cmp_md = pipe.compare(rows)
        atomic_write(out / "comparison.csv", cmp_csv)
        atomic_write(out / "comparison.md", cmp_md)
    except _NoBaseline:
        pass  # deltas are against baseline: nothing to compare
    except TasmoeError as exc:
        log.warning("comparison for %s not written: %s", exp_id, exc)
    reports = power_reports(out, [str(r["scenario"]) for r in rows], spec.workload.label)
    if reports:
        try:
            atomic_write(out / "power.md", pipe.power_table(reports))
        except TasmoeError as exc:
            log.warning("power table for %s not written: %s", exp_id, exc)
    if not plots:
        return summary
    # half the body limit for the windows: the rows and the JSON's own overhead stay well inside the rest
    plot_windows = fit_plot_windows(windows, clients.settings.max_body_mb * 2**20 / 2)
    for kind in PLOT_KINDS:
        try:
            data = pipe.plot(kind, workload=label, rows=rows, windows=plot_windows, mesh=spec.arch.mesh.cores,
                             thot_c=spec.tas.tacs.thresholds.Thot, warmup_ms=warm_ms)
        except TasmoeError as exc:
            log.warning("plot %s for %s not drawn: %s", kind, exp_id, exc)
            continue
        atomic_write(out / "plots" / f"{kind}.png", data)
        # what `tasmoe plot` needs beside the folder's rows and windows to draw the same figure
        atomic_write(out / FIGURE_ARGS_FILE, json.dumps(figure_args, indent=2, sort_keys=True) + "\n")
    return summary
