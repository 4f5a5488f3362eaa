"""Request and response bodies of the placement service's HTTP API (every contract is in ``shared/contracts``,
so its callers build and read them typed: the orchestrator's pipeline, the CLI, tests).

Owner: placement service. Consumers: orchestrator (``Pipeline.placement``, ``Pipeline.tacs_step``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.configs import ArchConfig, TasParams, WorkloadConfig
from shared.configs.tas import TacsParams
from shared.contracts.placement import Overlays, Placement, ReplicaState, Telemetry
from shared.contracts.registry import ContentHash
from shared.contracts.workload import LogicalWindow
from shared.limits import MAX_EPOCH_WINDOWS, MAX_EXPERTS, MAX_LAYERS


class PlacementRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    arch: ArchConfig = ArchConfig()
    workload: WorkloadConfig = WorkloadConfig()
    tas: TasParams = TasParams()
    method: Literal["default", "heuristic", "milp"] = "heuristic"
    expert_load: list[list[float]] | None = Field(
        default=None, min_length=1, description="per MoE layer, per expert (any scale); required for heuristic/milp")
    moe_layers: list[Annotated[int, Field(ge=0, le=MAX_LAYERS)]] | None = Field(
        default=None, max_length=MAX_LAYERS, description="model layer index of each expert_load row")
    n_experts: int | None = Field(default=None, ge=1, le=MAX_EXPERTS, description=(
        "routed experts per layer (default method without expert_load; else from the workload's model)"))
    # bounds: far past any model's expert (DeepSeek-V3's: 88 MFLOP a token, 44 MB of weights), finite
    expert_flops_per_token: float = Field(default=2 * 3 * 4096 * 14336, gt=0, le=1e15, allow_inf_nan=False,
                                          description="FLOPs/token/expert")
    expert_bytes: float = Field(default=3 * 4096 * 14336 * 2, ge=0, le=1e13, allow_inf_nan=False,
                                description="weight bytes of one expert")
    H: list[list[float]] | None = Field(default=None, description="cores x cores influence matrix, K/W")
    nonexpert_flops_per_step: float = Field(
        default=0.0, ge=0, allow_inf_nan=False,
        description="FLOPs of one micro-batch step's non-expert work (attention, router, shared/dense FFN, head): "
                    "part of TAPS's base power (the workload service's trace summary); 0 = not counted")
    nonexpert_bytes_per_step: float = Field(
        default=0.0, ge=0, allow_inf_nan=False,
        description="DRAM bytes of one micro-batch step's non-expert work (its KV and activation traffic)")


JobState = Literal["queued", "running", "done", "failed", "cancelled"]


class JobAccepted(BaseModel):
    job_id: str
    status: JobState


class JobStatus(BaseModel):
    job_id: str
    status: JobState
    result: Placement | None = None
    error: dict[str, str | None] | None = None


class TacsStepRequest(BaseModel):
    """``POST /v1/tacs/step``. What is fixed for a run (placement, params, arch, H) is given inline or by the hash
    its ``POST /v1/registry/...`` answered: exactly one of ``placement`` / ``placement_hash`` and of ``H`` /
    ``H_hash``; at most one of ``params`` / ``params_hash`` and of ``arch`` / ``arch_hash`` (neither: the
    defaults). An unknown hash is a 404 ``unknown_<kind>`` (register it again)."""

    model_config = ConfigDict(extra="forbid")

    telemetry: Telemetry
    placement: Placement | None = None
    placement_hash: ContentHash | None = None
    state: ReplicaState | None = None  # None (and no state_ref): no change yet (every expert at its placement cores)
    state_ref: ContentHash | None = None  # or the replica state by the name a step answered (404 unknown_...)
    return_state: bool = True  # false: answer the state only when this step changed it (its name always)
    params: TacsParams | None = None
    params_hash: ContentHash | None = None
    arch: ArchConfig | None = None
    arch_hash: ContentHash | None = None
    H: list[list[float]] | None = None
    H_hash: ContentHash | None = None
    pending: LogicalWindow | None = None
    smoothed: list[float] | None = None
    now_ns: int = Field(default=0, ge=0)
    bank_bw_gbps: float = Field(default=25.0, gt=0)


class TacsEpochStep(BaseModel):
    """What TACS sees before one window: the telemetry after the window before it, the window's pending logical
    work and its start time."""

    model_config = ConfigDict(extra="forbid")

    telemetry: Telemetry
    pending: LogicalWindow | None = None
    now_ns: int = Field(default=0, ge=0)


class TacsEpochRequest(BaseModel):
    """``POST /v1/tacs/epoch``: TACS's decisions for consecutive windows of a control epoch, one step per window from
    the state and smoothed temperatures before the first, stopping at the first decision that acts (a reroute or a
    migration: the windows after it must be physicalized with its overlays). The run's fixed objects as in
    `TacsStepRequest`; the replica state whole (None: every expert at its placement cores)."""

    model_config = ConfigDict(extra="forbid")

    steps: list[TacsEpochStep] = Field(min_length=1, max_length=MAX_EPOCH_WINDOWS)
    placement: Placement | None = None
    placement_hash: ContentHash | None = None
    state: ReplicaState | None = None
    params: TacsParams | None = None
    params_hash: ContentHash | None = None
    arch: ArchConfig | None = None
    arch_hash: ContentHash | None = None
    H: list[list[float]] | None = None
    H_hash: ContentHash | None = None
    smoothed: list[float] | None = None
    bank_bw_gbps: float = Field(default=25.0, gt=0)


class TacsEpochResponse(BaseModel):
    """The smoothed temperatures after each step evaluated; ``acted``: the index of the step whose decision acts (the
    last one evaluated), with its overlays and, when it moved an expert, the replica state after it; None when no
    step acted (``overlays`` empty, the state unchanged)."""

    smoothed: list[list[float]]
    acted: int | None = None
    overlays: Overlays = Field(default_factory=Overlays)
    state: ReplicaState | None = None


class InfluenceRegistration(BaseModel):
    """``POST /v1/registry/influence``: a run's cores x cores influence matrix H (K/W), named by its hash
    (``H_hash`` of ``/v1/tacs/step``)."""

    model_config = ConfigDict(extra="forbid")

    H: list[list[float]] = Field(min_length=1)


class TacsStepResponse(BaseModel):
    """The overlays for the next window, the replica state after them (whole, unless the request said
    ``return_state: false`` and nothing changed) and its name ``state_ref``, the smoothed temperatures."""

    overlays: Overlays
    state: ReplicaState | None = None
    state_ref: ContentHash | None = None
    smoothed: list[float]


class BalanceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    loads: list[list[float]] = Field(min_length=1, description="per layer, per expert")
    cores: int = Field(default=64, ge=1, le=65536)
    slots: int = Field(ge=1, description="total replica slots (>= experts)")


class BalanceLayer(BaseModel):
    layer: int
    replicas: list[list[int]]  # [core, expert]
    replica_counts: list[int]
    core_loads: list[float]
    max_over_mean: float
    lower_bound: float
    gap: float


class BalanceResponse(BaseModel):
    layers: list[BalanceLayer]
