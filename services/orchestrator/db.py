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
        if schema:
            connect_args["options"] = f"-csearch_path={schema}"
        kw = {"pool_pre_ping": True, "pool_size": 8, "max_overflow": 8}
    # JSON columns (a window's frontier is ~430 kB) through orjson: shared.json_codec
    engine = sa.create_engine(url, echo=echo, connect_args=connect_args, json_serializer=json_codec.dumps_str,
                              json_deserializer=json_codec.loads, **kw)
    if engine.dialect.name == "sqlite":
        _sqlite_setup(engine)
    return engine


# SQLite's transactions take the write lock when they begin (not at their first write, where a concurrent writer would
# make them fail with SQLITE_BUSY instead of waiting busy_timeout): the engine's ``begin`` event emits this, and so
# does a transaction on the driver connection (`services.orchestrator.driver_sql`)
SQLITE_BEGIN = "BEGIN IMMEDIATE"


def begin_sql(dialect_name: str) -> str | None:
    """What starts a transaction on a driver connection of this dialect (None: the driver begins one itself)."""
    return SQLITE_BEGIN if dialect_name == "sqlite" else None


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


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the migrations to ``revision`` on ``engine`` (idempotent)."""
    cfg = alembic_config()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def open_database(url: str, *, schema: str | None = None) -> tuple[Engine, sessionmaker[Session]]:
    """Engine + migrated schema + session factory: what a worker or the API needs at start-up."""
    engine = make_engine(url, schema=schema)
    upgrade(engine)
    return engine, session_factory(engine)
