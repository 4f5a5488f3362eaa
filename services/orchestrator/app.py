"""HTTP layer of the orchestrator service: routers only; the logic lives in plain functions beside this module."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from shared.service_app import create_service_app
from shared.settings import Settings, get_settings

router = APIRouter(tags=["orchestrator"])


def create_app(settings: Settings | None = None) -> FastAPI:
    return create_service_app("orchestrator", settings or get_settings(), [router])
