"""The orchestrator's Celery app (``celery -A services.orchestrator.celery_app worker``).

Minimal version written by the platform work so the local cluster, Compose and Kubernetes can start a worker; the
orchestrator's own tasks (the window loop) replace or extend it. Broker and result backend are ``TASMOE_REDIS_URL``;
acks late with a prefetch of 1, so a worker that dies mid-task leaves the task to another worker.
"""

from __future__ import annotations

from celery import Celery

from shared.settings import Settings, get_settings


def create_celery_app(settings: Settings | None = None) -> Celery:
    s = settings or get_settings()
    app = Celery("tasmoe", broker=s.redis_url, backend=s.redis_url)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        result_expires=3600,
    )
    return app


celery_app = create_celery_app()


@celery_app.task(name="tasmoe.ping")
def ping() -> str:
    """Round-trip check through the broker and the result backend."""
    return "pong"
