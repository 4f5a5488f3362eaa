"""One request, bounded cost (issue 17, item 2): requests past a documented bound (shared/limits.py, the configs'
field bounds, the trace-window bound) are refused with a 422 naming the field, before anything is built — the
bodies below used to overflow, divide by zero or run for minutes."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.root_app import create_service
from services.workload.traces import MAX_TRACE_WINDOWS
from shared.limits import MAX_DIM, MAX_LAYERS, MAX_STAGES
from shared.settings import Settings

CASES: list[tuple[str, str, dict[str, Any], str]] = [
    # a decode trace of 500 micro-batches 1000 s apart cut into 3 ms windows: 1.7e8 windows
    ("workload", "/v1/traces", {"workload": {"model": "mixtral-8x7b", "sequence": {
        "steps": 500, "micro_batch": 32, "step_interval_ms": 999999.0}}, "window_ms": 3}, "window_ms"),
    ("workload", "/v1/ir", {"model": "x", "config": {"model_type": "llama", "hidden_size": 4096,
                                                     "num_hidden_layers": 10 ** 6, "num_attention_heads": 32,
                                                     "intermediate_size": 14336, "vocab_size": 32000}},
     "num_hidden_layers"),
    ("workload", "/v1/ir", {"model": "mixtral-8x7b", "seq_len": MAX_DIM + 1}, "seq_len"),
    ("lowering", "/v1/lower/stages", {"blocks": [{"d": 2 ** 63}]}, "blocks[0].d"),
    ("lowering", "/v1/lower/stages", {"blocks": [{"n_experts": 4096, "topk": 4096}] * 3}, "blocks"),
    ("lowering", "/v1/lower/graph", {"arch": {"dram": {"vault_bw_gbps": 5e-324}}, "ops": [{"kind": "GQA"}]},
     "arch.dram.vault_bw_gbps"),
    ("lowering", "/v1/lower/ops", {"ops": [{"kind": "matmul", "M": 2 ** 40, "K": 8, "N": 8}]}, "ops[0]"),
    ("thermal", "/v1/step", {"arch": {"power": {"logic_leak_w_per_core": 1e308}}}, "arch.power.logic_leak_w_per_core"),
]


@pytest.mark.parametrize(("service", "path", "body", "field"), CASES)
def test_an_over_budget_request_is_refused_naming_the_field(service: str, path: str, body: dict[str, Any],
                                                            field: str, settings: Settings) -> None:
    with TestClient(create_service(service, settings)) as client:
        r = client.post(path, json=body)
    assert r.status_code == 422, r.text[:400]
    err = r.json()["error"]
    assert err["field"] is not None and err["field"].startswith(field), err


def test_the_bounds_are_what_the_operations_doc_lists() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = text[text.index("## Security and limits"):]
    for value in (MAX_DIM, MAX_LAYERS, MAX_STAGES, MAX_TRACE_WINDOWS):
        assert re.search(rf"\b{value:,}\b|\b{value}\b", section), value
