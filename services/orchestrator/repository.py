"""Queries on the run-state database. Every function takes its session (or session factory) as a keyword argument.

The two that make runs crash-safe:

- `claim_run`: take (or re-take) a run's lease in one conditional UPDATE. A lease that expired (its worker died) can
  be taken by anyone; every claim counts one attempt, and a run whose attempts are used up is failed instead of
  claimed, so a run that keeps killing its worker stops cleanly.
- `commit_epoch`: an epoch's windows k .. e are committed by ONE fenced update that moves the frontier and saves its
  state: ``UPDATE scenario_runs SET next_window = e+1, frontier = ... WHERE id = :id AND lease_owner = :me AND
  next_window = :k`` decides: 0 rows means another worker owns the run now (or it was cancelled), so the caller stops
  without anything committed. The windows' own records are the run's files, appended before the commit and cut back
  to the frontier's sizes on resume (`services.orchestrator.run_files`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator.models import (
    TERMINAL,
    Experiment,
    Handoff,
    Job,
    QuotaLock,
    RunStatus,
    ScenarioRun,
    utcnow,
)

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


def get_experiment_by_key(*, session: Session, owner: str, idempotency_key: str) -> Experiment | None:
    """The principal's experiment submitted with this key (keys are per principal)."""
    return session.scalars(sa.select(Experiment).where(Experiment.owner == owner,
                                                       Experiment.idempotency_key == idempotency_key)).first()


# Expected cost of a scenario's run, for the order runs are handed to workers: longest first (LPT), so that the
# last run to finish is a short one. TAPS solves a placement before its first window; TACS adds a step per window
# and the migrations' traffic. Measured on the default Mixtral experiment (make run, 2 workers): baseline 19.6 s,
# tacs 21.3 s, taps 22.7 s, tas 23.4 s; in position order the two workers ended 5.2 s apart, in this order 0-0.7 s.
COST_RANK = {"tas": 0, "taps": 1, "tacs": 2, "baseline": 3, "unthrottled": 3}


def cost_order(scenario: str, position: int) -> tuple[int, int]:
    """Sort key of an experiment's runs: the most expensive scenario first (`COST_RANK`)."""
    return COST_RANK.get(scenario, -1), position


def add_experiment(*, session: Session, exp_id: str, name: str, configs: dict[str, Any], seed: int,
                   scenarios: Sequence[str], out_dir: str, idempotency_key: str | None, request_hash: str,
                   max_attempts: int, sweep_id: str | None = None, owner: str = "local") -> Experiment:
    """Insert an experiment, one queued run per scenario and the runs' hand-offs to the queue, most expensive first
    (the caller commits: all of it or nothing)."""
    exp = Experiment(id=exp_id, name=name, configs=configs, seed=seed, out_dir=out_dir,
                     idempotency_key=idempotency_key, request_hash=request_hash, sweep_id=sweep_id,
                     status=RunStatus.queued, owner=owner)
    session.add(exp)
    for i, sc in enumerate(scenarios):
        session.add(ScenarioRun(id=run_id_for(exp_id, sc), experiment_id=exp_id, scenario=sc, position=i,
                                status=RunStatus.queued, max_attempts=max_attempts, next_window=0, attempts=0))
    session.flush()  # the runs before the rows that refer to them
    order = sorted(range(len(scenarios)), key=lambda i: cost_order(scenarios[i], i))
    add_handoffs(session=session, run_ids=[run_id_for(exp_id, scenarios[i]) for i in order])
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
                    started_at=sa.func.coalesce(R.started_at, now), waiting_reason=None, waiting_since=None)
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


def commit_epoch(*, sessions: sessionmaker[Session], run_id: str, owner: str, first: int, next_window: int,
                 frontier: dict[str, Any], lease_s: float, compute_s: float = 0.0) -> bool:
    """Commit windows ``first`` .. ``next_window - 1`` (the frontier moves to ``next_window`` with its state) in one
    fenced update; False = lease lost (or the run was cancelled): stop, nothing was committed. The run's waiting
    mark (an outage it waited out) is cleared: it made progress again."""
    R = ScenarioRun
    now = utcnow()
    with sessions.begin() as s:
        res = s.execute(
            sa.update(R).where(R.id == run_id, R.lease_owner == owner, R.next_window == first,
                               R.status == RunStatus.running)
            .values(next_window=next_window, frontier=frontier, lease_expires_at=now + timedelta(seconds=lease_s),
                    compute_s=R.compute_s + compute_s, waiting_reason=None, waiting_since=None)
            .execution_options(synchronize_session=False))
        return _rowcount(res) == 1


