"""HTTP wiring of the lowering service (the science is tested on the plain functions)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.lowering.app import create_app
from services.lowering.synthetic import default_placement, synthetic_window
from shared.configs.arch import ArchConfig
from shared.settings import Settings


def _client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


def _body() -> dict[str, object]:
    arch = ArchConfig()
    lw = synthetic_window(0, n_layers=2, micro_batch=8, context=256)
    return {"window": 0, "logical": lw.model_dump(), "placement": default_placement(arch, n_layers=2).model_dump(),
            "window_ms": 3.0, "n_layers": 2}


def test_physicalize_roundtrip(settings: Settings) -> None:
    c = _client(settings)
    r = c.post("/v1/physicalize", json=_body())
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"compute", "memory", "state", "timing"}
    assert len(out["compute"]["evt_id"]) == len(out["compute"]["core_id"]) > 0
    assert len(out["timing"]["util_core"]) == 64
    # the returned state feeds the next window
    body = _body()
    body["state"] = out["state"]
    body["window"] = 1
    r2 = c.post("/v1/physicalize", json=body)
    assert r2.status_code == 200, r2.text
    nxt = r2.json()
    ids = nxt["compute"]["evt_id"] + nxt["memory"]["evt_id"]
    assert ids and min(ids) == out["state"]["next_evt_id"]


def test_physicalize_bad_input_names_the_field(settings: Settings) -> None:
    c = _client(settings)
    body = _body()
    body["freq_ghz"] = [2.0, 2.0]
    r = c.post("/v1/physicalize", json=body)
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "freq_ghz"
    body = _body()
    body["window_ms"] = 0
    r = c.post("/v1/physicalize", json=body)
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "window_ms"
    body = _body()
    logical = body["logical"]
    assert isinstance(logical, dict)
    logical["compute"]["tokens"] = logical["compute"]["tokens"][:-1]
    r = c.post("/v1/physicalize", json=body)
    assert r.status_code == 422
    assert r.json()["error"]["field"].startswith("logical.compute")
