"""Every body the orchestrator's pipeline sends is a request of the contract its route takes (issue 21, item 2).

The pipeline encodes its bodies itself (the logical windows pass through as the workload service answered them), so
the type system
does not tie a key it writes to the contract's field: a misspelt optional key would be ignored by the service
(pydantic drops unknown keys) and the run would silently use the default. `encode_request` checks every body's top
level keys against the route's request model on each call; this test runs a small `tas` experiment
(TACS, physicalizer, thermal step, registries, metrics) on the real services and checks each recorded request body
against the request model of the route that served it: it validates, and it names no key the model does not have,
at any depth (the keys of the model's own dump of what was set)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.types import Message, Receive, Scope, Send

from services.orchestrator import repository as repo
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.window_loop import run_scenario
from services.orchestrator.worker import compute_clients
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator.conftest import Db
from tests.orchestrator.test_window_loop import small_request


@dataclass
class Recording:
    """An ASGI wrapper keeping each request's scope and body."""

    app: Any
    requests: list[tuple[Scope, bytes]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recording_receive() -> Message:
            msg = await receive()
            if msg["type"] == "http.request":
                chunks.append(msg.get("body", b""))
                if not msg.get("more_body", False):
                    self.requests.append((scope, b"".join(chunks)))
            return msg

        await self.app(scope, recording_receive, send)


def body_model(scope: Scope) -> type[BaseModel] | None:
    """The pydantic request model of the route that served the request (the router records it in the scope; None:
    not a single-model body)."""
    route = scope.get("route")
    if not isinstance(route, APIRoute):
        return None
    params = route.dependant.body_params
    if len(params) != 1:
        return None
    model = params[0].field_info.annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def unknown_keys(sent: Any, kept: Any, path: str = "") -> list[str]:
    """Keys of ``sent`` (the body) that ``kept`` (the model's dump of the fields set) lacks, at any depth."""
    out: list[str] = []
    if isinstance(sent, dict) and isinstance(kept, dict):
        for k, v in sent.items():
            if k not in kept:
                out.append(f"{path}{k}")
            else:
                out += unknown_keys(v, kept[k], f"{path}{k}.")
    elif isinstance(sent, list) and isinstance(kept, list) and len(sent) == len(kept):
        for i, (a, b) in enumerate(zip(sent, kept, strict=True)):
            out += unknown_keys(a, b, f"{path}[{i}].")
    return out


def test_every_body_the_pipeline_sends_is_its_contract(sqlite: Db, settings: Settings, tmp_path: Path) -> None:
    spec = resolve_spec(small_request(scenarios=["tas"], plots=False), configs_dir=CONFIGS)
    exp, _ = create_experiment(sessions=sqlite.sessions, spec=spec, settings=settings, out_dir=tmp_path / "run")
    apps: dict[str, Recording] = {}

    def record(name: str, app: Any) -> Recording:
        apps[name] = Recording(app)
        return apps[name]

    with compute_clients(settings, wrap=record) as clients:
        assert run_scenario(repo.run_id_for(exp, "tas"), clients, sqlite.sessions).status == "succeeded"
    checked: dict[str, int] = {}
    problems: list[str] = []
    for name, rec in apps.items():
        for scope, raw in rec.requests:
            if scope["method"] != "POST" or not raw:
                continue
            model = body_model(scope)
            where = f"{name} POST {scope['path']}"
            if model is None:
                continue
            try:
                obj = model.model_validate_json(raw)
            except Exception as exc:  # the service would have answered 422: the run would have failed
                problems.append(f"{where}: {exc}"[:300])
                continue
            extra = unknown_keys(json.loads(raw), obj.model_dump(mode="json", by_alias=True, exclude_unset=True))
            if extra:
                problems.append(f"{where}: keys not in {model.__name__}: {extra[:5]}")
            key = f"{name} {scope['path']}"
            checked[key] = checked.get(key, 0) + 1
    assert not problems, problems
    # the epochs' calls and the run's registrations were all among them
    for key in ("placement /v1/tacs/epoch", "lowering /v1/physicalize/epoch", "thermal /v1/step/epoch",
                "lowering /v1/registry/placements", "placement /v1/registry/influence"):
        assert checked.get(key, 0) >= 1, (key, sorted(checked))


def test_the_check_sees_a_misspelt_key() -> None:
    from services.lowering.synthetic import synthetic_window
    from shared.contracts.events import PhysicalizeRequest

    good = PhysicalizeRequest(window=0, logical=synthetic_window(0, n_layers=2, micro_batch=4, context=64),
                              window_ms=3.0).model_dump(mode="json", exclude_unset=True)
    body = {**good, "retrun_state": False, "state": {"next_evt_id": 3, "replicaz": {}}}
    obj = PhysicalizeRequest.model_validate(body)
    kept = obj.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert unknown_keys(good, PhysicalizeRequest.model_validate(good).model_dump(
        mode="json", by_alias=True, exclude_unset=True)) == []
    assert unknown_keys(body, kept) == ["retrun_state", "state.replicaz"]


def test_a_body_is_checked_against_its_request_model_on_every_call() -> None:
    """`encode_request` refuses a key the route's model lacks (a misspelt optional key would be dropped by the
    service and the run would use its default) and a body without a required field; what passes is the JSON of the
    parts, models dumped as JSON."""
    from services.orchestrator.pipeline_clients import encode_request
    from shared.contracts.events import WindowTiming
    from shared.contracts.thermal import StepRequest

    body = encode_request(StepRequest, {"window": 3, "window_ms": 3.0, "deposit": {"x": 1}, "return_state": False,
                                        "state": WindowTiming(tokens_completed=2)})
    assert json.loads(body) == {"window": 3, "window_ms": 3.0, "deposit": {"x": 1}, "return_state": False,
                                "state": WindowTiming(tokens_completed=2).model_dump(mode="json")}
    with pytest.raises(TypeError, match="retrun_state"):
        encode_request(StepRequest, {"window": 3, "window_ms": 3.0, "retrun_state": False})
    with pytest.raises(TypeError, match="window_ms"):
        encode_request(StepRequest, {"window": 3})
