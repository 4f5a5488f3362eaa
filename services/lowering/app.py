"""HTTP layer of the lowering service: routers only; the logic lives in plain functions beside this module."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from services.lowering import service
from services.lowering.graph import GraphRequest, GraphResponse, plan_graph
from services.lowering.ops import LowerOpsRequest, LowerOpsResponse, lower_ops
from services.lowering.stages import StagesRequest, StagesResult, decompose
from shared.contracts.events import PhysicalizeRequest, PhysicalizeResponse
from shared.service_app import ERROR_RESPONSES, JsonBodyRoute, create_service_app
from shared.settings import Settings, get_settings

router = APIRouter(tags=["lowering"], route_class=JsonBodyRoute)


@router.post("/physicalize", response_model=PhysicalizeResponse, responses=ERROR_RESPONSES)
def physicalize(req: PhysicalizeRequest) -> PhysicalizeResponse:
    """Seed 001 §4.4: one logical window + placement + overlays → physical events, new state, timing."""
    return service.physicalize(req)


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
    return create_service_app("lowering", settings or get_settings(), [router])
