"""The service-to-service client: which failures it retries, the Idempotency-Key it reuses, its timeouts, run-id
propagation and how an error body becomes an exception. Small Starlette apps over ASGI; real uvicorn on loopback for
the socket-level cases (refused connection, read timeout)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shared import SERVICES
from shared.client import (
    IDEMPOTENCY_HEADER,
    MAX_BACKOFF_S,
    RETRY_STATUSES,
    AsyncServiceClient,
    ServiceClient,
    ServiceClients,
    async_asgi_client,
    retry_policy,
)
from shared.errors import BadInput, Conflict, NotFound, TasmoeError, UpstreamError
from shared.logging import RUN_ID_HEADER, bind_run_id
from shared.settings import Settings
from tests.platform.conftest import free_port, serve_in_thread


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    base: dict[str, Any] = {"results_dir": tmp_path, "http_retries": 3, "http_backoff_s": 0.0}
    base.update(kw)
    return Settings.model_validate(base)


@dataclass
class Script:
    """A fake service: answers the queued statuses in order (then 200) and records every request's headers."""

    statuses: list[int] = field(default_factory=list)
    body: dict[str, object] | None = None
    sleep_s: float = 0.0
    seen: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> Starlette:
        async def handler(request: Request) -> Response:
            self.seen.append(dict(request.headers))
            if self.sleep_s:
                await asyncio.sleep(self.sleep_s)
            if self.statuses:
                status = self.statuses.pop(0)
                return JSONResponse(self.body or {"error": {"code": "x", "message": f"status {status}",
                                                            "field": None}}, status_code=status)
            payload = await request.body()
            return JSONResponse({"ok": True, "echo": payload.decode() or None})

        return Starlette(routes=[Route("/v1/thing", handler, methods=["GET", "POST"])])

    def keys(self) -> list[str]:
        return [h[IDEMPOTENCY_HEADER.lower()] for h in self.seen]


def _client(tmp_path: Path, script: Script, **kw: Any) -> ServiceClient:
    return ServiceClients(_settings(tmp_path, **kw), asgi_apps={"thermal": script.app()})["thermal"]


@pytest.mark.parametrize("status", sorted(RETRY_STATUSES))
def test_retryable_status_is_retried_with_the_same_idempotency_key(tmp_path: Path, status: int) -> None:
    script = Script(statuses=[status, status])
    client = _client(tmp_path, script)
    assert client.post_json("/v1/thing", {"a": 1}) == {"ok": True, "echo": '{"a":1}'}
    assert len(script.seen) == 3
    keys = script.keys()
    assert len(set(keys)) == 1 and keys[0]


def test_retryable_status_gives_up_after_the_configured_attempts(tmp_path: Path) -> None:
    script = Script(statuses=[503] * 10)
    client = _client(tmp_path, script, http_retries=2)
    with pytest.raises(UpstreamError) as info:
        client.get_json("/v1/thing")
    assert len(script.seen) == 3
    assert info.value.status == 502
    assert "thermal" in info.value.message


def test_the_waits_between_attempts_grow_with_jitter_up_to_five_seconds(tmp_path: Path) -> None:
    """tenacity's exponential backoff with jitter: ``http_backoff_s · 2^(n−1)`` plus up to ``http_backoff_s`` after
    failed attempt n, at most `MAX_BACKOFF_S`."""
    settings = _settings(tmp_path, http_backoff_s=0.75)
    wait = retry_policy(settings)["wait"]
    for attempt, low in ((1, 0.75), (2, 1.5), (3, 3.0), (4, 5.0), (30, 5.0), (2000, 5.0)):
        state = type("State", (), {"attempt_number": attempt})()
        for _ in range(20):
            got = wait(state)
            assert min(low, MAX_BACKOFF_S) <= got <= min(low + 0.75, MAX_BACKOFF_S), (attempt, got)


