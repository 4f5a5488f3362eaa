"""Service-to-service HTTP client: the only module that imports httpx.

Base URLs come from settings (``TASMOE_<SERVICE>_URL``). Explicit timeouts; retries with tenacity (exponential
backoff with jitter) only on connect errors, timeouts and 429/502/503/504; one ``Idempotency-Key`` per logical
call, reused across its retries. In embedded mode and in tests the same client is built over httpx's ASGI transport,
so the code path is the one the cluster uses (routing, middleware, validation, error bodies). The window loop calls
the services once per control epoch, not once per window, so a call's microseconds do not matter: this module is
httpx and tenacity as they are documented.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from shared import SERVICES, json_codec
from shared.errors import BadInput, Conflict, NotFound, ServiceUnavailable, TasmoeError, UpstreamError
from shared.logging import RUN_ID_HEADER, current_run_id
from shared.settings import Settings

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_BACKOFF_S = 5.0  # the longest wait between two attempts
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class RetryableStatus(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (httpx.ConnectError, httpx.TimeoutException, httpx.RemoteProtocolError, RetryableStatus))


def retry_policy(settings: Settings) -> dict[str, Any]:
    """tenacity's arguments for one call: ``http_retries + 1`` attempts, the retryable errors only, waits of
    ``http_backoff_s · 2^(n−1)`` plus up to ``http_backoff_s`` of jitter, at most `MAX_BACKOFF_S`; the last error is
    re-raised as it was."""
    return {"stop": stop_after_attempt(settings.http_retries + 1),
            "wait": wait_exponential_jitter(multiplier=settings.http_backoff_s, max=MAX_BACKOFF_S,
                                            jitter=settings.http_backoff_s),
            "retry": retry_if_exception(_retryable), "reraise": True}


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
    if issubclass(exc_type, UpstreamError):  # answered as this service's 502: its own code, the upstream's in words
        raise exc_type(f"{text} ({response.status_code}{f' {code}' if code else ''})", field=field)
    raise exc_type(text, field=field, code=code)


def _headers(settings: Settings, idempotency_key: str | None, extra: Mapping[str, str] | None,
             json_body: bool) -> dict[str, str]:
    """One Idempotency-Key per logical call (reused by every retry of it), the caller's run id when one is bound,
    the service key (TASMOE_AUTH=keys) and the JSON content type of a body."""
    hdrs = {IDEMPOTENCY_HEADER: idempotency_key or str(uuid.uuid4())}
    run_id = current_run_id()
    if run_id != "-":
        hdrs[RUN_ID_HEADER] = run_id
    if settings.service_key:  # service-to-service calls authenticate
        hdrs["Authorization"] = f"Bearer {settings.service_key}"
    if json_body:
        hdrs["Content-Type"] = "application/json"
    hdrs.update(extra or {})
    return hdrs


def _body(json: Any, content: bytes | None) -> bytes | None:
    if content is not None or json is None:
        return content
    if isinstance(json, BaseModel):
        return json.model_dump_json().encode()
    return json_codec.dumps(json)


def _unreachable(service: str, settings: Settings, exc: httpx.TransportError) -> ServiceUnavailable:
    return ServiceUnavailable(f"{service}: unreachable after {settings.http_retries + 1} attempts: {exc}")


def _timeout(settings: Settings) -> httpx.Timeout:
    return httpx.Timeout(settings.http_read_timeout_s, connect=settings.http_connect_timeout_s)


class ServiceClient:
    """A synchronous client for one service (the window loop in worker threads and processes, the CLI): one pooled
    ``httpx.Client``."""

    def __init__(self, service: str, base_url: str, settings: Settings,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.service = service
        self.settings = settings
        self._client = httpx.Client(base_url=base_url, timeout=_timeout(settings), transport=transport)

    @property
    def base_url(self) -> str:
        return str(self._client.base_url).rstrip("/")

    @property
    def timeouts(self) -> tuple[float | None, float | None]:
        """(connect, read) timeouts in seconds, from settings (never httpx's implicit default)."""
        return self._client.timeout.connect, self._client.timeout.read

    def close(self) -> None:
        self._client.close()

    def request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                idempotency_key: str | None = None, headers: Mapping[str, str] | None = None,
                content: bytes | None = None) -> httpx.Response:
        """``json``: a JSON value or a pydantic model; ``content``: a body already encoded as JSON."""
        body = _body(json, content)
        hdrs = _headers(self.settings, idempotency_key, headers, body is not None)
        try:
            for attempt in Retrying(**retry_policy(self.settings)):
                with attempt:
                    resp = self._client.request(method, path, params=params, headers=hdrs, content=body)
                    if resp.status_code in RETRY_STATUSES:
                        raise RetryableStatus(resp)
        except RetryableStatus as exc:
            _raise_for_error(self.service, exc.response)
            raise  # pragma: no cover - _raise_for_error always raises for >= 400
        except httpx.TransportError as exc:
            raise _unreachable(self.service, self.settings, exc) from exc
        _raise_for_error(self.service, resp)
        return resp

    def get_json(self, path: str, **kw: Any) -> Any:
        return json_codec.loads(self.request("GET", path, **kw).content)

    def post_json(self, path: str, body: Any = None, **kw: Any) -> Any:
        return json_codec.loads(self.request("POST", path, json=body, **kw).content)

    def post_model(self, path: str, body: Any, model: type[M], **kw: Any) -> M:
        return model.model_validate_json(self.request("POST", path, json=body, **kw).content)

    def get_model(self, path: str, model: type[M], **kw: Any) -> M:
        return model.model_validate_json(self.request("GET", path, **kw).content)


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
                      idempotency_key: str | None = None, headers: Mapping[str, str] | None = None,
                      content: bytes | None = None) -> httpx.Response:
        body = _body(json, content)
        hdrs = _headers(self.settings, idempotency_key, headers, body is not None)
        try:
            async for attempt in AsyncRetrying(**retry_policy(self.settings)):
                with attempt:
                    resp = await self._client.request(method, path, params=params, headers=hdrs, content=body)
                    if resp.status_code in RETRY_STATUSES:
                        raise RetryableStatus(resp)
        except RetryableStatus as exc:
            _raise_for_error(self.service, exc.response)
            raise  # pragma: no cover
        except httpx.TransportError as exc:
            raise _unreachable(self.service, self.settings, exc) from exc
        _raise_for_error(self.service, resp)
        return resp

    async def get_json(self, path: str, **kw: Any) -> Any:
        return json_codec.loads((await self.request("GET", path, **kw)).content)

    async def post_json(self, path: str, body: Any = None, **kw: Any) -> Any:
        return json_codec.loads((await self.request("POST", path, json=body, **kw)).content)


