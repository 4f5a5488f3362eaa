"""Shared fixtures: the repository and reference paths, settings in a temp dir, real PostgreSQL/Redis access.

A test that needs PostgreSQL or Redis uses the `postgres_url` / `redis_url` fixtures: when the service is down the test
is skipped on a laptop, and FAILS when ``REQUIRE_SERVICES=1`` (CI), so CI never silently skips it.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.settings import Settings

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(os.environ.get("TASMOE_REFERENCE_DIR", REPO.parent / "shared" / "reference"))
FIXTURES = Path(__file__).resolve().parent / "fixtures"
CONFIGS = REPO / "configs"

# Registered models (POST /v1/models) persist in a folder: the test session gets its own, never ./results/models.
os.environ.setdefault("TASMOE_MODELS_DIR", tempfile.mkdtemp(prefix="tasmoe-models-"))

PG_URL = os.environ.get("TASMOE_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("TASMOE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _require_services() -> bool:
    return os.environ.get("REQUIRE_SERVICES", "") not in {"", "0", "false"}


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _need(name: str, host: str, port: int) -> None:
    if _port_open(host, port):
        return
    msg = f"{name} is not reachable at {host}:{port}"
    if _require_services():
        pytest.fail(f"{msg} and REQUIRE_SERVICES=1")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``../shared/reference`` beside the checkout (CI has it); a missing one is a failure, not a skip."""
    if not REFERENCE.is_dir():
        pytest.fail(f"reference data not found at {REFERENCE} (set TASMOE_REFERENCE_DIR)")
    return REFERENCE


@pytest.fixture(scope="session")
def postgres_url() -> str:
    _need("PostgreSQL", "127.0.0.1", 5432)
    return PG_URL


@pytest.fixture(scope="session")
def redis_url() -> str:
    _need("Redis", "127.0.0.1", 6379)
    return REDIS_URL


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    """Embedded-mode settings writing under a temporary results directory."""
    return Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)


@pytest.fixture()
def chdir_tmp(tmp_path: Path) -> Iterator[Path]:
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)