def test_sync_and_async_calls_wait_between_attempts(tmp_path: Path) -> None:
    """A sync call sleeps on its thread, an async call on its loop; both keep one Idempotency-Key."""
    script = Script(statuses=[503, 503])
    t0 = time.monotonic()
    assert _client(tmp_path, script, http_retries=2, http_backoff_s=0.05).get_json("/v1/thing")["ok"]
    assert time.monotonic() - t0 >= 0.05 + 0.1 and len(set(script.keys())) == 1
    script = Script(statuses=[429, 504])

    async def go() -> Any:
        c = async_asgi_client("thermal", script.app(), _settings(tmp_path, http_retries=2, http_backoff_s=0.05))
        try:
            return await c.get_json("/v1/thing")
        finally:
            await c.aclose()

    t0 = time.monotonic()
    assert asyncio.run(go()) == {"ok": True, "echo": None}
    assert time.monotonic() - t0 >= 0.05 + 0.1 and len(set(script.keys())) == 1


@pytest.mark.parametrize(
    ("status", "exc_type"),
    [(400, BadInput), (404, NotFound), (409, Conflict), (422, BadInput), (500, UpstreamError)],
)
def test_non_retryable_status_is_sent_once(tmp_path: Path, status: int, exc_type: type[TasmoeError]) -> None:
    script = Script(statuses=[status])
    client = _client(tmp_path, script)
    with pytest.raises(exc_type):
        client.post_json("/v1/thing", {"a": 1})
    assert len(script.seen) == 1


def test_error_body_maps_code_message_and_field(tmp_path: Path) -> None:
    body: dict[str, object] = {"error": {"code": "invalid", "message": "mesh.cores[0]: must be >= 1",
                                         "field": "mesh.cores[0]"}}
    client = _client(tmp_path, Script(statuses=[422], body=body))
    with pytest.raises(BadInput) as info:
        client.post_json("/v1/thing", {})
    err = info.value
    assert err.field == "mesh.cores[0]"
    assert err.code == "invalid"
    assert err.message == "thermal: mesh.cores[0]: must be >= 1"
    assert err.body() == {"error": {"code": "invalid", "message": "thermal: mesh.cores[0]: must be >= 1",
                                    "field": "mesh.cores[0]"}}


def test_non_json_error_body_still_maps_status(tmp_path: Path) -> None:
    async def handler(_: Request) -> Response:
        return Response("gone fishing", status_code=404, media_type="text/plain")

    app = Starlette(routes=[Route("/v1/thing", handler)])
    client = ServiceClients(_settings(tmp_path), asgi_apps={"placement": app})["placement"]
    with pytest.raises(NotFound, match="placement: gone fishing"):
        client.get_json("/v1/thing")


def test_caller_supplied_idempotency_key_is_sent_on_every_attempt(tmp_path: Path) -> None:
    script = Script(statuses=[502, 504])
    client = _client(tmp_path, script)
    client.post_json("/v1/thing", {"w": 3}, idempotency_key="run-7:window-3:thermal-step")
    assert script.keys() == ["run-7:window-3:thermal-step"] * 3


def test_each_logical_call_gets_its_own_key(tmp_path: Path) -> None:
    script = Script()
    client = _client(tmp_path, script)
    client.get_json("/v1/thing")
    client.get_json("/v1/thing")
    assert len(set(script.keys())) == 2


def test_run_id_is_propagated_only_when_bound(tmp_path: Path) -> None:
    script = Script()
    client = _client(tmp_path, script)
    with bind_run_id("exp-42/tas"):
        client.get_json("/v1/thing")
    client.get_json("/v1/thing")
    assert script.seen[0][RUN_ID_HEADER.lower()] == "exp-42/tas"
    assert RUN_ID_HEADER.lower() not in script.seen[1]


def test_timeouts_come_from_settings(tmp_path: Path) -> None:
    client = _client(tmp_path, Script(), http_connect_timeout_s=1.5, http_read_timeout_s=7.0)
    assert client.timeouts == (1.5, 7.0)


