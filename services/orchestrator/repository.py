"""Queries on the run-state database. Every function takes its session (or session factory) as a keyword argument.

The two that make runs crash-safe:

- `claim_run`: take (or re-take) a run's lease in one conditional UPDATE. A lease that expired (its worker died) can
  be taken by anyone; every claim counts one attempt, and a run whose attempts are used up is failed instead of
  claimed, so a run that keeps killing its worker stops cleanly.
- `commit_window`: window k's record and the frontier move in ONE transaction; the fenced
  ``UPDATE scenario_runs SET next_window = k+1 WHERE id = :id AND lease_owner = :me AND next_window = :k`` decides: 0
  rows means another worker owns the run now (or it was cancelled), so the caller stops without writing anything.
  The window row is inserted with ``INSERT ... ON CONFLICT DO NOTHING`` (dialect insert for SQLite / PostgreSQL).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import driver_sql
from services.orchestrator.driver_sql import DriverStatement
from services.orchestrator.models import (
    TERMINAL,
    Experiment,
    Job,
    QuotaLock,
    RunStatus,
    ScenarioRun,
    WindowRecord,
    utcnow,
)
from shared import json_codec

ClaimOutcome = Literal["claimed", "done", "leased", "exhausted", "missing"]


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    run_id: str
    next_window: int = 0
    attempts: int = 0
    lease_expires_at: datetime | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "claimed"


def _rowcount(result: Any) -> int:
    assert isinstance(result, CursorResult)
    return int(result.rowcount)


# --------------------------------------------------------------------------------------------------- experiments


def get_experiment_by_key(*, session: Session, idempotency_key: str) -> Experiment | None:
    return session.scalars(sa.select(Experiment).where(Experiment.idempotency_key == idempotency_key)).first()


def add_experiment(*, session: Session, exp_id: str, name: str, configs: dict[str, Any], seed: int,
                   scenarios: Sequence[str], out_dir: str, idempotency_key: str | None, request_hash: str,
                   max_attempts: int, sweep_id: str | None = None, owner: str = "local") -> Experiment:
    """Insert an experiment and one queued run per scenario (the caller commits)."""
    exp = Experiment(id=exp_id, name=name, configs=configs, seed=seed, out_dir=out_dir,
                     idempotency_key=idempotency_key, request_hash=request_hash, sweep_id=sweep_id,
                     status=RunStatus.queued, owner=owner)
    session.add(exp)
    for i, sc in enumerate(scenarios):
        session.add(ScenarioRun(id=run_id_for(exp_id, sc), experiment_id=exp_id, scenario=sc, position=i,
                                status=RunStatus.queued, max_attempts=max_attempts, next_window=0, attempts=0))
    return exp


def run_id_for(exp_id: str, scenario: str) -> str:
    return f"{exp_id}-{scenario}"


def get_experiment(*, session: Session, exp_id: str) -> Experiment | None:
    return session.get(Experiment, exp_id)


def list_experiments(*, session: Session, status: RunStatus | None = None, limit: int = 50, offset: int = 0,
                     sweep_id: str | None = None, owner: str | None = None) -> tuple[list[Experiment], int]:
    """A page of experiments, newest first; ``owner``: only that principal's (None: everyone's)."""
    q = sa.select(Experiment)
    cq = sa.select(sa.func.count()).select_from(Experiment)
    if owner is not None:
        q, cq = q.where(Experiment.owner == owner), cq.where(Experiment.owner == owner)
    if status is not None:
        q, cq = q.where(Experiment.status == status), cq.where(Experiment.status == status)
    if sweep_id is not None:
        q, cq = q.where(Experiment.sweep_id == sweep_id), cq.where(Experiment.sweep_id == sweep_id)
    rows = list(session.scalars(q.order_by(Experiment.created_at.desc(), Experiment.id).limit(limit).offset(offset)))
    return rows, int(session.scalar(cq) or 0)


def active_runs_of_owner(*, session: Session, owner: str) -> int:
    """Queued and running runs of a principal's experiments (its quota counts them)."""
    R, E = ScenarioRun, Experiment
    q = (sa.select(sa.func.count()).select_from(R).join(E, R.experiment_id == E.id)
         .where(E.owner == owner, R.status.in_([RunStatus.queued, RunStatus.running])))
    return int(session.scalar(q) or 0)


