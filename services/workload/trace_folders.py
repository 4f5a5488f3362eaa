"""The rule both kinds of recorded trace follow (routing traces, `RecordedFiles`; arrival traces, `ArrivalFiles`): a
config gives a file's **name**, never a path, looked up in the traces folder and then in the packaged files, so that a
request cannot make a service read an arbitrary file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def is_plain_name(name: str) -> bool:
    """A name that stays inside the folder it is looked up in: no separator, not hidden, not empty."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def names_in(dirs: Iterable[Path], suffixes: tuple[str, ...], *, stem: bool = False) -> list[str]:
    """The files of ``dirs`` with one of ``suffixes``, sorted, by file name (or by name without the suffix)."""
    names: set[str] = set()
    for d in dirs:
        if d.is_dir():
            names.update(p.stem if stem else p.name for p in d.iterdir() if p.suffix in suffixes and p.is_file())
    return sorted(names)
