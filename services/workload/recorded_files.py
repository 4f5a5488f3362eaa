"""Where a workload's recorded routing trace (``routing.trace``) comes from: a file **name** looked up in
``TASMOE_TRACES_DIR`` (default ``<configs_dir>/traces``) and then in the shipped samples
(``services/workload/samples``). Names only, never paths: a request cannot make a service read an arbitrary file.

Loaded traces are kept in a small LRU (``TASMOE_CACHE_SIZE`` entries) keyed by the file's path, size and mtime, so a
trace is parsed once per process however many windows read it; ``recorded_hash`` (SHA-256 of the file's bytes) goes
into the trace id, so editing a trace file gives new trace ids.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path

from services.workload.recorded import RecordedRouting, read_routing
from shared.errors import BadInput
from shared.settings import get_settings

SAMPLES_DIR = Path(__file__).resolve().parent / "samples"
TRACE_SUFFIXES = (".csv", ".jsonl", ".parquet", ".json")

_lock = threading.Lock()
_cache: OrderedDict[tuple[str, int, int, str | None], RecordedRouting] = OrderedDict()
_hashes: dict[tuple[str, int, int], str] = {}


def traces_dirs() -> list[Path]:
    s = get_settings()
    return [s.traces_dir if s.traces_dir is not None else s.configs_dir / "traces", SAMPLES_DIR]


def available_traces() -> list[str]:
    names: set[str] = set()
    for d in traces_dirs():
        if d.is_dir():
            names.update(p.name for p in d.iterdir() if p.suffix in TRACE_SUFFIXES and p.is_file())
    return sorted(names)


def trace_path(name: str) -> Path:
    """The file ``name`` names; ``BadInput`` (field ``routing.trace``) listing the available ones otherwise."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise BadInput(f"routing.trace {name!r}: give a file name (no path) in TASMOE_TRACES_DIR or the samples",
                       field="routing.trace")
    for d in traces_dirs():
        p = d / name
        if p.is_file():
            return p
    raise BadInput(f"routing.trace {name!r} not found in {', '.join(str(d) for d in traces_dirs())}; available: "
                   f"{', '.join(available_traces()) or 'none'}", field="routing.trace")


def _stat_key(p: Path) -> tuple[str, int, int]:
    st = p.stat()
    return str(p), st.st_size, st.st_mtime_ns


def load_recorded(name: str, fmt: str | None = None) -> RecordedRouting:
    """The parsed trace (cached); parse errors name the file and the row, under field ``routing.trace``."""
    p = trace_path(name)
    key = (*_stat_key(p), fmt)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    try:
        rec = read_routing(p, fmt)
    except BadInput as exc:
        raise BadInput(f"routing.trace: {exc.message}", field="routing.trace") from None
    with _lock:
        _cache[key] = rec
        while len(_cache) > get_settings().cache_size:
            _cache.popitem(last=False)
    return rec


def recorded_hash(name: str) -> str:
    """SHA-256 (hex) of the trace file's bytes."""
    p = trace_path(name)
    key = _stat_key(p)
    h = _hashes.get(key)
    if h is None:
        digest = hashlib.sha256()
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        h = digest.hexdigest()
        with _lock:
            if len(_hashes) >= 4 * get_settings().cache_size:
                _hashes.clear()
            _hashes[key] = h
    return h
