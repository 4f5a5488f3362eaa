"""A Core statement compiled once for a dialect and executed on the driver's own cursor (the window commit's path).

SQLAlchemy's `Connection.execute` costs ~0.1 ms a statement in Python (execution context, parameter coercion,
result object, events) and its `Connection.begin` as much again, where SQLite's own work for a window's commit is
~0.4 ms; right after a window's compute (README: a window against its compute) the four calls cost ~0.6 ms of a
1.2 ms commit. The statement here is still SQLAlchemy's: compiled by the dialect (its SQL text and parameter order,
the driver's paramstyle), each value passed through its column type's bind processor (``TypeEngine.dialect_impl(dialect)
.bind_processor``: JSON through the engine's ``json_serializer``, datetimes as SQLite stores them), so the rows are
the ones `Connection.execute` would write. The transaction is the driver connection's (`transaction`): SQLite's
``BEGIN IMMEDIATE`` where the engine's ``begin`` event emits it (`services.orchestrator.db.begin_sql`), commit or
rollback, a driver error raised as SQLAlchemy's (`sqlalchemy.exc.DBAPIError.instance`) and a connection the dialect
calls disconnected invalidated, as `Connection.execute` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.sql.compiler import SQLCompiler

from services.orchestrator.db import begin_sql


@dataclass(frozen=True)
class DriverStatement:
    """``stmt`` compiled for one dialect: the driver's SQL and the parameters it wants (`params`)."""

    sql: str
    compiled: SQLCompiler  # the literals' values and the bind names' order
    positional: tuple[str, ...] | None  # bind names in order (qmark, format, numeric), None: by name (pyformat)
    processors: Mapping[str, Callable[[Any], Any]]  # by bind name, the type's bind processor (where it has one)

    @classmethod
    def of(cls, stmt: sa.ClauseElement, dialect: sa.Dialect) -> DriverStatement:
        compiled = cast(SQLCompiler, stmt.compile(dialect=dialect))
        procs: dict[str, Callable[[Any], Any]] = {}
        for bind in compiled.binds.values():
            proc = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if proc is not None:
                procs[compiled.bind_names[bind]] = proc
        positional = tuple(compiled.positiontup or ()) if dialect.positional else None
        return cls(sql=str(compiled), compiled=compiled, positional=positional, processors=procs)

    def params(self, values: Mapping[str, Any]) -> tuple[Any, ...] | Mapping[str, Any]:
        """The driver's parameters from ``values`` by bind name (the statement's literals filled in)."""
        full = self.compiled.construct_params(dict(values))
        for name, proc in self.processors.items():
            full[name] = proc(full[name])
        return tuple(full[name] for name in self.positional) if self.positional is not None else full


@contextmanager
def as_sqlalchemy_error(dialect: sa.Dialect, sql: str, args: Any = ()) -> Iterator[None]:
    """A driver error inside the block raised as SQLAlchemy's (`sqlalchemy.exc.DBAPIError.instance`: its ``orig`` is
    the driver's, ``statement`` / ``params`` are ``sql`` / ``args``), as `Connection.execute` raises it."""
    try:
        yield
    except dialect.loaded_dbapi.Error as exc:
        raise sa.exc.DBAPIError.instance(sql, args, exc, dialect.loaded_dbapi.Error, dialect=dialect) from exc


class DriverTransaction:
    """One transaction on a driver connection (`transaction`): `execute` runs a `DriverStatement`."""

    def __init__(self, dialect: sa.Dialect, cursor: Any) -> None:
        self.dialect = dialect
        self.cursor = cursor
        self.aborted = False

    def abort(self) -> None:
        """Roll the transaction back when the block ends (instead of committing it)."""
        self.aborted = True

    def run(self, sql: str, args: Any = ()) -> None:
        """``sql`` on the cursor; a driver error raised as SQLAlchemy's (its ``orig``: the driver's)."""
        with as_sqlalchemy_error(self.dialect, sql, args):
            self.cursor.execute(sql, args)

    def execute(self, stmt: DriverStatement, values: Mapping[str, Any]) -> int:
        """Run ``stmt`` with ``values``; the rows it changed (the driver's ``rowcount``)."""
        self.run(stmt.sql, stmt.params(values))
        return int(self.cursor.rowcount)


@contextmanager
def transaction(engine: sa.Engine) -> Iterator[DriverTransaction]:
    """A pooled connection's driver connection in one transaction: committed when the block ends, rolled back when it
    raises or called `DriverTransaction.abort`; the connection goes back to the pool, or is invalidated when the
    dialect finds it disconnected (or its rollback fails)."""
    dialect = engine.dialect
    raw = engine.raw_connection()
    cursor = None
    try:
        cursor = raw.cursor()
        tx = DriverTransaction(dialect, cursor)
        begin = begin_sql(dialect.name)
        if begin is not None:
            tx.run(begin)
        yield tx
        with as_sqlalchemy_error(dialect, "ROLLBACK" if tx.aborted else "COMMIT"):
            if tx.aborted:
                raw.rollback()
            else:
                raw.commit()
    except BaseException as exc:
        orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else None
        if orig is not None and dialect.is_disconnect(cast(Any, orig), cast(DBAPIConnection, raw.dbapi_connection),
                                                      cursor):
            raw.invalidate(orig)
        else:
            try:
                raw.rollback()
            except dialect.loaded_dbapi.Error as lost:  # the connection broke: not returned to the pool as it is
                raw.invalidate(lost)
        raise
    finally:
        if cursor is not None and raw.is_valid:
            cursor.close()
        raw.close()
