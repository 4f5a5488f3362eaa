"""A standalone run worker without Celery: claims queued runs and runs whose lease expired, from the database, on an
in-process pool, with the compute services in-process (embedded) or at their URLs.

    python -m services.orchestrator.worker --until-idle                      # embedded services, settings' DB
    python -m services.orchestrator.worker --services urls                   # services at TASMOE_<SERVICE>_URL
    python -m services.orchestrator.worker --apps tests.orchestrator.fakes:build_apps   # any app factory

Several workers (or a worker and the API's own pool) may share one database: claims are atomic, commits fenced.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from typing import Any

from services.orchestrator.apps import build_apps
from services.orchestrator.db import make_engine, session_factory, upgrade
from services.orchestrator.jobs import EmbeddedRunner
from services.orchestrator.models import RunStatus, ScenarioRun
from services.orchestrator.settings import OrchestratorSettings, orchestrator_settings
from shared.client import ServiceClients
from shared.logging import setup_logging
from shared.peers import close_peers
from shared.settings import Settings


@contextmanager
def compute_clients(settings: Settings, factory: str | None = None,
                    wrap: Callable[[str, Any], Any] | None = None,
                    only: Sequence[str] | None = None) -> Iterator[ServiceClients]:
    """Clients over the five compute services running in this process (their lifespans entered on a portal thread
    for the duration of the block). The orchestrator app is not started: its runtime would recover runs itself.
    ``wrap(name, app)``: the ASGI app the clients call instead of ``app`` (a measuring wrapper). ``only``: just
    these services in process (the others' clients go to their TASMOE_<SERVICE>_URL)."""
    from anyio.from_thread import start_blocking_portal

    apps = build_apps(orchestrator_settings(settings), factory, only)
    with start_blocking_portal() as portal:
        stack = AsyncExitStack()
        portal.call(stack.__aenter__)
        try:
            for app in apps.values():
                portal.call(stack.enter_async_context, app.router.lifespan_context(app))
            called = apps if wrap is None else {name: wrap(name, app) for name, app in apps.items()}
            clients = ServiceClients(settings, asgi_apps=called)
            try:
                yield clients
            finally:
                clients.close()
        finally:
            try:
                portal.call(stack.__aexit__, None, None, None)
            finally:
                close_peers(apps)


@contextmanager
def service_clients(settings: OrchestratorSettings, *, mode: str, apps: str | None) -> Iterator[ServiceClients]:
    if mode != "urls":
        with compute_clients(settings, apps) as c:
            yield c
        return
    c = ServiceClients(settings)
    try:
        yield c
    finally:
        c.close()


def unfinished(sessions: Any) -> int:
    with sessions() as s:
        return int(s.query(ScenarioRun).filter(ScenarioRun.status.in_([RunStatus.queued, RunStatus.running])).count())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.orchestrator.worker", description=__doc__)
    ap.add_argument("--database-url", default=None, help="default: TASMOE_DATABASE_URL or the embedded SQLite file")
    ap.add_argument("--schema", default=None, help="PostgreSQL schema (search_path)")
    ap.add_argument("--services", choices=["embedded", "urls"], default="embedded")
    ap.add_argument("--apps", default=None, help="module:factory(settings) -> {service: ASGI app} (embedded)")
    ap.add_argument("--lease-s", type=float, default=None)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--until-idle", action="store_true", help="exit when no run is queued or running")
    args = ap.parse_args(argv)
    settings = OrchestratorSettings()
    setup_logging(settings.log_level)
    lease = args.lease_s or settings.lease_s
    engine = make_engine(args.database_url or settings.effective_database_url, schema=args.schema)
    upgrade(engine)
    sessions = session_factory(engine)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with service_clients(settings, mode=args.services, apps=args.apps) as clients:
        runner = EmbeddedRunner(sessions=sessions, clients=clients, lease_s=lease,
                                max_workers=args.workers or settings.pool_workers)
        try:
            while not stop.is_set():
                runner.recover()
                if args.until_idle and unfinished(sessions) == 0:
                    break
                stop.wait(max(min(lease / 2, 2.0), 0.1))
        finally:
            runner.shutdown()
    with sessions() as s:
        left = s.query(ScenarioRun).filter(ScenarioRun.status == RunStatus.running).count()
    engine.dispose()
    return 0 if left == 0 or not args.until_idle else 1


if __name__ == "__main__":
    sys.exit(main())
