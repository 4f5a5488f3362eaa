"""HTTP layer of the lowering service: routers only; the logic lives in plain functions beside this module."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from services.lowering import service
from shared.contracts.events import PhysicalizeRequest, PhysicalizeResponse
from shared.service_app import ERROR_RESPONSES, create_service_app
from shared.settings import Settings, get_settings

router = APIRouter(tags=["lowering"])


@router.post("/physicalize", response_model=PhysicalizeResponse, responses=ERROR_RESPONSES)
def physicalize(req: PhysicalizeRequest) -> PhysicalizeResponse:
    """Seed 001 §4.4: one logical window + placement + overlays → physical events, new state, timing."""
    return service.physicalize(req)


def create_app(settings: Settings | None = None) -> FastAPI:
    return create_service_app("lowering", settings or get_settings(), [router])