def load_frontier(*, sessions: sessionmaker[Session], run_id: str, next_window: int) -> dict[str, Any] | None:
    """The state saved with the commit that moved the frontier to ``next_window`` (None when next_window == 0:
    start from scratch)."""
    if next_window <= 0:
        return None
    with sessions() as s:
        frontier = s.scalar(sa.select(ScenarioRun.frontier).where(ScenarioRun.id == run_id,
                                                                  ScenarioRun.next_window == next_window))
    if frontier is None:
        raise RuntimeError(f"run {run_id}: the frontier state of window {next_window} is missing")
    return dict(frontier)


def finish_run(*, sessions: sessionmaker[Session], run_id: str, owner: str, status: RunStatus,
               error: str | None = None, result_row: dict[str, Any] | None = None) -> bool:
    """Close the run (fenced on the lease); False if the run is no longer ours. A run that succeeded drops its
    frontier state (a failed one keeps it: ``POST .../retry`` resumes there)."""
    R = ScenarioRun
    values: dict[str, Any] = {"status": status, "error": error, "result_row": result_row, "finished_at": utcnow(),
                              "lease_owner": None, "lease_expires_at": None, "waiting_reason": None,
                              "waiting_since": None}
    if status == RunStatus.succeeded:
        values["frontier"] = None
    with sessions.begin() as s:
        res = s.execute(
            sa.update(R).where(R.id == run_id, R.lease_owner == owner, R.status == RunStatus.running)
            .values(**values)
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
    """Record (``reason``) or clear (None) the outage the run waits out, renewing its lease (fenced on the owner, not
    on the lease's expiry: a run that waited out a database outage longer than its lease takes its lease back here,
    unless another worker claimed the run meanwhile). False when the run is no longer ours (cancelled, finished or
    claimed by another worker). The mark stays while the run tries again; its next committed epoch clears it."""
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
    runs = [r for r in runs_of(session=session, exp_id=exp_id) if r.id in set(ids)]
    add_handoffs(session=session, run_ids=[r.id for r in sorted(runs, key=lambda r: cost_order(r.scenario,
                                                                                                r.position))])
    return ids


# ------------------------------------------------------------------------------------------- hand-offs (outbox)


def add_handoffs(*, session: Session, run_ids: Sequence[str]) -> None:
    """Queue the runs' hand-offs, in this order, in the caller's transaction (`models.Handoff`)."""
    now = utcnow()
    session.add_all([Handoff(run_id=r, created_at=now) for r in run_ids])
    session.flush()


@dataclass(frozen=True)
class PendingHandoff:
    id: int
    run_id: str
    queued: bool  # the run still waits for a worker (else it was cancelled, claimed or finished meanwhile)


def take_handoffs(*, session: Session, limit: int) -> list[PendingHandoff]:
    """The oldest hand-offs, locked for the caller's transaction: PostgreSQL skips the rows another relay holds
    (``FOR UPDATE SKIP LOCKED``), so two relays never send the same hand-off; on SQLite the transaction already
    holds the database's write lock (``BEGIN IMMEDIATE``)."""
    H, R = Handoff, ScenarioRun
    q = (sa.select(H.id, H.run_id, R.status).join(R, R.id == H.run_id).order_by(H.id).limit(limit)
         .with_for_update(of=H, skip_locked=True))
    return [PendingHandoff(int(i), str(r), st == RunStatus.queued) for i, r, st in session.execute(q)]


def drop_handoffs(*, session: Session, ids: Sequence[int]) -> None:
    if ids:
        session.execute(sa.delete(Handoff).where(Handoff.id.in_(list(ids))).execution_options(
            synchronize_session=False))


def drop_handoffs_of(*, sessions: sessionmaker[Session], run_ids: Sequence[str]) -> None:
    """The runs were handed over some other way (the embedded pool took them): their hand-offs are done."""
    if not run_ids:
        return
    with sessions.begin() as s:
        s.execute(sa.delete(Handoff).where(Handoff.run_id.in_(list(run_ids))).execution_options(
            synchronize_session=False))


def count_handoffs(*, session: Session, exp_id: str | None = None) -> int:
    q = sa.select(sa.func.count()).select_from(Handoff)
    if exp_id is not None:
        q = q.join(ScenarioRun, ScenarioRun.id == Handoff.run_id).where(ScenarioRun.experiment_id == exp_id)
    return int(session.scalar(q) or 0)


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
    with sessions.begin() as s:
        mark_enqueued_in(session=s, run_ids=run_ids, now=now)


def mark_enqueued_in(*, session: Session, run_ids: Sequence[str], now: datetime | None = None) -> None:
    """`mark_enqueued` in the caller's transaction."""
    if run_ids:
        R = ScenarioRun
        session.execute(sa.update(R).where(R.id.in_(list(run_ids))).values(enqueued_at=now or utcnow())
                        .execution_options(synchronize_session=False))


def runs_to_redeliver(*, session: Session, now: datetime | None = None, handoff_grace_s: float,
                      requeue_after_s: float, expired: bool = True) -> list[str]:
    """What a reaper re-enqueues: running runs whose lease expired (their worker died; not with ``expired=False``),
    unless they were handed to the queue less than ``handoff_grace_s`` ago (a reaper re-enqueued one already: the
    worker that takes it has that long to claim it, instead of a duplicate per reaper pass piling up in the queue);
    queued runs never handed to the queue and with no hand-off waiting in the outbox (created before it existed)
    once ``handoff_grace_s`` passed since their creation; queued runs whose hand-off is older than
    ``requeue_after_s`` (the broker lost the message). A queued run that waits its turn in the queue is left alone:
    it is not a lost run; nor is one whose hand-off waits in the outbox (the relay sends it)."""
    now = now or utcnow()
    R, E = ScenarioRun, Experiment
    handed_long_ago = sa.or_(R.enqueued_at.is_(None), R.enqueued_at < now - timedelta(seconds=handoff_grace_s))
    lease_gone = (sa.and_(R.status == RunStatus.running, R.lease_expires_at < now, handed_long_ago) if expired
                  else sa.false())
    pending = sa.exists(sa.select(Handoff.id).where(Handoff.run_id == R.id))
    never_handed = sa.and_(R.status == RunStatus.queued, R.enqueued_at.is_(None), ~pending,
                           E.created_at < now - timedelta(seconds=handoff_grace_s))
    lost = sa.and_(R.status == RunStatus.queued, R.enqueued_at < now - timedelta(seconds=requeue_after_s))
    q = sa.select(R.id).join(E, R.experiment_id == E.id).where(sa.or_(lease_gone, never_handed, lost))
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


def apply_retention(*, sessions: sessionmaker[Session], retention_days: float | None) -> list[str]:
    """`prune_experiments` of the experiments finished more than ``retention_days`` ago (None: nothing)."""
    if retention_days is None:
        return []
    with sessions.begin() as s:
        return prune_experiments(session=s, older_than=utcnow() - timedelta(days=retention_days))


def prune_experiments(*, session: Session, older_than: datetime) -> list[str]:
    """Delete the finished experiments (succeeded, failed or cancelled) last updated before ``older_than``, with
    their runs and their runs' placement job rows; their results folders are left alone. The ids, oldest first."""
    E, R = Experiment, ScenarioRun
    q = (sa.select(E.id).where(E.status.in_(list(TERMINAL)), E.updated_at < older_than)
         .order_by(E.created_at, E.id))
    found = list(session.scalars(q))
    for exp_id in found:
        run_ids = list(session.scalars(sa.select(R.id).where(R.experiment_id == exp_id)))
        session.execute(sa.delete(Job).where(Job.id.in_([f"plc-{r}" for r in run_ids]))
                        .execution_options(synchronize_session=False))
        session.execute(sa.delete(R).where(R.experiment_id == exp_id).execution_options(synchronize_session=False))
        session.execute(sa.delete(E).where(E.id == exp_id).execution_options(synchronize_session=False))
    return found


# ------------------------------------------------------------------------------------------------------------ jobs


def add_job(*, session: Session, job_id: str, kind: str, payload: dict[str, Any], owner: str = "local") -> Job:
    job = Job(id=job_id, kind=kind, payload=payload, status=RunStatus.queued, owner=owner)
    session.add(job)
    return job


def get_job(*, session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)
