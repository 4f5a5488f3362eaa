"""The orchestrator's Celery app (``celery -A services.orchestrator.celery_app worker``): cluster-mode runs.

Broker and result backend: ``TASMOE_REDIS_URL``. One task per experiment-scenario (``tasmoe.run_scenario``), which
runs the whole window loop; ``worker_prefetch_multiplier=1`` so a worker never sits on runs it is not running; hard and
soft time limits from ``TASMOE_TASK_TIME_LIMIT_S``; tasks never wait on other tasks (no ``.get()`` inside a task).

Acknowledgement choice: **acks_late is OFF** (a task is acknowledged when a worker takes it). A run lasts minutes; with
Redis, an unacknowledged message comes back only after ``visibility_timeout``: shorter than a run and a healthy long run
would be delivered twice, longer and the run of a dead worker waits that long. Recovery does not go through the broker
at all: the database is the source of truth. A worker holds a lease on its run, renewed at every committed window
and by a heartbeat every ``lease_s / 3``; if it dies (kill -9, OOM, node loss), the lease expires and the reaper that
every worker runs (at start-up and then every ``lease_s / 2``) re-enqueues the run; the next claim resumes at
``next_window`` from the state saved at the frontier.
Each claim counts one attempt in the database, so a run that kills its worker every time fails cleanly after
``TASMOE_MAX_ATTEMPTS`` claims instead of looping. Even a duplicated message is harmless: claims are atomic and every
window commit is fenced on the lease owner.
"""

from __future__ import annotations

import logging

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator.settings import orchestrator_settings
from shared.settings import Settings

log = logging.getLogger(__name__)


def create_celery_app(settings: Settings | None = None) -> Celery:
    s = orchestrator_settings(settings)
    app = Celery("tasmoe", broker=s.redis_url, backend=s.redis_url, include=["services.orchestrator.tasks"])
    app.conf.update(
        task_acks_late=False,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        task_time_limit=s.task_time_limit_s,
        task_soft_time_limit=max(s.task_time_limit_s - 60.0, s.task_time_limit_s * 0.9),
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        result_expires=3600,
        task_default_queue=s.celery_queue,
        worker_max_tasks_per_child=200,
    )
    return app


celery_app = create_celery_app()


@celery_app.task(name="tasmoe.ping")
def ping() -> str:
    """Round-trip check through the broker and the result backend."""
    return "pong"


class CeleryDispatcher:
    """Cluster mode: one ``tasmoe.run_scenario`` task per unfinished run of the experiment."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session], app: Celery | None = None) -> None:
        self.settings = orchestrator_settings(settings)
        self.sessions = sessions
        self.app = app or create_celery_app(self.settings)

    def submit_experiment(self, exp_id: str) -> None:
        from services.orchestrator import repository as repo
        from services.orchestrator.jobs import run_ids_of

        run_ids = run_ids_of(sessions=self.sessions, exp_id=exp_id)
        for run_id in run_ids:
            self.app.send_task("tasmoe.run_scenario", args=[run_id], queue=self.settings.celery_queue)
        repo.mark_enqueued(sessions=self.sessions, run_ids=run_ids)

    def shutdown(self) -> None:
        self.app.close()
