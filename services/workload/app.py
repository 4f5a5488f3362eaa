"""HTTP layer of the workload service: routers only; the logic lives in plain functions beside this module
(``service.py``: models, IR, trace cache; ``traces.py``: trace generation; ``ir/``: the WorkloadIR)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from services.workload import service
from services.workload.traces import DEFAULT_WINDOW_MS
from shared.configs import WorkloadConfig
from shared.contracts.workload import ExpertLoad, LogicalWindow, TraceSummary
from shared.limits import Dim
from shared.service_app import JsonBodyRoute, create_service_app
from shared.settings import Settings, get_settings

router = APIRouter(tags=["workload"], route_class=JsonBodyRoute)


class IrRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="zoo model name (GET /v1/models), or the name of the inline `config`")
    phase: Literal["prefill", "decode"] = "decode"
    batch: Dim = 1
    seq_len: Dim = Field(default=2048, description="prompt length (prefill) or context length (decode)")
    config: dict[str, Any] | None = Field(default=None, description="inline HuggingFace-style config.json")
    generic: bool = Field(default=False, description="read an unsupported model_type with the generic key mapping")


class ModelRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "name": "my-moe", "config": {"model_type": "mixtral", "hidden_size": 1024, "intermediate_size": 2816,
                                     "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
                                     "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000}}]})

    name: str = Field(min_length=1, max_length=64, description="the name workloads use (lower-case, dashes)")
    config: dict[str, Any] = Field(description="the checkpoint's HuggingFace config.json")
    generic: bool = Field(default=False, description="read an unsupported model_type with the generic key mapping")


class TraceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: WorkloadConfig
    window_ms: float = Field(default=DEFAULT_WINDOW_MS, ge=1e-6, le=1e6, allow_inf_nan=False)  # 1 ns .. 1000 s


def _cache(request: Request) -> service.TraceCache:
    cache: service.TraceCache = request.app.state.trace_cache
    return cache


@router.get("/models")
def list_models() -> dict[str, list[dict[str, Any]]]:
    return {"models": service.list_models()}


@router.post("/models", status_code=201, responses={200: {"description": "already registered with this config"},
                                                      409: {"description": "the name is taken by another config"},
                                                      429: {"description": "the registry is full"}})
def register_model(body: ModelRegistration, response: Response) -> dict[str, Any]:
    """Register a model from its config.json: validated (422 naming the config.json key), content-hashed and
    persisted, so every replica and a restarted cluster know it; workloads then name it."""
    summary, created = service.register(body.name, body.config, generic=body.generic)
    if not created:
        response.status_code = 200
    return summary


@router.get("/models/{name}")
def get_model(name: str) -> dict[str, Any]:
    return service.describe_model(name)


@router.post("/ir")
def workload_ir(body: IrRequest) -> dict[str, Any]:
    return service.ir_report(model=body.model, phase=body.phase, batch=body.batch, seq_len=body.seq_len,
                             config=body.config, generic=body.generic)


@router.post("/traces")
def create_trace(body: TraceRequest, request: Request) -> TraceSummary:
    return service.create_trace(_cache(request), body.workload, body.window_ms)


@router.get("/traces/{trace_id}")
def get_trace(trace_id: str, request: Request) -> TraceSummary:
    return service.trace_summary(_cache(request).get(trace_id))


@router.get("/traces/{trace_id}/windows/{k}", response_model=LogicalWindow)
def get_window(trace_id: str, k: Annotated[int, Path(ge=0)], request: Request,
               window_ms: Annotated[float | None, Query(ge=1e-6, le=1e6)] = None) -> Response:
    window = service.get_window(_cache(request).get(trace_id), k, window_ms)
    return Response(content=window.model_dump_json(), media_type="application/json")


@router.get("/traces/{trace_id}/expert-load")
def get_expert_load(trace_id: str, request: Request) -> ExpertLoad:
    return service.get_expert_load(_cache(request).get(trace_id))


def create_app(settings: Settings | None = None) -> FastAPI:
    s = settings or get_settings()
    app = create_service_app("workload", s, [router])
    app.state.trace_cache = service.TraceCache(s.cache_size)
    return app