def lock_owner_quota(*, session: Session, owner: str) -> None:
    """Hold the principal's quota lock until the session's transaction ends, so that no other submission of this
    principal counts its active runs (`active_runs_of_owner`) before this transaction's runs are committed or rolled
    back. PostgreSQL: the principal's `QuotaLock` row, created if missing (``ON CONFLICT DO NOTHING``: a concurrent
    first creation waits for the other's commit), then ``SELECT ... FOR UPDATE``; read-committed statements after it
    see every run the previous holder committed. SQLite: every transaction of `db.make_engine`'s engines begins with
    ``BEGIN IMMEDIATE`` and so already holds the database's write lock (SQLite has no ``FOR UPDATE``; SQLAlchemy
    leaves it out); the row is written there too, so both databases hold the same rows."""
    table = cast(sa.Table, QuotaLock.__table__)
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        session.execute(postgresql.insert(table).values(owner=owner).on_conflict_do_nothing(index_elements=["owner"]))
    elif dialect == "sqlite":
        session.execute(sqlite.insert(table).values(owner=owner).on_conflict_do_nothing(index_elements=["owner"]))
    else:
        raise RuntimeError(f"no quota lock on {dialect} (PostgreSQL and SQLite only)")
    session.execute(sa.select(QuotaLock.owner).where(QuotaLock.owner == owner).with_for_update())


def runs_of(*, session: Session, exp_id: str) -> list[ScenarioRun]:
    return list(session.scalars(sa.select(ScenarioRun).where(ScenarioRun.experiment_id == exp_id)
                                .order_by(ScenarioRun.position)))


def get_run(*, session: Session, run_id: str) -> ScenarioRun | None:
    return session.get(ScenarioRun, run_id)


def refresh_experiment_status(*, session: Session, exp_id: str) -> RunStatus | None:
    """Derive the experiment's status from its runs (failed > cancelled > running > queued > succeeded)."""
    exp = session.get(Experiment, exp_id)
    if exp is None:
        return None
    statuses = {r.status for r in runs_of(session=session, exp_id=exp_id)}
    if not statuses:
        new = exp.status
    elif statuses <= {RunStatus.succeeded}:
        # "succeeded" means its files exist: until the finalisation wrote them, the experiment is still running
        new = RunStatus.succeeded if exp.finalized_at is not None else RunStatus.running
    elif statuses <= TERMINAL:
        new = RunStatus.failed if RunStatus.failed in statuses else RunStatus.cancelled
    elif RunStatus.running in statuses or statuses & TERMINAL:
        new = RunStatus.running
    else:
        new = RunStatus.queued
    if new != exp.status:
        exp.status = new
        errors = [f"{r.scenario}: {r.error}" for r in runs_of(session=session, exp_id=exp_id) if r.error]
        exp.error = "; ".join(errors) or None
    return new


def cancel_experiment(*, session: Session, exp_id: str) -> int:
    """Mark every unfinished run cancelled (its worker notices at its next commit). Returns the runs changed."""
    res = session.execute(
        sa.update(ScenarioRun)
        .where(ScenarioRun.experiment_id == exp_id, ScenarioRun.status.in_([RunStatus.queued, RunStatus.running]))
        .values(status=RunStatus.cancelled, finished_at=utcnow(), lease_owner=None, lease_expires_at=None)
        .execution_options(synchronize_session=False))
    session.flush()
    refresh_experiment_status(session=session, exp_id=exp_id)
    return _rowcount(res)


# ---------------------------------------------------------------------------------------------------- runs / leases


