"""Embedded POSTs that run on the caller's own thread (issue 21: a window against its compute).

In the embedded mode the services' synchronous clients (`shared.client.ServiceClients` over in-process ASGI apps) run a
POST to an app built by `shared.service_app.create_service_app` from `JsonBodyRoute` routers (it sets `INLINE_STATE`
on the app's state) on an event loop of the calling thread's own, and mark the ASGI scope with `INLINE`, whose value
is the shared embedded loop (`shared.client.EventLoopThread`). `shared.service_app.JsonBodyRoute` then calls a
synchronous endpoint on that thread instead of handing it to a thread pool, and hands what it does not serve itself
(FastAPI's handler, with its thread pool) to the shared loop. Routing, middleware, validation, the error body and the
serialisation are the cluster's; only the thread that runs the endpoint differs (a pool thread of the service's
process in the cluster).

Why: a call that hops to the loop's thread and on to a pool thread and back costs ~0.5 ms more than one that stays,
and 1-2 ms when the compute before it has evicted the caches (`python -m services.orchestrator.window_overhead`;
README, "A window against its compute"). Every other method keeps the shared loop (a GET's answer may stream or read
a file on its thread pool), as does a call made from inside an endpoint or a coroutine (its thread runs a loop
already) and a call to any other app (a synchronous handler there would start a pool thread on the caller's loop
for every call).
"""

from __future__ import annotations

INLINE = "tasmoe.inline"  # ASGI scope key: present (the shared loop) on a call that runs on the caller's thread
INLINE_STATE = "inline_calls"  # app.state flag: the app's routes serve such calls (create_service_app sets it)
