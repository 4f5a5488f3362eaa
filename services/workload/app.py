"""HTTP layer of the workload service: routers only; the logic lives in plain functions beside this module
(``service.py``: models, IR, trace cache; ``traces.py``: trace generation; ``ir/``: the WorkloadIR)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.responses import Response

from services.workload import service
from services.workload.sources import WorkloadSources
from shared.contracts.workload import (
    MAX_WINDOWS_PER_CALL,
    ExpertLoad,
    LogicalWindow,
    LogicalWindows,
    MicroBatchRows,
    TraceSummary,
)
from shared.contracts.workload_api import IrRequest, MicroBatchesRequest, ModelRegistration, TraceRequest
from shared.service_app import JsonRoute, create_service_app
from shared.settings import Settings, get_settings

router = APIRouter(route_class=JsonRoute, tags=["workload"])


def _cache(request: Request) -> service.TraceCache:
    cache: service.TraceCache = request.app.state.trace_cache
    return cache


def _sources(request: Request) -> WorkloadSources:
    sources: WorkloadSources = request.app.state.sources
    return sources


@router.get("/models")
def list_models(request: Request) -> dict[str, list[dict[str, Any]]]:
    return {"models": service.list_models(_sources(request))}


@router.post("/models", status_code=201, responses={200: {"description": "already registered with this config"},
                                                      409: {"description": "the name is taken by another config"},
                                                      429: {"description": "the registry is full"}})
def register_model(body: ModelRegistration, response: Response, request: Request) -> dict[str, Any]:
    """Register a model from its config.json: validated (422 naming the config.json key), content-hashed and
    persisted, so every replica and a restarted cluster know it; workloads then name it."""
    summary, created = service.register(_sources(request), body.name, body.config, generic=body.generic)
    if not created:
        response.status_code = 200
    return summary


@router.get("/models/{name}")
def get_model(name: str, request: Request) -> dict[str, Any]:
    return service.describe_model(_sources(request), name)


@router.post("/ir")
def workload_ir(body: IrRequest, request: Request) -> dict[str, Any]:
    return service.ir_report(_sources(request), model=body.model, phase=body.phase, batch=body.batch,
                             seq_len=body.seq_len, config=body.config, generic=body.generic)


@router.post("/traces")
def create_trace(body: TraceRequest, request: Request) -> TraceSummary:
    return service.create_trace(_cache(request), _sources(request), body.workload, body.window_ms)


@router.get("/traces/{trace_id}")
def get_trace(trace_id: str, request: Request) -> TraceSummary:
    return service.trace_summary(_cache(request).get(trace_id))


@router.get("/traces/{trace_id}/windows/{k}", response_model=LogicalWindow)
def get_window(trace_id: str, k: Annotated[int, Path(ge=0)], request: Request,
               window_ms: Annotated[float | None, Query(ge=1e-6, le=1e6)] = None) -> Response:
    window = service.get_window(_cache(request).get(trace_id), k, window_ms)
    return Response(content=window.model_dump_json(), media_type="application/json")


@router.get("/traces/{trace_id}/windows", response_model=LogicalWindows)
def get_windows(trace_id: str, request: Request,
                start: Annotated[int, Query(ge=0, description="the first window")] = 0,
                count: Annotated[int, Query(ge=1, le=MAX_WINDOWS_PER_CALL,
                                            description="windows wanted (fewer where the trace ends)")] = 16,
                window_ms: Annotated[float | None, Query(ge=1e-6, le=1e6)] = None) -> Response:
    """Windows ``start`` .. ``start + count - 1`` of the trace, each as ``GET .../windows/{k}`` answers it."""
    windows = service.get_windows(_cache(request).get(trace_id), start, count, window_ms)
    return Response(content=LogicalWindows(windows=windows).model_dump_json(), media_type="application/json")


@router.post("/traces/{trace_id}/microbatches", response_model=MicroBatchRows)
def post_microbatches(trace_id: str, body: MicroBatchesRequest, request: Request) -> Response:
    """The logical events of micro-batches a serving scheduler formed from a serving trace's requests: each one's
    rows as a fixed-arrival micro-batch's, its costs from its requests' tokens and contexts, its routing from its
    place in the run's token stream (``token_offset``); event ids from ``mb_id``. 422 naming the field for a
    micro-batch over the config's budget or the call's bounds, or a fixed-arrival trace."""
    rows = service.microbatch_rows(_cache(request).get(trace_id), body.batches)
    return Response(content=rows.model_dump_json(), media_type="application/json")


@router.get("/traces/{trace_id}/expert-load")
def get_expert_load(trace_id: str, request: Request,
                    expected: Annotated[bool, Query(description="the routing law's expected shares (no routing "
                                                                "generated) instead of the trace's own")] = False
                    ) -> ExpertLoad:
    """Per (MoE layer, expert) share of the token→expert assignments; each row sums to 1."""
    return service.get_expert_load(_cache(request).get(trace_id), expected=expected)


def create_app(settings: Settings | None = None) -> FastAPI:
    s = settings or get_settings()
    app = create_service_app("workload", s, [router])
    app.state.trace_cache = service.TraceCache(s.cache_size)
    app.state.sources = WorkloadSources.from_settings(s)  # the models and routing files this app's settings name
    return app