def claim_run(*, sessions: sessionmaker[Session], run_id: str, owner: str, lease_s: float,
              now: datetime | None = None) -> Claim:
    """Take the run's lease if it is free, expired or already ours; counts one attempt per claim."""
    now = now or utcnow()
    expires = now + timedelta(seconds=lease_s)
    R = ScenarioRun
    with sessions.begin() as s:
        res = s.execute(
            sa.update(R)
            .where(R.id == run_id,
                   R.status.in_([RunStatus.queued, RunStatus.running]),
                   sa.or_(R.lease_owner.is_(None), R.lease_expires_at < now, R.lease_owner == owner),
                   R.attempts < R.max_attempts)
            .values(lease_owner=owner, lease_expires_at=expires, status=RunStatus.running, attempts=R.attempts + 1,
                    started_at=sa.func.coalesce(R.started_at, now))
            .execution_options(synchronize_session=False))
        run = s.get(R, run_id)
        if run is None:
            return Claim("missing", run_id)
        if _rowcount(res) == 1:
            s.refresh(run)
            refresh_experiment_status(session=s, exp_id=run.experiment_id)
            return Claim("claimed", run_id, run.next_window, run.attempts, run.lease_expires_at)
        if run.status in TERMINAL:
            return Claim("done", run_id, run.next_window, run.attempts)
        lease_free = run.lease_owner is None or (run.lease_expires_at is not None and run.lease_expires_at < now)
        if run.attempts >= run.max_attempts and lease_free:
            run.status = RunStatus.failed
            run.error = (f"gave up after {run.attempts} attempts (the worker died or lost its lease each time; "
                         f"last frontier: window {run.next_window})")
            run.finished_at = now
            run.lease_owner = None
            s.flush()
            refresh_experiment_status(session=s, exp_id=run.experiment_id)
            return Claim("exhausted", run_id, run.next_window, run.attempts)
        return Claim("leased", run_id, run.next_window, run.attempts, run.lease_expires_at)


def set_n_windows(*, sessions: sessionmaker[Session], run_id: str, owner: str, n_windows: int) -> bool:
    R = ScenarioRun
    with sessions.begin() as s:
        res = s.execute(sa.update(R).where(R.id == run_id, R.lease_owner == owner).values(n_windows=n_windows)
                        .execution_options(synchronize_session=False))
        return _rowcount(res) == 1


@dataclass(frozen=True)
class _CommitStatements:
    """`commit_window`'s statements, built and compiled once per engine (Core, not the ORM) and run on the
    driver's cursor (`driver_sql`): building them per call cost more than the database's own work (SQLAlchemy's
    coercion and cache key of every value, ~4 ms a window), and so did executing them through a `Connection`
    (~0.6 ms of a 1.2 ms commit right after a window's compute)."""

    advance: DriverStatement  # the fenced update of the run: next_window, lease, compute time
    insert: DriverStatement  # the window's row (a replay of a committed window changes nothing)
    drop: DriverStatement  # the frontier state of an earlier window, no longer needed


# by engine (its dialect object: the compiled form carries that engine's bind processors, e.g. its JSON serializer);
# an engine's entry goes with it
_COMMIT: weakref.WeakKeyDictionary[sa.Dialect, _CommitStatements] = weakref.WeakKeyDictionary()
_WINDOW_ROW = frozenset({"run_id", "window", "snapshot", "metrics", "frontier", "worker", "created_at"})


