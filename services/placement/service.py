"""Plain functions behind the placement endpoints (HTTP-free; tests call them directly)."""

from __future__ import annotations

import numpy as np

from services.placement.balance import balance
from services.placement.default import default_placement
from services.placement.geometry import influence_for
from services.placement.schemas import (
    BalanceRequest,
    BalanceResponse,
    PlacementRequest,
    TacsStepRequest,
    TacsStepResponse,
)
from services.placement.tacs import tacs_step
from services.placement.taps import build_placement, validate_loads
from shared.contracts.placement import Placement
from shared.errors import BadInput, TasmoeError


def _n_experts_of(req: PlacementRequest) -> int:
    if req.n_experts is not None:
        return req.n_experts
    try:  # the model zoo is deterministic data shipped with the project
        from services.workload.zoo import resolve_model

        mc = resolve_model(req.workload.model)
    except (ImportError, TasmoeError):
        raise BadInput("n_experts is required with method=default and no expert_load (unknown model "
                       f"{req.workload.model_name!r})", field="n_experts") from None
    if mc.moe is None:
        raise BadInput(f"workload.model {req.workload.model_name!r} has no routed experts", field="workload.model")
    return int(mc.moe.num_routed_experts)


MAX_CORES = 4096  # the placer works with dense cores x cores matrices


def _check_mesh(n_cores: int) -> None:
    if n_cores > MAX_CORES:
        raise BadInput(f"the placement service handles meshes of up to {MAX_CORES} cores, got {n_cores}",
                       field="arch.mesh.cores")


def placement_for(req: PlacementRequest) -> Placement:
    """Default mapping or TAPS (heuristic / milp) for one request."""
    _check_mesh(req.arch.mesh.n_cores)
    if req.method == "default":
        if req.expert_load is not None:
            loads = validate_loads(req.expert_load)
            n_layers, n_e = loads.shape
        else:
            if req.moe_layers is None:
                raise BadInput("moe_layers (or expert_load) is required", field="moe_layers")
            n_layers, n_e = len(req.moe_layers), _n_experts_of(req)
        layers = req.moe_layers if req.moe_layers is not None else list(range(n_layers))
        if len(layers) != n_layers:
            raise BadInput(f"moe_layers lists {len(layers)} layers but expert_load has {n_layers}",
                           field="moe_layers")
        return default_placement(req.arch, layers, n_e, req.workload.tensors.weight_shard_mb, int(req.expert_bytes))
    if req.expert_load is None:
        raise BadInput(f"expert_load is required with method={req.method}", field="expert_load")
    H = None if req.H is None else np.asarray(req.H, dtype=float)
    return build_placement(req.arch, req.workload, req.tas.taps, req.expert_load, req.expert_flops_per_token, H,
                           moe_layers=req.moe_layers, expert_bytes=int(req.expert_bytes), method=req.method)


def tacs_for(req: TacsStepRequest) -> TacsStepResponse:
    _check_mesh(req.arch.mesh.n_cores)
    H = influence_for(req.arch)[0] if req.H is None else np.asarray(req.H, dtype=float)
    overlays, state, smoothed = tacs_step(req.telemetry, req.placement, req.state, req.params, req.arch, H,
                                          req.pending, req.smoothed, req.now_ns, bank_bw_gbps=req.bank_bw_gbps)
    return TacsStepResponse(overlays=overlays, state=state, smoothed=smoothed)


def balance_for(req: BalanceRequest) -> BalanceResponse:
    return BalanceResponse.model_validate(balance(req.loads, req.cores, req.slots))
