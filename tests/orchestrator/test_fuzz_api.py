"""Malformed and hostile requests against every operation of the orchestrator's OpenAPI, in-process: never a 500.

(Beside tests/platform/test_schemathesis.py, which generates from the schemas, this test sends what a schema-driven
generator rarely makes: for every operation in the app's own OpenAPI document, hostile path parameters, query strings,
headers and JSON bodies — random JSON, wrong types, huge numbers, NaN-like strings, deep nesting — and mutated valid
bodies.)

Runs are accepted but not executed (a recording dispatcher): this checks the API layer, not the simulation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from services.orchestrator.app import create_app
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator.fakes import RecordingDispatcher


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    tmp: Path = tmp_path_factory.mktemp("orch-fuzz")
    settings = Settings(results_dir=tmp / "results", configs_dir=CONFIGS)
    with TestClient(create_app(settings, dispatcher=RecordingDispatcher()), raise_server_exceptions=False) as tc:
        yield tc


def _operations() -> list[tuple[str, str]]:
    spec = create_app(Settings(configs_dir=CONFIGS), dispatcher=RecordingDispatcher()).openapi()
    return [(method.upper(), path) for path, item in spec["paths"].items() for method in item
            if path.startswith("/v1/")]


HOSTILE_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
    st.text(max_size=40), st.sampled_from(["NaN", "Infinity", "-1e309", "../../etc/passwd", "\x00", "' OR 1=1 --",
                                           "arch_8x8_32x32x8", "baseline", "tas", "9" * 400]))
JSON = st.recursive(HOSTILE_SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=5),
                                                            st.dictionaries(st.text(max_size=12), kids, max_size=5)),
                    max_leaves=25)
KEYS = st.sampled_from(["arch", "workload", "tas", "scenarios", "seed", "windows", "name", "traces", "grid", "base",
                        "mesh", "cores", "sequence", "steps", "routing", "tacs", "thresholds", "Thot"])
BODY = st.one_of(JSON, st.dictionaries(KEYS, JSON, max_size=6),
                 st.fixed_dictionaries({"grid": st.dictionaries(st.sampled_from(
                     ["tas.tacs.thresholds.Thot", "seed", "workload.routing.zipf_s", "arch", "x.y", ""]),
                     st.lists(HOSTILE_SCALARS, max_size=3), max_size=3)}))
PATH_PARAM = st.one_of(st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="/?#%"),
                               min_size=1, max_size=30), st.just("exp-000000000000"))


@pytest.mark.parametrize(("method", "path"), _operations())
@hsettings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=BODY, param=PATH_PARAM, query=st.dictionaries(st.sampled_from(
    ["status", "limit", "offset", "format", "scenario", "poll_s"]), HOSTILE_SCALARS.map(str), max_size=3),
       key=st.one_of(st.none(), st.text(max_size=300).filter(lambda s: s.isascii() and s.isprintable())))
def test_no_server_errors(client: TestClient, method: str, path: str, body: Any, param: str,
                          query: dict[str, str], key: str | None) -> None:
    quoted = quote(param, safe="")
    url = path.replace("{exp_id}", quoted).replace("{sweep_id}", quoted)
    if url.endswith("/events"):
        query = {**query, "poll_s": "0.05"}
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    content = json.dumps(body) if method == "POST" else None
    r = client.request(method, url, params=query, content=content, headers=headers)
    assert r.status_code < 500, f"{method} {url} {query} {content!r}: {r.status_code} {r.text[:300]}"
    if r.status_code >= 400:
        assert set(r.json()["error"]) >= {"code", "message", "field"}


def test_not_json_at_all(client: TestClient) -> None:
    r = client.post("/v1/experiments", content=b"\xff\xfe{not json", headers={"Content-Type": "application/json"})
    assert r.status_code in {400, 422} and r.json()["error"]["message"]