def _commit_statements(dialect: sa.Dialect) -> _CommitStatements:
    got = _COMMIT.get(dialect)
    if got is None:
        runs, W = cast(sa.Table, ScenarioRun.__table__), cast(sa.Table, WindowRecord.__table__)
        R = runs.c
        advance = (sa.update(runs)
                   .where(R.id == sa.bindparam("b_run"), R.lease_owner == sa.bindparam("b_owner"),
                          R.next_window == sa.bindparam("b_window"), R.status == RunStatus.running)
                   .values(next_window=sa.bindparam("b_next"), lease_expires_at=sa.bindparam("b_lease"),
                           compute_s=R.compute_s + sa.bindparam("b_compute_s", type_=sa.Float)))
        # the dialects' own ``insert().on_conflict_do_nothing()`` is never cached (SQLAlchemy 2.0 gives it no cache
        # key); the same statement as text, with the columns' types on its parameters (JSON through
        # shared.json_codec). ON CONFLICT ... DO NOTHING: PostgreSQL, SQLite >= 3.24
        q = dialect.identifier_preparer.quote
        names = [c.name for c in W.columns]
        if set(names) != _WINDOW_ROW:  # the text lists every column: a new one needs its value in commit_window
            raise RuntimeError(f"windows has columns {sorted(names)}; commit_window writes {sorted(_WINDOW_ROW)}")
        insert = sa.text(f"INSERT INTO {q(W.name)} ({', '.join(q(n) for n in names)}) "
                         f"VALUES ({', '.join(':' + n for n in names)}) "
                         f"ON CONFLICT ({q('run_id')}, {q('window')}) DO NOTHING"
                         ).bindparams(*(sa.bindparam(c.name, type_=c.type) for c in W.columns))
        drop = (sa.update(W).where(W.c.run_id == sa.bindparam("b_run"), W.c.window == sa.bindparam("b_drop"))
                .values(frontier=None))
        got = _COMMIT[dialect] = _CommitStatements(
            advance=DriverStatement.of(advance, dialect), insert=DriverStatement.of(insert, dialect),
            drop=DriverStatement.of(drop, dialect))
    return got


def _engine(sessions: sessionmaker[Session]) -> sa.Engine:
    """The engine a session factory binds its sessions to (`services.orchestrator.db.session_factory`)."""
    bind = sessions.kw.get("bind")
    if not isinstance(bind, sa.Engine):
        raise TypeError("the session factory is not bound to an engine")
    return bind


def commit_window(*, sessions: sessionmaker[Session], run_id: str, owner: str, window: int,
                  snapshot: dict[str, Any] | json_codec.Encoded, metrics: dict[str, Any] | json_codec.Encoded,
                  frontier: dict[str, Any], lease_s: float, compute_s: float = 0.0,
                  drop_frontiers: Sequence[int] | None = None) -> bool:
    """Commit window ``window`` (the frontier moves to window+1) in one transaction; False = lease lost, stop.
    ``snapshot`` and ``metrics``: JSON objects, or the same already encoded (`shared.json_codec.encoded`: the
    window loop's models written once by pydantic, not turned into Python objects first).
    ``drop_frontiers``: the earlier windows whose frontier state is no longer needed (default: window - 1, so only
    the newest keeps one; the window loop also keeps its last checkpoint's)."""
    now = utcnow()
    engine = _engine(sessions)
    st = _commit_statements(engine.dialect)
    with driver_sql.transaction(engine) as tx:
        if tx.execute(st.advance, {"b_run": run_id, "b_owner": owner, "b_window": window, "b_next": window + 1,
                                   "b_lease": now + timedelta(seconds=lease_s), "b_compute_s": compute_s}) != 1:
            tx.abort()
            return False
        tx.execute(st.insert, {"run_id": run_id, "window": window, "snapshot": snapshot, "metrics": metrics,
                               "frontier": frontier, "worker": owner, "created_at": now})  # every `_WINDOW_ROW`
        drop = [window - 1] if drop_frontiers is None else [w for w in drop_frontiers if 0 <= w < window]
        for w in drop if window > 0 else []:  # only the newest window (and a checkpoint) keeps its frontier state
            tx.execute(st.drop, {"b_run": run_id, "b_drop": w})
    return True


def load_frontier_at(*, sessions: sessionmaker[Session], run_id: str, window: int) -> dict[str, Any]:
    """The frontier state saved with ``window`` (a checkpoint the window loop kept); an error when it is gone."""
    with sessions() as s:
        row = s.execute(sa.select(WindowRecord.frontier)
                        .where(WindowRecord.run_id == run_id, WindowRecord.window == window)).first()
    if row is None or row[0] is None:
        raise RuntimeError(f"run {run_id}: frontier state of window {window} (a checkpoint) is missing")
    frontier: dict[str, Any] = row[0]
    return frontier