def test_read_timeout_is_enforced_and_retried_over_a_real_socket(tmp_path: Path) -> None:
    script = Script(sleep_s=1.0)
    port = free_port()
    settings = _settings(tmp_path, http_read_timeout_s=0.2, http_retries=1,
                         thermal_url=f"http://127.0.0.1:{port}")
    client = ServiceClients(settings)["thermal"]
    with serve_in_thread(script.app(), port):
        t0 = time.monotonic()
        with pytest.raises(UpstreamError, match="unreachable after 2 attempts"):
            client.get_json("/v1/thing")
        elapsed = time.monotonic() - t0
    assert len(script.seen) == 2
    assert len(set(script.keys())) == 1
    assert elapsed < 1.9  # two 0.2 s timeouts, not two full 1 s answers


def test_connect_error_is_retried_until_the_server_comes_up(tmp_path: Path) -> None:
    script = Script()
    port = free_port()
    settings = _settings(tmp_path, http_retries=20, http_backoff_s=0.05, http_connect_timeout_s=0.5,
                         workload_url=f"http://127.0.0.1:{port}")
    client = ServiceClients(settings)["workload"]
    assert client.base_url == f"http://127.0.0.1:{port}"
    with serve_in_thread(script.app(), port, start_delay_s=0.4):
        assert client.post_json("/v1/thing", {"x": 1}, idempotency_key="k-1")["ok"] is True
    assert script.keys() == ["k-1"]  # refused attempts never reached the server; the one that did carried the key


def test_connect_error_gives_up_with_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    settings = _settings(tmp_path, http_retries=2, metrics_url=f"http://127.0.0.1:{port}")
    client = ServiceClients(settings)["metrics"]
    with pytest.raises(UpstreamError, match=r"metrics: unreachable after 3 attempts"):
        client.get_json("/v1/thing")


def test_service_clients_use_settings_urls_or_asgi_mounts(tmp_path: Path) -> None:
    settings = _settings(tmp_path, thermal_url="http://thermal:8004/")
    clients = ServiceClients(settings, asgi_apps={"metrics": Script().app()})
    assert clients["thermal"].base_url == "http://thermal:8004"
    assert clients["metrics"].base_url == "http://metrics"
    assert {clients[name].service for name in SERVICES} == set(SERVICES)
    clients.close()


def test_async_client_retries_with_one_key_and_maps_errors(tmp_path: Path) -> None:
    script = Script(statuses=[429, 503])
    settings = _settings(tmp_path)

    async def go() -> tuple[object, TasmoeError | None]:
        client: AsyncServiceClient = async_asgi_client("lowering", script.app(), settings)
        with bind_run_id("r-9"):
            ok = await client.post_json("/v1/thing", {"b": 2})
        script.statuses = [404]
        err: TasmoeError | None = None
        try:
            await client.get_json("/v1/thing")
        except NotFound as exc:
            err = exc
        await client.aclose()
        return ok, err

    ok, err = asyncio.run(go())
    assert ok == {"ok": True, "echo": '{"b":2}'}
    assert len(set(script.keys()[:3])) == 1
    assert [h.get(RUN_ID_HEADER.lower()) for h in script.seen[:3]] == ["r-9"] * 3
    assert len(script.seen) == 4  # the 404 was not retried
    assert isinstance(err, NotFound)


def test_async_client_connect_error_is_upstream_error(tmp_path: Path) -> None:
    port = free_port()
    settings = _settings(tmp_path, http_retries=1)
    client = AsyncServiceClient("thermal", f"http://127.0.0.1:{port}", settings)

    async def go() -> None:
        try:
            await client.get_json("/healthz")
        finally:
            await client.aclose()

    with pytest.raises(UpstreamError, match="unreachable after 2 attempts"):
        asyncio.run(go())


def test_transport_error_type_is_not_swallowed_for_unexpected_exceptions(tmp_path: Path) -> None:
    """A bug in the caller (a body that is not JSON-serialisable) surfaces as itself, not as a retried network
    error."""
    script = Script()
    client = _client(tmp_path, script)
    with pytest.raises(TypeError):
        client.post_json("/v1/thing", {"x": object()})
    assert script.seen == []


