"""The files a scenario run writes (ARCHITECTURE §6, seed §3), appended epoch by epoch, window by window.

Layout under the experiment's output directory ``<out>``::

    <out>/<scenario>/<workload>.csv                       unified result row (seed §3.6), written at the end
    <out>/traces/logical_compute.csv.gz                   the experiment's logical trace (seed §3.1 columns, then
    <out>/traces/logical_memory.csv.gz                    `layer,tokens`): one copy, written by its first scenario
    <out>/runs/<scenario>/run.log                          seed, config snapshot, versions, git revision, progress
    <out>/runs/<scenario>/mapping/placement.json
    <out>/runs/<scenario>/runtime/overlay_reroute.csv, overlay_migrate.csv
    <out>/runs/<scenario>/runtime/replica_state.json       the replica state after the newest committed window
    <out>/runs/<scenario>/windows.jsonl.gz, windows.idx     every window's metrics and their index (window_store)
    <out>/runs/<scenario>/traces/physical/compute_events.csv.gz, memory_events.csv.gz   only with ``events``

The logical trace is the same for every scenario (seed §3.1: scenario-agnostic; the runs read the same windows of one
workload trace), so one copy per experiment: four were 84 % of what a run wrote. The physical events of the default
experiment are ~85 kB of CSV per window and scenario (3.4 GB per experiment; gzip: ~400 MB), so they are written on
request (``events``). The trace files are gzip-compressed CSV with a header (``pandas.read_csv(path)``, ``zcat``):
each window appends its rows as one gzip member (a file of several members is one valid gzip stream; ``mtime`` 0,
so the same rows give the same bytes), whatever the epoch it was computed in.

Crash safety: each epoch appends its windows' rows *before* the epoch commits, and the file sizes after the append
are saved in the frontier state. A resumed run first truncates every appended file to the sizes saved at the
frontier (a member boundary), which drops the rows of an epoch that was written but never committed, so the files
end up byte-identical to an uninterrupted run's.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.orchestrator import window_store
from shared import gz_text
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.ids import expert_id
from shared.contracts.metrics import SCENARIOS
from shared.contracts.placement import OverlayMigrate, OverlayReroute, Placement, ReplicaState

LOGICAL_COMPUTE_COLUMNS = ("event_id", "t_gen_ns", "mb_id", "token_id", "experts_json", "flops_json", "op_type",
                           "layer", "tokens")

Columns = dict[str, list[Any]]

# the appended files, by path under <out> (logical trace) or under <out>/runs/<scenario> (the rest)
LOGICAL_FILES: dict[str, tuple[str, ...]] = {
    "traces/logical_compute.csv.gz": LOGICAL_COMPUTE_COLUMNS,
    "traces/logical_memory.csv.gz": ("event_id", "tensor_id", "access", "bytes", "locality_hint"),
}
OVERLAY_FILES: dict[str, tuple[str, ...]] = {
    "runtime/overlay_reroute.csv": tuple(OverlayReroute.columns()),
    "runtime/overlay_migrate.csv": tuple(OverlayMigrate.columns()),
}
EVENT_FILES: dict[str, tuple[str, ...]] = {
    "traces/physical/compute_events.csv.gz": tuple(ComputeEvents.columns()),
    "traces/physical/memory_events.csv.gz": tuple(MemoryEvents.columns()),
}


def _csv_text(rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


class RunFiles:
    """Appends one run's per-window files; `sizes()` / `truncate_to()` implement the crash-safe resume.

    ``traces``: the logical trace (when ``logical``: this run is the experiment's first scenario, the one that writes
    it) and the overlays; ``events``: the physical event files."""

    def __init__(self, out_dir: Path, scenario: str, *, traces: bool = True, events: bool = False,
                 logical: bool = True) -> None:
        self.out_dir = out_dir
        self.run_dir = run_dir_for(out_dir, scenario)
        self.traces = traces
        self.events = events
        self.logical = traces and logical
        run_rel = self.run_dir.relative_to(out_dir).as_posix()
        self._files: dict[str, tuple[Path, tuple[str, ...]]] = {}
        if self.logical:
            self._files.update({rel: (out_dir / rel, cols) for rel, cols in LOGICAL_FILES.items()})
        if traces:
            self._files.update({f"{run_rel}/{rel}": (self.run_dir / rel, cols) for rel, cols in OVERLAY_FILES.items()})
        if events:
            self._files.update({f"{run_rel}/{rel}": (self.run_dir / rel, cols) for rel, cols in EVENT_FILES.items()})
        for rel in (window_store.WINDOWS_FILE, window_store.INDEX_FILE):  # the series: always, no header
            self._files[f"{run_rel}/{rel}"] = (self.run_dir / rel, ())
        self._sizes: dict[str, int] = {}  # what this object wrote or truncated to: no stat per window

    def path(self, rel: str) -> Path:
        return self.run_dir / rel

    def appended(self) -> dict[str, tuple[Path, tuple[str, ...]]]:
        """The files this run appends to: path under ``<out>`` -> (path, header)."""
        return dict(self._files)

    def start_fresh(self) -> None:
        """Window 0: (re)create every appended file with its header only."""
        for rel, (p, cols) in self._files.items():
            p.parent.mkdir(parents=True, exist_ok=True)
            header = gz_text.encode(p, _csv_text([cols])) if cols else b""
            p.write_bytes(header)
            self._sizes[rel] = len(header)

    def sizes(self) -> dict[str, int]:
        """Every appended file's size in bytes: as this object last wrote or truncated it (a file it has not
        touched yet: read from the file system)."""
        return {rel: self._sizes[rel] if rel in self._sizes else p.stat().st_size
                for rel, (p, _) in self._files.items()}

    def truncate_to(self, sizes: dict[str, int]) -> None:
        """Resume: cut every appended file back to its size at the frontier (a missing file is an error)."""
        for rel, (p, _) in self._files.items():
            size = sizes.get(rel)
            if size is None or not p.exists() or p.stat().st_size < size:
                raise RuntimeError(f"{p}: cannot resume, file missing or shorter than at the frontier "
                                   f"({size} bytes)")
            with open(p, "r+b") as fh:
                fh.truncate(size)
            self._sizes[rel] = size

    def write_placement(self, placement: Placement) -> None:
        p = self.path(PLACEMENT_FILE)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(_dump_json(placement.model_dump(mode="json", exclude_none=True)), encoding="utf-8")

    def write_replica_state(self, state: ReplicaState | dict[str, Any]) -> None:
        if isinstance(state, dict):
            state = ReplicaState.model_validate(state)
        p = self.path("runtime/replica_state.json")
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(_dump_json(state.to_json_obj()), encoding="utf-8")
        os.replace(tmp, p)

    def append_windows(self, windows: Sequence[WindowRows]) -> None:
        """Append an epoch's windows to the files this run writes: per window and file, one gzip member of its rows
        (the bytes window-by-window appends would give), written once per file; each window's metrics line and its
        offset to the window store."""
        run_rel = self.run_dir.relative_to(self.out_dir).as_posix()
        store = f"{run_rel}/{window_store.WINDOWS_FILE}"
        index = f"{run_rel}/{window_store.INDEX_FILE}"
        out: dict[str, list[bytes]] = {}
        store_at = self.sizes()[store]
        for w in windows:
            for key, text in self._texts(w, run_rel).items():
                if text:
                    out.setdefault(key, []).append(gz_text.encode(self._files[key][0], text))
            data = window_store.member(w.metrics_line)
            out.setdefault(index, []).append(window_store.offset_entry(store_at))
            out.setdefault(store, []).append(data)
            store_at += len(data)
        for key, parts in out.items():
            with open(self._files[key][0], "ab") as fh:
                fh.write(b"".join(parts))
                self._sizes[key] = fh.tell()

    def _texts(self, w: WindowRows, run_rel: str) -> dict[str, str]:
        """One window's CSV rows per trace file (no header)."""
        parts: dict[str, str] = {}
        if self.logical:
            parts["traces/logical_compute.csv.gz"] = _csv_text(_logical_compute_rows(w.logical_compute))
            rel = "traces/logical_memory.csv.gz"
            parts[rel] = _table(w.logical_memory, LOGICAL_FILES[rel])
        if self.traces:
            for kind in ("reroute", "migrate"):
                rel = f"runtime/overlay_{kind}.csv"
                parts[f"{run_rel}/{rel}"] = _table(w.overlays[kind], OVERLAY_FILES[rel])
        if self.events:
            for rel, batch in zip(EVENT_FILES, (w.compute, w.memory), strict=True):
                parts[f"{run_rel}/{rel}"] = _table(batch or {c: [] for c in EVENT_FILES[rel]}, EVENT_FILES[rel])
        return parts