def load_frontier(*, sessions: sessionmaker[Session], run_id: str, next_window: int) -> dict[str, Any] | None:
    """The state saved with window next_window-1 (None when next_window == 0: start from scratch)."""
    if next_window <= 0:
        return None
    with sessions() as s:
        row = s.execute(sa.select(WindowRecord.frontier)
                        .where(WindowRecord.run_id == run_id, WindowRecord.window == next_window - 1)).first()
    if row is None or row[0] is None:
        raise RuntimeError(f"run {run_id}: frontier state of window {next_window - 1} is missing")
    frontier: dict[str, Any] = row[0]
    return frontier


def window_metrics(*, session: Session, run_id: str, offset: int = 0, limit: int | None = None
                   ) -> list[dict[str, Any]]:
    """The run's committed windows' metrics in window order, from window ``offset``, at most ``limit`` of them."""
    q = (sa.select(WindowRecord.metrics).where(WindowRecord.run_id == run_id, WindowRecord.window >= offset)
         .order_by(WindowRecord.window))
    if limit is not None:
        q = q.limit(limit)
    return [r[0] for r in session.execute(q).all()]


def iter_window_metrics(*, sessions: sessionmaker[Session], run_id: str, chunk: int = 500
                        ) -> Iterator[list[dict[str, Any]]]:
    """The run's windows' metrics in chunks of ``chunk`` windows (window order), one short session per chunk:
    a run of 10^4 windows is ~150 MB of JSON, never held at once."""
    offset = 0
    while True:
        with sessions() as s:
            part = window_metrics(session=s, run_id=run_id, offset=offset, limit=chunk)
        if not part:
            return
        yield part
        offset = int(part[-1]["window"]) + 1


def window_count(*, session: Session, run_id: str) -> int:
    return int(session.scalar(sa.select(sa.func.count()).select_from(WindowRecord)
                              .where(WindowRecord.run_id == run_id)) or 0)


def finish_run(*, sessions: sessionmaker[Session], run_id: str, owner: str, status: RunStatus,
               error: str | None = None, result_row: dict[str, Any] | None = None) -> bool:
    """Close the run (fenced on the lease); False if the run is no longer ours."""
    R = ScenarioRun
    with sessions.begin() as s:
        res = s.execute(
            sa.update(R).where(R.id == run_id, R.lease_owner == owner, R.status == RunStatus.running)
            .values(status=status, error=error, result_row=result_row, finished_at=utcnow(), lease_owner=None,
                    lease_expires_at=None)
            .execution_options(synchronize_session=False))
        ok = _rowcount(res) == 1
        run = s.get(R, run_id)
        if run is not None:
            refresh_experiment_status(session=s, exp_id=run.experiment_id)
        return ok


LeaseBeat = Literal["extended", "expired", "lost"]


def extend_lease(*, sessions: sessionmaker[Session], run_id: str, owner: str, lease_s: float) -> LeaseBeat:
    """Heartbeat: push a live lease of ours ``lease_s`` ahead. Fenced on owner, status running and a lease that has
    not expired (or been given back by `release_lease`): a heartbeat never revives a lease. ``"expired"``: still
    ours but not live (a late beat, or given back: the next window commit renews it, or the run stops);
    ``"lost"``: another owner has it, or the run is no longer running."""
    R = ScenarioRun
    with sessions.begin() as s:
        now = utcnow()
        res = s.execute(sa.update(R).where(R.id == run_id, R.lease_owner == owner, R.status == RunStatus.running,
                                           R.lease_expires_at >= now)
                        .values(lease_expires_at=now + timedelta(seconds=lease_s))
                        .execution_options(synchronize_session=False))
        if _rowcount(res) == 1:
            return "extended"
        ours = s.scalar(sa.select(sa.func.count()).select_from(R).where(
            R.id == run_id, R.lease_owner == owner, R.status == RunStatus.running))
        return "expired" if ours else "lost"


# A lease given back is dated this far in the past: a heartbeat that read the clock before it (and then waited on
# the row) still finds it expired and does not revive it.
RELEASED_AGO = timedelta(days=1)


