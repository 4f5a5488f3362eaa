"""HTTP layer of the placement service: routers only; the logic lives in plain functions beside this module."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from services.placement import jobs
from services.placement.service import (
    RunData,
    balance_for,
    placement_for,
    register,
    tacs_epoch,
    tacs_for,
    with_model_topk,
    with_thermal_h,
)
from shared.configs import ArchConfig
from shared.configs.tas import TacsParams
from shared.contracts.placement import Placement
from shared.contracts.placement_api import (
    BalanceRequest,
    BalanceResponse,
    InfluenceRegistration,
    JobAccepted,
    JobStatus,
    PlacementRequest,
    TacsEpochRequest,
    TacsEpochResponse,
    TacsStepRequest,
    TacsStepResponse,
)
from shared.contracts.registry import Registered
from shared.peers import peers_of
from shared.service_app import JsonRoute, create_service_app, principal_of
from shared.settings import Settings, get_settings

router = APIRouter(route_class=JsonRoute, tags=["placement"])


def _owner(request: Request) -> str | None:
    """Whose jobs the caller sees: its own, or every one for an admin (None)."""
    who = principal_of(request)
    return None if who.admin else who.name


@router.post("/placements", response_model=Placement, responses={202: {"model": JobAccepted}})
def create_placement(req: PlacementRequest, request: Request) -> Placement | JSONResponse:
    """Default mapping or TAPS. ``method=milp`` answers 202 with a job id (poll ``/placement-jobs/{id}``); a
    principal's queued and running MILP jobs are capped (TASMOE_QUOTA_MILP_JOBS: 429 with Retry-After) and so is the
    HiGHS time limit (TASMOE_MILP_TIME_LIMIT_MAX_S)."""
    peers = peers_of(request.app)
    if req.method == "milp":
        settings: Settings = request.app.state.settings
        req = with_model_topk(with_thermal_h(req, peers), peers)  # the job carries its H and top-k: it runs
        # without the request
        job_id = _jobs(request).submit(req, owner=principal_of(request).name, max_active=settings.quota_milp_jobs,
                                       time_limit_max_s=settings.milp_time_limit_max_s)
        return JSONResponse(status_code=202, content=JobAccepted(job_id=job_id, status="queued").model_dump())
    return placement_for(req, peers)


_jobs_lock = threading.Lock()


def _jobs(request: Request) -> jobs.MilpJobs:
    """The app's MILP jobs: made on the first MILP request (no thread before one is needed), shut down by the app's
    lifespan."""
    with _jobs_lock:
        milp: jobs.MilpJobs | None = getattr(request.app.state, "milp_jobs", None)
        if milp is None:
            milp = request.app.state.milp_jobs = jobs.MilpJobs()
        return milp


def _status(job_id: str, job: jobs._Job) -> JobStatus:
    result = Placement.model_validate(job.result) if job.result is not None else None
    return JobStatus(job_id=job_id, status=job.status, result=result, error=job.error)


@router.get("/placement-jobs/{job_id}", response_model=JobStatus)
def get_placement_job(job_id: str, request: Request) -> JobStatus:
    return _status(job_id, _jobs(request).get(job_id, _owner(request)))


@router.delete("/placement-jobs/{job_id}", response_model=JobStatus)
def cancel_placement_job(job_id: str, request: Request) -> JobStatus:
    """Cancel a MILP job: a queued one never starts; a running one's answer is dropped (HiGHS stops at the latest at
    its capped time limit, then the slot frees)."""
    return _status(job_id, _jobs(request).cancel(job_id, _owner(request)))


def _run_data(request: Request) -> RunData:
    data: RunData = request.app.state.run_data
    return data


@router.post("/tacs/step", response_model=TacsStepResponse, response_model_exclude_none=True)
def tacs_step_endpoint(req: TacsStepRequest, request: Request) -> TacsStepResponse:
    """One TACS decision: overlays for the next window, the updated replica state and the smoothed temperatures.
    The request carries H (the thermal service's ``GET /v1/models/{hash}/influence``) or ``H_hash``, its hash from
    ``POST /v1/registry/influence`` (a request with neither is a 422 naming H); the placement, params and arch inline
    or by hash likewise (404 ``unknown_<kind>`` when this replica does not know a hash: register it again); the
    replica state inline or by the ``state_ref`` a step answered (404 ``unknown_replica_state``: send it inline).
    With ``params.lookahead_windows`` > 0 this service asks the thermal service for the chip's pulse responses (once
    per chip, window length and look-ahead)."""
    return tacs_for(req, data=_run_data(request), pulse_peers=peers_of(request.app))


@router.post("/tacs/epoch", response_model=TacsEpochResponse, response_model_exclude_none=True)
def tacs_epoch_endpoint(req: TacsEpochRequest, request: Request) -> TacsEpochResponse:
    """TACS's decisions for consecutive windows of a control epoch, one per step, until one acts (a reroute or a
    migration): each decision is what ``/tacs/step`` answers for that window alone. The run's fixed objects as in
    ``/tacs/step``; the replica state whole."""
    return tacs_epoch(req, data=_run_data(request), pulse_peers=peers_of(request.app))


@router.post("/registry/placements", response_model=Registered)
def register_placement(placement: Placement, request: Request) -> Registered:
    """Keep a run's placement (LRU of TASMOE_CACHE_SIZE) under its content hash: ``placement_hash`` of
    ``/tacs/step``."""
    return register(_run_data(request).placements, placement)


@router.post("/registry/archs", response_model=Registered)
def register_arch(arch: ArchConfig, request: Request) -> Registered:
    """Keep a run's arch config under its content hash: ``arch_hash`` of ``/tacs/step``."""
    return register(_run_data(request).archs, arch)


@router.post("/registry/tacs-params", response_model=Registered)
def register_tacs_params(params: TacsParams, request: Request) -> Registered:
    """Keep a run's TACS parameters under their content hash: ``params_hash`` of ``/tacs/step``."""
    return register(_run_data(request).params, params)


@router.post("/registry/influence", response_model=Registered)
def register_influence(body: InfluenceRegistration, request: Request) -> Registered:
    """Keep a run's influence matrix H (cores x cores, K/W) under its content hash: ``H_hash`` of ``/tacs/step``."""
    return register(_run_data(request).influence, body)


@router.post("/balance", response_model=BalanceResponse)
def balance_endpoint(req: BalanceRequest) -> BalanceResponse:
    """Replicate experts into ``slots`` and spread them over ``cores`` (max/mean, lower bound, gap per layer)."""
    return balance_for(req)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The MILP job pool ends with the app (it is made on the first MILP request; nothing starts at import)."""
    try:
        yield
    finally:
        milp: jobs.MilpJobs | None = getattr(app.state, "milp_jobs", None)
        if milp is not None:
            milp.close()


def create_app(settings: Settings | None = None) -> FastAPI:
    s = settings or get_settings()
    app = create_service_app("placement", s, [router], lifespan=_lifespan)
    app.state.run_data = RunData.of(s.cache_size, s.state_cache_size)
    return app