@dataclass(frozen=True)
class WindowRows:
    """What one committed window appends: its logical rows, the overlays applied at it, its physical events (with
    ``events``; every argument a columnar batch as JSON, one list per field) and its metrics as one JSON line."""

    logical_compute: Columns
    logical_memory: Columns
    overlays: dict[str, Columns]
    compute: Columns | None
    memory: Columns | None
    metrics_line: bytes


def _logical_compute_rows(lc: Columns) -> Iterable[Sequence[Any]]:
    # experts_json / flops_json are one-element JSON arrays; formatted directly (json.dumps per row is slow)
    return ((eid, t, mb, "", f'["{expert_id(layer, e)}"]' if e >= 0 else "[]", f"[{float(fl)!r}]", op, layer, tok)
            for eid, t, mb, layer, op, e, tok, fl in zip(lc["event_id"], lc["t_gen_ns"], lc["mb_id"], lc["layer"],
                                                         lc["op_type"], lc["expert"], lc["tokens"], lc["flops"],
                                                         strict=True))


def _rows(cols: Columns, order: tuple[str, ...]) -> Iterable[Sequence[Any]]:
    return zip(*(cols[c] for c in order), strict=True)


def _table(cols: Columns, order: tuple[str, ...]) -> str:
    """The CSV rows (no header) of one columnar batch, in the column order ``order`` of its file."""
    return _csv_text(_rows(cols, order))


def result_csv_path(out_dir: Path, scenario: str, workload_label: str) -> Path:
    return out_dir / scenario / f"{workload_label}.csv"


def power_json_path(out_dir: Path, scenario: str, workload_label: str) -> Path:
    """The run's power report (metrics `PowerReport`) beside its CSV."""
    return out_dir / scenario / f"{workload_label}.power.json"


def power_reports(out_dir: Path, scenarios: list[str], workload_label: str) -> dict[str, dict[str, Any]]:
    """The power reports of the scenarios that wrote one, in the order of SCENARIOS."""
    found: dict[str, dict[str, Any]] = {}
    for sc in SCENARIOS:
        path = power_json_path(out_dir, sc, workload_label)
        if sc in scenarios and path.is_file():
            found[sc] = json.loads(path.read_text(encoding="utf-8"))
    return found


def run_dir_for(out_dir: Path, scenario: str) -> Path:
    return out_dir / "runs" / scenario


PLACEMENT_FILE = "mapping/placement.json"  # under a run's folder (`RunFiles.write_placement`)


def placement_path(out_dir: Path, scenario: str) -> Path:
    """The placement a scenario's run used, ``<out>/runs/<scenario>/mapping/placement.json``."""
    return run_dir_for(out_dir, scenario) / PLACEMENT_FILE
