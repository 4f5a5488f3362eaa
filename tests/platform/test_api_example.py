"""docs/api.md's Python client runs as written: its ``run_experiment`` submits an experiment to an orchestrator
(in-process, over the fake compute services), waits for it and returns one result row per scenario, and the whole
script, its ``__main__`` part included, compiles."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from services.orchestrator.app import create_app
from shared.client import ServiceClients
from shared.settings import Settings
from tests.orchestrator import fakes
from tests.orchestrator.conftest import SMALL_WL

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def example_code() -> str:
    """The first Python block under "## A Python client"."""
    section = DOC.read_text(encoding="utf-8").split("\n## A Python client\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python block under ## A Python client"
    return match.group(1)


def test_the_example_compiles() -> None:
    compile(example_code(), str(DOC), "exec")


def test_the_example_runs_an_experiment(settings: Settings) -> None:
    namespace: dict[str, Any] = {"__name__": "docs_api_example"}
    exec(compile(example_code(), str(DOC), "exec"), namespace)  # our own documentation's code
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    try:
        with TestClient(create_app(settings, clients=clients)) as client:
            body = {"workload": SMALL_WL, "scenarios": ["baseline", "tas"], "seed": 5}
            rows = namespace["run_experiment"](client, body, key="docs-example", poll_s=0.05, timeout_s=60.0)
            again = namespace["run_experiment"](client, body, key="docs-example", poll_s=0.05, timeout_s=60.0)
            assert client.get("/v1/experiments").json()["total"] == 1  # the key made the retry the same experiment
    finally:
        clients.close()
    assert [row["scenario"] for row in rows] == ["baseline", "tas"]
    assert all(row["T_peak_logic"] > 0 and row["ips"] >= 0 for row in rows)
    assert again == rows
