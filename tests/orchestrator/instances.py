"""PostgreSQL and Redis servers of a test's own, which the test stops and starts (an outage), never the machine's.

`PgServer` runs ``initdb`` into a temporary folder and ``pg_ctl`` on a free loopback port (as the ``postgres`` user
when the tests run as root: PostgreSQL refuses to run as root); `RedisServer` runs ``redis-server`` on a free port
without persistence. Both skip the test where the programs are missing, and fail it under ``REQUIRE_SERVICES=1``
(CI), as the `postgres_url` / `redis_url` fixtures do. `serve_app` runs an ASGI app (lifespan included) under a real
uvicorn in a thread, for what a client sees over a socket.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import uvicorn
from sqlalchemy.pool import NullPool

from services.orchestrator.db import make_engine, session_factory, upgrade
from tests.conftest import _require_services
from tests.orchestrator.conftest import Db


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _missing(what: str) -> None:
    msg = f"{what} not found: the outage tests start servers of their own"
    if _require_services():
        pytest.fail(f"{msg} and REQUIRE_SERVICES=1")
    pytest.skip(msg)


def _pg_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


class PgServer:
    """A PostgreSQL server in a temporary folder on a free port (trust authentication, user postgres, fsync off)."""

    def __init__(self) -> None:
        bindir = _pg_bindir()
        if bindir is None or not (bindir / "initdb").is_file():
            _missing("PostgreSQL's initdb")
            raise AssertionError("unreachable")
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tasmoe-pg-"))
        self.data = self.root / "data"
        self._as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL does not run as root: its own user owns the folder
            shutil.chown(self.root, "postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync",
                  "-N", timeout=120)
        self.start()

    def _run(self, prog: str, *args: str, timeout: float = 60) -> None:
        res = subprocess.run([*self._as_user, str(self.bindir / prog), *args], capture_output=True, text=True,
                             timeout=timeout, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"{prog} {' '.join(args)} failed: {res.stdout}\n{res.stderr}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` ends every session at once (the clients' connections break), ``immediate``
        is a crash (no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").is_file()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class RedisServer:
    """A Redis server on a free port that keeps nothing on disk (a restart loses every message, as the machine's)."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            _missing("redis-server")
            raise AssertionError("unreachable")
        self.exe = exe
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="tasmoe-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        cmd = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", str(self.root), "--daemonize", "no"]
        self.proc = subprocess.Popen(cmd, stdout=(self.root / "server.log").open("ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(self.root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.proc = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def own_pg() -> Iterator[PgServer]:
    """A PostgreSQL server of this test module's own (started; each test leaves it running)."""
    server = PgServer()
    try:
        yield server
    finally:
        server.close()


def outage_db(server: PgServer) -> Iterator[Db]:
    """A fresh schema on ``server``, migrated; afterwards the server runs again (a test may have left it stopped)
    and the schema is dropped over a new connection (the old ones died with any restart)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server.url(), poolclass=NullPool)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    engine = make_engine(server.url(), schema=schema)
    try:
        upgrade(engine)
        yield Db(server.url(), schema, engine, session_factory(engine))
    finally:
        engine.dispose()
        if not server.running():
            server.start()
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture()
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """``app`` under a real uvicorn on a free loopback port, its lifespan entered; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
