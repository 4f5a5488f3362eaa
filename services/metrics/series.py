"""Per-window series on disk: ``<results_dir>/<scenario>/<workload>.windows.jsonl``, one `WindowMetrics` JSON per line.

Written per window (appended), never one giant in-memory frame (ARCHITECTURE §6); read back by ``tasmoe plot`` for
the time series and heat maps. Lines are compact JSON with sorted keys, so the same windows give the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from services.metrics.compare import collect_result_rows
from shared.contracts.metrics import SCENARIOS, ResultRow, WindowMetrics
from shared.errors import BadInput, NotFound, first_validation_error


def windows_path(results_dir: Path, scenario: str, workload: str) -> Path:
    return Path(results_dir) / scenario / f"{workload}.windows.jsonl"


def window_line(wm: WindowMetrics) -> str:
    return json.dumps(wm.model_dump(mode="json"), sort_keys=True, separators=(",", ":")) + "\n"


def append_windows(path: Path, windows: Iterable[WindowMetrics]) -> Path:
    """Append windows to a ``.windows.jsonl`` file (created with its folder when missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for wm in windows:
            f.write(window_line(wm))
    return path


def read_windows(path: Path) -> list[WindowMetrics]:
    """The windows of a ``.windows.jsonl`` file; a bad line is an error naming the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"{path}: no such file", field="windows")
    out = []
    for k, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
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
            names.update(p.name[: -len(".windows.jsonl")] for p in d.glob("*.windows.jsonl"))
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
