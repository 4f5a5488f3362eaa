"""What the orchestrator process holds while it serves: the database and a dispatcher for runs.

Embedded mode: the five compute services run in-process (ASGI apps with their lifespans entered) and runs execute on
the `EmbeddedRunner` pool. Cluster mode: services are reached at their URLs and runs go to Celery workers.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator.apps import build_apps
from services.orchestrator.db import open_database
from services.orchestrator.jobs import Dispatcher, EmbeddedRunner
from services.orchestrator.settings import orchestrator_settings
from shared.client import ServiceClients
from shared.logging import bind_run_id
from shared.peers import close_peers
from shared.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    dispatcher: Dispatcher
    clients: ServiceClients | None


def handle_abandoned(runner: EmbeddedRunner, sessions: sessionmaker[Session], *, resume: bool) -> list[str]:
    """The embedded server's rule for experiments another process left unfinished (an interrupted ``tasmoe run``
    on the same database): each is logged with its runs' progress; they are resumed only with
    ``TASMOE_RESUME_STALE=true``, otherwise left alone for ``tasmoe experiments list|cancel|clean``."""
    with sessions() as s:
        found = repo.abandoned_experiments(session=s)
        for exp_id in found:
            runs = repo.runs_of(session=s, exp_id=exp_id)
            where = ", ".join(f"{r.scenario} {r.status.value} at window {r.next_window} of {r.n_windows or '?'}"
                              for r in runs)
            verb = "resuming" if resume else "not resuming (TASMOE_RESUME_STALE=false; tasmoe experiments cancel)"
            with bind_run_id(exp_id):
                log.warning("%s experiment %s left unfinished by another process: %s", verb, exp_id, where)
    if found and not resume:
        runner.ignore_experiments(found)
    return found


@asynccontextmanager
async def runtime(settings: Settings, *, clients: ServiceClients | None = None,
                  dispatcher: Dispatcher | None = None, lease_s: float | None = None) -> AsyncIterator[Runtime]:
    osettings = orchestrator_settings(settings)
    lease = lease_s if lease_s is not None else osettings.lease_s
    engine, sessions = open_database(settings.effective_database_url)
    async with AsyncExitStack() as stack:
        if dispatcher is None and settings.mode == "cluster":
            from services.orchestrator.celery_app import CeleryDispatcher

            dispatcher = CeleryDispatcher(settings, sessions)
        if dispatcher is None:
            if clients is None:
                apps = build_apps(settings)
                stack.callback(close_peers, apps)  # after the lifespans' exits (a stack unwinds in reverse)
                for app in apps.values():
                    await stack.enter_async_context(app.router.lifespan_context(app))
                clients = ServiceClients(settings, asgi_apps=apps)
                stack.callback(clients.close)
            runner = EmbeddedRunner(sessions=sessions, clients=clients, lease_s=lease,
                                    max_workers=osettings.pool_workers, reap_interval_s=max(lease / 2, 1.0))
            pruned = repo.apply_retention(sessions=sessions, retention_days=osettings.retention_days)
            if pruned:
                log.info("retention (TASMOE_RETENTION_DAYS=%g): %d finished experiment(s) deleted from the database",
                         osettings.retention_days, len(pruned))
            handle_abandoned(runner, sessions, resume=osettings.resume_stale)
            runner.recover()
            dispatcher = runner
        try:
            yield Runtime(settings, engine, sessions, dispatcher, clients)
        finally:
            dispatcher.shutdown()
            engine.dispose()
