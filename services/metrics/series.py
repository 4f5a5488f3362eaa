"""Per-window series on disk: ``<results_dir>/<scenario>/<workload>.windows.jsonl.gz``, one `WindowMetrics` JSON per
line, gzip-compressed (an uncompressed ``.windows.jsonl`` is read too).

Written per window (appended), never one giant in-memory frame (ARCHITECTURE §6); read back by ``tasmoe plot`` for
the time series and heat maps. Lines are compact JSON with sorted keys, so the same windows give the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.metrics.compare import collect_result_rows
from shared import gz_text
from shared.contracts.metrics import SCENARIOS, PlotRequest, ResultRow, WindowMetrics
from shared.errors import BadInput, NotFound, first_validation_error
from shared.window_series import (
    FIGURE_ARGS_FILE,
    PLAIN_WINDOWS_SUFFIX,
    WINDOWS_SUFFIX,
    window_json_line,
)


def windows_path(results_dir: Path, scenario: str, workload: str) -> Path:
    """The scenario's window series: the compressed file, else an uncompressed one that exists (a folder written
    before the series were compressed)."""
    path = Path(results_dir) / scenario / f"{workload}{WINDOWS_SUFFIX}"
    plain = Path(results_dir) / scenario / f"{workload}{PLAIN_WINDOWS_SUFFIX}"
    return plain if not path.is_file() and plain.is_file() else path


def window_line(wm: WindowMetrics) -> str:
    return window_json_line(wm.model_dump(mode="json"))


def append_windows(path: Path, windows: Iterable[WindowMetrics]) -> Path:
    """Append windows to a ``.windows.jsonl[.gz]`` file (created with its folder when missing; a compressed file
    gets one gzip member more)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    gz_text.append(path, "".join(window_line(wm) for wm in windows))
    return path


def read_windows(path: Path) -> list[WindowMetrics]:
    """The windows of a ``.windows.jsonl[.gz]`` file; a bad line is an error naming the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"{path}: no such file", field="windows")
    try:
        text = gz_text.read_text(path)
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # gzip.BadGzipFile is an OSError
        raise BadInput(f"{path}: not a readable window series ({exc})", field="windows") from None
    out = []
    for k, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(WindowMetrics.model_validate_json(line))
        except ValidationError as exc:
            fld, msg = first_validation_error(exc)
            raise BadInput(f"{path} line {k}: {fld or 'line'}: {msg}", field=fld or "windows") from None
        except json.JSONDecodeError as exc:  # pragma: no cover - pydantic wraps JSON errors
            raise BadInput(f"{path} line {k}: {exc}", field="windows") from None
    return out


def workloads_in(results_dir: Path) -> list[str]:
    """Workload names with a result CSV or a window series under any scenario folder, sorted."""
    names: set[str] = set()
    for s in SCENARIOS:
        d = Path(results_dir) / s
        if d.is_dir():
            for suffix in (WINDOWS_SUFFIX, PLAIN_WINDOWS_SUFFIX):
                names.update(p.name[: -len(suffix)] for p in d.glob(f"*{suffix}"))
            names.update(p.stem for p in d.glob("*.csv"))
    return sorted(names)


def load_plot_inputs(results_dir: Path, workload: str | None) -> tuple[str, list[ResultRow],
                                                                          dict[str, list[WindowMetrics]]]:
    """(workload, result rows, windows per scenario) found under a results folder."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise NotFound(f"results: {results_dir} is not a directory", field="results")
    if workload is None:
        found = workloads_in(results_dir)
        if len(found) != 1:
            raise BadInput(f"workload: {'several' if found else 'no'} workloads under {results_dir} "
                           f"({', '.join(found) or 'none'}); choose one with --workload", field="workload")
        workload = found[0]
    windows = {s: read_windows(p) for s in SCENARIOS if (p := windows_path(results_dir, s, workload)).is_file()}
    try:
        rows = collect_result_rows(results_dir, workload=workload)
    except NotFound:
        rows = []
    if not rows and not windows:
        raise NotFound(f"results: nothing for workload {workload!r} under {results_dir}", field="results")
    return workload, rows, windows


class FigureArgs(BaseModel):
    """``plots/figure_args.json`` of a results folder (written by the orchestrator beside its figures)."""

    model_config = ConfigDict(extra="ignore")
    workload: str | None = None
    mesh: tuple[int, int] | None = None
    thot_c: float | None = Field(default=None, allow_inf_nan=False)
    warmup_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)


def figure_args(results_dir: Path, workload: str) -> FigureArgs:
    """The figure parameters saved in the folder for ``workload`` (none saved, or for another workload: empty)."""
    path = Path(results_dir) / FIGURE_ARGS_FILE
    if not path.is_file():
        return FigureArgs()
    try:
        args = FigureArgs.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as exc:
        fld, msg = first_validation_error(exc)
        raise BadInput(f"{path}: {fld or 'file'}: {msg}", field=fld or "figure_args") from None
    return args if args.workload in (None, workload) else FigureArgs()


def load_plot_request(results_dir: Path, workload: str | None, *, dram_layer: int | None = None,
                      thot_c: float | None = None) -> PlotRequest:
    """Everything a figure of the folder needs: its rows, its windows and the saved figure parameters; ``thot_c``
    overrides the saved Thot (default: the saved one, else the result CSV's)."""
    wl, rows, windows = load_plot_inputs(results_dir, workload)
    saved = figure_args(results_dir, wl)
    thot = thot_c if thot_c is not None else saved.thot_c if saved.thot_c is not None else (
        rows[0].thot_c if rows else None)
    return PlotRequest(workload=wl, rows=rows, windows=windows, dram_layer=dram_layer, mesh=saved.mesh,
                       thot_c=thot, warmup_ms=saved.warmup_ms)
