"""A run too short for any token is refused at submission (issue 17, item 7): 422 naming ``windows`` with the
minimum, which the first micro-batch alone on the idle chip needs (the cycle model, `capacity.first_token_window`);
that many windows are accepted. The real services, in process (embedded mode); nothing is run."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from services.orchestrator.app import create_app
from services.orchestrator.worker import compute_clients
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator.fakes import RecordingDispatcher


def test_windows_shorter_than_the_first_token_are_refused_with_the_minimum(tmp_path: Path) -> None:
    disp = RecordingDispatcher()
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    body = {"workload": "workload_quick.yaml", "scenarios": ["baseline"]}
    with compute_clients(settings) as clients, \
            TestClient(create_app(settings, clients=clients, dispatcher=disp)) as c:
        r = c.post("/v1/experiments", json={**body, "windows": 1})
        assert r.status_code == 422 and r.json()["error"]["field"] == "windows", r.text
        m = re.search(r"needs at least (\d+) windows", r.json()["error"]["message"])
        assert m, r.json()
        need = int(m.group(1))
        assert need > 1
        r = c.post("/v1/experiments", json={**body, "windows": need - 1})
        assert r.status_code == 422 and f"at least {need} windows" in r.json()["error"]["message"]
        assert c.post("/v1/experiments", json={**body, "windows": need}).status_code == 202
        assert c.post("/v1/experiments", json=body).status_code == 202  # the whole trace: not checked
    assert len(disp.submitted) == 2
