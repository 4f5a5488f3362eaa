"""Orchestrator-only settings (same ``TASMOE_`` environment prefix as the shared settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.settings import Settings


class OrchestratorSettings(Settings):
    lease_s: float = Field(default=60.0, gt=0,
                           description="a run's lease; renewed at every committed window and by a heartbeat every "
                                       "lease_s / 3")
    requeue_after_s: float = Field(
        default=6 * 3600.0, gt=0,
        description="cluster mode: a queued run handed to the queue this long ago is handed again (the broker lost "
                    "its message); a queued run that waits its turn is otherwise never re-enqueued")
    quota_active_runs: int = Field(
        default=256, ge=1, le=10**6,
        description="queued + running runs one principal may have; more is a 429 with Retry-After (a sweep counts "
                    "points x scenarios)")
    outage_budget_s: float = Field(
        default=600.0, ge=0, le=7 * 86400.0,
        description="how long a run waits out an unreachable compute service or run-state database (status "
                    "waiting, retried with capped backoff, then resumed at its frontier) before it fails; 0: fail at "
                    "once")
    outage_backoff_max_s: float = Field(default=30.0, gt=0, le=3600.0,
                                        description="the longest pause between two tries during an outage")
    max_attempts: int = Field(default=3, ge=1, le=100, description="claims of one run before it is failed")
    retention_days: float | None = Field(
        default=None, gt=0, le=36500,
        description="finished experiments (succeeded, failed, cancelled) older than this are deleted from the run "
                    "database by the API server at start-up and by the cluster's reaper (results folders are kept); "
                    "unset: kept until tasmoe experiments prune")
    epoch_windows: int = Field(
        default=256, ge=1, le=1024,
        description="the most windows one control epoch advances (one call to each compute service): epochs grow "
                    "up to it while nothing happens and shrink after a DVFS, refresh or TACS event; the results do "
                    "not depend on it. 1: the per-window loop, the reference (tasmoe run --epoch 1)")
    pool_workers: int = Field(default=2, ge=1, le=64,
                              description="embedded mode: runs executed at once (about the number of cores)")
    pool: Literal["process", "thread"] = Field(
        default="process",
        description="embedded runs of make run / tasmoe run / run_all: 'process' (worker processes, each with its own "
                    "in-process services: uses every core) or 'thread' (one process; threads share one core under the "
                    "GIL). The API server's embedded runtime always uses threads.")
    task_time_limit_s: float = Field(default=4 * 3600.0, gt=0, description="Celery hard time limit of one run")
    celery_queue: str = Field(default="tasmoe", min_length=1, description="the Celery queue runs are sent to")
    resume_stale: bool = Field(
        default=False,
        description="embedded API server (tasmoe serve): at start-up, resume experiments another process left "
                    "unfinished (an interrupted tasmoe run / make run). Off: they are listed in the log and left "
                    "alone (tasmoe experiments list|cancel|clean). Celery workers always resume expired runs")
    link_token_ttl_s: int = Field(
        default=600, ge=30, le=86400,
        description="lifetime of a link token (GET /v1/experiments/{id}/token): the dashboard's read access to one "
                    "experiment where a browser sends no header (its event stream, figures, downloads)")
    link_secret: str = Field(
        default="", repr=False,
        description="the HMAC secret of link tokens (at least 16 characters; the same on every orchestrator "
                    "replica); empty: derived from TASMOE_SERVICE_KEY, else random per process")
    worker_services: str = Field(
        default="urls", min_length=1,
        description="how a Celery worker reaches the compute services: 'urls' (TASMOE_<SERVICE>_URL), 'embedded' "
                    "(in-process apps) or 'module:factory' returning {service: ASGI app}")


def orchestrator_settings(base: Settings | None = None) -> OrchestratorSettings:
    """Orchestrator settings from the environment, or layered over an explicit `Settings` (tests)."""
    if base is None:
        return OrchestratorSettings()
    if isinstance(base, OrchestratorSettings):
        return base
    return OrchestratorSettings(**base.model_dump())
