"""HTTP wiring of the workload service (TestClient on create_app): the science is tested on the plain functions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from services.workload.app import create_app
from services.workload.ir import build_ir
from services.workload.traces import expert_load, iter_windows
from services.workload.zoo import ModelZoo
from shared.configs import WorkloadConfig
from shared.contracts.workload import ExpertLoad, LogicalWindow, LogicalWindows, TraceSummary
from shared.settings import Settings

SMALL: dict[str, Any] = {"model": "mixtral-8x7b", "routing": {"topk": 2, "seed": 3, "zipf_s": 1.1, "locality": 0.2},
                         "sequence": {"tokens": 128, "micro_batch": 4, "steps": 10, "step_interval_ms": 1.0}}


@pytest.fixture()
def client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


def test_models(client: TestClient) -> None:
    names = [m["name"] for m in client.get("/v1/models").json()["models"]]
    assert "mixtral-8x7b" in names and "deepseek-v3" in names
    r = client.get("/v1/models/deepseek-v3").json()
    assert r["config"]["moe"]["first_k_dense_replace"] == 3 and r["params_total"] > 6.7e11
    r404 = client.get("/v1/models/gpt-9")
    assert r404.status_code == 404
    err = r404.json()["error"]
    assert err["code"] == "unknown_model" and "llama-3-8b" in err["message"]


def test_ir(client: TestClient) -> None:
    r = client.post("/v1/ir", json={"model": "mixtral-8x7b", "phase": "decode", "batch": 1, "seq_len": 2048})
    assert r.status_code == 200
    body = r.json()
    ir = build_ir(ModelZoo().get_model_config("mixtral-8x7b"))
    assert body["params_total"] == ir.params_total and body["params_active"] == ir.params_active
    assert body["matmul_flops_per_token"] == ir.get_ops_breakdown().cube_ops
    assert body["flops_per_token"] > body["matmul_flops_per_token"] and body["bytes_per_token"] > 0
    assert len(body["layers"]) == 2 + 2 * 32 and body["layers"][2]["comm"]["pattern"] == "all2all"
    assert body["expert_flops_per_token"] == pytest.approx(2 * 3 * 4096 * 14336, rel=1e-3)


def test_ir_inline_config_and_errors(client: TestClient) -> None:
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 100}
    r = client.post("/v1/ir", json={"model": "tiny", "config": cfg, "seq_len": 16})
    assert r.status_code == 200 and r.json()["model"] == "tiny" and r.json()["attention"] == "mha"
    for body, field in [({"model": "mixtral-8x7b", "batch": 0}, "batch"),
                        ({"model": "mixtral-8x7b", "phase": "train"}, "phase"),
                        ({"model": "tiny", "config": {**cfg, "hidden_size": None}}, "hidden_size")]:
        r = client.post("/v1/ir", json=body)
        assert r.status_code == 422, body
        assert r.json()["error"]["field"] == field
    assert client.post("/v1/ir", json={"model": "nope"}).status_code == 404


def test_trace_lifecycle(client: TestClient) -> None:
    r = client.post("/v1/traces", json={"workload": SMALL, "window_ms": 3})
    assert r.status_code == 200
    s = TraceSummary.model_validate(r.json())
    assert s.n_windows == 4 and s.tokens_total == 40 and s.n_experts == 8 and s.moe_layers == list(range(32))
    assert client.post("/v1/traces", json={"workload": SMALL, "window_ms": 3}).json()["trace_id"] == s.trace_id
    assert client.post("/v1/traces", json={"workload": SMALL, "window_ms": 2}).json()["trace_id"] != s.trace_id
    assert TraceSummary.model_validate(client.get(f"/v1/traces/{s.trace_id}").json()) == s
    cfg = WorkloadConfig.model_validate(SMALL)
    streamed = list(iter_windows(cfg, 3.0, trace_id=s.trace_id))
    for k in (2, 0, 3, 1):  # random access gives the streaming windows, global event ids included
        w = LogicalWindow.model_validate(client.get(f"/v1/traces/{s.trace_id}/windows/{k}").json())
        assert w == streamed[k]
    assert client.get(f"/v1/traces/{s.trace_id}/windows/4").json()["error"]["code"] == "unknown_window"
    wide = client.get(f"/v1/traces/{s.trace_id}/windows/0", params={"window_ms": 100}).json()
    assert len(wide["compute"]["event_id"]) == sum(len(w.compute) for w in streamed)
    load = ExpertLoad.model_validate(client.get(f"/v1/traces/{s.trace_id}/expert-load").json())
    layers, want = expert_load(cfg)
    assert load.layers == layers
    np.testing.assert_allclose(np.asarray(load.load), want)


def test_windows_in_batches(client: TestClient) -> None:
    """``GET .../windows?start=&count=``: the windows ``GET .../windows/{k}`` gives, in order, cut at the trace's end;
    a start past the end and a count out of bounds are errors naming the parameter."""
    s = TraceSummary.model_validate(client.post("/v1/traces", json={"workload": SMALL, "window_ms": 3}).json())
    one = [client.get(f"/v1/traces/{s.trace_id}/windows/{k}").json() for k in range(s.n_windows)]
    for start, count in ((0, 16), (1, 2), (3, 1), (2, 64)):
        r = client.get(f"/v1/traces/{s.trace_id}/windows", params={"start": start, "count": count})
        assert r.status_code == 200, r.text
        assert LogicalWindows.model_validate(r.json()).windows == [
            LogicalWindow.model_validate(w) for w in one[start:start + count]]
    r = client.get(f"/v1/traces/{s.trace_id}/windows", params={"start": s.n_windows})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_window"
    assert r.json()["error"]["field"] == "start"
    for count in (0, 65):
        r = client.get(f"/v1/traces/{s.trace_id}/windows", params={"count": count})
        assert r.status_code == 422 and r.json()["error"]["field"] == "count", r.text
    wide = client.get(f"/v1/traces/{s.trace_id}/windows", params={"window_ms": 100}).json()["windows"]
    assert len(wide) == 1 and wide[0]["compute"] == client.get(f"/v1/traces/{s.trace_id}/windows/0",
                                                                params={"window_ms": 100}).json()["compute"]


def test_unknown_trace_and_lru_eviction(settings: Settings) -> None:
    client = TestClient(create_app(settings.model_copy(update={"cache_size": 1})))
    r = client.get("/v1/traces/0123456789abcdef/windows/0")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_trace"
    a = client.post("/v1/traces", json={"workload": SMALL}).json()["trace_id"]
    b = client.post("/v1/traces", json={"workload": {**SMALL, "model": "llama-2-7b"}}).json()["trace_id"]
    assert client.get(f"/v1/traces/{b}").status_code == 200
    assert client.get(f"/v1/traces/{a}").json()["error"]["code"] == "unknown_trace"


@pytest.mark.parametrize(("patch", "field", "status"), [
    ({"routing": {"topk": 9}}, "workload.routing.topk", 422),
    ({"routing": {"zipf_s": -0.5}}, "workload.routing.zipf_s", 422),
    ({"sequence": {"tokens": 0}}, "workload.sequence.tokens", 422),
    ({"sequence": {"micro_batch": 0}}, "workload.sequence.micro_batch", 422),
    ({"model": "gpt-9"}, "workload.model", 404),
])
def test_trace_bad_input(client: TestClient, patch: dict[str, Any], field: str, status: int) -> None:
    wl: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in SMALL.items()}
    for k, v in patch.items():
        if isinstance(v, dict):
            wl[k].update(v)
        else:
            wl[k] = v
    r = client.post("/v1/traces", json={"workload": wl})
    assert r.status_code == status
    assert r.json()["error"]["field"] == field
    assert client.post("/v1/traces", json={"workload": SMALL, "window_ms": 0}).json()["error"]["field"] == "window_ms"
