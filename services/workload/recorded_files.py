"""Where a workload's recorded routing trace (``routing.trace``) comes from: a file **name** looked up in
``TASMOE_TRACES_DIR`` (default ``<configs_dir>/traces``) and then in the shipped samples
(``services/workload/samples``). Names only, never paths: a request cannot make a service read an arbitrary file.

A `RecordedFiles` (one per workload app, from its settings) keeps the parsed traces in a small LRU
(``TASMOE_CACHE_SIZE`` entries) keyed by the file's path, size and mtime, so a trace is parsed once per service
however many windows read it; its ``sha256`` of the file's bytes goes into the trace id, so editing a trace file gives
new trace ids.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from services.workload.recorded import RecordedRouting, read_routing
from services.workload.trace_folders import is_plain_name, names_in
from shared.errors import BadInput
from shared.lru import LRU
from shared.settings import Settings

SAMPLES_DIR = Path(__file__).resolve().parent / "samples"
TRACE_SUFFIXES = (".csv", ".jsonl", ".parquet", ".json")

class RecordedFiles:
    """The recorded routing traces one workload service can replay: file names in ``traces_dir`` (None: only the
    shipped samples), then in the samples; parsed traces in an LRU of ``cache_size`` entries keyed by path, size and
    mtime, and the files' SHA-256 likewise. One per workload app, from its settings (`from_settings`; no
    module-level state)."""

    def __init__(self, traces_dir: Path | None = None, cache_size: int = 64) -> None:
        self.traces_dir = traces_dir
        self.cache_size = max(1, int(cache_size))
        self._cache: LRU[tuple[str, int, int, str | None], RecordedRouting] = LRU(self.cache_size)
        self._hashes: LRU[tuple[str, int, int], str] = LRU(4 * self.cache_size)

    @classmethod
    def from_settings(cls, settings: Settings) -> RecordedFiles:
        """``TASMOE_TRACES_DIR`` (default ``<configs_dir>/traces``) and ``TASMOE_CACHE_SIZE`` of ``settings``."""
        return cls(settings.effective_traces_dir(), settings.cache_size)

    def dirs(self) -> list[Path]:
        return [self.traces_dir, SAMPLES_DIR] if self.traces_dir is not None else [SAMPLES_DIR]

    def available(self) -> list[str]:
        return names_in(self.dirs(), TRACE_SUFFIXES)

    def path(self, name: str) -> Path:
        """The file ``name`` names; ``BadInput`` (field ``routing.trace``) listing the available ones otherwise."""
        if not is_plain_name(name):
            raise BadInput(f"routing.trace {name!r}: give a file name (no path) in TASMOE_TRACES_DIR or the "
                           "samples", field="routing.trace")
        for d in self.dirs():
            p = d / name
            if p.is_file():
                return p
        raise BadInput(f"routing.trace {name!r} not found in {', '.join(str(d) for d in self.dirs())}; available: "
                       f"{', '.join(self.available()) or 'none'}", field="routing.trace")

    def load(self, name: str, fmt: str | None = None) -> RecordedRouting:
        """The parsed trace (cached); parse errors name the file and the row, under field ``routing.trace``."""
        p = self.path(name)
        key = (*_stat_key(p), fmt)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        try:
            rec = read_routing(p, fmt)
        except BadInput as exc:
            raise BadInput(f"routing.trace: {exc.message}", field="routing.trace") from None
        self._cache.put(key, rec)
        return rec

    def sha256(self, name: str) -> str:
        """SHA-256 (hex) of the trace file's bytes."""
        p = self.path(name)
        key = _stat_key(p)
        h = self._hashes.get(key)
        if h is None:
            digest = hashlib.sha256()
            with p.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            h = digest.hexdigest()
            self._hashes.put(key, h)
        return h


def _stat_key(p: Path) -> tuple[str, int, int]:
    st = p.stat()
    return str(p), st.st_size, st.st_mtime_ns