def release_lease(*, sessions: sessionmaker[Session], run_id: str, owner: str) -> None:
    """Give the lease back without finishing (graceful shutdown): another worker may claim it at once."""
    R = ScenarioRun
    with sessions.begin() as s:
        s.execute(sa.update(R).where(R.id == run_id, R.lease_owner == owner, R.status == RunStatus.running)
                  .values(lease_expires_at=utcnow() - RELEASED_AGO)
                  .execution_options(synchronize_session=False))


def set_waiting(*, sessions: sessionmaker[Session], run_id: str, owner: str, reason: str | None,
                lease_s: float) -> bool:
    """Record (``reason``) or clear (None) the outage the run waits out, renewing its lease (fenced on it: False when
    the run is no longer ours, e.g. cancelled while it waited)."""
    R = ScenarioRun
    now = utcnow()
    values: dict[str, Any] = {"lease_expires_at": now + timedelta(seconds=lease_s), "waiting_reason": reason}
    if reason is None:
        values["waiting_since"] = None
    with sessions.begin() as s:
        res = s.execute(sa.update(R).where(R.id == run_id, R.lease_owner == owner, R.status == RunStatus.running)
                        .values(**values).execution_options(synchronize_session=False))
        if reason is not None:
            s.execute(sa.update(R).where(R.id == run_id, R.waiting_since.is_(None)).values(waiting_since=now)
                      .execution_options(synchronize_session=False))
        return _rowcount(res) == 1


def retry_experiment(*, session: Session, exp_id: str) -> list[str]:
    """Put the experiment's failed runs back in the queue, to resume at their frontier (their committed windows
    stay): attempts start again, the error is cleared, and the experiment is to be finalised again. The run ids."""
    R, E = ScenarioRun, Experiment
    ids = list(session.scalars(sa.select(R.id).where(R.experiment_id == exp_id, R.status == RunStatus.failed)))
    if not ids:
        return []
    session.execute(sa.update(R).where(R.id.in_(ids))
                    .values(status=RunStatus.queued, attempts=0, error=None, finished_at=None, lease_owner=None,
                            lease_expires_at=None, waiting_reason=None, waiting_since=None, enqueued_at=None)
                    .execution_options(synchronize_session=False))
    session.execute(sa.update(E).where(E.id == exp_id)
                    .values(finalized_at=None, finalize_lease_until=None, error=None)
                    .execution_options(synchronize_session=False))
    session.expire_all()
    refresh_experiment_status(session=session, exp_id=exp_id)
    return ids


def note_delivery(*, sessions: sessionmaker[Session], run_id: str) -> None:
    """A task for the run started (counted: an undisturbed run is delivered once)."""
    R = ScenarioRun
    with sessions.begin() as s:
        s.execute(sa.update(R).where(R.id == run_id).values(deliveries=R.deliveries + 1)
                  .execution_options(synchronize_session=False))


def mark_enqueued(*, sessions: sessionmaker[Session], run_ids: list[str], now: datetime | None = None) -> None:
    """The runs were handed to the queue (the reaper leaves a queued run alone while its hand-off is recent)."""
    if not run_ids:
        return
    R = ScenarioRun
    with sessions.begin() as s:
        s.execute(sa.update(R).where(R.id.in_(run_ids)).values(enqueued_at=now or utcnow())
                  .execution_options(synchronize_session=False))


def runs_to_redeliver(*, session: Session, now: datetime | None = None, handoff_grace_s: float,
                      requeue_after_s: float) -> list[str]:
    """What a reaper re-enqueues: running runs whose lease expired (their worker died); queued runs never handed to
    the queue (the process that created them died before it could) once ``handoff_grace_s`` passed since their
    creation; queued runs whose hand-off is older than ``requeue_after_s`` (the broker lost the message). A queued
    run that waits its turn in the queue is left alone: it is not a lost run."""
    now = now or utcnow()
    R, E = ScenarioRun, Experiment
    expired = sa.and_(R.status == RunStatus.running, R.lease_expires_at < now)
    never_handed = sa.and_(R.status == RunStatus.queued, R.enqueued_at.is_(None),
                           E.created_at < now - timedelta(seconds=handoff_grace_s))
    lost = sa.and_(R.status == RunStatus.queued, R.enqueued_at < now - timedelta(seconds=requeue_after_s))
    q = sa.select(R.id).join(E, R.experiment_id == E.id).where(sa.or_(expired, never_handed, lost))
    return list(session.scalars(q.order_by(R.id)))


