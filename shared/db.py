"""The SQLAlchemy declarative base shared by services that keep durable state (only the orchestrator today), and the
test that tells a database outage from a bug.

A `MetaData` naming convention makes constraint names deterministic, so one Alembic history produces the same schema
on SQLite and PostgreSQL and later migrations can refer to constraints by name.
"""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


# OperationalErrors that are bugs in the SQL or the schema, not the database being away (SQLite reports both kinds as
# OperationalError; PostgreSQL's are ProgrammingErrors)
_NOT_AN_OUTAGE = ("no such table", "no such column", "syntax error", "has no column")


def database_outage(exc: BaseException) -> bool:
    """True when ``exc`` says the database cannot be used for now: a refused or lost connection, a server shutting
    down or starting up (PostgreSQL's ``OperationalError``s), a connection SQLAlchemy invalidated, no free connection
    in the pool within its timeout, SQLite's lock held past ``busy_timeout``. Such an error is waited out (a run) or
    answered 503 with Retry-After (a request); every other database error (a constraint, bad SQL) is a bug."""
    if isinstance(exc, sa_exc.TimeoutError):  # the pool's checkout timeout
        return True
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    if exc.connection_invalidated or isinstance(exc, sa_exc.InterfaceError):
        return True
    if isinstance(exc, sa_exc.OperationalError):
        msg = str(exc.orig).lower()
        return not any(s in msg for s in _NOT_AN_OUTAGE)
    return False


def outage_text(exc: BaseException) -> str:
    """One line on a database outage for a log or a run's waiting reason (the driver's first line, no SQL)."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0][:300]
    return f"{type(orig).__name__}: {first}" if first else type(orig).__name__
