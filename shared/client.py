"""Service-to-service HTTP client: with `shared.http11` (its short path over a socket), the only module that imports
httpx.

Base URLs come from settings (``TASMOE_<SERVICE>_URL``). Explicit timeouts; retries (`backoff_s`) only on connect
errors, timeouts and 429/502/503/504; one ``Idempotency-Key`` per logical call, reused across its retries. In
embedded mode and in tests the same client is built over in-process ASGI transports, so the code path is the one
the cluster uses (routing, middleware, validation, error bodies); only the thread that runs a POST's synchronous
endpoint differs (`shared.inline_calls`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar
from urllib.parse import unquote
from urllib.request import getproxies

import httpx
from pydantic import BaseModel

from shared import SERVICES, json_codec
from shared.errors import BadInput, Conflict, NotFound, ServiceUnavailable, TasmoeError, UpstreamError
from shared.http11 import HTTP11Connections
from shared.inline_calls import INLINE, INLINE_STATE
from shared.logging import RUN_ID_HEADER, current_run_id
from shared.settings import Settings

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
IDEMPOTENCY_HEADER = "Idempotency-Key"
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # httpx sends Content-Length: 0 when they have no body
_SOCKET_METHODS = _BODY_METHODS | {"GET", "DELETE"}  # the short path over a socket (`shared.http11`): not HEAD
# a path httpx sends as it is: non-empty segments of unreserved characters and percent escapes, none starting with a
# dot (httpx quotes other characters and removes dot segments)
_PLAIN_PATH = re.compile(r"(?:/(?:[A-Za-z0-9_~-]|%[0-9A-Fa-f]{2})(?:[A-Za-z0-9_~.-]|%[0-9A-Fa-f]{2})*)+/?|/")


def _proxied() -> bool:
    """True when the environment names an HTTP proxy (``HTTP_PROXY``, ``ALL_PROXY``, lower case too), which httpx's
    client would use: calls then stay with httpx's client."""
    proxies = getproxies()
    return bool(proxies.get("http") or proxies.get("all"))


class RetryableStatus(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (httpx.ConnectError, httpx.TimeoutException, httpx.RemoteProtocolError, RetryableStatus))


