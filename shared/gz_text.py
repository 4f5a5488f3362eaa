"""Text files the runs append to window by window, compressed or not by their name: a file whose name ends in
``.gz`` gets one gzip member per append (no file name, time 0: the same text gives the same bytes; readers see the
members as one stream, and a crash-safe resume can truncate the file to an earlier member boundary), any other name
gets the UTF-8 text. One owner for the files appended to and read back: the run files
(``services.orchestrator.run_files``) and the window series (``services.metrics.series``). A whole window series
written at once streams through one gzip member instead (``shared.window_series.write_windows_jsonl``); this module
reads it back like any other."""

from __future__ import annotations

import gzip
from pathlib import Path

GZIP_LEVEL = 6  # zlib's default: 9.0x smaller than the CSV for the physical events, ~2 ms per window of them


def is_gz(path: Path | str) -> bool:
    return str(path).endswith(".gz")


def encode(path: Path | str, text: str, level: int = GZIP_LEVEL) -> bytes:
    """The bytes one append of ``text`` adds to ``path``: a gzip member (of compression ``level``) for a ``.gz``
    file, else UTF-8."""
    data = text.encode("utf-8")
    return gzip.compress(data, compresslevel=level, mtime=0) if is_gz(path) else data


def append(path: Path | str, text: str) -> int:
    """Append ``text`` to ``path`` (created when missing), as `encode` gives it; the file's size after it (bytes)."""
    with open(path, "ab") as fh:
        fh.write(encode(path, text))
        return fh.tell()


def read_text(path: Path | str) -> str:
    """The whole text of ``path``: every gzip member of a ``.gz`` file decompressed, else its UTF-8 text.
    ``OSError`` (``gzip.BadGzipFile``), ``EOFError`` or ``UnicodeDecodeError`` for a damaged file."""
    data = Path(path).read_bytes()
    return (gzip.decompress(data) if is_gz(path) else data).decode("utf-8")
