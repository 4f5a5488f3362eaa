"""docs/api.md's table of error statuses (section "Errors") is what the services answer: its statuses are exactly the
4xx/5xx statuses the services' OpenAPI documents, and for each row a service asked for it answers that status with
one of the row's codes in the standard error body."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from services.orchestrator.app import create_app
from services.orchestrator.settings import OrchestratorSettings
from shared import SERVICES
from shared.auth import KeyStore
from shared.client import ServiceClients
from tests.conftest import CONFIGS
from tests.orchestrator import fakes

REPO = Path(__file__).resolve().parents[2]
API_DOC = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
BODY = {"workload": "workload_quick.yaml", "scenarios": ["baseline"]}


def error_table() -> dict[int, set[str]]:
    """{status: its codes} from the table under "## Errors"."""
    section = API_DOC.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d{3}) \| ([^|]*) \|", section, re.M)
    assert rows, "no status table under ## Errors"
    return {int(status): set(re.findall(r"`([a-z_<>]+)`", codes)) for status, codes in rows}


def documented_statuses() -> set[int]:
    out: set[int] = set()
    for name in SERVICES:
        spec = json.loads((REPO / "openapi" / f"{name}.json").read_text(encoding="utf-8"))
        for item in spec["paths"].values():
            for op in item.values():
                if isinstance(op, dict):
                    out |= {int(code) for code in op.get("responses", {}) if code[0] in "45"}
    return out


ROUTING = {405}  # answered by the router for a method a path does not have: no operation documents it


def test_the_table_lists_the_statuses_the_services_document() -> None:
    table, answered = set(error_table()), documented_statuses() | ROUTING
    assert table == answered, f"docs/api.md only: {sorted(table - answered)}, services only: {sorted(answered - table)}"


class Refusing:
    """A workload service that is down (every request refused) or broken (every answer a 500)."""

    def __init__(self, broken: bool) -> None:
        self.broken = broken

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if not self.broken:
            raise httpx.ConnectError("connection refused (workload is down)")
        body = b'{"error": {"code": "internal", "message": "internal error (KeyError)", "field": null}}'
        await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


def _orchestrator(tmp_path: Path, name: str, *, workload: Any = None, **extra: Any) -> tuple[TestClient,
                                                                                           ServiceClients]:
    settings = OrchestratorSettings(results_dir=tmp_path / name / "results", configs_dir=CONFIGS, http_retries=0,
                                    database_url=f"sqlite:///{tmp_path / name / 'runs.sqlite3'}", **extra)
    apps: dict[str, Any] = fakes.build_apps(settings)
    if workload is not None:
        apps["workload"] = workload
    clients = ServiceClients(settings, asgi_apps=apps)
    app = create_app(settings, clients=clients, dispatcher=fakes.RecordingDispatcher())
    return TestClient(app, raise_server_exceptions=False), clients


def test_every_row_is_what_a_service_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = error_table()
    answers: dict[int, list[httpx.Response]] = {}

    def ask(status: int, call: Callable[[], httpx.Response]) -> None:
        answers.setdefault(status, []).append(call())

    store = KeyStore(tmp_path / "keys.json")
    reader = store.create("alice", "read")
    keyed, kc = _orchestrator(tmp_path, "keyed", auth="keys", keys_file=tmp_path / "keys.json")
    with keyed as c:
        ask(401, lambda: c.get("/v1/experiments"))
        ask(403, lambda: c.post("/v1/experiments", json=BODY, headers={"Authorization": f"Bearer {reader}"}))
    kc.close()

    plain, pc = _orchestrator(tmp_path, "plain", quota_active_runs=1, max_body_mb=0.001)
    with plain as c:
        ask(404, lambda: c.get("/v1/experiments/exp-000000000000"))
        ask(405, lambda: c.delete("/v1/experiments"))
        ask(413, lambda: c.post("/v1/experiments", json={**BODY, "name": "x" * 2000}))
        ask(422, lambda: c.post("/v1/experiments", json={"scenarios": ["nope"]}))
        ask(429, lambda: c.post("/v1/experiments", json={**BODY, "scenarios": ["baseline", "tas"]}))
        exp = c.post("/v1/experiments", json=BODY, headers={"Idempotency-Key": "k"}).json()["id"]
        ask(409, lambda: c.get(f"/v1/experiments/{exp}/results", params={"format": "csv"}))
        ask(409, lambda: c.post(f"/v1/experiments/{exp}/retry"))
        ask(409, lambda: c.post("/v1/experiments", json={**BODY, "name": "other"}, headers={"Idempotency-Key": "k"}))
        from services.orchestrator import repository, service

        with monkeypatch.context() as m:
            def bug(**_: Any) -> Any:
                raise KeyError("a bug")

            m.setattr(service, "experiment_view", bug)
            ask(500, lambda: c.get(f"/v1/experiments/{exp}"))
        with monkeypatch.context() as m:
            def away(**_: Any) -> Any:
                raise sa.exc.OperationalError("SELECT", {}, Exception("connection refused"))

            m.setattr(repository, "get_experiment", away)
            ask(503, lambda: c.get(f"/v1/experiments/{exp}"))
    pc.close()

    for broken in (True, False):
        down, dc = _orchestrator(tmp_path, f"upstream-{broken}", workload=Refusing(broken))
        with down as c:
            ask(502, lambda: c.post("/v1/experiments", json=BODY))
        dc.close()

    assert set(answers) == set(table), f"rows not asked: {sorted(set(table) - set(answers))}"
    codes_seen: dict[int, set[str]] = {}
    for status, responses in answers.items():
        for r in responses:
            assert r.status_code == status, (status, r.text)
            err = r.json()["error"]
            assert set(err) == {"code", "message", "field"} and err["message"], r.text
            assert err["code"] in table[status], f"{status}: {err['code']} is not in docs/api.md's row {table[status]}"
            codes_seen.setdefault(status, set()).add(err["code"])
            if status in (429, 503):
                assert int(r.headers["Retry-After"]) > 0
    assert codes_seen[409] == {"conflict", "nothing_to_retry", "idempotency_mismatch"}
    assert codes_seen[502] == {"upstream", "unavailable"}
