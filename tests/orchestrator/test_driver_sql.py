"""A Core statement run on the driver's cursor (`services.orchestrator.driver_sql`, the window commit's path) writes
the rows `Connection.execute` writes, in one transaction that commits, rolls back on an error or on `abort`, and
raises a driver error as SQLAlchemy's; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa

from services.orchestrator import driver_sql
from services.orchestrator import repository as repo
from services.orchestrator.db import make_engine, session_factory, upgrade
from services.orchestrator.models import WindowRecord, utcnow
from tests.orchestrator.conftest import Db
from tests.orchestrator.test_repository import _experiment

W = cast(sa.Table, WindowRecord.__table__)


def _insert(db: Db) -> driver_sql.DriverStatement:
    return driver_sql.DriverStatement.of(sa.insert(W), db.engine.dialect)


def _row(run_id: str, window: int, **kw: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"run_id": run_id, "window": window, "snapshot": {"T": [50.0 + 1 / 3, 1e-300]},
                              "metrics": {"window": window, "name": "ü\"\\x", "none": None},
                              "frontier": {"k": window}, "worker": "w1", "created_at": utcnow() - timedelta(hours=1)}
    return values | kw


def _rows(db: Db, run_id: str) -> list[tuple[Any, ...]]:
    with db.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(W).where(W.c.run_id == run_id).order_by(W.c.window))]


def test_the_driver_writes_the_row_connection_execute_writes(db: Db) -> None:
    run_a, run_b = _experiment(db, exp_id="ea"), _experiment(db, exp_id="eb")
    when = utcnow()
    with driver_sql.transaction(db.engine) as tx:
        assert tx.execute(_insert(db), _row(run_a, 0, created_at=when)) == 1
    with db.engine.begin() as conn:
        conn.execute(sa.insert(W), _row(run_b, 0, created_at=when))
    a, b = _rows(db, run_a), _rows(db, run_b)
    assert len(a) == len(b) == 1
    assert a[0][1:] == b[0][1:]  # every column but the run id, read back the same way
    with db.engine.connect() as conn:  # and stored the same way (JSON text, the timestamp's form)
        raw = [tuple(r) for r in conn.execute(sa.text(
            "SELECT CAST(snapshot AS TEXT), CAST(metrics AS TEXT), CAST(created_at AS TEXT) FROM windows "
            "ORDER BY run_id"))]
    assert raw[0] == raw[1]


def test_a_failed_statement_rolls_the_transaction_back_and_raises_sqlalchemys_error(db: Db) -> None:
    run_id = _experiment(db)
    ins = _insert(db)
    # the same (run, window) twice: the primary key
    with pytest.raises(sa.exc.IntegrityError) as err, driver_sql.transaction(db.engine) as tx:
        tx.execute(ins, _row(run_id, 0))
        tx.execute(ins, _row(run_id, 0))
    assert isinstance(err.value.orig, db.engine.dialect.loaded_dbapi.Error)
    assert _rows(db, run_id) == []  # the first insert went with it
    with driver_sql.transaction(db.engine) as tx:  # the pooled connection is usable again
        tx.execute(ins, _row(run_id, 1))
    assert [r[1] for r in _rows(db, run_id)] == [1]


def test_abort_and_an_exception_in_the_block_roll_back(db: Db) -> None:
    run_id = _experiment(db)
    ins = _insert(db)
    with driver_sql.transaction(db.engine) as tx:
        tx.execute(ins, _row(run_id, 0))
        tx.abort()
    with pytest.raises(RuntimeError), driver_sql.transaction(db.engine) as tx:
        tx.execute(ins, _row(run_id, 1))
        raise RuntimeError("the caller's own error")
    assert _rows(db, run_id) == []


def test_literals_and_positional_order_come_from_the_compiled_statement(db: Db) -> None:
    """An update whose WHERE mixes bound names and a literal, its SET before them in the SQL: the parameters go in
    the compiled statement's order whatever the dialect's paramstyle."""
    run_id = _experiment(db)
    ins = _insert(db)
    with driver_sql.transaction(db.engine) as tx:
        for k in range(3):
            tx.execute(ins, _row(run_id, k, worker="w1" if k < 2 else "w2"))
    upd = driver_sql.DriverStatement.of(
        sa.update(W).where(W.c.run_id == sa.bindparam("b_run"), W.c.worker == "w1", W.c.window >= sa.bindparam("b_k"))
        .values(frontier=sa.bindparam("b_frontier", type_=W.c.frontier.type)), db.engine.dialect)
    with driver_sql.transaction(db.engine) as tx:
        assert tx.execute(upd, {"b_run": run_id, "b_k": 1, "b_frontier": {"moved": [1, 2]}}) == 1
    assert [r[4] for r in _rows(db, run_id)] == [{"k": 0}, {"moved": [1, 2]}, {"k": 2}]


def test_each_engine_commits_with_its_own_compiled_statements(tmp_path: Path) -> None:
    """`commit_window` compiles its statements once per engine (their bind processors carry the engine's JSON
    serializer), not once per dialect name: a second engine with another serializer writes with its own."""
    texts = []
    for name, serializer in (("a", None), ("b", lambda v: json.dumps(v, indent=1))):
        url = f"sqlite:///{(tmp_path / f'{name}.sqlite3').as_posix()}"
        engine = make_engine(url) if serializer is None else sa.create_engine(url, json_serializer=serializer)
        try:
            upgrade(engine)
            db = Db(url, None, engine, session_factory(engine))
            run_id = _experiment(db)
            assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30).ok
            assert repo.commit_window(sessions=db.sessions, run_id=run_id, owner="w1", window=0,
                                      snapshot={"w": [1, 2]}, metrics={"m": 1}, frontier={"k": 0}, lease_s=30)
            with engine.connect() as conn:
                texts.append(conn.execute(sa.text("SELECT snapshot FROM windows")).scalar_one())
        finally:
            engine.dispose()
    assert texts[0] == '{"w":[1,2]}' and texts[1] == json.dumps({"w": [1, 2]}, indent=1)


def test_a_driver_error_is_raised_as_sqlalchemys_naming_the_statement(db: Db) -> None:
    """`as_sqlalchemy_error`, the one translation the statements, the commit ("COMMIT") and the rollback of an
    aborted transaction ("ROLLBACK") go through: the driver's error class becomes SQLAlchemy's of the same name,
    the driver's error its ``orig``; any other error passes as it is."""
    dbapi = db.engine.dialect.loaded_dbapi
    lost = dbapi.OperationalError("server closed the connection")
    with pytest.raises(sa.exc.OperationalError) as err, driver_sql.as_sqlalchemy_error(db.engine.dialect, "COMMIT"):
        raise lost
    assert err.value.orig is lost and err.value.statement == "COMMIT" and err.value.__cause__ is lost
    with pytest.raises(KeyError), driver_sql.as_sqlalchemy_error(db.engine.dialect, "ROLLBACK"):
        raise KeyError("not the driver's")
