"""HTTP layer of the placement service: routers only; the logic lives in plain functions beside this module."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse

from services.placement import jobs
from services.placement.schemas import (
    BalanceRequest,
    BalanceResponse,
    JobAccepted,
    JobStatus,
    PlacementRequest,
    TacsStepRequest,
    TacsStepResponse,
)
from services.placement.service import balance_for, placement_for, tacs_for
from shared.contracts.placement import Placement
from shared.service_app import JsonBodyRoute, create_service_app
from shared.settings import Settings, get_settings

router = APIRouter(tags=["placement"], route_class=JsonBodyRoute)


@router.post("/placements", response_model=Placement, responses={202: {"model": JobAccepted}})
def create_placement(req: PlacementRequest) -> Placement | JSONResponse:
    """Default mapping or TAPS. ``method=milp`` answers 202 with a job id (poll ``/placement-jobs/{id}``)."""
    if req.method == "milp":
        job_id = jobs.submit(req)
        return JSONResponse(status_code=202, content=JobAccepted(job_id=job_id, status="queued").model_dump())
    return placement_for(req)


@router.get("/placement-jobs/{job_id}", response_model=JobStatus)
def get_placement_job(job_id: str) -> JobStatus:
    job = jobs.get(job_id)
    result = Placement.model_validate(job.result) if job.result is not None else None
    return JobStatus(job_id=job_id, status=job.status, result=result, error=job.error)


@router.post("/tacs/step", response_model=TacsStepResponse)
def tacs_step_endpoint(req: TacsStepRequest) -> TacsStepResponse:
    """One TACS decision: overlays for the next window, the updated replica state and the smoothed temperatures."""
    return tacs_for(req)


@router.post("/balance", response_model=BalanceResponse)
def balance_endpoint(req: BalanceRequest) -> BalanceResponse:
    """Replicate experts into ``slots`` and spread them over ``cores`` (max/mean, lower bound, gap per layer)."""
    return balance_for(req)


def create_app(settings: Settings | None = None) -> FastAPI:
    return create_service_app("placement", settings or get_settings(), [router])