def _raise_for_error(service: str, response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        err = response.json().get("error", {})
        message, field, code = err.get("message", response.text), err.get("field"), err.get("code")
    except Exception:
        message, field, code = response.text[:500], None, None
    text = f"{service}: {message}"
    exc_type: type[TasmoeError] = {404: NotFound, 409: Conflict, 422: BadInput, 400: BadInput}.get(
        response.status_code, ServiceUnavailable if response.status_code in RETRY_STATUSES else UpstreamError)
    raise exc_type(text, field=field, code=code)


def _headers(idempotency_key: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    """One Idempotency-Key per logical call (reused by every retry of it) and the caller's run id, when one is bound."""
    hdrs = {IDEMPOTENCY_HEADER: idempotency_key or str(uuid.uuid4())}
    run_id = current_run_id()
    if run_id != "-":
        hdrs[RUN_ID_HEADER] = run_id
    hdrs.update(extra or {})
    return hdrs


MAX_BACKOFF_S = 5.0  # the longest wait between two attempts


def backoff_s(settings: Settings, attempt: int) -> float:
    """The wait after failed attempt ``attempt`` (1, 2, ...) before the next: ``http_backoff_s * 2**(attempt - 1)``,
    at most `MAX_BACKOFF_S` (tenacity's ``wait_exponential(multiplier=http_backoff_s, max=5)``, which this replaced:
    its attempt loop cost ~20 us a call warm and ~50 us right after a window's compute, three calls a window)."""
    return float(min(MAX_BACKOFF_S, max(0.0, settings.http_backoff_s * 2.0 ** min(attempt - 1, 64))))


def _attempts(settings: Settings) -> range:
    """The attempt numbers of one call: 1 .. ``http_retries + 1``. An attempt that raises a `_retryable` error is
    followed by the next after `backoff_s`; the last one's error, or any other, reaches the caller as raised."""
    return range(1, settings.http_retries + 2)


def _timeout(settings: Settings) -> httpx.Timeout:
    return httpx.Timeout(settings.http_read_timeout_s, connect=settings.http_connect_timeout_s)


class ServiceClient:
    """A synchronous client for one service (used by the window loop in worker threads and by the CLI)."""

    def __init__(self, service: str, base_url: str, settings: Settings,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.service = service
        self.settings = settings
        self._client = httpx.Client(base_url=base_url, timeout=_timeout(settings), transport=transport)
        # an in-process app (the embedded mode, a base URL without a path): requests go to the app as the ASGI call
        # httpx's client would make (`_send`); httpx's client adds nothing there (no cookies, auth, redirects or
        # event hooks: this client sets none) but ~0.1 ms of plumbing a call, ~0.3 ms after the window's compute
        base = self._client.base_url
        self._inproc = transport if isinstance(transport, _SyncASGITransport) and base.raw_path == b"/" else None
        # a service over plain HTTP (the cluster; a base URL without a path or credentials, no proxy in the
        # environment: httpx's client would honour those): the same request written on the socket (`shared.http11`),
        # ~0.25 ms of client CPU less a call
        self._socket = (HTTP11Connections(base.host, base.port or 80, connect_timeout=settings.http_connect_timeout_s,
                                          timeout=settings.http_read_timeout_s)
                        if transport is None and base.scheme == "http" and base.raw_path == b"/"
                        and not base.userinfo and not _proxied() else None)
        self._scheme, self._server = base.scheme, (base.host, base.port)
        self._default_headers = {b"host": base.netloc} | {k.lower(): v for k, v in self._client.headers.raw}

    @property
    def base_url(self) -> str:
        return str(self._client.base_url).rstrip("/")

    @property
    def timeouts(self) -> tuple[float | None, float | None]:
        """(connect, read) timeouts in seconds, from settings (never httpx's implicit default)."""
        return self._client.timeout.connect, self._client.timeout.read

    def close(self) -> None:
        self._client.close()
        if self._socket is not None:
            self._socket.close()

    def request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                idempotency_key: str | None = None, headers: Mapping[str, str] | None = None,
                content: bytes | None = None) -> httpx.Response:
        """``content``: a body already encoded as JSON (sent as is, ``Content-Type: application/json``), for callers
        that splice pre-encoded parts instead of re-encoding large objects on every call."""
        hdrs = _headers(idempotency_key, headers)
        if self.settings.service_key:  # service-to-service calls authenticate (TASMOE_AUTH=keys)
            hdrs.setdefault("Authorization", f"Bearer {self.settings.service_key}")
        if json is not None and content is None:
            content = json_codec.dumps(json)  # orjson: several times faster than httpx's json.dumps on large bodies
        if content is not None:
            hdrs.setdefault("Content-Type", "application/json")
        try:
            for attempt in _attempts(self.settings):
                try:
                    resp = self._send(method, path, params=params, headers=hdrs, content=content)
                    if resp.status_code in RETRY_STATUSES:
                        raise RetryableStatus(resp)
                    break
                except Exception as exc:
                    if attempt > self.settings.http_retries or not _retryable(exc):
                        raise
                time.sleep(backoff_s(self.settings, attempt))
        except RetryableStatus as exc:
            _raise_for_error(self.service, exc.response)
            raise  # pragma: no cover - _raise_for_error always raises for >= 400
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"{self.service}: unreachable after {self.settings.http_retries + 1} attempts: "
                                f"{exc}") from exc
        _raise_for_error(self.service, resp)
        return resp

    def _send(self, method: str, path: str, *, params: Mapping[str, Any] | None, headers: dict[str, str],
              content: bytes | None) -> httpx.Response:
        """One attempt: through httpx's client, or the request httpx's client would make (``build_request``: Host and
        the client's default headers under ``headers``, Content-Length as httpx sets it, the query encoded by
        ``httpx.QueryParams``, header values ASCII as httpx wants them) without building httpx's URL and request
        objects (~40-60 us a call): straight to an in-process app as its ASGI call, or written on a kept-alive
        socket (`shared.http11`). The same headers reach the app, in another order (a name the caller gives twice in
        different cases: once). A path httpx would quote or normalise goes through httpx (``build_request``)."""
        if self._inproc is None and (self._socket is None or method not in _SOCKET_METHODS
                                     or not _PLAIN_PATH.fullmatch(path)):
            return self._client.request(method, path, params=params, headers=headers, content=content)
        if self._inproc is not None and not _PLAIN_PATH.fullmatch(path):  # httpx would quote or normalise it
            return self._inproc.handle_request(self._client.build_request(method, path, params=params,
                                                                          headers=headers, content=content))
        merged = dict(self._default_headers)  # the client's defaults, then the call's (names case-insensitive)
        merged.update((k.lower().encode("ascii"), v.encode("ascii")) for k, v in headers.items())
        if content or method in _BODY_METHODS:  # httpx: the length of a body, 0 for these methods without one
            merged[b"content-length"] = str(len(content or b"")).encode("ascii")
        query = str(httpx.QueryParams(params)).encode("ascii") if params else b""
        if self._inproc is not None:
            status, raw, body = self._inproc.call(method, path.encode("ascii"), query, list(merged.items()),
                                                  content or b"", scheme=self._scheme, server=self._server)
        else:
            assert self._socket is not None
            target = path.encode("ascii") + (b"?" + query if query else b"")
            status, raw, body = self._socket.call(method, target, list(merged.items()), content or b"")
        return httpx.Response(status, headers=raw, content=body)

    def get_json(self, path: str, **kw: Any) -> Any:
        return json_codec.loads(self.request("GET", path, **kw).content)

    def post_json(self, path: str, body: Any = None, **kw: Any) -> Any:
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        return json_codec.loads(self.request("POST", path, json=body, **kw).content)

    def post_model(self, path: str, body: Any, model: type[M], **kw: Any) -> M:
        return model.model_validate(self.post_json(path, body, **kw))

    def get_model(self, path: str, model: type[M], **kw: Any) -> M:
        return model.model_validate(self.get_json(path, **kw))


class AsyncServiceClient:
    """The asynchronous twin, for code that runs inside an event loop (the orchestrator's request handlers)."""

    def __init__(self, service: str, base_url: str, settings: Settings,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.service = service
        self.settings = settings
        self._client = httpx.AsyncClient(base_url=base_url, timeout=_timeout(settings), transport=transport)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                      idempotency_key: str | None = None, headers: Mapping[str, str] | None = None
                      ) -> httpx.Response:
        hdrs = _headers(idempotency_key, headers)
        if self.settings.service_key:  # service-to-service calls authenticate (TASMOE_AUTH=keys)
            hdrs.setdefault("Authorization", f"Bearer {self.settings.service_key}")
        content = None
        if json is not None:
            content = json_codec.dumps(json)
            hdrs.setdefault("Content-Type", "application/json")
        try:
            for attempt in _attempts(self.settings):
                try:
                    resp = await self._client.request(method, path, params=params, headers=hdrs, content=content)
                    if resp.status_code in RETRY_STATUSES:
                        raise RetryableStatus(resp)
                    break
                except Exception as exc:
                    if attempt > self.settings.http_retries or not _retryable(exc):
                        raise
                await asyncio.sleep(backoff_s(self.settings, attempt))
        except RetryableStatus as exc:
            _raise_for_error(self.service, exc.response)
            raise  # pragma: no cover
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"{self.service}: unreachable after {self.settings.http_retries + 1} attempts: "
                                f"{exc}") from exc
        _raise_for_error(self.service, resp)
        return resp

    async def get_json(self, path: str, **kw: Any) -> Any:
        return json_codec.loads((await self.request("GET", path, **kw)).content)

    async def post_json(self, path: str, body: Any = None, **kw: Any) -> Any:
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        return json_codec.loads((await self.request("POST", path, json=body, **kw)).content)


