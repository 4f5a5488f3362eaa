"""An experiment's files over HTTP (issue 17, item 7): the list, one file, or the whole folder as a zip; every path
confined to the experiment's results folder (no ``..``, no absolute path, no symlink leading out of it)."""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from shared.errors import BadInput, NotFound

MAX_LISTED = 10_000  # files listed in one answer (a run folder holds a few dozen)


def list_files(out_dir: Path) -> list[dict[str, Any]]:
    """Every regular file under the folder: relative path (POSIX) and size in bytes, sorted by path."""
    root = out_dir.resolve()
    if not root.is_dir():
        return []
    out: list[dict[str, Any]] = []
    for dirpath, _dirs, names in os.walk(root):  # followlinks=False: a symlinked folder is not entered
        for name in names:
            p = Path(dirpath) / name
            if name.endswith(".tmp") or p.is_symlink() or not p.is_file():
                continue
            out.append({"path": p.relative_to(root).as_posix(), "bytes": p.stat().st_size})
            if len(out) >= MAX_LISTED:
                break
    return sorted(out, key=lambda f: f["path"])


def resolve_file(out_dir: Path, rel: str) -> Path:
    """The file ``rel`` inside the folder, or NotFound / BadInput (a path that would leave it)."""
    if not rel or rel.startswith("/") or "\x00" in rel:
        raise BadInput(f"path {rel!r}: a path relative to the experiment's folder", field="path")
    root = out_dir.resolve()
    p = (root / rel).resolve()
    if not p.is_relative_to(root):
        raise BadInput(f"path {rel!r} leaves the experiment's folder", field="path")
    if not p.is_file():
        raise NotFound(f"no file {rel!r} in this experiment", field="path")
    return p


def zip_folder(out_dir: Path, name: str) -> Path:
    """The folder as a zip in a temporary file (the caller deletes it); entries under ``<name>/``."""
    fd, tmp = tempfile.mkstemp(prefix="tasmoe-", suffix=".zip")
    os.close(fd)
    root = out_dir.resolve()
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for f in list_files(root):
            z.write(root / f["path"], arcname=f"{name}/{f['path']}")
    return Path(tmp)
