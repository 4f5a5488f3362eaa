"""Embedded POSTs run their synchronous endpoint on the caller's thread (`shared.inline_calls`); everything else, and a
call made from inside an endpoint, takes the shared loop and its thread pool; the answers are the same either way."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Annotated

import pytest
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from shared.client import ServiceClients
from shared.errors import BadInput
from shared.logging import bind_run_id, current_run_id
from shared.service_app import JsonBodyRoute, create_service_app
from shared.settings import Settings


class Numbers(BaseModel):
    xs: list[float] = Field(min_length=1)


class Sum(BaseModel):
    total: float
    thread: int
    run_id: str


def _apps(settings: Settings, clients: list[ServiceClients]) -> dict[str, object]:
    thermal = APIRouter(route_class=JsonBodyRoute)

    @thermal.post("/sum", response_model=Sum)
    def add(body: Numbers) -> Sum:
        return Sum(total=sum(body.xs), thread=threading.get_ident(), run_id=current_run_id())

    @thermal.post("/scaled", response_model=Sum)  # a query parameter: FastAPI's own handler
    def scaled(body: Numbers, factor: Annotated[float, Query()] = 1.0) -> Sum:
        return Sum(total=factor * sum(body.xs), thread=threading.get_ident(), run_id=current_run_id())

    @thermal.post("/stream")  # an answer streamed on the caller's loop: not cut short
    def stream(body: Numbers) -> StreamingResponse:
        async def parts() -> AsyncIterator[bytes]:
            for x in body.xs:
                await asyncio.sleep(0)
                yield f"{x};".encode()
        return StreamingResponse(parts(), media_type="text/plain")

    @thermal.post("/interrupt")
    def interrupt(body: Numbers) -> Sum:
        raise KeyboardInterrupt

    @thermal.get("/where", response_model=Sum)
    def where() -> Sum:
        return Sum(total=0.0, thread=threading.get_ident(), run_id=current_run_id())

    lowering = APIRouter(route_class=JsonBodyRoute)

    @lowering.post("/twice", response_model=Sum)  # calls its peer, as placement calls thermal
    def twice(body: Numbers, request: Request) -> Sum:
        inner = Sum.model_validate(clients[0]["thermal"].post_json("/v1/sum", body))
        return Sum(total=2 * inner.total, thread=threading.get_ident(), run_id=inner.run_id)

    plain = FastAPI()  # not built by create_service_app: its calls keep the shared loop

    @plain.post("/v1/sum", response_model=Sum)
    def plain_add(body: Numbers) -> Sum:
        return Sum(total=sum(body.xs), thread=threading.get_ident(), run_id=current_run_id())

    routes = APIRouter()  # plain routes (as the test fakes have): FastAPI's handler would start a thread per call

    @routes.post("/sum", response_model=Sum)
    def routes_add(body: Numbers) -> Sum:
        return Sum(total=sum(body.xs), thread=threading.get_ident(), run_id=current_run_id())

    return {"thermal": create_service_app("thermal", settings, [thermal]),
            "lowering": create_service_app("lowering", settings, [lowering]), "metrics": plain,
            "placement": create_service_app("placement", settings, [routes])}


@pytest.fixture()
def clients(settings: Settings) -> Iterator[ServiceClients]:
    holder: list[ServiceClients] = []
    c = ServiceClients(settings, asgi_apps=_apps(settings, holder))
    holder.append(c)
    yield c
    c.close()


def test_a_post_runs_on_the_callers_thread(clients: ServiceClients) -> None:
    me = threading.get_ident()
    with bind_run_id("run-inline"):
        got = Sum.model_validate(clients["thermal"].post_json("/v1/sum", {"xs": [1.0, 2.5]}))
    assert got.total == 3.5 and got.thread == me and got.run_id == "run-inline"
    # FastAPI's handler (a query parameter) and a GET: the shared loop's thread pool, same answers
    got = Sum.model_validate(clients["thermal"].post_json("/v1/scaled?factor=2", {"xs": [1.0, 2.5]}))
    assert got.total == 7.0 and got.thread != me
    assert Sum.model_validate(clients["thermal"].get_json("/v1/where")).thread != me
    for other in ("metrics", "placement"):  # apps whose routes are not all JsonBodyRoutes
        got = Sum.model_validate(clients[other].post_json("/v1/sum", {"xs": [1.0, 2.5]}))
        assert got.total == 3.5 and got.thread != me
    assert clients["thermal"].request("POST", "/v1/stream", json={"xs": [1, 2, 3]}).content == b"1.0;2.0;3.0;"


def test_an_interrupt_leaves_no_half_call_behind(clients: ServiceClients) -> None:
    loop = clients._loop
    assert loop is not None
    clients["thermal"].post_json("/v1/sum", {"xs": [1.0]})
    before = loop.caller_loop()
    with pytest.raises(KeyboardInterrupt):
        clients["thermal"].post_json("/v1/interrupt", {"xs": [1.0]})
    assert before is not None and before.is_closed()
    assert Sum.model_validate(clients["thermal"].post_json("/v1/sum", {"xs": [2.0]})).total == 2.0


def test_errors_and_calls_from_inside_an_endpoint(clients: ServiceClients) -> None:
    with pytest.raises(BadInput) as err:
        clients["thermal"].post_json("/v1/sum", {"xs": []})
    assert err.value.field == "xs"
    with pytest.raises(BadInput) as err:
        clients["thermal"].post_json("/v1/scaled?factor=x", {"xs": [1.0]})
    assert err.value.field == "factor"
    with bind_run_id("run-nested"):
        got = Sum.model_validate(clients["lowering"].post_json("/v1/twice", {"xs": [1.0, 2.0]}))
    assert got.total == 6.0 and got.thread == threading.get_ident() and got.run_id == "run-nested"


def test_no_thread_per_call_and_loops_closed(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    holder: list[ServiceClients] = []
    clients = ServiceClients(settings, asgi_apps=_apps(settings, holder))
    holder.append(clients)
    for _ in range(3):  # the shared loop's pool threads, started once
        clients["thermal"].get_json("/v1/where")
        clients["thermal"].post_json("/v1/scaled", {"xs": [1.0]})
        clients["lowering"].post_json("/v1/twice", {"xs": [1.0]})
    started: list[str] = []
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for _ in range(50):
        clients["thermal"].post_json("/v1/sum", {"xs": [1.0]})
        clients["thermal"].post_json("/v1/scaled", {"xs": [1.0]})
        clients["lowering"].post_json("/v1/twice", {"xs": [1.0]})
        clients["thermal"].get_json("/v1/where")
        clients["metrics"].post_json("/v1/sum", {"xs": [1.0]})
        clients["placement"].post_json("/v1/sum", {"xs": [1.0]})
    assert len(started) <= 2, started  # a pool thread or two more at most, not one per call
    monkeypatch.undo()
    loop = clients._loop
    assert loop is not None
    own = loop.caller_loop()
    assert own is not None and own is loop.caller_loop()  # one per thread, kept
    others: list[asyncio.AbstractEventLoop | None] = []

    def other() -> None:
        others.append(loop.caller_loop())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    del t
    assert len(others) == 1 and others[0] is not None and others[0] is not own
    gc.collect()
    assert others[0].is_closed()  # its thread ended: its loop went with it
    clients.close()
    assert own.is_closed()