class ServiceClients:
    """One `ServiceClient` per service, from settings (real sockets) or from ASGI apps (embedded/tests). Where the
    settings list several replicas of a service, ``replica`` picks one (modulo their number); the services are
    stateless, so any replica serves any call."""

    def __init__(self, settings: Settings, asgi_apps: Mapping[str, Any] | None = None, *, replica: int = 0) -> None:
        self.settings = settings
        self._clients: dict[str, ServiceClient] = {}
        self._loop = EventLoopThread() if asgi_apps else None
        for name in SERVICES:
            if asgi_apps is not None and name in asgi_apps and self._loop is not None:
                transport: httpx.BaseTransport | None = SyncASGITransport(asgi_apps[name], self._loop)
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
    """One event loop on a daemon thread, for synchronous callers of in-process ASGI apps (the embedded mode): a
    caller's coroutine runs on the loop (`run`) in a copy of the caller's context (run id and other context
    variables), as in the cluster, where each service has one loop. The loop runs one root task until `close`, so
    the worker threads anyio keeps per root task serve a synchronous endpoint call after call."""

    def __init__(self, name: str = "tasmoe-asgi-loop") -> None:
        self.pid = os.getpid()  # a forked child inherits this object but not its thread
        self.loop = asyncio.new_event_loop()
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
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

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

    def close(self) -> None:
        if self.thread.is_alive() and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self.thread.join(timeout=10)


class SyncASGITransport(httpx.BaseTransport):
    """httpx's `ASGITransport` for a synchronous client (httpx's is async-only): each request runs on ``loop`` and
    its answer is read whole there. The app's lifespan must already have been entered by whoever owns the app (see
    `services.root_app.EmbeddedApps`)."""

    def __init__(self, app: Any, loop: EventLoopThread) -> None:
        self._asgi = httpx.ASGITransport(app=app)
        self._loop = loop

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def call() -> httpx.Response:
            answer = await self._asgi.handle_async_request(request)
            content = await answer.aread()
            return httpx.Response(answer.status_code, headers=answer.headers, content=content, request=request)

        return self._loop.run(call())


def async_asgi_client(service: str, app: Any, settings: Settings) -> AsyncServiceClient:
    return AsyncServiceClient(service, f"http://{service}", settings, httpx.ASGITransport(app=app))
