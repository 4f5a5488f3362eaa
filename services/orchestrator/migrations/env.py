"""Alembic environment: runs the migrations on a connection handed over by `db.upgrade` or on `-x url=...`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from services.orchestrator import models  # noqa: F401  (registers the tables on Base.metadata)
from shared.db import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    from shared.settings import Settings

    return context.get_x_argument(as_dictionary=True).get("url") or Settings().effective_database_url


def run_offline() -> None:
    url = _url()
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    conn = config.attributes.get("connection")
    if conn is not None:
        _run(conn)
        return
    from services.orchestrator.db import make_engine

    engine = make_engine(_url())
    with engine.connect() as connection:
        _run(connection)


if context.is_offline_mode():
    run_offline()
else:
    run_online()