def test_post_model_sends_a_model_and_validates_the_answer(tmp_path: Path) -> None:
    from pydantic import BaseModel, ValidationError

    class Echo(BaseModel):
        ok: bool
        echo: str | None

    class Strict(BaseModel):
        missing_field: int

    class Body(BaseModel):
        n: int

    script = Script()
    client = _client(tmp_path, script)
    got = client.post_model("/v1/thing", Body(n=5), Echo)
    assert got == Echo(ok=True, echo='{"n":5}')
    assert client.get_model("/v1/thing", Echo).ok is True
    with pytest.raises(ValidationError):
        client.get_model("/v1/thing", Strict)


@pytest.mark.parametrize("exc", [BadInput("bad", field="mesh.cores[0]"), NotFound("gone"), UpstreamError("down")])
def test_error_body_matches_its_schema(exc: TasmoeError) -> None:
    from shared.service_app import ErrorBody

    assert ErrorBody.model_validate(exc.body()).model_dump() == exc.body()


def test_embedded_transport_keeps_one_loop_per_thread_and_the_callers_context(tmp_path: Path) -> None:
    """Over ASGI mounts a thread's calls share one event loop, so a synchronous endpoint's worker threads are reused
    (a loop per request started a new worker thread for every call); each call runs in its caller's context."""
    import itertools
    import threading

    from fastapi import FastAPI

    from shared.logging import current_run_id

    made = itertools.count()
    local = threading.local()
    app = FastAPI()

    @app.get("/who")
    def who() -> dict[str, Any]:  # sync: FastAPI runs it on a worker thread of the loop
        if not hasattr(local, "n"):
            local.n = next(made)  # a number per thread that ever served a call
        return {"thread": local.n, "run": current_run_id()}

    clients = ServiceClients(_settings(tmp_path), asgi_apps={"thermal": app})
    try:
        seen = set()
        for i in range(40):
            with bind_run_id(f"run-{i % 3}"):
                got = clients["thermal"].get_json("/who")
            assert got["run"] == f"run-{i % 3}"
            seen.add(got["thread"])
        assert len(seen) <= 2, seen

        answers: list[dict[str, Any]] = []

        def other() -> None:
            with bind_run_id("other"):
                answers.append(clients["thermal"].get_json("/who"))

        t = threading.Thread(target=other)  # another caller thread: its own loop, its own context
        t.start()
        t.join()
        assert [a["run"] for a in answers] == ["other"]
    finally:
        clients.close()


def test_embedded_requests_reach_the_app_through_httpx(tmp_path: Path) -> None:
    """Over an ASGI mount the request is httpx's own (its ASGITransport): the query, headers, the run id, a
    percent-encoded path and the body reach the app as over a socket."""
    seen: list[dict[str, Any]] = []

    async def handler(request: Request) -> Response:
        scope = request.scope
        seen.append({"path": scope["path"], "raw_path": scope["raw_path"], "query": scope["query_string"],
                     "headers": dict(scope["headers"]), "body": await request.body()})
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/v1/{rest:path}", handler, methods=["GET", "POST"])])
    embedded = ServiceClients(_settings(tmp_path), asgi_apps={"thermal": app})["thermal"]
    with bind_run_id("run-7"):
        assert embedded.post_json("/v1/thing", {"x": [1, 2]}, params={"start": 3, "count": 16},
                                  headers={"X-Extra": "yes"}) == {"ok": True}
        assert embedded.get_json("/v1/models/a%2Fb/thing", params={"a": "b c&d"}) == {"ok": True}
    post, get = seen
    assert post["query"] == b"start=3&count=16" and post["body"] == b'{"x":[1,2]}'
    headers = post["headers"]
    assert headers[b"x-extra"] == b"yes" and headers[RUN_ID_HEADER.lower().encode()] == b"run-7"
    assert headers[b"content-type"] == b"application/json" and headers[b"content-length"] == b"11"
    assert get["raw_path"] == b"/v1/models/a%2Fb/thing"
    with pytest.raises(NotFound):
        embedded.get_json("/nothing")
