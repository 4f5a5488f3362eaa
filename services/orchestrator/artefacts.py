"""An experiment's files over HTTP: the list, one file, or the whole folder as a zip; every path confined to the
experiment's results folder (no ``..``, no absolute path, no symlink leading out of it), and every file-system error
answered as a 4xx (`fs_error`)."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.errors import BadInput, NotFound, TasmoeError

MAX_LISTED = 10_000  # files listed in one answer (a run folder holds a few dozen)


def fs_error(exc: OSError, rel: str) -> TasmoeError:
    """A file-system error met while answering for ``rel`` as the 4xx it is for the client: a name too long or a
    symbolic-link loop is an invalid path (422); permission denied a 403; everything else (missing, a folder where
    a file was asked, a file where a folder, a file that cannot be read) a 404 naming the reason. Never a 500: an
    unhandled error there made the server close the client's keep-alive connection."""
    reason = os.strerror(exc.errno) if exc.errno is not None else str(exc)
    if exc.errno in (errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL, errno.EILSEQ):
        return BadInput(f"path {rel[:300]!r}: {reason} (a name is at most 255 bytes, a path 4096)"
                        if exc.errno == errno.ENAMETOOLONG else f"path {rel[:300]!r}: {reason}", field="path")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return TasmoeError(f"path {rel[:300]!r}: {reason}", field="path", code="forbidden", status=403)
    return NotFound(f"no readable file {rel[:300]!r} in this experiment ({reason})", field="path")


@contextlib.contextmanager
def fs_errors(rel: str) -> Iterator[None]:
    """`fs_error` for every `OSError` raised inside (and for the symlink loop `Path.resolve` reports as a
    `RuntimeError`)."""
    try:
        yield
    except OSError as exc:
        raise fs_error(exc, rel) from None
    except RuntimeError as exc:
        if "symlink loop" not in str(exc).lower():
            raise
        raise fs_error(OSError(errno.ELOOP, os.strerror(errno.ELOOP)), rel) from None


def list_files(out_dir: Path) -> list[dict[str, Any]]:
    """Every regular file under the folder: relative path (POSIX) and size in bytes, sorted by path. A file that
    vanishes (or cannot be read) while the folder is walked is left out."""
    with fs_errors("."):
        root = out_dir.resolve()
        if not root.is_dir():
            return []
    out: list[dict[str, Any]] = []
    for dirpath, _dirs, names in os.walk(root):  # followlinks=False: a symlinked folder is not entered
        for name in names:
            p = Path(dirpath) / name
            try:
                if name.endswith(".tmp") or p.is_symlink() or not p.is_file():
                    continue
                size = p.stat().st_size
            except OSError:
                continue
            out.append({"path": p.relative_to(root).as_posix(), "bytes": size})
            if len(out) >= MAX_LISTED:
                break
    return sorted(out, key=lambda f: f["path"])


def resolve_file(out_dir: Path, rel: str) -> tuple[Path, os.stat_result]:
    """The file ``rel`` inside the folder and its stat, or NotFound / BadInput (a path that would leave it) / a
    4xx for any file-system error (`fs_error`). The file is opened once here, so one that cannot be read is refused
    before the answer starts (not mid-answer, which would break the connection)."""
    if not rel or rel.startswith("/") or "\x00" in rel:
        raise BadInput(f"path {rel[:300]!r}: a path relative to the experiment's folder", field="path")
    with fs_errors(rel):
        root = out_dir.resolve()
        p = (root / rel).resolve()
        if not p.is_relative_to(root):
            raise BadInput(f"path {rel[:300]!r} leaves the experiment's folder", field="path")
        if p.is_dir():
            raise NotFound(f"{rel[:300]!r} is a folder of this experiment, not a file (GET .../files lists them)",
                           field="path")
        if not p.is_file():
            raise NotFound(f"no file {rel[:300]!r} in this experiment", field="path")
        with p.open("rb") as fh:
            st = os.fstat(fh.fileno())
    return p, st


def zip_folder(out_dir: Path, name: str) -> Path:
    """The folder as a zip in a temporary file (the caller deletes it); entries under ``<name>/``. A file that
    vanishes meanwhile is left out."""
    with fs_errors("."):
        fd, tmp = tempfile.mkstemp(prefix="tasmoe-", suffix=".zip")
        os.close(fd)
        try:
            root = out_dir.resolve()
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as z:
                for f in list_files(root):
                    with contextlib.suppress(FileNotFoundError):
                        z.write(root / f["path"], arcname=f"{name}/{f['path']}")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return Path(tmp)