class ServiceClients:
    """One `ServiceClient` per service, from settings (real sockets) or from ASGI apps (embedded/tests). Where the
    settings list several replicas of a service, these clients keep to replica number ``replica`` (modulo their
    number) for every call: a worker process's runs find their window states where they left them."""

    def __init__(self, settings: Settings, asgi_apps: Mapping[str, Any] | None = None, *, replica: int = 0) -> None:
        self.settings = settings
        self._clients: dict[str, ServiceClient] = {}
        self._loop = EventLoopThread() if asgi_apps else None
        for name in SERVICES:
            if asgi_apps is not None and name in asgi_apps and self._loop is not None:
                transport: httpx.BaseTransport | None = _SyncASGITransport(asgi_apps[name], self._loop)
                base = f"http://{name}"
            else:
                transport, base = None, settings.service_url(name, replica)
            self._clients[name] = ServiceClient(name, base, settings, transport)

    def __getitem__(self, service: str) -> ServiceClient:
        return self._clients[service]

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        if self._loop is not None:
            self._loop.close()


class EventLoopThread:
    """One event loop on a daemon thread, for synchronous callers of in-process ASGI apps (the embedded mode).

    A caller's coroutine runs on the loop (``run``) in a copy of the caller's context (run id and other context
    variables), as in the cluster, where each service has one loop. The loop's root task lives until `close`, so a
    synchronous endpoint's worker threads (anyio keeps them per root task) serve call after call; a new loop per
    request (``anyio.run``) started a new thread for every call: 431 in one run. It also keeps each calling thread's
    own loop (`caller_loop`), on which a POST runs without leaving its thread (`shared.inline_calls`)."""

    def __init__(self, name: str = "tasmoe-asgi-loop") -> None:
        self.pid = os.getpid()  # a forked child inherits this object but not its thread
        self.loop = asyncio.new_event_loop()
        self._caller = threading.local()  # each calling thread's own loop (`caller_loop`): a `_CallerLoop`
        self._callers: weakref.WeakSet[_CallerLoop] = weakref.WeakSet()  # all of them, for `close`
        self._callers_lock = threading.Lock()
        self._stop: asyncio.Event | None = None
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), name=name, daemon=True)
        self.thread.start()
        ready.wait()

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def root() -> None:
            self._stop = asyncio.Event()
            ready.set()
            await self._stop.wait()

        try:
            self.loop.run_until_complete(root())
        finally:  # calls still in flight at close: cancelled, so their callers get CancelledError, not a hang
            _shut(self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (its exception is raised here)."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a synchronous service call from inside the embedded event loop would wait for "
                               "itself: use AsyncServiceClient there")
        if os.getpid() != self.pid or not self.thread.is_alive():
            coro.close()
            raise RuntimeError("the embedded event loop is closed or belongs to the parent process (build the "
                               "ServiceClients in this process)")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def caller_loop(self) -> asyncio.AbstractEventLoop | None:
        """The calling thread's own event loop (made on first use; closed when the thread ends, or by `close`) for
        a call that runs on that thread (`shared.inline_calls`); None where the thread runs a loop already (a call
        from inside an endpoint or a coroutine) or the shared loop cannot serve (closed, or another process's):
        such a call goes to `run`."""
        try:
            asyncio.get_running_loop()
            return None
        except RuntimeError:
            pass
        if os.getpid() != self.pid or not self.thread.is_alive():
            return None
        own: _CallerLoop | None = getattr(self._caller, "loop", None)
        if own is None or own.loop.is_closed() or own.pid != self.pid:
            own = self._caller.loop = _CallerLoop(self.pid)
            with self._callers_lock:
                self._callers.add(own)
        return own.loop

    def drop_caller_loop(self) -> None:
        """Close the calling thread's own loop (an interrupt left a call on it unfinished); the next call makes a
        new one."""
        own: _CallerLoop | None = getattr(self._caller, "loop", None)
        self._caller.loop = None
        if own is not None:
            own.close()

    def close(self) -> None:
        if self.thread.is_alive() and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self.thread.join(timeout=10)
        with self._callers_lock:
            owned = list(self._callers)
        for own in owned:  # a loop still running a call (another thread) is left to its thread
            own.close()


