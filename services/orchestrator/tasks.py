"""Celery tasks of the orchestrator (cluster mode). Each worker process opens its own database engine and service
clients lazily (after the fork) and keeps them for its lifetime."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task
from celery.signals import worker_ready, worker_shutdown
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator.celery_app import celery_app, send_run
from services.orchestrator.db import open_database
from services.orchestrator.jobs import after_run, finalize_once
from services.orchestrator.models import utcnow
from services.orchestrator.outbox import relay_once
from services.orchestrator.settings import OrchestratorSettings, orchestrator_settings
from services.orchestrator.window_loop import DatabaseAway, default_owner, run_scenario, through_database_outage
from shared.client import ServiceClients
from shared.db import database_outage, outage_text
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


@celery_app.task(name="tasmoe.run_scenario", bind=True, max_retries=20, ignore_result=True)
def run_scenario_task(self: Task[Any, Any], run_id: str) -> dict[str, Any]:
    """Claim the run and run (or resume) its window loop; a run leased by a live worker is retried after its lease."""
    res = process_resources()
    budget = res.settings.outage_budget_s
    try:  # a delivery met during a database outage waits for the database (the message is already taken)
        through_database_outage(lambda: repo.note_delivery(sessions=res.sessions, run_id=run_id), budget_s=budget,
                                what=run_id)
    except DatabaseAway:
        raise self.retry(countdown=max(res.settings.lease_s / 2, 1.0)) from None
    out = run_scenario(run_id, res.clients, res.sessions, owner=f"{default_owner()}:{run_id}",
                       lease_s=res.settings.lease_s)
    if out.status in {"leased", "unavailable"}:
        raise self.retry(countdown=max(res.settings.lease_s / 2, 1.0))
    if out.status in {"succeeded", "failed", "cancelled", "done", "exhausted"}:
        after_run(sessions=res.sessions, clients=res.clients, run_id=run_id)
    return {"run_id": run_id, "status": out.status, "windows_run": out.windows_run, "error": out.error}


def reap_once(settings: OrchestratorSettings, app: Celery, *, expired: bool = True) -> list[str]:
    """Re-enqueue the runs that are lost (``repo.runs_to_redeliver``: an expired lease unless ``expired`` is False,
    a queued run never handed to the queue, a hand-off older than ``requeue_after_s``), never a queued run that waits
    its turn; relay the outbox's hand-offs (`outbox.relay_once`); finalise the experiments whose finalising process
    died; and delete the finished experiments past ``retention_days``. Raises when the broker is away (the next
    pass tries again)."""
    res = process_resources(settings)
    now = utcnow()
    with res.sessions() as s:
        picked = repo.runs_to_redeliver(session=s, now=now, handoff_grace_s=2 * settings.lease_s,
                                        requeue_after_s=settings.requeue_after_s, expired=expired)
        unfinalized = repo.unfinalized_experiments(session=s, now=now)
    sent: list[str] = []
    try:
        for run_id in picked:
            send_run(app, settings.celery_queue, run_id)
            sent.append(run_id)
    finally:
        repo.mark_enqueued(sessions=res.sessions, run_ids=sent)
    if picked:
        log.info("reaper re-enqueued %d run(s): %s", len(picked), ", ".join(picked))
    relayed = relay_once(sessions=res.sessions, send=lambda run_id: send_run(app, settings.celery_queue, run_id))
    if relayed.sent:  # an API process died before its relay sent them
        log.info("reaper relayed %d hand-off(s) from the outbox: %s", len(relayed.sent), ", ".join(relayed.sent))
    for exp_id in unfinalized:
        if finalize_once(sessions=res.sessions, clients=res.clients, exp_id=exp_id):
            log.info("reaper finalised %s (its finalising process had died)", exp_id)
    pruned = repo.apply_retention(sessions=res.sessions, retention_days=settings.retention_days)
    if pruned:
        log.info("reaper: retention deleted %d finished experiment(s) from the database", len(pruned))
    return picked


# The reaper lives with the tasks (the worker imports this module through the app's ``include``), so the Celery app
# module does not import its tasks back.
_reaper_stop = threading.Event()


class ReaperPace:
    """When a reaper pass may re-enqueue runs whose lease expired. After the database was away, not before one
    lease has passed since it answered again: every lease ran out during the outage, and the live workers renew
    theirs as soon as they reach the database (`window_loop`); re-enqueueing them at once would hand live runs to
    a second worker and spend an attempt of each on an outage."""

    def __init__(self, lease_s: float, interval_s: float) -> None:
        self.hold_s = lease_s + interval_s
        self.expired_after = 0.0  # time.monotonic() from which expired leases are re-enqueued

    def expired_ok(self) -> bool:
        return time.monotonic() >= self.expired_after

    def database_away(self) -> None:
        self.expired_after = time.monotonic() + self.hold_s


@worker_ready.connect
def _start_reaper(sender: Any = None, **_: Any) -> None:
    """Every worker re-enqueues runs whose lease expired (their worker died), at start-up and periodically."""
    s = OrchestratorSettings()
    interval = max(s.lease_s / 2, 1.0)
    pace = ReaperPace(s.lease_s, interval)

    def loop() -> None:
        while True:
            try:
                reap_once(s, celery_app, expired=pace.expired_ok())
            except Exception as exc:
                if database_outage(exc):
                    pace.database_away()
                    log.warning("reaper pass: the database is unreachable (%s)", outage_text(exc))
                elif isinstance(exc, BrokerError):
                    log.warning("reaper pass: the broker is unreachable (%s); the next pass tries again", exc)
                else:
                    log.exception("reaper pass failed")
            if _reaper_stop.wait(interval):
                return

    threading.Thread(target=loop, name="tasmoe-reaper", daemon=True).start()


@worker_shutdown.connect
def _stop_reaper(**_: Any) -> None:
    _reaper_stop.set()
