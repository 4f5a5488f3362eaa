"""Shared fixtures: the repository and reference paths, settings in a temp dir, real PostgreSQL/Redis access.

A test that needs PostgreSQL or Redis uses the `postgres_url` / `redis_url` fixtures: when the service is down the test
is skipped on a laptop, and FAILS when ``REQUIRE_SERVICES=1`` (CI), so CI never silently skips it.
"""

from __future__ import annotations

import os
import socket
import sys
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
# So does everything else written under the default results folder (the embedded run database
# <results_dir>/tasmoe.sqlite3 of a command run without its own --out or TASMOE_DATABASE_URL): never ./results/.
# Under pytest-xdist each worker gets folders of its own (the workers inherit the controller's environment): a folder
# the user set stays theirs.
_OWN_DIRS = "TASMOE_TEST_OWN_DIRS"
for _name, _prefix in (("TASMOE_MODELS_DIR", "tasmoe-models-"), ("TASMOE_RESULTS_DIR", "tasmoe-results-")):
    if _name not in os.environ or (os.environ.get(_OWN_DIRS) and os.environ.get("PYTEST_XDIST_WORKER")):
        os.environ[_name] = tempfile.mkdtemp(prefix=_prefix)
        os.environ[_OWN_DIRS] = "1"

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


def need_chromium(found: str | None) -> None:
    """A browser test without Chromium: skipped on a laptop (``make test`` installs it where apt-get can), a failure
    under ``REQUIRE_SERVICES=1`` (CI installs it: a missing browser there is a broken image, not a skip)."""
    if found is not None:
        return
    msg = "Chromium is not installed (Debian's package chromium: make test installs it as root; .ci/run does)"
    if _require_services():
        pytest.fail(f"{msg} and REQUIRE_SERVICES=1")
    pytest.skip(msg)


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


# --- the checkout's results/ is the user's: a test writes its files under its own temporary folder -----------------

_RESULTS = REPO / "results"
_RESULTS_KEY = pytest.StashKey[set[str]]()


def _results_entries() -> set[str]:
    return {p.name for p in _RESULTS.iterdir()} if _RESULTS.is_dir() else set()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_RESULTS_KEY] = _results_entries()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a test left a new file or folder in the checkout's ``results/`` (a user's ``make test``
    must not add an experiment folder beside their own results)."""
    before = session.config.stash.get(_RESULTS_KEY, None)
    if before is None:
        return
    new = sorted(_results_entries() - before)
    if new:
        print(f"\ntests left {', '.join(new)} in {_RESULTS}: write into tmp_path (TASMOE_RESULTS_DIR, --out)",
              file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- pytest-xdist (make test: -n auto --dist loadgroup) --------------------------------------------------------------

# Modules whose tests start processes, servers or browsers and wait on them with timeouts: one worker runs them one
# after another (as a serial run does), the other workers run everything else.
_PROCESS_MODULES = frozenset({
    "test_chaos", "test_cluster_celery", "test_broker_outage", "test_database_outage", "test_outage",
    "test_kill_worker", "test_service_restart", "test_cluster", "test_compose", "test_dashboard_browser",
    "test_docs_browser", "test_front_door", "test_client",
})


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's xdist group: the process tests' one, else its module's (a module's module-scoped fixtures, such as
    the hot chip's five runs, are then built once, on one worker). Without xdist the marks change nothing. Under
    xdist the groups that hold a slow test go first (in their order), so that the longest ones do not start last and
    leave one worker running alone at the end; the order within a group is kept."""
    groups: dict[str, str] = {}
    for item in items:
        module = item.path.stem
        group = ("processes" if module in _PROCESS_MODULES or item.get_closest_marker("cluster")
                 else item.nodeid.split("::")[0])
        groups[item.nodeid] = group
        item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow = {groups[i.nodeid] for i in items if i.get_closest_marker("slow")}
        items.sort(key=lambda i: groups[i.nodeid] not in slow)  # stable: the collection order otherwise

