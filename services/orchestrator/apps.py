"""The embedded wiring: the compute services built in this process and given one another (``shared.peers``).

A leaf module (it imports no other orchestrator module), so the runtime, the job runners, the Celery tasks and the
standalone worker all build their in-process services here without importing each other (no import
cycles). Services are built by name (``services.root_app.create_service``), never imported from here.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any

from shared import SERVICES
from shared.client import ServiceClients
from shared.peers import wire_peers
from shared.settings import Settings

COMPUTE_SERVICES: tuple[str, ...] = tuple(s for s in SERVICES if s != "orchestrator")


def build_apps(settings: Settings, factory: str | None = None,
               only: Sequence[str] | None = None) -> dict[str, Any]:
    """The compute services as ASGI apps (the real ones, or those of ``module:factory(settings)``), wired to reach
    each other in process. ``only``: just these services (e.g. the metrics service to draw a figure)."""
    if factory:
        mod, _, fn = factory.partition(":")
        make: Callable[[Any], dict[str, Any]] = getattr(importlib.import_module(mod), fn)
        apps = make(settings)
        if only is not None:
            apps = {name: app for name, app in apps.items() if name in only}
    else:
        from services.root_app import create_service

        apps = {name: create_service(name, settings) for name in COMPUTE_SERVICES if only is None or name in only}
    wire_peers(apps, ServiceClients(settings, asgi_apps=apps))
    return apps


_lifespan_loops: list[asyncio.AbstractEventLoop] = []


def enter_lifespans(apps: dict[str, Any]) -> None:
    """Enter the apps' lifespans on an event loop in a daemon thread that lives as long as the process (Celery
    worker children: nothing to tear down, and a daemon thread never holds up the process's exit)."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="tasmoe-lifespans", daemon=True).start()
    _lifespan_loops.append(loop)
    stack = AsyncExitStack()

    async def enter() -> None:
        await stack.__aenter__()
        for app in apps.values():
            await stack.enter_async_context(app.router.lifespan_context(app))

    asyncio.run_coroutine_threadsafe(enter(), loop).result()


def preload(factory: str | None) -> None:
    """Import the modules the workers build their services from, so that forked workers share them instead of each
    importing them again."""
    if factory:
        importlib.import_module(factory.partition(":")[0])
        return
    for name in COMPUTE_SERVICES:
        importlib.import_module(f"services.{name}.app")
