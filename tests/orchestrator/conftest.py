"""Orchestrator test fixtures: a migrated database on SQLite and on the real PostgreSQL (one schema per test)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator.app import create_app
from services.orchestrator.db import make_engine, session_factory, upgrade
from shared.client import ServiceClients
from shared.settings import Settings
from tests.orchestrator import fakes


@dataclass
class Db:
    url: str
    schema: str | None
    engine: Engine
    sessions: sessionmaker[Session]

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name


def sqlite_db(tmp_path: Path) -> Iterator[Db]:
    url = f"sqlite:///{(tmp_path / 'runs.sqlite3').as_posix()}"
    engine = make_engine(url)
    upgrade(engine)
    yield Db(url, None, engine, session_factory(engine))
    engine.dispose()


def postgres_db(postgres_url: str) -> Iterator[Db]:
    """A fresh schema in the `test` database, migrated with the real Alembic history, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    engine = make_engine(postgres_url, schema=schema)
    try:
        upgrade(engine)
        yield Db(postgres_url, schema, engine, session_factory(engine))
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    """The run-state database on both backends (PostgreSQL via the `postgres_url` fixture)."""
    if request.param == "sqlite":
        yield from sqlite_db(tmp_path)
    else:
        yield from postgres_db(request.getfixturevalue("postgres_url"))


@pytest.fixture()
def sqlite(tmp_path: Path) -> Iterator[Db]:
    yield from sqlite_db(tmp_path)


@pytest.fixture()
def pg(postgres_url: str) -> Iterator[Db]:
    yield from postgres_db(postgres_url)


# a small workload for the HTTP API tests, and the orchestrator app (embedded) over the fake compute services
SMALL_WL: dict[str, Any] = {"model": "mixtral-8x7b", "sequence": {"steps": 12, "micro_batch": 4}}


@pytest.fixture()
def api(settings: Settings) -> Iterator[TestClient]:
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    with TestClient(create_app(settings, clients=clients)) as tc:
        yield tc
    clients.close()
