"""The boundary-bytes measurement (issue 21) counts exactly the request and response bodies a service sees."""

from __future__ import annotations

import json
from pathlib import Path

from services.orchestrator.boundary_bytes import Counting, counting
from services.orchestrator.worker import compute_clients
from shared.settings import Settings
from tests.conftest import CONFIGS


def test_counting_wrapper_sees_every_body_byte(tmp_path: Path) -> None:
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    wrapped: dict[str, Counting] = {}
    body = {"workload": {"model": "mixtral-8x7b", "sequence": {"steps": 2}}, "window_ms": 3.0}
    with compute_clients(settings, "tests.orchestrator.fakes:build_apps", wrap=counting(wrapped)) as clients:
        resp = clients["workload"].request("POST", "/v1/traces", content=json.dumps(body).encode())
        health = clients["workload"].request("GET", "/healthz")
    t = wrapped["workload"].tally
    assert t.calls == 2
    assert t.sent == len(json.dumps(body).encode())
    assert t.received == len(resp.content) + len(health.content) > 0
    assert wrapped["thermal"].tally.calls == 0
