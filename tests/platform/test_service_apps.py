"""Every service's app: /healthz, the one error body for 404/405/422/500, stable and unique operation ids.

The 422 cases run against each real service app: a probe router is added to the app the service's own `create_app`
built (so its error handlers and middleware are the ones under test), and every JSON-body endpoint the service
declares is sent a body of the wrong type.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from services.root_app import create_root_app, create_service
from shared import SERVICES, __version__, json_codec
from shared.errors import BadInput, Conflict, NotFound
from shared.service_app import JsonRoute
from shared.settings import Settings


class _Mesh(BaseModel):
    cores: list[int] = Field(min_length=1)


class _ProbeBody(BaseModel):
    mesh: _Mesh
    windows: int = Field(ge=1)


class _Numbers(BaseModel):
    x: float
    n: int


def _probe_router() -> APIRouter:
    router = APIRouter(route_class=JsonRoute, tags=["probe"])

    @router.post("/probe/numbers")
    def probe_numbers(body: _Numbers) -> dict[str, Any]:
        return {"x": repr(body.x), "n": str(body.n)}

    @router.post("/probe/body")
    def probe_body(body: _ProbeBody) -> dict[str, int]:
        return {"windows": body.windows}

    @router.get("/probe/items/{k}")
    def probe_item(k: int, limit: int = 10) -> dict[str, int]:
        return {"k": k, "limit": limit}

    @router.get("/probe/raise/{kind}")
    def probe_raise(kind: str) -> None:
        errors: dict[str, Exception] = {
            "bad": BadInput("windows: must be >= 1", field="windows"),
            "missing": NotFound("no such trace 'abc'", field="trace_id"),
            "conflict": Conflict("window 3 already stepped"),
            "value": ValueError("n_experts must divide the mesh"),
            "bug": RuntimeError("boom"),
        }
        raise errors[kind]

    @router.get("/probe/nested")
    def probe_nested() -> None:
        _ProbeBody.model_validate({"mesh": {"cores": []}, "windows": 1})

    return router


def _error(resp: Any) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "field"}, body
    err: dict[str, Any] = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    return err


@pytest.fixture(scope="module", params=SERVICES)
def service_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[str, FastAPI, TestClient]]:
    """One service's real app (lifespan entered once per module) with the probe router added."""
    name: str = request.param
    settings = Settings.model_validate({"results_dir": tmp_path_factory.mktemp(name) / "results",
                                        "configs_dir": Path(__file__).resolve().parents[2] / "configs"})
    app = create_service(name, settings)
    app.include_router(_probe_router(), prefix="/v1")
    with TestClient(app, raise_server_exceptions=False) as client:  # enters the service's lifespan
        yield name, app, client


def test_healthz(service_app: tuple[str, FastAPI, TestClient]) -> None:
    name, _, client = service_app
    resp = client.get("/healthz")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok", "service": name, "version": __version__}


def test_unknown_path_is_404_with_error_body(service_app: tuple[str, FastAPI, TestClient]) -> None:
    _, _, client = service_app
    resp = client.get("/v1/definitely/not/here")
    assert resp.status_code == 404
    assert _error(resp)["code"] == "not_found"


def test_wrong_method_is_405_with_error_body_and_allow(service_app: tuple[str, FastAPI, TestClient]) -> None:
    _, _, client = service_app
    resp = client.delete("/healthz")
    assert resp.status_code == 405
    assert _error(resp)["code"] == "method_not_allowed"
    assert "GET" in resp.headers["allow"]


def test_bad_body_field_is_422_with_field_path(service_app: tuple[str, FastAPI, TestClient]) -> None:
    _, _, client = service_app
    resp = client.post("/v1/probe/body", json={"mesh": {"cores": [1, "x"]}, "windows": 2})
    assert resp.status_code == 422
    err = _error(resp)
    assert err["code"] == "invalid"
    assert err["field"] == "mesh.cores[1]"
    assert err["message"].startswith("mesh.cores[1]: ")

    resp = client.post("/v1/probe/body", json={"mesh": {"cores": [1]}, "windows": 0})
    err = _error(resp)
    assert (resp.status_code, err["field"], err["message"]) == (422, "windows", "windows: must be >= 1")

    resp = client.post("/v1/probe/body", json={"mesh": {"cores": [1]}})
    assert _error(resp)["field"] == "windows"


