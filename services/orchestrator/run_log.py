"""``run.log`` of a scenario run: the seed, the config snapshot, package versions and the git revision at the top of
every attempt, then progress lines and errors (the run's log records, filtered by its run id)."""

from __future__ import annotations

import json
import logging
import platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from services.orchestrator.schemas import ExperimentSpec
from shared.logging import TEXT_FORMAT, RunIdFilter, current_run_id

PACKAGES = ("tasmoe", "numpy", "scipy", "fastapi", "pydantic", "sqlalchemy", "alembic", "httpx", "celery")
REPO_ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


@lru_cache(maxsize=1)
def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=5, check=False)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if rev.returncode != 0:
        return "unknown"
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


class _OnlyRun(logging.Filter):
    """This run's records: its progress and header lines (``tasmoe.runfile``, INFO and up) and any other module's
    warnings and errors. Other modules' INFO records (e.g. httpx's line per request: ~1.1 kB per window, 11 MB per
    run of the default experiment) stay out of the file; they still reach the console's handlers."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != _RUN_LOGGER.name and record.levelno < logging.WARNING:
            return False
        return current_run_id() == self.run_id


# Progress and header lines go to the run's file only (not to the console): a logger that does not propagate, with one
# file handler per active run, each keeping only its own run's records.
_RUN_LOGGER = logging.getLogger("tasmoe.runfile")
_RUN_LOGGER.propagate = False
_RUN_LOGGER.setLevel(logging.INFO)


class RunLog:
    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        self.run_id = run_id
        self.log = _RUN_LOGGER

    def info(self, msg: str) -> None:
        self.log.info(msg)

    def header(self, *, spec: ExperimentSpec, scenario: str, attempt: int, next_window: int) -> None:
        self.log.info("run %s scenario %s attempt %d starting at window %d", self.run_id, scenario, attempt,
                      next_window)
        self.log.info("seed %d", spec.seed)
        self.log.info("git revision %s", git_revision())
        self.log.info("versions %s", json.dumps(package_versions(), sort_keys=True))
        self.log.info("config %s", json.dumps(spec.model_dump(mode="json"), sort_keys=True))


def logged_config(path: Path) -> dict[str, Any] | None:
    """The resolved configs a run ran (the spec `RunLog.header` writes at the top of every attempt: arch, workload,
    tas, seed, scenarios ...), from its ``run.log``; None when the file holds no config line."""
    if not path.is_file():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        _, sep, body = line.partition(" config ")
        if sep and body.startswith("{"):
            return dict(json.loads(body))
    return None


@contextmanager
def run_log(path: Path, *, run_id: str) -> Iterator[RunLog]:
    """Attach a file handler for this run's records (other runs' threads are filtered out) while the block runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.addFilter(RunIdFilter())
    handler.addFilter(_OnlyRun(run_id))
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)  # warnings and errors of any module while this run is bound (e.g. its failure)
    _RUN_LOGGER.addHandler(handler)
    try:
        yield RunLog(path, run_id)
    finally:
        _RUN_LOGGER.removeHandler(handler)
        root.removeHandler(handler)
        handler.close()
