"""HTTP layer of the lowering service: routers only; the logic lives in plain functions beside this module."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from services.lowering import service
from services.lowering.epoch import physicalize_epoch
from services.lowering.graph import GraphRequest, GraphResponse, plan_graph
from services.lowering.ops import LowerOpsRequest, LowerOpsResponse, lower_ops
from services.lowering.physical.serving import MicroBatchFn
from services.lowering.stages import StagesRequest, StagesResult, decompose
from shared.configs import ArchConfig
from shared.contracts.events import (
    PhysicalizeEpochRequest,
    PhysicalizeEpochResponse,
    PhysicalizeRequest,
    PhysicalizeResponse,
)
from shared.contracts.placement import Placement
from shared.contracts.registry import Registered
from shared.peers import peers_of, workload_microbatches
from shared.service_app import ERROR_RESPONSES, JsonRoute, create_service_app
from shared.settings import Settings, get_settings

router = APIRouter(route_class=JsonRoute, tags=["lowering"])


def _run_data(request: Request) -> service.RunData:
    data: service.RunData = request.app.state.run_data
    return data


def _microbatches(serving: bool, request: Request) -> MicroBatchFn | None:
    """The workload service's micro-batch rows through this app's peers (only built for a serving request)."""
    return workload_microbatches(peers_of(request.app)) if serving else None


@router.post("/physicalize", response_model=PhysicalizeResponse, responses=ERROR_RESPONSES,
             response_model_exclude_none=True)
def physicalize(req: PhysicalizeRequest, request: Request) -> PhysicalizeResponse:
    """Seed 001 §4.4: one logical window + placement + overlays → physical events, new state, timing. The placement
    and the arch inline or by the hash of their registration (404 ``unknown_placement`` / ``unknown_arch`` when this
    replica does not know it: register it again). The previous state inline or by ``state_ref`` (404
    ``unknown_physical_state`` when this replica no longer keeps it: send it inline). With ``serving``, the
    micro-batches' rows come from the workload service (``POST /v1/traces/{id}/microbatches``)."""
    return service.physicalize(req, _run_data(request), _microbatches(req.serving is not None, request))


@router.post("/physicalize/epoch", response_model=PhysicalizeEpochResponse, responses=ERROR_RESPONSES,
             response_model_exclude_none=True)
def physicalize_epoch_endpoint(req: PhysicalizeEpochRequest, request: Request) -> PhysicalizeEpochResponse:
    """A control epoch: windows ``window .. window + len(logical) − 1`` in one call, with the overlays at the first
    window only and the clocks, refresh factor, window length and layers of every window. Each window's events,
    deposit and timing and the last state are what ``/physicalize`` called window after window answers (each call
    with the previous answer's state), byte for byte. The placement and the arch inline or by their registered hash
    (404 ``unknown_placement`` / ``unknown_arch``); the state inline only. A bad field of window k's logical events
    is named ``logical[k]...``. With ``serving``, the micro-batches' rows come from the workload service (``POST
    /v1/traces/{id}/microbatches``, one call per window that forms micro-batches)."""
    return physicalize_epoch(req, _run_data(request), _microbatches(req.serving is not None, request))


@router.post("/registry/placements", response_model=Registered, responses=ERROR_RESPONSES)
def register_placement(placement: Placement, request: Request) -> Registered:
    """Keep a run's placement (LRU of TASMOE_CACHE_SIZE) and name it by its content hash: ``placement_hash`` of
    ``/physicalize``."""
    return service.register_placement(_run_data(request), placement)


@router.post("/registry/archs", response_model=Registered, responses=ERROR_RESPONSES)
def register_arch(arch: ArchConfig, request: Request) -> Registered:
    """Keep a run's arch config (LRU of TASMOE_CACHE_SIZE) and name it by its content hash: ``arch_hash`` of
    ``/physicalize``."""
    return service.register_arch(_run_data(request), arch)


@router.post("/lower/ops", response_model=LowerOpsResponse, responses=ERROR_RESPONSES)
def lower_ops_endpoint(req: LowerOpsRequest) -> LowerOpsResponse:
    """Seed 002: tensor ops → validated tile ISA streams ``(opcode, dst, src0, src1, imm)`` with their cost."""
    return lower_ops(req)


@router.post("/lower/stages", response_model=StagesResult, responses=ERROR_RESPONSES)
def lower_stages(req: StagesRequest) -> StagesResult:
    """Seed 000: transformer blocks → chiplet stages with host transfers counted per host kind."""
    return decompose(req)


@router.post("/lower/graph", response_model=GraphResponse, responses=ERROR_RESPONSES)
def lower_graph(req: GraphRequest) -> GraphResponse:
    """Seed 004: fused ops → atomic-op DAG, fusion plan and parallel strategy for the device."""
    return plan_graph(req)


def create_app(settings: Settings | None = None) -> FastAPI:
    s = settings or get_settings()
    app = create_service_app("lowering", s, [router])
    app.state.run_data = service.RunData.of(s.cache_size, s.state_cache_size)
    return app
