"""Embedded mode: build the six service apps, enter their lifespans, mount them on one root app or hand them to the
shared client as ASGI transports (so code paths are the cluster's)."""

from __future__ import annotations

import html
import importlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

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


_DESCRIPTIONS = {
    "orchestrator": "experiments end to end: runs, results, sweeps, the dashboard",
    "workload": "models and routing traces",
    "placement": "TAPS placements and TACS decisions",
    "lowering": "the cycle model and the physical events",
    "thermal": "the thermal model of the stack",
    "metrics": "per-window metrics reduced to result rows, figures",
}


def landing_page(names: list[str]) -> str:
    """The root page of ``tasmoe serve all``: the dashboard and each service's offline docs. Every link is relative,
    so the page works under whatever prefix a proxy serves it."""
    rows = "\n".join(
        f'<tr><th>{n}</th><td>{html.escape(_DESCRIPTIONS.get(n, ""))}</td>'
        f'<td><a href="{n}/docs">docs</a> · <a href="{n}/redoc">reference</a> · '
        f'<a href="{n}/openapi.json">openapi.json</a> · <a href="{n}/healthz">health</a></td></tr>'
        for n in names)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>TAS-MoE Lab</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font:15px/1.5 system-ui,sans-serif;margin:2rem auto;max-width:52rem;padding:0 1rem;color:#222}}
th{{text-align:left;padding-right:1rem}}td{{padding:.2rem 1rem .2rem 0}}a.big{{font-size:1.3rem}}
code{{background:#f3f3f3;padding:0 .2rem}}</style></head>
<body><h1>TAS-MoE Lab</h1>
<p><a class="big" href="orchestrator/ui/">Open the dashboard</a>: experiments, live heat maps, replay, traces.</p>
<p>The API: <code>/v1/...</code> here is the orchestrator's (<code>/orchestrator/v1/...</code> the same);
each service below is mounted under <code>/&lt;service&gt;/</code>. With <code>TASMOE_AUTH=keys</code> send
<code>Authorization: Bearer &lt;key&gt;</code>.</p>
<table>{rows}</table></body></html>
"""


class FrontDoor:
    """At the root of the one-port app: ``/v1/...`` and ``/ui...`` are the orchestrator's (its API and its
    dashboard, as on its own port), so a client that follows the orchestrator's URLs from the root reaches it."""

    def __init__(self, app: ASGIApp, orchestrator: ASGIApp) -> None:
        self.app = app
        self.orchestrator = orchestrator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] in {"http", "websocket"} else ""
        if path in {"/v1", "/ui"} or path.startswith(("/v1/", "/ui/")):
            await self.orchestrator(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_root_app(settings: Settings) -> FastAPI:
    """All six services mounted under ``/<service>`` on one app; the root lifespan enters each sub-app's lifespan
    (Starlette does not run the lifespans of mounted apps). The root is a front door: a landing page at ``/``
    (the dashboard, each service's docs), ``/docs`` and ``/redoc`` the orchestrator's, and ``/v1``, ``/ui`` the
    orchestrator's too (`FrontDoor`)."""
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

    root = FastAPI(title="tasmoe (all services)", lifespan=lifespan, docs_url=None, redoc_url=None,
                   openapi_url=None)
    root.state.apps = apps
    root.add_middleware(FrontDoor, orchestrator=apps["orchestrator"])

    @root.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "services": list(apps)}

    @root.get("/", include_in_schema=False)
    async def landing() -> HTMLResponse:
        return HTMLResponse(landing_page(list(apps)))

    @root.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/orchestrator/docs", status_code=307)

    @root.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/orchestrator/redoc", status_code=307)

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