def test_bad_path_and_query_params_name_the_param(service_app: tuple[str, FastAPI, TestClient]) -> None:
    _, _, client = service_app
    assert _error(client.get("/v1/probe/items/abc"))["field"] == "k"
    resp = client.get("/v1/probe/items/3?limit=many")
    assert resp.status_code == 422
    assert _error(resp)["field"] == "limit"
    assert client.get("/v1/probe/items/3?limit=4").json() == {"k": 3, "limit": 4}


def test_missing_and_malformed_body(service_app: tuple[str, FastAPI, TestClient]) -> None:
    _, _, client = service_app
    resp = client.post("/v1/probe/body")
    assert resp.status_code == 422
    assert _error(resp)["message"] == "request body is required"
    resp = client.post("/v1/probe/body", content=b'{"mesh": ', headers={"content-type": "application/json"})
    assert resp.status_code == 422
    err = _error(resp)
    assert err["field"] is None
    assert err["message"].startswith("request body is not valid JSON")


def test_a_json_body_is_parsed_by_orjson_and_what_it_refuses_as_before(
        service_app: tuple[str, FastAPI, TestClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """A route parses its body with `shared.json_codec.loads` (orjson; `JsonRoute`); what orjson refuses and the
    standard library reads (the NaN token Python's json.dumps writes, an integer beyond 64 bits) is read as before."""
    import shared.service_app as service_app_module

    _, _, client = service_app
    parsed: list[bytes] = []

    def counting(data: bytes) -> Any:
        parsed.append(data)
        return json_codec.loads(data)

    monkeypatch.setattr(service_app_module, "parse_json", counting)
    for body, want in ((b'{"x": NaN, "n": 1}', {"x": "nan", "n": "1"}),
                       (b'{"x": 0.5, "n": 123456789012345678901234567890}',
                        {"x": "0.5", "n": "123456789012345678901234567890"}),
                       (b'{"x": 0.1, "n": -9007199254740993}', {"x": "0.1", "n": "-9007199254740993"})):
        resp = client.post("/v1/probe/numbers", content=body, headers={"content-type": "application/json"})
        assert (resp.status_code, resp.json()) == (200, want)
        assert parsed[-1] == body


def test_every_service_route_is_a_json_route(service_app: tuple[str, FastAPI, TestClient]) -> None:
    """Every route of a service's router reads its JSON body with orjson (the router's route_class)."""
    name = service_app[0]
    routes = importlib.import_module(f"services.{name}.app").router.routes
    assert routes, name
    assert [r.path for r in routes if not isinstance(r, JsonRoute)] == []


@pytest.mark.parametrize(
    ("kind", "status", "code", "field"),
    [("bad", 422, "invalid", "windows"), ("missing", 404, "not_found", "trace_id"),
     ("conflict", 409, "conflict", None), ("value", 422, "invalid", None), ("bug", 500, "internal", None)],
)
def test_raised_errors_use_the_error_body(service_app: tuple[str, FastAPI, TestClient], kind: str, status: int,
                                          code: str, field: str | None) -> None:
    _, _, client = service_app
    resp = client.get(f"/v1/probe/raise/{kind}")
    assert resp.status_code == status
    err = _error(resp)
    assert (err["code"], err["field"]) == (code, field)


def test_pydantic_error_inside_a_handler_names_the_field(service_app: tuple[str, FastAPI, TestClient]) -> None:
    _, _, client = service_app
    resp = client.get("/v1/probe/nested")
    assert resp.status_code == 422
    err = _error(resp)
    assert err["field"] == "mesh.cores"
    assert "\n" not in err["message"]


def _json_body_operations(app: FastAPI) -> list[tuple[str, str]]:
    ops = []
    for path, item in app.openapi()["paths"].items():
        for method, op in item.items():
            body = op.get("requestBody", {})
            if "probe" in path or "application/json" not in body.get("content", {}):
                continue
            ops.append((method, re.sub(r"\{[^}]+\}", "x", path)))
    return ops


def test_every_declared_json_endpoint_answers_a_wrong_body_with_the_error_body(
        service_app: tuple[str, FastAPI, TestClient]) -> None:
    """Whatever endpoints a service grows, a body of the wrong type gets a 422 in the one error format."""
    _, app, client = service_app
    for method, path in _json_body_operations(app):
        resp = client.request(method.upper(), path, json="not an object")
        assert resp.status_code == 422, (method, path, resp.text)
        assert _error(resp)["code"] == "invalid"


def test_operation_ids_are_tag_dash_name_and_unique(settings: Settings) -> None:
    """``<tag>-<function name>``; unique within each spec and, apart from /healthz, across all six."""
    seen: dict[str, str] = {}
    for name in SERVICES:
        spec = create_service(name, settings).openapi()
        assert spec["paths"]["/healthz"]["get"]["operationId"] == "health-healthz"
        mine: set[str] = set()
        for path, item in spec["paths"].items():
            for method, op in item.items():
                op_id = op["operationId"]
                where = f"{name} {method.upper()} {path}"
                assert re.fullmatch(r"[a-z_]+-[A-Za-z0-9_]+", op_id), f"{where}: operationId {op_id}"
                assert op_id not in mine, f"{where}: operationId {op_id} used twice in {name}"
                mine.add(op_id)
                if path == "/healthz":
                    continue
                assert op_id not in seen, f"operationId {op_id} used by {seen.get(op_id)} and {where}"
                seen[op_id] = where


def test_specs_are_stable_across_builds(settings: Settings) -> None:
    for name in SERVICES:
        assert create_service(name, settings).openapi() == create_service(name, settings).openapi()


def test_root_app_mounts_all_six(settings: Settings) -> None:
    with TestClient(create_root_app(settings)) as client:
        assert client.get("/healthz").json() == {"status": "ok", "services": list(SERVICES)}
        for name in SERVICES:
            assert client.get(f"/{name}/healthz").json()["service"] == name
            assert _error(client.get(f"/{name}/v1/nowhere"))["code"] == "not_found"


def test_embedded_clients_reach_every_service_over_asgi(settings: Settings) -> None:
    from services.root_app import embedded

    with embedded(settings) as emb:
        for name in SERVICES:
            assert emb.clients[name].base_url == f"http://{name}"
            assert emb.clients[name].get_json("/healthz")["service"] == name
        with pytest.raises(NotFound, match="thermal: Not Found"):
            emb.clients["thermal"].get_json("/v1/definitely/not/here")


@pytest.mark.parametrize("name", ["thermal", "lowering"])
def test_an_oversized_body_is_refused_with_413_before_it_is_read(name: str, settings: Settings) -> None:
    small = settings.model_copy(update={"max_body_mb": 0.01})  # 10 KiB
    app = create_service(name, small)
    client = TestClient(app)
    path = "/v1/physicalize" if name == "lowering" else "/v1/step"
    body = b'{"x": "' + b"a" * 20_000 + b'"}'
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == "too_large" and err["field"] == "body" and "TASMOE_MAX_BODY_MB" in err["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        yield b'{"x": "'
        for _ in range(20):
            yield b"a" * 1000
        yield b'"}'

    r2 = client.post(path, content=chunks(), headers={"content-type": "application/json"})
    assert r2.status_code == 413 and r2.json()["error"]["code"] == "too_large"
    assert client.get("/healthz").status_code == 200  # the service is fine afterwards
