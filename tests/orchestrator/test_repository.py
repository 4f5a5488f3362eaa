"""Durable run state: migrations, leases, the fenced epoch commit, attempts — on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from services.orchestrator import repository as repo
from services.orchestrator.db import downgrade, upgrade
from services.orchestrator.models import RunStatus, ScenarioRun, utcnow
from tests.orchestrator.conftest import Db


def _experiment(db: Db, *, max_attempts: int = 3, key: str | None = None, exp_id: str = "e1") -> str:
    with db.sessions.begin() as s:
        repo.add_experiment(session=s, exp_id=exp_id, name="t", configs={"a": 1}, seed=7, scenarios=["baseline", "tas"],
                            out_dir="/tmp/x", idempotency_key=key, request_hash="h", max_attempts=max_attempts)
    return repo.run_id_for(exp_id, "baseline")


def _commit(db: Db, run_id: str, owner: str, k: int, n: int = 1) -> bool:
    """Commit the epoch of windows k .. k + n - 1."""
    return repo.commit_epoch(sessions=db.sessions, run_id=run_id, owner=owner, first=k, next_window=k + n,
                             frontier={"k": k + n - 1, "T": 50.0 + k / 3}, lease_s=30)


def test_migrations_create_tables_and_round_trip(db: Db) -> None:
    names = set(sa.inspect(db.engine).get_table_names())
    assert {"experiments", "scenario_runs", "jobs", "quota_locks", "alembic_version"} <= names
    assert "windows" not in names  # the windows are a run file; the run keeps only its frontier
    downgrade(db.engine)
    assert "scenario_runs" not in set(sa.inspect(db.engine).get_table_names())
    upgrade(db.engine)
    upgrade(db.engine)  # idempotent
    assert "frontier" in {c["name"] for c in sa.inspect(db.engine).get_columns("scenario_runs")}


def test_an_unfinished_run_of_the_windows_table_starts_over(db: Db) -> None:
    """Migrating a database whose runs kept their frontier in the windows table: an unfinished run has no frontier
    left, so it starts over from window 0; a finished one keeps its place."""
    downgrade(db.engine, "0006")
    with db.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO experiments (id, name, status, configs, seed, request_hash, out_dir, owner, "
                             "created_at, updated_at, finalizations) VALUES ('e', 'n', 'running', '{}', 1, '', '/x', "
                             "'local', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 0)"))
        for rid, status, nxt in (("e-a", "running", 7), ("e-b", "succeeded", 9)):
            conn.execute(sa.text("INSERT INTO scenario_runs (id, experiment_id, scenario, position, status, "
                                 "next_window, attempts, max_attempts, compute_s, deliveries) VALUES (:id, 'e', :sc, "
                                 "0, :st, :n, 1, 3, 0, 0)"), {"id": rid, "sc": rid[-1], "st": status, "n": nxt})
    upgrade(db.engine)
    with db.sessions() as s:
        assert {r.id: r.next_window for r in s.scalars(sa.select(ScenarioRun))} == {"e-a": 0, "e-b": 9}


def test_claim_commit_and_frontier(db: Db) -> None:
    run_id = _experiment(db)
    c = repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30)
    assert c.ok and c.next_window == 0 and c.attempts == 1
    assert _commit(db, run_id, "w1", 0, 2) and _commit(db, run_id, "w1", 2)
    assert repo.load_frontier(sessions=db.sessions, run_id=run_id, next_window=3) == {"k": 2, "T": 50.0 + 2 / 3}
    assert repo.load_frontier(sessions=db.sessions, run_id=run_id, next_window=0) is None
    with pytest.raises(RuntimeError, match="frontier"):  # only the newest frontier is kept
        repo.load_frontier(sessions=db.sessions, run_id=run_id, next_window=2)
    with db.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.next_window == 3 and run.status == RunStatus.running


def test_fenced_commit_refuses_wrong_owner_and_wrong_window(db: Db) -> None:
    run_id = _experiment(db)
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30).ok
    assert not _commit(db, run_id, "intruder", 0)
    assert not _commit(db, run_id, "w1", 1)  # not the frontier
    assert _commit(db, run_id, "w1", 0)
    assert not _commit(db, run_id, "w1", 0)  # replay of a committed epoch
    with db.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.next_window == 1


def test_commit_adds_up_its_compute_time_and_renews_the_lease(db: Db) -> None:
    run_id = _experiment(db)
    assert repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30).ok
    before = utcnow()
    for k in range(3):
        assert repo.commit_epoch(sessions=db.sessions, run_id=run_id, owner="w1", first=2 * k, next_window=2 * k + 2,
                                 frontier={"k": k}, lease_s=60, compute_s=0.25)
    with db.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.next_window == 6 and run.compute_s == pytest.approx(0.75)
        assert run.lease_expires_at is not None and run.lease_expires_at >= before + timedelta(seconds=59)


def test_a_finished_run_drops_its_frontier_a_failed_one_keeps_it(db: Db) -> None:
    run_id = _experiment(db)
    other = repo.run_id_for("e1", "tas")
    for rid in (run_id, other):
        assert repo.claim_run(sessions=db.sessions, run_id=rid, owner="w1", lease_s=30).ok
        assert _commit(db, rid, "w1", 0, 4)
    assert repo.finish_run(sessions=db.sessions, run_id=run_id, owner="w1", status=RunStatus.succeeded)
    assert repo.finish_run(sessions=db.sessions, run_id=other, owner="w1", status=RunStatus.failed, error="x")
    with db.sessions() as s:
        done, failed = s.get(ScenarioRun, run_id), s.get(ScenarioRun, other)
        assert done is not None and done.frontier is None
        assert failed is not None and failed.frontier == {"k": 3, "T": 50.0}  # POST .../retry resumes there


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


def test_idempotency_key_is_unique_per_principal(db: Db) -> None:
    _experiment(db, key="k-1")
    with pytest.raises(sa.exc.IntegrityError), db.sessions.begin() as s:
        repo.add_experiment(session=s, exp_id="e2", name="t", configs={}, seed=1, scenarios=["baseline"],
                            out_dir="/tmp/y", idempotency_key="k-1", request_hash="h", max_attempts=3)
    with db.sessions.begin() as s:  # another principal's key of the same name is its own
        repo.add_experiment(session=s, exp_id="e3", name="t", configs={}, seed=1, scenarios=["baseline"],
                            out_dir="/tmp/z", idempotency_key="k-1", request_hash="h", max_attempts=3, owner="bob")
    with db.sessions() as s:
        exp = repo.get_experiment_by_key(session=s, owner="local", idempotency_key="k-1")
        assert exp is not None and exp.id == "e1"
        bobs = repo.get_experiment_by_key(session=s, owner="bob", idempotency_key="k-1")
        assert bobs is not None and bobs.id == "e3"
        assert repo.get_experiment_by_key(session=s, owner="carol", idempotency_key="k-1") is None


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


def test_a_large_frontier_round_trips_exactly(db: Db) -> None:
    """A run's frontier holds its thermal field whole (~300 kB of JSON): it round-trips exactly, floats included."""
    run_id = _experiment(db)
    repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w1", lease_s=30)
    frontier = {"field": [50.0 + i / 7 for i in range(20_000)], "b64": "A" * 260_000}
    assert repo.commit_epoch(sessions=db.sessions, run_id=run_id, owner="w1", first=0, next_window=5,
                             frontier=frontier, lease_s=30)
    assert repo.load_frontier(sessions=db.sessions, run_id=run_id, next_window=5) == frontier
