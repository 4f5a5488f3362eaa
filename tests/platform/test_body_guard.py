"""`shared.body_guard`: a JSON body over a bound (depth, keys, values), not UTF-8, or with a key its request model
does not know is refused with a 422 naming the field before pydantic builds anything from it; legitimate bodies
(free-form config dicts, aliases, extra="allow") pass as before; and the memory one such request takes is bounded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.body_guard import JsonLimits, check_raw
from shared.service_app import create_service_app
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]


class _Core(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int
    temps: list[float] = []


class _Free(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = "x"


class _MatMul(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["matmul"]
    M: int


class _Add(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["add"]
    N: int = 1


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cores: list[_Core] = []
    by_name: dict[str, _Core] = {}
    config: dict[str, Any] = {}  # free-form (an inline HF config.json)
    free: _Free = _Free()
    ops: list[Annotated[_MatMul | _Add, Field(discriminator="kind")]] = []
    label: str = Field(default="", alias="Label")
    values: list[float] = []

    built: ClassVar[int] = 0

    @field_validator("label")
    @classmethod
    def _count(cls, v: str) -> str:
        _Body.built += 1  # pydantic validated a body (the guard's refusals come before this)
        return v


def _client(settings: Settings | None = None) -> TestClient:
    router = APIRouter(tags=["probe"])

    @router.post("/probe")
    def probe(body: _Body) -> dict[str, int]:
        return {"cores": len(body.cores), "config": len(body.config)}

    return TestClient(create_service_app("probe", settings or Settings(), [router]))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with _client() as c:
        yield c


REFUSED: list[tuple[str, Any, str, str]] = [
    ("top level", {"cores": [], "bogus": 1}, "bogus", "unknown key"),
    ("in a list item", {"cores": [{"id": 1}, {"id": 2, "x": 0}]}, "cores[1].x", "unknown key"),
    ("in a dict of models", {"by_name": {"a": {"id": 1, "tmps": []}}}, "by_name.a.tmps", "unknown key"),
    ("in a tagged union", {"ops": [{"kind": "add"}, {"kind": "matmul", "M": 2, "K": 3}]}, "ops[1].matmul.K",
     "unknown key"),
    ("an item that is not an object", {"cores": [{"id": 1}, 0, 0]}, "cores[1]",
     "Input should be a valid dictionary or object to extract fields from"),
    ("an item without a required field", {"cores": [{"id": 1}, {"temps": []}]}, "cores[1].id", "required"),
]


PADDING = {"config": {f"c{i}": 0 for i in range(4100)}}  # past 4,096 keys a body is walked before pydantic runs


@pytest.mark.parametrize(("case", "body", "field", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_key_the_model_does_not_know_is_refused_naming_it_before_the_model_is_built(
        client: TestClient, case: str, body: Any, field: str, message: str) -> None:
    before = _Body.built
    r = client.post("/v1/probe", json={**body, **PADDING})
    assert r.status_code == 422, r.text
    assert r.json() == {"error": {"code": "invalid", "field": field, "message": f"{field}: {message}"}}
    assert _Body.built == before, case


@pytest.mark.parametrize(("case", "body", "field", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_small_body_gets_the_same_answer_from_pydantic(client: TestClient, case: str, body: Any, field: str,
                                                         message: str) -> None:
    """Below 4,096 keys, 1,024 arrays and objects and 32,768 values the body goes to the route unwalked (pydantic's
    errors are few there): the answer is the same."""
    r = client.post("/v1/probe", json=body)
    assert r.status_code == 422, r.text
    assert r.json() == {"error": {"code": "invalid", "field": field, "message": f"{field}: {message}"}}, case


def test_the_first_unknown_key_of_a_million_is_named_at_once(client: TestClient) -> None:
    body = {"cores": [{"id": 1}], **{f"k{i:07d}": 0 for i in range(300_000)}}
    r = client.post("/v1/probe", json=body)
    assert r.status_code == 422 and r.json()["error"]["field"] == "k0000000"


ACCEPTED: list[tuple[str, Any]] = [
    ("free-form dict", {"config": {"architectures": ["X"], "rope_scaling": {"type": "yarn", "factor": 4.0}}}),
    ("extra=allow", {"free": {"name": "a", "anything": {"deep": [1, 2]}}}),
    ("alias", {"Label": "mine", "cores": [{"id": 3, "temps": [1.5]}]}),
    ("tagged union", {"ops": [{"kind": "matmul", "M": 2}, {"kind": "add"}]}),
    ("brackets, colons and escapes in strings", {"config": {"s": "[[[[{{{{::,,\\\"]]]}", "t": "\\\\"}}),
]


@pytest.mark.parametrize(("case", "body"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_legitimate_bodies_still_pass(client: TestClient, case: str, body: Any) -> None:
    for padded in (body, {**PADDING, **body} if "config" not in body else {**body, "free": {"x": PADDING}}):
        r = client.post("/v1/probe", json=padded)
        assert r.status_code == 200, (case, r.text)


def test_a_large_body_of_wrong_values_answers_the_first_one(client: TestClient) -> None:
    """Past 32,768 values the body is validated fail-fast first: one error for 100,000 wrong values."""
    r = client.post("/v1/probe", json={"values": [1.0, *["x"] * 100_000]})
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "values[1]"


def _nested(depth: int) -> bytes:
    return b'{"config":{"x":' + b"[" * (depth - 2) + b"]" * (depth - 2) + b"}}"


@pytest.mark.parametrize(("body", "status", "message"), [
    (_nested(8), 200, None),
    (_nested(9), 422, "nested deeper than 8 arrays and objects (TASMOE_MAX_JSON_DEPTH)"),
    (b'{"config":{"x":"' + b"[" * 50 + b'"}}', 200, None),  # brackets in a string are not nesting
    (b'{"config":{"x":"\\"' + b"[" * 50 + b'"}}', 200, None),  # nor after an escaped quote
    (b'{"config":{' + b",".join(b'"k%d":0' % i for i in range(11)) + b"}}", 422,
     "has 12 object keys, over the limit of 11 (TASMOE_MAX_JSON_KEYS)"),
    (b'{"config":{' + b",".join(b'"k%d":0' % i for i in range(10)) + b"}}", 200, None),
    (b'{"values":[' + b",".join([b"0"] * 40) + b"]}", 422,
     "has 42 values, over the limit of 41 (TASMOE_MAX_JSON_VALUES)"),
    (b'{"values":[' + b",".join([b"0"] * 39) + b"]}", 200, None),
    (b'{"config":{"name":"\xff"}}', 422, "request body is not valid UTF-8 (byte 19)"),
    (b'{"config":{"name":"\xc3\xa9t\xc3\xa9"}}', 200, None),
])
def test_the_bounds_on_the_raw_body(body: bytes, status: int, message: str | None) -> None:
    with _client(Settings(max_json_depth=8, max_json_keys=11, max_json_values=41)) as c:
        before = _Body.built
        r = c.post("/v1/probe", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    if message is not None:
        assert r.json()["error"]["field"] == "body" and message in r.json()["error"]["message"], r.text
        assert _Body.built == before


def test_too_deep_for_the_json_parser_is_a_422_not_a_400(client: TestClient) -> None:
    """Nesting the parser itself refuses (Python's recursion limit, orjson's 1024) answered 400 "There was an error
    parsing the body"; docs/api.md promises 422 for malformed JSON."""
    r = client.post("/v1/probe", content=b"[" * 100_000 + b"]" * 100_000,
                    headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "body"


def test_a_chunked_body_over_the_size_limit_is_a_413() -> None:
    """The guard reads the body whole before the route does: a chunked body over TASMOE_MAX_BODY_MB is a 413 (inside
    FastAPI's body read the size limit's exception became a 400)."""
    def chunks() -> Iterator[bytes]:
        yield b'{"config": {"x": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}}'

    router = APIRouter(tags=["probe"])

    @router.post("/probe")
    def probe(body: _Body) -> dict[str, int]:
        return {"config": len(body.config)}

    with TestClient(create_service_app("probe", Settings(max_body_mb=1.0), [router])) as c:
        r = c.post("/v1/probe", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text


def test_the_raw_scan_counts_structure_only() -> None:
    limits = JsonLimits(max_depth=64, max_keys=100, max_values=100)
    shape = check_raw(b'{"a:b": "[{,", "c": [1, 2, {"d": "\\\\"}], "e": "\\"]:"}', limits)
    assert not isinstance(shape, str)
    assert (shape.keys, shape.values) == (4, 8)  # 4 commas + 3 arrays and objects + 1


def test_the_operations_doc_lists_the_json_bounds_with_their_defaults() -> None:
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text[text.index("## Security and limits"):]
    section = section[:section.index("\n## ")]
    s = Settings()
    for name, value in (("TASMOE_MAX_JSON_DEPTH", s.max_json_depth), ("TASMOE_MAX_JSON_KEYS", s.max_json_keys),
                        ("TASMOE_MAX_JSON_VALUES", s.max_json_values)):
        row = next((line for line in section.splitlines() if name in line), "")
        assert re.search(rf"\b{value:,}\b", row), (name, value, row)


MEMORY: list[tuple[str, str, bytes, float]] = [
    # the operator's probe: 9 MB of unique unknown keys took the orchestrator from 256 to 1,260 MB (109 MiB now)
    ("orchestrator", "/v1/experiments", b"{" + b",".join(b'"k%07d":0' % i for i in range(690_000)) + b"}", 160.0),
    # 4 MB of numbers where objects belong: one pydantic error each (9 MB of them took 7 GB; 58 MiB now)
    ("metrics", "/v1/reduce", b'{"scenario":"tas","workload":"w","thot_c":80,"windows":[' + b",".join(
        [b"0"] * 2_000_000) + b"]}", 100.0),
]


@pytest.mark.parametrize(("service", "path", "body", "max_mib"), MEMORY, ids=[m[0] for m in MEMORY])
def test_the_memory_of_one_such_request_is_bounded(service: str, path: str, body: bytes, max_mib: float) -> None:
    """The service's peak RSS growth while it answers, measured from outside (`scripts.bench_memory`)."""
    from scripts.bench_memory import Case, measure

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc")
    got = measure(Case(service, path, "probe", "probe", lambda n: b""), body, b'{"k": 0}')
    assert got.status == 422, got.answer
    assert got.growth < max_mib * 2**20, f"{got.growth / 2**20:.0f} MiB for a {len(body) / 2**20:.1f} MiB body"


def test_an_admin_callers_body_is_not_walked_a_researchers_is(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk along the model runs for a researcher's key (scope submit); the services' own calls and an
    operator's (admin) skip it: their control-epoch bodies hold millions of values. The raw bounds hold for both."""
    from shared import body_guard
    from shared.auth import KeyStore, Scope

    walked: list[int] = []
    real = body_guard.body_problem
    def counted(*a: Any) -> Any:
        walked.append(1)
        return real(*a)

    monkeypatch.setattr(body_guard, "body_problem", counted)
    store = KeyStore(tmp_path / "keys.json")
    scopes: tuple[Scope, ...] = ("submit", "admin")
    keys = {scope: store.create(scope, scope) for scope in scopes}
    settings = Settings(auth="keys", keys_file=tmp_path / "keys.json", results_dir=tmp_path)
    body = {"cores": [{"id": 1}], **PADDING}
    with _client(settings) as c:
        for scope, expect in zip(scopes, (1, 0), strict=True):
            walked.clear()
            r = c.post("/v1/probe", json=body, headers={"authorization": f"Bearer {keys[scope]}"})
            assert r.status_code == 200, r.text
            assert len(walked) == expect, scope
