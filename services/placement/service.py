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
from shared.errors import BadInput


def placement_for(req: PlacementRequest) -> Placement:
    """Default mapping or TAPS (heuristic / milp) for one request."""
    if req.method == "default":
        loads = validate_loads(req.expert_load)
        layers = req.moe_layers if req.moe_layers is not None else list(range(loads.shape[0]))
        if len(layers) != loads.shape[0]:
            raise BadInput(f"moe_layers lists {len(layers)} layers but expert_load has {loads.shape[0]}",
                           field="moe_layers")
        return default_placement(req.arch, layers, loads.shape[1], req.workload.tensors.weight_shard_mb,
                                 req.expert_bytes)
    H = None if req.H is None else np.asarray(req.H, dtype=float)
    return build_placement(req.arch, req.workload, req.tas.taps, req.expert_load, req.expert_flops_per_token, H,
                           moe_layers=req.moe_layers, expert_bytes=req.expert_bytes, method=req.method)


def tacs_for(req: TacsStepRequest) -> TacsStepResponse:
    H = influence_for(req.arch)[0] if req.H is None else np.asarray(req.H, dtype=float)
    overlays, state, smoothed = tacs_step(req.telemetry, req.placement, req.state, req.params, req.arch, H,
                                          req.pending, req.smoothed, req.now_ns, bank_bw_gbps=req.bank_bw_gbps)
    return TacsStepResponse(overlays=overlays, state=state, smoothed=smoothed)


def balance_for(req: BalanceRequest) -> BalanceResponse:
    return BalanceResponse.model_validate(balance(req.loads, req.cores, req.slots))
