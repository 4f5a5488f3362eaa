"""Durable run state (SQLAlchemy 2 typed models): experiments, scenario runs, committed windows, jobs, the
principals' quota locks, and the runs' hand-offs to the queue (the outbox).

Times are naive UTC datetimes (the same on SQLite and PostgreSQL, so lease comparisons in SQL agree on both).
JSON columns hold plain JSON (not JSONB) so floats round-trip exactly as written.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from shared.db import Base


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class RunStatus(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL: frozenset[RunStatus] = frozenset({RunStatus.succeeded, RunStatus.failed, RunStatus.cancelled})


def _status_enum(name: str) -> sa.Enum:
    # native_enum=False: a VARCHAR + CHECK constraint, identical on SQLite and PostgreSQL.
    return sa.Enum(RunStatus, name=name, native_enum=False, create_constraint=True, length=16,
                   values_callable=lambda e: [m.value for m in e])


class Experiment(Base):
    __tablename__ = "experiments"
    # an Idempotency-Key is the principal's own: two principals may use the same key for two experiments
    __table_args__ = (sa.UniqueConstraint("owner", "idempotency_key", name="uq_experiments_owner_idempotency_key"),)

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), default="")
    status: Mapped[RunStatus] = mapped_column(_status_enum("experiment_status"), default=RunStatus.queued,
                                              index=True)
    configs: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    seed: Mapped[int] = mapped_column(sa.BigInteger)
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(200))
    request_hash: Mapped[str] = mapped_column(sa.String(64), default="")
    out_dir: Mapped[str] = mapped_column(sa.String(1000))
    sweep_id: Mapped[str | None] = mapped_column(sa.String(40), index=True)
    owner: Mapped[str] = mapped_column(sa.String(64), default="local", index=True)  # the API key's principal
    created_at: Mapped[datetime] = mapped_column(sa.DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(sa.DateTime, default=utcnow, onupdate=utcnow)
    error: Mapped[str | None] = mapped_column(sa.Text)
    # finalisation (summary, comparison, plots) happens once: a process takes it by setting finalize_lease_until
    # (compare-and-set), writes the files, then sets finalized_at; "succeeded" waits for finalized_at
    finalize_lease_until: Mapped[datetime | None] = mapped_column(sa.DateTime)
    finalized_at: Mapped[datetime | None] = mapped_column(sa.DateTime)
    finalizations: Mapped[int] = mapped_column(sa.Integer, default=0)  # times finalisation ran to the end

    runs: Mapped[list[ScenarioRun]] = relationship(back_populates="experiment", order_by="ScenarioRun.position")


class ScenarioRun(Base):
    __tablename__ = "scenario_runs"
    __table_args__ = (sa.UniqueConstraint("experiment_id", "scenario"),)

    id: Mapped[str] = mapped_column(sa.String(60), primary_key=True)
    experiment_id: Mapped[str] = mapped_column(sa.ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    scenario: Mapped[str] = mapped_column(sa.String(20))
    position: Mapped[int] = mapped_column(sa.Integer, default=0)
    status: Mapped[RunStatus] = mapped_column(_status_enum("run_status"), default=RunStatus.queued, index=True)
    lease_owner: Mapped[str | None] = mapped_column(sa.String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(sa.DateTime)
    next_window: Mapped[int] = mapped_column(sa.Integer, default=0)
    n_windows: Mapped[int | None] = mapped_column(sa.Integer)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(sa.Integer, default=3)
    started_at: Mapped[datetime | None] = mapped_column(sa.DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(sa.DateTime)
    compute_s: Mapped[float] = mapped_column(sa.Float, default=0.0)  # wall time spent in the window loop
    error: Mapped[str | None] = mapped_column(sa.Text)
    result_row: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    enqueued_at: Mapped[datetime | None] = mapped_column(sa.DateTime)  # last handed to the queue (cluster mode)
    deliveries: Mapped[int] = mapped_column(sa.Integer, default=0)  # times a task for this run started
    # set while the run waits out an outage of a service it needs (cleared when it tries again)
    waiting_reason: Mapped[str | None] = mapped_column(sa.Text)
    waiting_since: Mapped[datetime | None] = mapped_column(sa.DateTime)
    # what window next_window starts from (the window loop's `Frontier`), saved with each epoch's commit; cleared
    # when the run ends
    frontier: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON(none_as_null=True))

    experiment: Mapped[Experiment] = relationship(back_populates="runs")


class Job(Base):
    """A unit of background work: a scenario run task, a sweep, or a placement MILP poll."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(40), index=True)
    status: Mapped[RunStatus] = mapped_column(_status_enum("job_status"), default=RunStatus.queued)
    payload: Mapped[dict[str, Any]] = mapped_column(sa.JSON, default=dict)
    owner: Mapped[str] = mapped_column(sa.String(64), default="local")  # the API key's principal
    result: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(sa.DateTime, default=utcnow, onupdate=utcnow)


class QuotaLock(Base):
    """One row per principal that submitted with a quota: a submission locks its row (``SELECT ... FOR UPDATE``) for
    the rest of its transaction, so one principal's quota checks and inserts happen one at a time. The row holds no
    count: the quota counts the principal's queued and running runs under the lock (nothing to keep in step, nothing
    to drift when runs finish)."""

    __tablename__ = "quota_locks"

    owner: Mapped[str] = mapped_column(sa.String(64), primary_key=True)  # the API key's principal


class Handoff(Base):
    """The outbox of the runs' hand-offs to the queue: one row per run to send, written in the transaction that
    queues the run (an experiment's creation, a retry), so a submission is accepted whole (its runs and their
    hand-off) or refused whole, whatever the broker's state. A relay sends the rows to Celery and deletes them once
    the broker took each message (`services.orchestrator.outbox`); the embedded pool takes them directly."""

    __tablename__ = "handoffs"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("scenario_runs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime, default=utcnow)
