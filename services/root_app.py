"""Embedded mode: build the six service apps, enter their lifespans, mount them on one root app or hand them to the
shared client as ASGI transports (so code paths are the cluster's)."""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from shared import SERVICES
from shared.client import ServiceClients
from shared.peers import wire_peers
from shared.settings import Settings


def create_service(name: str, settings: Settings) -> FastAPI:
    """``services.<name>.app.create_app(settings)``."""
    if name not in SERVICES:
        raise KeyError(f"unknown service {name!r}; known: {', '.join(SERVICES)}")
    mod = importlib.import_module(f"services.{name}.app")
    app: FastAPI = mod.create_app(settings)
    return app


def create_root_app(settings: Settings) -> FastAPI:
    """All six services mounted under ``/<service>`` on one app; the root lifespan enters each sub-app's lifespan
    (Starlette does not run the lifespans of mounted apps)."""
    apps = {name: create_service(name, settings) for name in SERVICES}
    peers = ServiceClients(settings, asgi_apps=apps)  # one process: the services reach each other in process
    wire_peers(apps, peers)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for sub in apps.values():
                await stack.enter_async_context(sub.router.lifespan_context(sub))
            try:
                yield
            finally:
                peers.close()

    root = FastAPI(title="tasmoe (all services)", lifespan=lifespan)
    root.state.apps = apps

    @root.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "services": list(apps)}

    for name, sub in apps.items():
        root.mount(f"/{name}", sub)
    return root


def build_app(name: str, settings: Settings) -> FastAPI:
    return create_root_app(settings) if name == "all" else create_service(name, settings)


class EmbeddedApps:
    """The six apps with their lifespans entered, and a `ServiceClients` over ASGI transports.

    Lifespans are entered on a dedicated event-loop thread (anyio's blocking portal) that lives as long as this object,
    so resources a lifespan opens stay valid while worker threads call the apps.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.apps = {name: create_service(name, settings) for name in SERVICES}
        self.clients = ServiceClients(settings, asgi_apps=self.apps)
        wire_peers(self.apps, self.clients)


@contextmanager
def embedded(settings: Settings) -> Iterator[EmbeddedApps]:
    """Context manager: six apps with lifespans running (in a portal thread) and clients bound to them."""
    from anyio.from_thread import start_blocking_portal

    emb = EmbeddedApps(settings)
    with start_blocking_portal() as portal:
        stack = AsyncExitStack()
        portal.call(stack.__aenter__)
        try:
            for app in emb.apps.values():
                portal.call(stack.enter_async_context, app.router.lifespan_context(app))
            yield emb
        finally:
            portal.call(stack.__aexit__, None, None, None)
            emb.clients.close()


def openapi_text(name: str, settings: Settings) -> str:
    """One service's OpenAPI spec as committed under ``openapi/``: JSON, sorted keys, 2-space indent, final newline."""
    spec = create_service(name, settings).openapi()
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_openapi(out_dir: Path, settings: Settings) -> list[Path]:
    """Write ``<out_dir>/<service>.json`` with sorted keys for every service."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in SERVICES:
        path = out_dir / f"{name}.json"
        path.write_text(openapi_text(name, settings), encoding="utf-8")
        paths.append(path)
    return paths