def claim_finalize(*, sessions: sessionmaker[Session], exp_id: str, lease_s: float,
                   now: datetime | None = None) -> bool:
    """Take the experiment's finalisation (compare-and-set): True for exactly one caller while the files are not
    written, every run is finished and no other process holds the finalisation (its lease expired if it died)."""
    now = now or utcnow()
    E, R = Experiment, ScenarioRun
    unfinished = sa.select(R.id).where(R.experiment_id == exp_id, R.status.in_([RunStatus.queued, RunStatus.running]))
    with sessions.begin() as s:
        res = s.execute(
            sa.update(E).where(E.id == exp_id, E.finalized_at.is_(None),
                               sa.or_(E.finalize_lease_until.is_(None), E.finalize_lease_until < now),
                               ~sa.exists(unfinished))
            .values(finalize_lease_until=now + timedelta(seconds=lease_s))
            .execution_options(synchronize_session=False))
        return _rowcount(res) == 1


def finish_finalize(*, sessions: sessionmaker[Session], exp_id: str, error: str | None = None) -> None:
    """The experiment's files are written (or, with ``error``, could not be: shown on the experiment): record it,
    and only now may its status become "succeeded"."""
    E = Experiment
    with sessions.begin() as s:
        s.execute(sa.update(E).where(E.id == exp_id)
                  .values(finalized_at=utcnow(), finalize_lease_until=None, finalizations=E.finalizations + 1)
                  .execution_options(synchronize_session=False))
        refresh_experiment_status(session=s, exp_id=exp_id)
        if error is not None:
            exp = s.get(E, exp_id)
            if exp is not None:
                exp.error = error


def unfinalized_experiments(*, session: Session, now: datetime | None = None) -> list[str]:
    """Experiments whose runs all finished but whose files were never written (the finalising process died)."""
    now = now or utcnow()
    E, R = Experiment, ScenarioRun
    unfinished = sa.select(R.experiment_id).where(R.status.in_([RunStatus.queued, RunStatus.running]))
    q = sa.select(E.id).where(E.finalized_at.is_(None), E.id.not_in(unfinished),
                              sa.or_(E.finalize_lease_until.is_(None), E.finalize_lease_until < now),
                              sa.exists(sa.select(R.id).where(R.experiment_id == E.id)))
    return list(session.scalars(q.order_by(E.created_at, E.id)))


def stale_runs(*, session: Session, now: datetime | None = None) -> list[str]:
    """Runs a worker should pick up: queued ones, and running ones whose lease expired."""
    now = now or utcnow()
    R = ScenarioRun
    q = sa.select(R.id).where(sa.or_(R.status == RunStatus.queued,
                                     sa.and_(R.status == RunStatus.running, R.lease_expires_at < now)))
    return list(session.scalars(q.order_by(R.id)))


def abandoned_experiments(*, session: Session, now: datetime | None = None) -> list[str]:
    """Unfinished experiments no process is running: every unfinished run is queued or holds an expired lease
    (an interrupted ``tasmoe run``: its worker processes died with it). Oldest first."""
    now = now or utcnow()
    R, E = ScenarioRun, Experiment
    live = sa.select(R.experiment_id).where(R.status == RunStatus.running, R.lease_expires_at >= now)
    unfinished = sa.select(R.experiment_id).where(R.status.in_([RunStatus.queued, RunStatus.running]))
    q = sa.select(E.id).where(E.id.in_(unfinished), E.id.not_in(live)).order_by(E.created_at, E.id)
    return list(session.scalars(q))


# ------------------------------------------------------------------------------------------------------------ jobs


def add_job(*, session: Session, job_id: str, kind: str, payload: dict[str, Any], owner: str = "local") -> Job:
    job = Job(id=job_id, kind=kind, payload=payload, status=RunStatus.queued, owner=owner)
    session.add(job)
    return job


def get_job(*, session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)
