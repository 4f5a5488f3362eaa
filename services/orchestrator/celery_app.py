"""The orchestrator's Celery app (``celery -A services.orchestrator.celery_app worker``): cluster-mode runs.

Broker and result backend: ``TASMOE_REDIS_URL``. One task per experiment-scenario (``tasmoe.run_scenario``), which
runs the whole window loop; ``worker_prefetch_multiplier=1`` so a worker never sits on runs it is not running; hard and
soft time limits from ``TASMOE_TASK_TIME_LIMIT_S``; tasks never wait on other tasks (no ``.get()`` inside a task).

Acknowledgement choice: **acks_late is OFF** (a task is acknowledged when a worker takes it). A run lasts minutes; with
Redis, an unacknowledged message comes back only after ``visibility_timeout``: shorter than a run and a healthy long run
would be delivered twice, longer and the run of a dead worker waits that long. Recovery does not go through the broker
at all: the database is the source of truth, and so is the hand-off (an outbox row written with the run, relayed
to the broker by `services.orchestrator.outbox`). A worker holds a lease on its run, renewed at every committed window
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


# A run's task is sent without waiting on the result backend (nothing reads a run task's result: the database holds
# the outcome; with the Redis backend away, a send that subscribes to its result blocks ~19 s and then breaks the
# app) and with one quick retry: a broker that is away fails the send at once, and the hand-off waits in the outbox.
SEND_RETRY_POLICY = {"max_retries": 1, "interval_start": 0.0, "interval_step": 0.2, "interval_max": 0.2}


def send_run(app: Celery, queue: str, run_id: str) -> None:
    """Hand one run to the queue (`tasmoe.run_scenario`); raises when the broker cannot take it."""
    app.send_task("tasmoe.run_scenario", args=[run_id], queue=queue, ignore_result=True,
                  retry_policy=SEND_RETRY_POLICY)


class CeleryDispatcher:
    """Cluster mode: runs reach the Celery workers through the outbox (`services.orchestrator.outbox`): the
    experiment's transaction wrote their hand-offs, and `submit_experiment` wakes this process's relay, which sends
    them now or, with the broker away, as soon as it is back."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session], app: Celery | None = None,
                 relay_interval_s: float = 1.0) -> None:
        from services.orchestrator.outbox import OutboxRelay

        self.settings = orchestrator_settings(settings)
        self.sessions = sessions
        self.app = app or create_celery_app(self.settings)
        self.relay = OutboxRelay(sessions, lambda run_id: send_run(self.app, self.settings.celery_queue, run_id),
                                 interval_s=relay_interval_s)
        self.relay.wake()  # hand-offs an earlier process left

    def submit_experiment(self, exp_id: str) -> None:
        """The experiment's runs are committed with their hand-offs: relay them now (never raises, never waits on
        the broker)."""
        self.relay.wake()

    def shutdown(self) -> None:
        self.relay.stop()
        self.app.close()
