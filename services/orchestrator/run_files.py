"""The files a scenario run writes (ARCHITECTURE §6, seed §3), appended window by window.

Layout under the experiment's output directory ``<out>``::

    <out>/<scenario>/<workload>.csv                  unified result row (seed §3.6), written at the end
    <out>/runs/<scenario>/run.log                     seed, config snapshot, package versions, git revision, progress
    <out>/runs/<scenario>/traces/logical_compute.csv  seed §3.1 columns, then `layer,tokens`
    <out>/runs/<scenario>/traces/logical_memory.csv
    <out>/runs/<scenario>/mapping/placement.json
    <out>/runs/<scenario>/runtime/overlay_reroute.csv, overlay_migrate.csv
    <out>/runs/<scenario>/traces/physical/compute_events.csv, memory_events.csv
    <out>/runs/<scenario>/runtime/replica_state.json  the replica state after the newest committed window

Crash safety: each window appends its rows *before* the window commits, and the file sizes after the append are saved
in the frontier state. A resumed run first truncates every appended file to the sizes saved at the frontier, which
drops the rows of a window that was written but never committed, so the files end up byte-identical to an
uninterrupted run's.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.ids import expert_id
from shared.contracts.metrics import SCENARIOS
from shared.contracts.placement import OverlayMigrate, OverlayReroute, Placement, ReplicaState

LOGICAL_COMPUTE_COLUMNS = ("event_id", "t_gen_ns", "mb_id", "token_id", "experts_json", "flops_json", "op_type",
                           "layer", "tokens")

Columns = dict[str, list[Any]]

APPENDED: dict[str, tuple[str, ...]] = {
    "traces/logical_compute.csv": LOGICAL_COMPUTE_COLUMNS,
    "traces/logical_memory.csv": ("event_id", "tensor_id", "access", "bytes", "locality_hint"),
    "runtime/overlay_reroute.csv": tuple(OverlayReroute.columns()),
    "runtime/overlay_migrate.csv": tuple(OverlayMigrate.columns()),
    "traces/physical/compute_events.csv": tuple(ComputeEvents.columns()),
    "traces/physical/memory_events.csv": tuple(MemoryEvents.columns()),
}


def _csv_text(rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


class _LogicalText:
    """The logical-trace CSV text of recent windows, keyed by a digest of the window's wire text.

    The four scenarios of an experiment read the same logical windows, so the runs executed by one process format
    each window's rows once instead of once per run. Bounded (oldest out first); thread-safe."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._items: OrderedDict[bytes, tuple[str, str]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> tuple[str, str] | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: bytes, texts: tuple[str, str]) -> None:
        size = len(texts[0]) + len(texts[1])
        with self._lock:
            if key in self._items or size > self.max_chars:
                return
            self._items[key] = texts
            self._chars += size
            while self._chars > self.max_chars:
                _, old = self._items.popitem(last=False)
                self._chars -= len(old[0]) + len(old[1])


# the default Mixtral trace formats to ~48 MB of logical CSV: room for all of its windows
LOGICAL_TEXT = _LogicalText(max_chars=64_000_000)


class RunFiles:
    """Appends one run's per-window files; `sizes()` / `truncate_to()` implement the crash-safe resume."""

    def __init__(self, run_dir: Path, *, traces: bool = True) -> None:
        self.run_dir = run_dir
        self.traces = traces

    def path(self, rel: str) -> Path:
        return self.run_dir / rel

    def start_fresh(self) -> None:
        """Window 0: (re)create every appended file with its header only."""
        if not self.traces:
            return
        for rel, cols in APPENDED.items():
            p = self.path(rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(_csv_text([cols]), encoding="utf-8")

    def sizes(self) -> dict[str, int]:
        if not self.traces:
            return {}
        return {rel: self.path(rel).stat().st_size for rel in APPENDED}

    def truncate_to(self, sizes: dict[str, int]) -> None:
        """Resume: cut every appended file back to its size at the frontier (a missing file is an error)."""
        if not self.traces:
            return
        for rel in APPENDED:
            p = self.path(rel)
            size = sizes.get(rel)
            if size is None or not p.exists() or p.stat().st_size < size:
                raise RuntimeError(f"{p}: cannot resume, file missing or shorter than at the frontier "
                                   f"({size} bytes)")
            with open(p, "r+b") as fh:
                fh.truncate(size)

    def write_placement(self, placement: Placement) -> None:
        p = self.path("mapping/placement.json")
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

    def append_window(self, *, logical_compute: Columns, logical_memory: Columns, overlays: dict[str, Columns],
                      compute: Columns, memory: Columns, logical_raw: str | None = None) -> None:
        """Append one window's rows; every argument is a columnar batch as JSON (one list per field).
        ``logical_raw``: the logical window's wire text, when given its rows' CSV text is formatted once per process
        for every run that reads the same window (`LOGICAL_TEXT`)."""
        if not self.traces:
            return
        key = hashlib.blake2b(logical_raw.encode(), digest_size=32).digest() if logical_raw is not None else None
        logical = LOGICAL_TEXT.get(key) if key is not None else None
        if logical is None:
            logical = (_csv_text(_logical_compute_rows(logical_compute)),
                       _table(logical_memory, "traces/logical_memory.csv"))
            if key is not None:
                LOGICAL_TEXT.put(key, logical)
        parts: dict[str, str] = {
            "traces/logical_compute.csv": logical[0],
            "traces/logical_memory.csv": logical[1],
            "runtime/overlay_reroute.csv": _table(overlays["reroute"], "runtime/overlay_reroute.csv"),
            "runtime/overlay_migrate.csv": _table(overlays["migrate"], "runtime/overlay_migrate.csv"),
            "traces/physical/compute_events.csv": _table(compute, "traces/physical/compute_events.csv"),
            "traces/physical/memory_events.csv": _table(memory, "traces/physical/memory_events.csv"),
        }
        for rel, text in parts.items():
            if text:
                with open(self.path(rel), "a", encoding="utf-8", newline="") as fh:
                    fh.write(text)


def _logical_compute_rows(lc: Columns) -> Iterable[Sequence[Any]]:
    # experts_json / flops_json are one-element JSON arrays; formatted directly (json.dumps per row is slow)
    return ((eid, t, mb, "", f'["{expert_id(layer, e)}"]' if e >= 0 else "[]", f"[{float(fl)!r}]", op, layer, tok)
            for eid, t, mb, layer, op, e, tok, fl in zip(lc["event_id"], lc["t_gen_ns"], lc["mb_id"], lc["layer"],
                                                         lc["op_type"], lc["expert"], lc["tokens"], lc["flops"],
                                                         strict=True))


def _rows(cols: Columns, order: tuple[str, ...]) -> Iterable[Sequence[Any]]:
    return zip(*(cols[c] for c in order), strict=True)


def _table(cols: Columns, rel: str) -> str:
    """The CSV rows (no header) of one columnar batch, in the column order of the appended file ``rel``."""
    return _csv_text(_rows(cols, APPENDED[rel]))


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
