"""Celery tasks of the orchestrator (cluster mode). Each worker process opens its own database engine and service
clients lazily (after the fork) and keeps them for its lifetime."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task
from celery.signals import worker_ready, worker_shutdown
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator.celery_app import celery_app
from services.orchestrator.db import open_database
from services.orchestrator.jobs import after_run, finalize_once
from services.orchestrator.models import utcnow
from services.orchestrator.settings import OrchestratorSettings, orchestrator_settings
from services.orchestrator.window_loop import default_owner, run_scenario
from shared.client import ServiceClients
from shared.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class _Resources:
    pid: int
    settings: OrchestratorSettings
    sessions: sessionmaker[Session]
    clients: ServiceClients


_lock = threading.Lock()
_res: _Resources | None = None


def process_resources(settings: Settings | None = None) -> _Resources:
    """This process's engine + clients (re-created after a fork)."""
    global _res
    with _lock:
        if _res is None or _res.pid != os.getpid():
            s = orchestrator_settings(settings)
            _, sessions = open_database(s.effective_database_url)
            _res = _Resources(os.getpid(), s, sessions, _clients(s))
        return _res


def _clients(s: OrchestratorSettings) -> ServiceClients:
    """Service clients of a worker process: over URLs, or over in-process apps (``worker_services``). Over URLs that
    list several replicas of a service, the pool process number ``i`` keeps to replica ``i`` (modulo their number):
    two runs at once on a two-process worker then use two replicas instead of queueing in one service process
    (``scripts.cluster up --replicas``)."""
    if s.worker_services == "urls":
        from billiard.process import current_process  # Celery's pool: its children carry their index

        index = getattr(current_process(), "index", None)
        return ServiceClients(s, replica=int(index) if index is not None else 0)
    from services.orchestrator.apps import build_apps, enter_lifespans

    apps = build_apps(s, None if s.worker_services == "embedded" else s.worker_services)
    enter_lifespans(apps)
    return ServiceClients(s, asgi_apps=apps)


@celery_app.task(name="tasmoe.run_scenario", bind=True, max_retries=20)
def run_scenario_task(self: Task[Any, Any], run_id: str) -> dict[str, Any]:
    """Claim the run and run (or resume) its window loop; a run leased by a live worker is retried after its lease."""
    res = process_resources()
    repo.note_delivery(sessions=res.sessions, run_id=run_id)
    out = run_scenario(run_id, res.clients, res.sessions, owner=f"{default_owner()}:{run_id}",
                       lease_s=res.settings.lease_s)
    if out.status == "leased":
        raise self.retry(countdown=max(res.settings.lease_s / 2, 1.0))
    if out.status in {"succeeded", "failed", "cancelled", "done", "exhausted"}:
        after_run(sessions=res.sessions, clients=res.clients, run_id=run_id)
    return {"run_id": run_id, "status": out.status, "windows_run": out.windows_run, "error": out.error}


def reap_once(settings: OrchestratorSettings, app: Celery) -> list[str]:
    """Re-enqueue the runs that are lost (``repo.runs_to_redeliver``: an expired lease, a queued run never handed to
    the queue, a hand-off older than ``requeue_after_s``), never a queued run that waits its turn; and finalise the
    experiments whose finalising process died."""
    res = process_resources(settings)
    now = utcnow()
    with res.sessions() as s:
        picked = repo.runs_to_redeliver(session=s, now=now, handoff_grace_s=2 * settings.lease_s,
                                        requeue_after_s=settings.requeue_after_s)
        unfinalized = repo.unfinalized_experiments(session=s, now=now)
    for run_id in picked:
        app.send_task("tasmoe.run_scenario", args=[run_id], queue=settings.celery_queue)
    repo.mark_enqueued(sessions=res.sessions, run_ids=picked)
    if picked:
        log.info("reaper re-enqueued %d run(s): %s", len(picked), ", ".join(picked))
    for exp_id in unfinalized:
        if finalize_once(sessions=res.sessions, clients=res.clients, exp_id=exp_id):
            log.info("reaper finalised %s (its finalising process had died)", exp_id)
    return picked


# The reaper lives with the tasks (the worker imports this module through the app's ``include``), so the Celery app
# module does not import its tasks back.
_reaper_stop = threading.Event()


@worker_ready.connect
def _start_reaper(sender: Any = None, **_: Any) -> None:
    """Every worker re-enqueues runs whose lease expired (their worker died), at start-up and periodically."""
    s = OrchestratorSettings()

    def loop() -> None:
        while True:
            try:
                reap_once(s, celery_app)
            except Exception:
                log.exception("reaper pass failed")
            if _reaper_stop.wait(max(s.lease_s / 2, 1.0)):
                return

    threading.Thread(target=loop, name="tasmoe-reaper", daemon=True).start()


@worker_shutdown.connect
def _stop_reaper(**_: Any) -> None:
    _reaper_stop.set()
