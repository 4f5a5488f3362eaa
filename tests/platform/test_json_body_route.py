"""`JsonBodyRoute`: the one-pass pydantic-core body parser of the hot endpoints answers exactly as FastAPI's own
handler does (same bodies, same errors, same OpenAPI), and is really used where it applies."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field

from shared.service_app import JsonBodyRoute, create_service_app, fast_json_model
from shared.settings import Settings


class _Inner(BaseModel):
    cores: list[int] = Field(min_length=1)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inner: _Inner
    windows: int = Field(ge=1)
    label: str = "x"

    parsed_json: ClassVar[int] = 0

    @classmethod
    def model_validate_json(cls, *args: Any, **kwargs: Any) -> _Body:
        cls.parsed_json += 1
        return super().model_validate_json(*args, **kwargs)


class _Out(BaseModel):
    total: int
    label: str
    scale: float


def _routers() -> tuple[APIRouter, APIRouter]:
    plain = APIRouter(tags=["probe"])
    fast = APIRouter(tags=["probe"], route_class=JsonBodyRoute)
    for router in (plain, fast):

        @router.post("/sum", response_model=_Out)
        def total(body: _Body) -> _Out:
            return _Out(total=sum(body.inner.cores) * body.windows, label=body.label, scale=0.1 * body.windows)

        @router.post("/sum-async", response_model=_Out, status_code=201)
        async def total_async(body: _Body) -> _Out:
            return _Out(total=sum(body.inner.cores), label=body.label, scale=1e-300)

        @router.post("/items/{k}")
        def with_path_param(k: int, body: _Body) -> dict[str, int]:
            return {"k": k, "windows": body.windows}

        @router.post("/with-request", response_model=_Out)
        def with_request(body: _Body, request: Request) -> _Out:
            return _Out(total=sum(body.inner.cores), label=str(request.app.state.probe), scale=1.0)

    return plain, fast


BODIES: list[tuple[str, bytes | None, str | None]] = [
    ("valid", b'{"inner": {"cores": [1, 2, 3]}, "windows": 3, "label": "\\u00e9t\\u00e9"}', "application/json"),
    ("valid charset", b'{"inner": {"cores": [4]}, "windows": 1}', "application/json; charset=utf-8"),
    ("valid +json", b'{"inner": {"cores": [4]}, "windows": 1}', "application/vnd.tasmoe+json"),
    ("bad field", b'{"inner": {"cores": []}, "windows": 3}', "application/json"),
    ("bad bound", b'{"inner": {"cores": [1]}, "windows": 0}', "application/json"),
    ("wrong type", b'{"inner": {"cores": ["a"]}, "windows": 1}', "application/json"),
    ("unknown key", b'{"inner": {"cores": [1]}, "windows": 1, "nope": 1}', "application/json"),
    ("missing", b'{"inner": {"cores": [1]}}', "application/json"),
    ("not an object", b"[1, 2]", "application/json"),
    ("invalid JSON", b'{"inner": {"cores": [1]}, "windows": ', "application/json"),
    ("empty", b"", "application/json"),
    ("text/plain", b'{"inner": {"cores": [1]}, "windows": 1}', "text/plain"),
    ("no content type", b'{"inner": {"cores": [1]}, "windows": 1}', None),
    ("lax int from string", b'{"inner": {"cores": ["7"]}, "windows": "2"}', "application/json"),
    ("NaN token", b'{"inner": {"cores": [1]}, "windows": NaN}', "application/json"),
]


@pytest.mark.parametrize(("path", "expect"), [("/sum", 200), ("/sum-async", 201), ("/items/5", 200)])
@pytest.mark.parametrize(("case", "body", "ctype"), BODIES, ids=[b[0] for b in BODIES])
def test_fast_route_answers_exactly_like_fastapi(path: str, expect: int, case: str, body: bytes | None,
                                                 ctype: str | None) -> None:
    headers = {} if ctype is None else {"content-type": ctype}
    ref = _plain_client().post(f"/v1{path}", content=body, headers=headers)
    got = _fast_client().post(f"/v1{path}", content=body, headers=headers)
    assert (got.status_code, got.json()) == (ref.status_code, ref.json()), case
    assert got.headers["content-type"] == ref.headers["content-type"]
    if case.startswith(("valid", "lax")):
        assert got.status_code == expect
    else:
        assert got.status_code == 422
        assert set(got.json()["error"]) == {"code", "message", "field"}


def _one(route_class: type[APIRoute]) -> TestClient:
    plain, fast = _routers()
    router = fast if route_class is JsonBodyRoute else plain
    return TestClient(create_service_app("probe", Settings(), [router]), raise_server_exceptions=False)


_CLIENTS: dict[str, TestClient] = {}


def _plain_client() -> TestClient:
    return _CLIENTS.setdefault("plain", _one(APIRoute))


def _fast_client() -> TestClient:
    return _CLIENTS.setdefault("fast", _one(JsonBodyRoute))


def test_bad_field_names_the_field_in_the_error_body() -> None:
    r = _fast_client().post("/v1/sum", json={"inner": {"cores": []}, "windows": 3})
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "inner.cores"
    assert r.json()["error"]["code"] == "invalid"


def test_fast_path_parses_once_with_pydantic_core_and_only_where_it_applies() -> None:
    client = _fast_client()
    before = _Body.parsed_json
    r = client.post("/v1/sum", json={"inner": {"cores": [1, 2]}, "windows": 2})
    assert r.status_code == 200 and r.json() == {"total": 6, "label": "x", "scale": 0.2}
    assert _Body.parsed_json == before + 1
    r = client.post("/v1/items/3", json={"inner": {"cores": [1]}, "windows": 2})
    assert r.status_code == 200 and r.json() == {"k": 3, "windows": 2}
    assert _Body.parsed_json == before + 1  # a path parameter besides the body: FastAPI's handler


def test_fastapis_handler_parses_the_body_with_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared import json_codec

    calls: list[int] = []
    real = json_codec.loads

    def counting(data: Any) -> Any:
        calls.append(len(data))
        return real(data)

    monkeypatch.setattr(json_codec, "loads", counting)
    r = _fast_client().post("/v1/items/3", json={"inner": {"cores": [1]}, "windows": 2})
    assert r.status_code == 200 and r.json() == {"k": 3, "windows": 2}
    assert len(calls) == 1


def test_eligibility() -> None:
    _, fast = _routers()
    routes = {r.path: r for r in fast.routes if isinstance(r, APIRoute)}
    assert fast_json_model(routes["/sum"]) is _Body
    assert fast_json_model(routes["/sum-async"]) is _Body
    assert fast_json_model(routes["/items/{k}"]) is None
    assert fast_json_model(routes["/with-request"]) is _Body  # a Request parameter is handed over as is


def test_the_fast_path_hands_the_request_over() -> None:
    """Endpoints that read the app's state (the run data registered by hash) stay on the fast path."""
    client = _fast_client()
    client.app.state.probe = "registered"  # type: ignore[attr-defined]
    before = _Body.parsed_json
    r = client.post("/v1/with-request", json={"inner": {"cores": [1, 2]}, "windows": 1})
    assert r.status_code == 200 and r.json() == {"total": 3, "label": "registered", "scale": 1.0}
    assert _Body.parsed_json == before + 1


def test_openapi_is_the_same_as_fastapis() -> None:
    ref = _plain_client().get("/openapi.json").json()
    assert ref["paths"]["/v1/sum"]["post"]["requestBody"]["content"]["application/json"]["schema"] == \
        {"$ref": "#/components/schemas/_Body"}
    assert _fast_client().get("/openapi.json").json() == ref


@pytest.mark.parametrize(("service", "path", "model"), [
    ("lowering", "/physicalize", "PhysicalizeRequest"),
    ("thermal", "/step", "StepRequest"),
    ("placement", "/tacs/step", "TacsStepRequest"),
])
def test_hot_endpoints_use_the_fast_route(service: str, path: str, model: str) -> None:
    import importlib

    router: APIRouter = importlib.import_module(f"services.{service}.app").router
    route = next(r for r in router.routes if isinstance(r, APIRoute) and r.path == path)
    assert isinstance(route, JsonBodyRoute)
    found = fast_json_model(route)
    assert found is not None and found.__name__ == model
