"""What the orchestrator process holds while it serves: the database and a dispatcher for runs.

Embedded mode: the five compute services run in-process (ASGI apps with their lifespans entered) and runs execute on
the `EmbeddedRunner` pool. Cluster mode: services are reached at their URLs and runs go to Celery workers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator.db import open_database
from services.orchestrator.jobs import Dispatcher, EmbeddedRunner
from services.orchestrator.settings import orchestrator_settings
from shared import SERVICES
from shared.client import ServiceClients
from shared.settings import Settings

COMPUTE_SERVICES: tuple[str, ...] = tuple(s for s in SERVICES if s != "orchestrator")


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    dispatcher: Dispatcher
    clients: ServiceClients | None


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
                from services.root_app import create_service

                apps = {name: create_service(name, settings) for name in COMPUTE_SERVICES}
                for app in apps.values():
                    await stack.enter_async_context(app.router.lifespan_context(app))
                clients = ServiceClients(settings, asgi_apps=apps)
                stack.callback(clients.close)
            runner = EmbeddedRunner(sessions=sessions, clients=clients, lease_s=lease,
                                    max_workers=osettings.pool_workers, reap_interval_s=max(lease / 2, 1.0))
            runner.recover()
            dispatcher = runner
        try:
            yield Runtime(settings, engine, sessions, dispatcher, clients)
        finally:
            dispatcher.shutdown()
            engine.dispose()
