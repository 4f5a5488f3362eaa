"""A run's per-window metrics: ``<out>/runs/<scenario>/windows.jsonl.gz``, every committed window's `WindowMetrics`
as one JSON line, and its index ``windows.idx``.

The window loop appends each epoch's windows before it commits the epoch, one gzip member per window (the same bytes
whatever the epochs were), and records both files' sizes in the frontier; a resumed run truncates them back to it
(`services.orchestrator.run_files.RunFiles`), like every other appended file. The index holds, per window, the
offset of its member (little-endian uint64), so a page of windows is read without decompressing the ones before it.

This file is the run's series: the reduction to the result row, the finalisation (series table, figures) and
``GET /v1/experiments/{id}/windows`` read it; the database keeps only the frontier.
"""

from __future__ import annotations

import gzip
import itertools
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared import json_codec

WINDOWS_FILE = "windows.jsonl.gz"
INDEX_FILE = "windows.idx"
GZIP_LEVEL = 1  # ~17 kB of JSON a window of the default chip in ~0.3 ms to ~7 kB; level 6 saves 5 % at 2.4x the time
_OFFSET = struct.Struct("<Q")


def member(line: bytes) -> bytes:
    """One window's line as the gzip member the store appends (no name, time 0: same window, same bytes)."""
    return gzip.compress(line, compresslevel=GZIP_LEVEL, mtime=0)


def offset_entry(offset: int) -> bytes:
    return _OFFSET.pack(offset)


def count(run_dir: Path) -> int:
    """Windows the store holds (by its index)."""
    idx = run_dir / INDEX_FILE
    return idx.stat().st_size // _OFFSET.size if idx.is_file() else 0


def read(run_dir: Path, offset: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
    """Windows ``offset`` .. ``offset + limit - 1`` of the store (fewer at its end), as JSON objects: each window's
    member decompressed on its own (its bounds from the index), in C."""
    n = count(run_dir)
    stop = n if limit is None else min(n, offset + limit)
    if offset >= stop:
        return []
    with open(run_dir / INDEX_FILE, "rb") as fh:
        fh.seek(offset * _OFFSET.size)
        raw = fh.read((stop + 1 - offset) * _OFFSET.size)  # one more: the end of the last member (absent at the end)
    starts = [v for (v,) in _OFFSET.iter_unpack(raw)]
    with open(run_dir / WINDOWS_FILE, "rb") as fh:
        fh.seek(starts[0])
        data = fh.read(starts[-1] - starts[0]) if len(starts) > stop - offset else fh.read()
    bounds = [s - starts[0] for s in starts[: stop - offset]] + [len(data)]
    return [json_codec.loads(zlib.decompress(data[a:b], wbits=31)) for a, b in itertools.pairwise(bounds)]


def iter_chunks(run_dir: Path, chunk: int = 1000) -> Iterator[list[dict[str, Any]]]:
    """Every window of the store in order, ``chunk`` at a time (a long run's windows are never held at once)."""
    offset, n = 0, count(run_dir)
    while offset < n:
        part = read(run_dir, offset, chunk)
        if not part:
            return
        yield part
        offset += len(part)
