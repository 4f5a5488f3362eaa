"""Durable run state: migrations, leases, the fenced window commit, attempts — on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from services.orchestrator import repository as repo
from services.orchestrator.db import downgrade, upgrade
from services.orchestrator.models import RunStatus, ScenarioRun, WindowRecord, utcnow
from tests.orchestrator.conftest import Db


def _experiment(db: Db, *, max_attempts: int = 3, key: str | None = None, exp_id: str = "e1") -> str:
    with db.sessions.begin() as s:
        repo.add_experiment(session=s, exp_id=exp_id, name="t", configs={"a": 1}, seed=7, scenarios=["baseline", "tas"],
                            out_dir="/tmp/x", idempotency_key=key, request_hash="h", max_attempts=max_attempts)
    return repo.run_id_for(exp_id, "baseline")


def _commit(db: Db, run_id: str, owner: str, k: int) -> bool:
    return repo.commit_window(sessions=db.sessions, run_id=run_id, owner=owner, window=k,
                              snapshot={"window": k}, metrics={"window": k, "T": 50.0 + k / 3},
                              frontier={"k": k}, lease_s=30)


def test_migrations_create_tables_and_round_trip(db: Db) -> None:
    names = set(sa.inspect(db.engine).get_table_names())
    assert {"experiments", "scenario_runs", "windows", "jobs", "alembic_version"} <= names
    downgrade(db.engine)
    assert "windows" not in set(sa.inspect(db.engine).get_table_names())
    upgrade(db.engine)
    upgrade(db.engine)  # idempotent
    assert "windows" in set(sa.inspect(db.engine).get_table_names())


def test_claim_commit_and_frontier(db: Db) -> None:
    run_id = _experiment(db)
    c = repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30)
    assert c.ok and c.next_window == 0 and c.attempts == 1
    for k in range(3):
        assert _commit(db, run_id, "w1", k)
    assert repo.load_frontier(sessions=db.sessions, run_id=run_id, next_window=3) == {"k": 2}
    with db.sessions() as s:
        rows = s.scalars(sa.select(WindowRecord).where(WindowRecord.run_id == run_id).order_by(WindowRecord.window))
        rows_l = list(rows)
        assert [r.window for r in rows_l] == [0, 1, 2]
        assert [r.frontier is None for r in rows_l] == [True, True, False]  # only the newest keeps its state
        assert rows_l[1].metrics == {"window": 1, "T": 50.0 + 1 / 3}  # floats round-trip exactly
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.next_window == 3 and run.status == RunStatus.running


def test_fenced_commit_refuses_wrong_owner_and_wrong_window(db: Db) -> None:
    run_id = _experiment(db)
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30).ok
    assert not _commit(db, run_id, "intruder", 0)
    assert not _commit(db, run_id, "w1", 1)  # not the frontier
    assert _commit(db, run_id, "w1", 0)
    assert not _commit(db, run_id, "w1", 0)  # replay of a committed window
    with db.sessions() as s:
        assert repo.window_count(session=s, run_id=run_id) == 1


def test_commit_keeps_a_row_already_there_and_adds_up_its_compute_time(db: Db) -> None:
    """A window row that exists already (a run put back to an earlier frontier that a worker had passed) is kept as
    it is: the commit moves the frontier and inserts nothing (ON CONFLICT DO NOTHING); the fenced update adds the
    window's compute time and renews the lease; checkpoints named in ``drop_frontiers`` keep or lose their state."""
    run_id = _experiment(db)
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30).ok
    for k in range(3):
        assert repo.commit_window(sessions=db.sessions, run_id=run_id, owner="w1", window=k, snapshot={"w": k},
                                  metrics={"w": k}, frontier={"k": k}, lease_s=30, compute_s=0.25,
                                  drop_frontiers=[] if k < 2 else [1])
    with db.sessions.begin() as s:
        s.execute(sa.update(ScenarioRun).where(ScenarioRun.id == run_id).values(next_window=1))
    before = utcnow()
    assert repo.commit_window(sessions=db.sessions, run_id=run_id, owner="w1", window=1, snapshot={"w": "again"},
                              metrics={"w": "again"}, frontier={"k": "again"}, lease_s=60, compute_s=0.5)
    with db.sessions() as s:
        rows = {r.window: r for r in s.scalars(sa.select(WindowRecord).where(WindowRecord.run_id == run_id))}
        assert sorted(rows) == [0, 1, 2]
        assert rows[1].snapshot == {"w": 1} and rows[1].metrics == {"w": 1}  # the first commit's row, untouched
        # window 2 dropped window 1's state; the replay of window 1 dropped window 0's (the default: window - 1)
        assert [rows[k].frontier for k in range(3)] == [None, None, {"k": 2}]
        # SQL NULL, not the JSON value null (both read back as None)
        assert s.scalar(sa.select(sa.func.count()).select_from(WindowRecord)
                        .where(WindowRecord.run_id == run_id, WindowRecord.frontier.is_(None))) == 2
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.next_window == 2 and run.compute_s == pytest.approx(1.25)
        assert run.lease_expires_at is not None and run.lease_expires_at >= before + timedelta(seconds=59)


def test_live_lease_blocks_expired_lease_is_reclaimed(db: Db) -> None:
    run_id = _experiment(db)
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30).ok
    assert _commit(db, run_id, "w1", 0)
    other = repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w2", lease_s=30)
    assert other.outcome == "leased"
    later = utcnow() + timedelta(seconds=120)
    with db.sessions() as s:
        assert run_id in repo.stale_runs(session=s, now=later)
    c2 = repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w2", lease_s=30, now=later)
    assert c2.ok and c2.next_window == 1 and c2.attempts == 2
    # the old owner has lost its lease: its next commit is fenced off
    assert not _commit(db, run_id, "w1", 1)
    assert _commit(db, run_id, "w2", 1)


