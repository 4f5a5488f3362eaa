"""HTTP layer of the thermal service: routers only; the logic lives in plain functions beside this module
(``service.py``, ``influence.py``, ``hotspot.py``)."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, FastAPI, Query, Request

from services.thermal import hotspot_files, service
from services.thermal.influence import (
    PULSE_MAX_WORK,
    influence_for_model,
    pulse_response_at,
    pulse_work,
    vault_die_shares,
    vault_influence_at,
)
from shared.content import ContentStore, state_store
from shared.contracts.thermal import (
    HotspotExportRequest,
    HotspotFiles,
    HotspotImportRequest,
    InfluenceMatrix,
    ModelInfo,
    ModelRequest,
    PulseResponse,
    SolveRequest,
    SolveResult,
    StepEpochRequest,
    StepEpochResult,
    StepRequest,
    StepResult,
    ThermalState,
    WarmStartRequest,
)
from shared.errors import BadInput
from shared.service_app import ERROR_RESPONSES, JsonRoute, create_service_app
from shared.settings import Settings, get_settings

router = APIRouter(route_class=JsonRoute, tags=["thermal"], responses=ERROR_RESPONSES)
# a vault's watt over its DRAM dies: one share per die (bank layer order, the die farthest from the sink first),
# normalised; absent: evenly
VAULT_DIES = Query(None, max_length=256, description="share of a vault's watt on each DRAM die (bank layer order: "
                   "the die farthest from the heat sink first), normalised to sum 1; absent: evenly over the dies")


@router.post("/models", response_model=ModelInfo)
def build_model(req: ModelRequest) -> ModelInfo:
    """Build (or find in the cache) the stack model of an arch config; returns its hash and size."""
    return service.model_info(req.arch)


def _states(request: Request) -> ContentStore[ThermalState]:
    states: ContentStore[ThermalState] = request.app.state.thermal_states
    return states


@router.post("/step", response_model=StepResult, response_model_exclude_none=True)
def step(req: StepRequest, request: Request) -> StepResult:
    """One window: power from events (or their deposit), transient step, DVFS for the next window, refresh.
    Idempotent. The arch inline or as ``model``, the hash of ``POST /v1/models`` (404 ``unknown_model`` when this
    replica lacks it); the previous state inline or as ``state_ref`` (404 ``unknown_thermal_state`` when this replica
    no longer keeps it: send it inline)."""
    return service.step_request(req, _states(request))


@router.post("/step/epoch", response_model=StepEpochResult)
def step_epoch(req: StepEpochRequest) -> StepEpochResult:
    """Windows ``window .. window + len(deposits) - 1`` (one energy deposit each, at most 1024) from the state after
    ``window - 1``: one snapshot per window, the state after the last and the first DVFS or refresh event, bit for bit
    what ``POST /v1/step`` answers window after window; with ``until_event`` (the default) it stops after the first
    window whose successor's inputs change."""
    return service.step_epoch_request(req)


@router.post("/warm_start", response_model=ThermalState)
def warm_start(req: WarmStartRequest, request: Request) -> ThermalState:
    """The state window 0 starts from after a warm-up pass (``thermal.init: steady``): the steady state of the
    warm-up's mean power map, from the energy the pass's last state (inline or ``state_ref``) carries."""
    return service.warm_start_request(req, _states(request))


@router.post("/solve", response_model=SolveResult)
def solve(req: SolveRequest) -> SolveResult:
    """One-off steady or transient solve of a power map."""
    return service.solve_power_map(req.arch, req.core_w, req.bank_w, mode=req.mode, duration_ms=req.duration_ms,
                                   state=req.state)


@router.get("/models/{model_hash}/influence", response_model=InfluenceMatrix)
def influence(model_hash: str, vault_dies: list[float] | None = VAULT_DIES) -> InfluenceMatrix:
    """H (cores × cores, K/W) of a model built earlier with ``POST /v1/models`` (404 when unknown), and H_vault
    (cores × vaults) for 1 W spread over a vault's DRAM dies, evenly or in the shares ``vault_dies``."""
    model = service.model_named(model_hash, field="model_hash")
    shares = vault_die_shares(model, vault_dies)  # checked and normalised once: what is used is what is echoed
    H = influence_for_model(model)
    return InfluenceMatrix(model=model.key, cores=model.n_cores, H=H.tolist(),
                           H_vault=vault_influence_at(model, shares).tolist(), vault_dies=_listed(shares))


@router.get("/models/{model_hash}/pulse-response", response_model=PulseResponse)
def pulse(model_hash: str, slot_ms: float = Query(gt=0, le=1e4, allow_inf_nan=False),
          lags: int = Query(ge=1, le=64), vault_dies: list[float] | None = VAULT_DIES) -> PulseResponse:
    """Short-time responses of a model built earlier (404 when unknown): the rise of every core at the end of each
    of ``lags`` slots of ``slot_ms`` after a 1 W pulse in one core (or its vault: over its DRAM dies evenly, or in
    the shares ``vault_dies``) during the first slot (TAPS's slot model). ``2 · cores · lags`` transient steps, at
    most 8192 (422 beyond: ask fewer lags)."""
    model = service.model_named(model_hash, field="model_hash")
    shares = vault_die_shares(model, vault_dies)
    work = pulse_work(model, lags)
    if work > PULSE_MAX_WORK:
        raise BadInput(f"lags: {lags} lags on a {model.n_cores}-core stack of {model.net.n_nodes} nodes take "
                       f"{work:.3g} step-nodes, more than {PULSE_MAX_WORK:.3g}: ask fewer lags", field="lags")
    Dc, Dv = pulse_response_at(model, slot_ms * 1e-3, lags, shares)
    return PulseResponse(model=model.key, cores=model.n_cores, slot_ms=slot_ms, lags=lags, core=Dc.tolist(),
                         vault=Dv.tolist() if model.dram_layers else [], vault_dies=_listed(shares))


def _listed(shares: np.ndarray | None) -> list[float] | None:
    return None if shares is None else [float(x) for x in shares]


@router.post("/hotspot/export", response_model=HotspotFiles)
def hotspot_export(req: HotspotExportRequest) -> HotspotFiles:
    """Our stack and a power map as HotSpot inputs (.flp per layer, .lcf, .ptrace, config); with ``run_hotspot``,
    also HotSpot's own steady block temperatures from a ``hotspot`` binary on PATH (502 when there is none)."""
    files = hotspot_files.export_files(req.arch, req.core_w, req.bank_w)
    steady = hotspot_files.run_hotspot(files) if req.run_hotspot else None
    return HotspotFiles(files=files, hotspot_steady_k=steady)


@router.post("/hotspot/import", response_model=HotspotFiles)
def hotspot_import(req: HotspotImportRequest) -> HotspotFiles:
    """HotSpot inputs + HotSpot's command line, solved like ``tasmoe hotspot``; returns the output files."""
    return HotspotFiles(files=hotspot_files.import_and_solve(req.files, req.args))


def create_app(settings: Settings | None = None) -> FastAPI:
    """The thermal service's app. Loads the window step's compiled kernels now (numba's cache; ~1-3 s, ~10 s the
    first time on a machine) so that no request pays it and worker processes forked from this one share them."""
    from services.thermal import exp_kernels, spectral_kernels, window_kernels

    s = settings or get_settings()
    app = create_service_app("thermal", s, [router])
    app.state.thermal_states = state_store("thermal_state", s.state_cache_size, long_strings=True)
    spectral_kernels.warm_up()
    exp_kernels.warm_up()
    window_kernels.warm_up()
    return app