class _CallerLoop:
    """One thread's own event loop, closed when the thread ends (its thread-local value goes), by
    `EventLoopThread.close`, or after an interrupt (`EventLoopThread.drop_caller_loop`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.loop = asyncio.new_event_loop()

    def close(self) -> None:
        if not self.loop.is_closed() and not self.loop.is_running():
            _shut(self.loop)  # an interrupted call's tasks too (their half on the shared loop with them)

    def __del__(self) -> None:
        if self.pid == os.getpid():
            self.close()
        else:  # a forked child's copy: closing it would take the parent's self-pipe off their shared epoll
            _FORKED.append(self.loop)


_FORKED: list[asyncio.AbstractEventLoop] = []  # the copies a forked child inherited: kept, never closed


def _shut(loop: asyncio.AbstractEventLoop) -> None:
    """Close a loop that is not running: its tasks cancelled and run to their end, its async generators shut."""
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:  # pragma: no cover - interpreter shutdown: close all the same
        log.debug("shutting an event loop down", exc_info=True)
    finally:
        loop.close()


class _SyncASGITransport(httpx.BaseTransport):
    """Run an ASGI app for a synchronous httpx client (httpx's ASGITransport is async-only). A POST to an app built
    by `shared.service_app.create_service_app` from `JsonBodyRoute` routers runs on the calling thread's own event
    loop, its synchronous endpoint on that thread (`shared.inline_calls`); every other request, and a call from a
    thread that runs a loop already, runs on ``loop`` (one per `ServiceClients`, shared by its services and the
    threads that call them). The app's lifespan must already have been entered by whoever owns the app (see
    `services.root_app.EmbeddedApps`).

    The request goes to the app as one ASGI ``http`` call (the scope httpx's ASGITransport builds, the whole body in
    one ``http.request`` message) and the answer is collected from its messages; an exception the app raises reaches
    the caller, as with httpx's ``raise_app_exceptions``. Built here rather than by wrapping httpx's async transport,
    which copied each request, streamed the body through an async iterator and an event: 0.14 ms of a call's 0.65
    (``GET /healthz``, embedded)."""

    def __init__(self, app: Any, loop: EventLoopThread) -> None:
        self.app = app
        self._loop = loop
        # only an app whose routes hand FastAPI's own handler to the shared loop (JsonBodyRoute) runs a call inline:
        # elsewhere a synchronous handler would start a pool thread on the caller's loop for every call
        self._inline = bool(getattr(getattr(app, "state", None), INLINE_STATE, False))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        status, headers, body = self.call(request.method, url.raw_path.split(b"?")[0], url.query,
                                          [(k.lower(), v) for k, v in request.headers.raw], request.read(),
                                          scheme=url.scheme, server=(url.host, url.port))
        return httpx.Response(status, headers=headers, content=body, request=request)

    def call(self, method: str, raw_path: bytes, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes, *,
             scheme: str = "http", server: tuple[str, int | None] = ("localhost", None)
             ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One ASGI ``http`` call of the app: ``raw_path`` (percent-encoded, no query), ``query`` (encoded),
        ``headers`` (lower-case names); (status, response headers, body) back."""
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "headers": headers,
            "scheme": scheme, "path": unquote(raw_path.decode("ascii")), "raw_path": raw_path, "query_string": query,
            "server": server, "client": ("127.0.0.1", 123), "root_path": ""}
        answer = _Answer(body)
        own = self._loop.caller_loop() if self._inline and method == "POST" else None
        if own is None:
            self._loop.run(self.app(scope, answer.receive, answer.send))
        else:
            scope[INLINE] = self._loop.loop
            try:
                own.run_until_complete(self.app(scope, answer.receive, answer.send))
            except (KeyboardInterrupt, SystemExit):
                self._loop.drop_caller_loop()
                raise
        if answer.status is None:
            raise RuntimeError(f"{method} {scope['path']}: the app returned without starting a response")
        return answer.status, answer.headers, b"".join(answer.body)


class _Answer:
    """One ASGI call's two channels: the request body (sent whole; then ``http.disconnect`` once the response is
    complete, as httpx's ASGITransport does, so a streaming response is not cut short) and the response's status,
    headers and body parts. The call may read the body on one loop and answer on another (`shared.inline_calls`), so
    a wait for the end is a future on the waiter's own loop."""

    def __init__(self, body: bytes) -> None:
        self._pending: bytes | None = body
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.complete = False
        self._waiters: list[asyncio.Future[None]] = []

    async def receive(self) -> dict[str, Any]:
        if self._pending is not None:
            body, self._pending = self._pending, None
            return {"type": "http.request", "body": body, "more_body": False}
        if not self.complete:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        return {"type": "http.disconnect"}

    async def send(self, message: Mapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.body.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                self.complete = True
                waiters, self._waiters = self._waiters, []
                for waiter in waiters:
                    waiter.get_loop().call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def async_asgi_client(service: str, app: Any, settings: Settings) -> AsyncServiceClient:
    return AsyncServiceClient(service, f"http://{service}", settings, httpx.ASGITransport(app=app))