def test_heartbeat_extends_a_live_lease_and_never_revives_one(db: Db) -> None:
    run_id = _experiment(db)
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=5).ok

    def expires() -> object:
        with db.sessions() as s:
            run = repo.get_run(session=s, run_id=run_id)
            assert run is not None
            return run.lease_expires_at

    before = expires()
    assert repo.extend_lease(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=600) == "extended"
    assert expires() > before  # type: ignore[operator]
    assert repo.extend_lease(sessions=db.sessions, run_id=run_id, owner="w2", lease_s=600) == "lost"  # not its lease
    repo.release_lease(sessions=db.sessions, run_id=run_id, owner="w1")
    given_back = expires()
    assert repo.extend_lease(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=600) == "expired"
    assert expires() == given_back  # not revived
    with db.sessions() as s:
        assert run_id in repo.stale_runs(session=s)


def test_attempts_are_bounded(db: Db) -> None:
    run_id = _experiment(db, max_attempts=2)
    t = utcnow()
    for i in range(2):
        assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner=f"w{i}", lease_s=1,
                              now=t + timedelta(seconds=10 * i)).ok
    c = repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w9", lease_s=1, now=t + timedelta(seconds=60))
    assert c.outcome == "exhausted"
    with db.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.status == RunStatus.failed and "gave up after 2 attempts" in (run.error or "")
        exp = repo.get_experiment(session=s, exp_id="e1")
        assert exp is not None and exp.status == RunStatus.running  # its other scenario is still queued


def test_finish_and_cancel(db: Db) -> None:
    run_id = _experiment(db)
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30).ok
    assert repo.finish_run(sessions=db.sessions, run_id=run_id, owner="w1", status=RunStatus.succeeded,
                           result_row={"ips": 1.0})
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30).outcome == "done"
    with db.sessions.begin() as s:
        assert repo.cancel_experiment(session=s, exp_id="e1") == 1  # the tas run was still queued
    with db.sessions() as s:
        exp = repo.get_experiment(session=s, exp_id="e1")
        assert exp is not None and exp.status == RunStatus.cancelled
    tas = repo.run_id_for("e1", "tas")
    assert repo.claim_run(sessions=db.sessions, run_id=tas, owner="w1", lease_s=30).outcome == "done"


def test_cancel_stops_a_running_commit(db: Db) -> None:
    run_id = _experiment(db)
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30).ok
    assert _commit(db, run_id, "w1", 0)
    with db.sessions.begin() as s:
        repo.cancel_experiment(session=s, exp_id="e1")
    assert not _commit(db, run_id, "w1", 1)


def test_idempotency_key_is_unique(db: Db) -> None:
    _experiment(db, key="k-1")
    with pytest.raises(sa.exc.IntegrityError), db.sessions.begin() as s:
        repo.add_experiment(session=s, exp_id="e2", name="t", configs={}, seed=1, scenarios=["baseline"],
                            out_dir="/tmp/y", idempotency_key="k-1", request_hash="h", max_attempts=3)
    with db.sessions() as s:
        exp = repo.get_experiment_by_key(session=s, idempotency_key="k-1")
        assert exp is not None and exp.id == "e1"


def test_concurrent_claims_one_winner(db: Db) -> None:
    run_id = _experiment(db)
    results: list[str] = []
    lock = threading.Lock()

    def go(i: int) -> None:
        c = repo.claim_run(sessions=db.sessions, run_id=run_id, owner=f"w{i}", lease_s=30)
        with lock:
            results.append(c.outcome)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["claimed", "leased", "leased", "leased"]


def test_models_match_the_migration_history(db: Db) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from shared.db import Base

    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []


def test_window_columns_are_lz4_on_postgresql_and_round_trip(pg: Db) -> None:
    """Migration 0005: PostgreSQL with lz4 compresses a window's JSON with it (pglz cost the server ~1 ms more CPU a
    commit); a downgrade puts the default back; a large row still round-trips exactly."""
    import importlib

    from services.orchestrator.db import downgrade, upgrade

    lz4_available = importlib.import_module("services.orchestrator.migrations.versions.0005_windows_lz4").lz4_available

    def methods() -> dict[str, str]:
        with pg.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT attname, attcompression FROM pg_attribute WHERE attrelid = "
                                        "'windows'::regclass AND attname IN ('snapshot', 'metrics', 'frontier')"))
            return {str(name): str(c) for name, c in rows}

    with pg.engine.connect() as conn:
        available = lz4_available(conn)
        offered = conn.execute(sa.text("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
                                       )).scalar()
    assert available == ("lz4" in (offered or []))
    if available:
        assert methods() == {"snapshot": "l", "metrics": "l", "frontier": "l"}
    downgrade(pg.engine, "0004")
    assert set(methods().values()) <= {"", "\x00"}
    upgrade(pg.engine)
    run_id = _experiment(pg)
    repo.claim_run(sessions=pg.sessions, run_id=run_id, owner="w1", lease_s=30)
    frontier = {"field": [50.0 + i / 7 for i in range(20_000)]}  # ~400 kB: compressed out of line
    assert repo.commit_window(sessions=pg.sessions, run_id=run_id, owner="w1", window=0, snapshot={"window": 0},
                              metrics={"window": 0}, frontier=frontier, lease_s=30)
    assert repo.load_frontier(sessions=pg.sessions, run_id=run_id, next_window=1) == frontier
    if available:
        with pg.engine.connect() as conn:
            used = conn.execute(sa.text("SELECT pg_column_compression(frontier) FROM windows")).scalar_one()
        assert used == "lz4"
