"""Engines, sessions and migrations of the orchestrator's run-state database.

- SQLite (embedded): WAL journal, ``busy_timeout``, foreign keys on, and every transaction opened with
  ``BEGIN IMMEDIATE`` so concurrent writers (the embedded pool's threads, a second worker process) queue on the lock
  instead of failing a read→write upgrade with "database is locked".
- PostgreSQL (cluster): psycopg 3; an optional ``schema`` puts every table (and Alembic's version table) in that schema
  via the connection's ``search_path`` (tests use one schema per test).
- `upgrade(engine)` runs the one Alembic history (``migrations/``) to head, under an advisory lock on PostgreSQL so an
  API process and a worker starting together do not race.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from shared import json_codec

HERE = Path(__file__).resolve().parent
ALEMBIC_INI = HERE / "migrations" / "alembic.ini"
_MIGRATION_LOCK = 0x7A5E_0001  # pg_advisory_xact_lock key for migrations
CONNECT_TIMEOUT_S = 5  # PostgreSQL: the longest wait for a new connection


def make_engine(url: str, *, schema: str | None = None, echo: bool = False) -> Engine:
    """An engine for ``url``; creates the SQLite file's directory. ``schema``: PostgreSQL search_path."""
    connect_args: dict[str, Any] = {}
    kw: dict[str, Any] = {}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        connect_args = {"check_same_thread": False, "timeout": 60.0}
    elif url.startswith("postgresql"):
        # a server that does not answer (a network partition) fails a connection attempt in seconds instead of
        # holding the request or the run for the system's TCP timeout: an outage is then waited out or answered 503
        if "connect_timeout=" not in url:  # the URL's own wins
            connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
        if schema:
            connect_args["options"] = f"-csearch_path={schema}"
        kw = {"pool_pre_ping": True, "pool_size": 8, "max_overflow": 8}
    # JSON columns (a run's frontier holds its thermal state whole, ~300 kB) through orjson: shared.json_codec
    engine = sa.create_engine(url, echo=echo, connect_args=connect_args, json_serializer=json_codec.dumps_str,
                              json_deserializer=json_codec.loads, **kw)
    if engine.dialect.name == "sqlite":
        _sqlite_setup(engine)
    return engine


# SQLite's transactions take the write lock when they begin (not at their first write, where a concurrent writer would
# make them fail with SQLITE_BUSY instead of waiting busy_timeout): the engine's ``begin`` event emits this (the
# pysqlite recipe of SQLAlchemy's documentation, "Serializable isolation / Savepoints / Transactional DDL")
SQLITE_BEGIN = "BEGIN IMMEDIATE"


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.isolation_level = None  # let SQLAlchemy's "begin" event emit BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(SQLITE_BEGIN)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config() -> Config:
    cfg = Config(str(ALEMBIC_INI))
    cfg.set_main_option("script_location", str(HERE / "migrations"))
    return cfg


@contextlib.contextmanager
def _migrating(engine: Engine) -> Iterator[sa.Connection]:
    """A connection in a transaction for Alembic. On SQLite, foreign keys are not enforced while it runs: a batch
    migration recreates a table (copy, DROP, rename), and the DROP of a parent table with enforcement on would
    cascade and delete the child rows (every run of every experiment, for a change to ``experiments``). The pragma
    only works outside a transaction, so it is set on the driver's connection before the transaction begins, and
    the database's foreign keys are checked before enforcement is turned back on."""
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        raw: Any = conn.connection.driver_connection
        if sqlite:
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
                yield conn
            if sqlite:
                bad = raw.execute("PRAGMA foreign_key_check").fetchall()
                if bad:
                    raise RuntimeError(f"the migration left rows whose foreign key names no row: {bad[:5]}")
        finally:
            if sqlite:
                raw.execute("PRAGMA foreign_keys=ON")


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the migrations to ``revision`` on ``engine`` (idempotent; under an advisory lock on PostgreSQL)."""
    cfg = alembic_config()
    with _migrating(engine) as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    cfg = alembic_config()
    with _migrating(engine) as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def open_database(url: str, *, schema: str | None = None) -> tuple[Engine, sessionmaker[Session]]:
    """Engine + migrated schema + session factory: what a worker or the API needs at start-up."""
    engine = make_engine(url, schema=schema)
    upgrade(engine)
    return engine, session_factory(engine)
