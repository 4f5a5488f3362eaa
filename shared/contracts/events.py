"""Physical events of one window (seed 001 §3.4), columnar, plus what the physicalizer reports about timing.

Owner: lowering service (``physicalize_window``). Consumers: thermal (power), metrics, orchestrator (CSV export).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from shared.configs.arch import ArchConfig
from shared.configs.workload import ServingConfig
from shared.contracts.columnar import Columnar
from shared.contracts.placement import Overlays, Placement, ReplicaState
from shared.contracts.registry import ContentHash
from shared.contracts.workload import LogicalCompute, LogicalMemory, LogicalWindow, Requests
from shared.limits import MAX_EPOCH_WINDOWS


class ComputeEvents(Columnar):
    """``traces/physical/compute_events.csv.gz`` columns, in order."""

    evt_id: list[int]
    t_start_ns: list[int]
    core_id: list[int]
    duration_cycles: list[int]
    flops: list[float]
    op: list[str]
    dvfs_domain: list[str]
    power_hint: list[float]  # average dynamic power of the event at V0, W (= energy_j / duration)
    energy_j: list[float]  # dynamic energy at V0: MACs + scratchpad accesses, J (shared/energy.py)


# ``MemoryEvents.noc_qos`` classes, in this order (the lowering service codes them by index): the last two are
# core-to-core activation traffic (MoE dispatch/combine), NoC only, no DRAM access.
NOC_QOS: tuple[str, ...] = ("normal", "migration", "dispatch", "combine")
NOC_ONLY_QOS: tuple[str, ...] = NOC_QOS[2:]


class MemoryEvents(Columnar):
    """``traces/physical/memory_events.csv.gz`` columns, in order."""

    evt_id: list[int]
    t_start_ns: list[int]
    src_core: list[int]
    dst_bank: list[str]  # "B(x,y,layer)"
    bytes: list[float]
    rw: list[str]  # "r" | "w"
    hops: list[int]
    noc_qos: list[str]  # "normal" | "migration" | "dispatch" | "combine" (the last two: core to core, NoC only)


class EnergyDeposit(BaseModel):
    """Where one window's dynamic energy is dissipated: all the thermal step needs of the window's events (J; compute
    at V0, thermal scales it by ``(V/V0)²``). ``shared.energy.deposit_of_events`` computes it from the events and
    ``shared.energy.WindowDeposit`` reads it back; ~15 kB of JSON where the events are ~200 kB.

    ``bank_ids`` / ``bank_array_j``: the banks whose array took energy (flat ids, die-major: ``die·BX·BY + x·BY +
    y``) and that energy; ``tsv_io_vault_j`` [die][vault core]: the TSV/IO share, spread evenly over the vault's banks
    of that die; ``core_mem_j``: the controller share and the NoC routers' energy, on the logic die."""

    model_config = ConfigDict(extra="forbid")

    core_compute_j: list[float]
    core_mac_j: list[float]
    core_mem_j: list[float]
    bank_ids: list[int] = Field(default_factory=list)
    bank_array_j: list[float] = Field(default_factory=list)
    tsv_io_vault_j: list[list[float]]
    array_j: float = Field(ge=0, allow_inf_nan=False)
    tsv_io_j: float = Field(ge=0, allow_inf_nan=False)
    controller_j: float = Field(ge=0, allow_inf_nan=False)
    noc_j: float = Field(ge=0, allow_inf_nan=False)


class RunningCompute(Columnar):
    """Compute pieces already scheduled that end after their window: the whole piece with its real interval; every
    window emits the share of it that falls inside the window (pro rata of time)."""

    core_id: list[int]
    op: list[str]
    start_ns: list[float]
    end_ns: list[float]
    cycles: list[float]
    flops: list[float]
    energy_j: list[float]


class RunningMemory(Columnar):
    """Memory traffic of scheduled pieces (and migrations) that ends after its window, with its real interval."""

    src_core: list[int]
    bank: list[int]  # flat bank id (layer·BY + by)·BX + bx
    bytes: list[float]
    rw: list[str]
    hops: list[int]
    noc_qos: list[str]
    start_ns: list[float]
    end_ns: list[float]


class PendingTokens(BaseModel):
    """Tokens of a scheduled micro-batch whose completion falls in a later window."""

    mb_id: int
    arrival_ns: int
    finish_ns: int
    tokens: int


class OpenMicroBatch(BaseModel):
    """A micro-batch in flight whose last stage has not been scheduled yet."""

    mb_id: int
    arrival_ns: int
    ready_ns: int  # when its last scheduled stage finishes: its next stage may not start earlier
    tokens: int


class ActiveReroute(BaseModel):
    """A reroute overlay row that still applies to open rows of earlier windows (work not yet scheduled when the row
    arrived is still logical, so it follows the reroute in whatever window it is scheduled)."""

    t_apply_ns: float
    scope: str
    from_core: int
    to_core: int
    mbs: list[int]  # the row's own micro-batch filter (empty = any)
    experts: list[int]  # expert codes layer·2^20 + expert (empty = any)
    open_mbs: list[int]  # the micro-batches open when it arrived: the only ones it still applies to


class CoreQueueState(BaseModel):
    """The schedule carried into the next window.

    ``busy_until_ns`` / ``vault_free_ns`` / ``link_free_ns``: per core / vault / directed NoC link, when the core (its
    array and DMA) / the vault's channels (held by migrations) / the link (held by remote traffic) become free.
    ``running_*``: scheduled work that ends after the window. ``open_compute`` / ``open_memory``: logical rows of
    admitted micro-batches whose stage has not been scheduled yet (re-mapped every window, so TACS overlays still act
    on them). ``dropped_mbs``: micro-batches shed by admission whose rows may still arrive.
    """

    busy_until_ns: list[int] = Field(default_factory=list)
    vault_free_ns: list[int] = Field(default_factory=list)
    link_free_ns: list[int] = Field(default_factory=list)  # per directed NoC link (Chip.link_bytes ids)
    running_compute: RunningCompute = Field(default_factory=RunningCompute.empty)
    running_memory: RunningMemory = Field(default_factory=RunningMemory.empty)
    open_compute: LogicalCompute = Field(default_factory=LogicalCompute.empty)
    open_memory: LogicalMemory = Field(default_factory=LogicalMemory.empty)
    pending: list[PendingTokens] = Field(default_factory=list)
    open_mbs: list[OpenMicroBatch] = Field(default_factory=list)
    dropped_mbs: list[int] = Field(default_factory=list)
    reroutes: list[ActiveReroute] = Field(default_factory=list)


MAX_REQUEST_COUNT = 1 << 40
"""Requests or output tokens counted in one window (a chip serves ~1e2-1e5 a window): sums over any run stay exact
int64 in the metrics reduction."""
MAX_TIME_NS = 1 << 62
"""A simulated time (ns, ~146 years): differences and sums of two stay in int64."""
RequestCount = Annotated[int, Field(ge=0, le=MAX_REQUEST_COUNT)]
TimeNs = Annotated[int, Field(ge=0, le=MAX_TIME_NS)]


class RequestsDone(Columnar):
    """The requests of a served trace whose last output token was generated in the window (absolute simulated ns):
    arrival, first output token, last output token, and the output tokens it generated."""

    request_id: list[Annotated[int, Field(ge=0, le=1 << 62)]]  # int64 with room
    t_arrival_ns: list[TimeNs]
    t_first_token_ns: list[TimeNs]
    t_done_ns: list[TimeNs]
    output_tokens: list[Annotated[int, Field(ge=1, le=MAX_REQUEST_COUNT)]]


class WindowTiming(BaseModel):
    """Timing outcome of one physicalized window (inputs of the metrics reduction).

    The request fields (``requests_done`` to ``tokens_queued``) are reported by a physicalizer that serves requests
    from a trace; a fixed-arrival run leaves them empty / 0. Their token counts balance over a run: the output tokens
    of the requests that arrived = those generated (``tokens_completed``) + those of admitted requests not yet
    generated at the end (``tokens_queued``) + those of the requests the full queue refused (``tokens_shed``), and
    window by window ``tokens_queued_w = tokens_queued_{w-1} + tokens_offered_w - tokens_completed_w -
    tokens_shed_w`` (shared/token_balance.py)."""

    tokens_completed: int = 0
    latencies_ms: list[float] = Field(default_factory=list)  # one per completed token: completion - generation
    queue_delay_ms: float = 0.0  # mean wait before a core started the work
    util_core: list[float] = Field(default_factory=list)  # busy fraction of the window per core
    bytes_moved: float = 0.0
    noc_link_util: list[float] = Field(default_factory=list)  # per directed mesh link, 0..1
    migrations: int = 0
    t0_ns: int = 0
    t1_ns: int = 0
    tokens_generated: int = 0
    energy_j: float = 0.0  # dynamic energy of the events emitted in this window (compute + memory + NoC)
    busy_until_ns: list[int] = Field(default_factory=list)  # per core, after this window's work
    backlog_ms: float = 0.0  # mean over cores of the work queued beyond the window end
    tokens_dropped: int = 0  # tokens of micro-batches shed by admission (schedule.max_open_mb) in this window
    open_mbs: int = 0  # micro-batches in flight at the window end
    oldest_inflight_ms: float = 0.0  # at the window end: age of the oldest admitted token not yet completed (0: none)
    requests_done: RequestsDone = Field(default_factory=RequestsDone.empty)  # requests finished in the window
    requests_arrived: RequestCount = 0  # requests of the trace that arrived in the window
    requests_shed: RequestCount = 0  # of those, refused by the full request queue
    tokens_offered: RequestCount = 0  # output tokens asked for by the requests that arrived
    tokens_shed: RequestCount = 0  # output tokens of the refused requests
    requests_waiting: RequestCount = 0  # at the window end: in the scheduler's waiting queue (not yet started)
    requests_running: RequestCount = 0  # at the window end: started, unfinished (prefilling or decoding)
    tokens_queued: RequestCount = 0  # at the window end: output tokens not yet generated of every
    # admitted, unfinished request (waiting or running)


class RunningRequests(Columnar):
    """The requests a serving scheduler has started and not finished, one row each in the order it started them
    (FCFS): ``prefilled`` prompt tokens in the KV cache, ``generated`` output tokens (the first one comes with the
    prompt's last chunk), ``t_first_token_ns`` / ``t_last_token_ns`` when the first / latest of them completed (-1:
    none yet), the pipeline ``lane`` that serves it (its KV cache stays with it), and whether a micro-batch in flight
    holds a token of it."""

    request_id: list[int]
    t_arrival_ns: list[int]
    prompt_tokens: list[int]
    output_tokens: list[int]
    prefilled: list[int]
    generated: list[int]
    t_first_token_ns: list[int]
    t_last_token_ns: list[int]
    lane: list[int]
    in_flight: list[bool]


class BatchesInFlight(Columnar):
    """The composition of the serving micro-batches in flight, one row per (micro-batch, request): what it credits
    at completion (``new_tokens`` prefilled or decoded; ``emits``: an output token)."""

    mb_id: list[int]
    request_id: list[int]
    new_tokens: list[int]
    emits: list[bool]


class ServingState(BaseModel):
    """The continuous-batching scheduler's state (``PhysicalizeRequest.serving``; services/lowering/physical/
    serving.py): the waiting queue in arrival order (FCFS), the running requests, per pipeline lane the micro-batch
    in flight on it (-1: free), the composition of those micro-batches, the next micro-batch id and the run's token
    offset (the tokens of every micro-batch formed so far: where the next one sits in the run's token stream)."""

    model_config = ConfigDict(extra="forbid")

    waiting: Requests = Field(default_factory=Requests.empty)
    running: RunningRequests = Field(default_factory=RunningRequests.empty)
    lanes: list[int] = Field(default_factory=list)
    batches: BatchesInFlight = Field(default_factory=BatchesInFlight.empty)
    next_mb_id: int = Field(default=0, ge=0)
    token_offset: int = Field(default=0, ge=0)


def _no_serving(v: object) -> bool:
    return v is None


class PhysicalState(BaseModel):
    """Everything the physicalizer carries across windows (saved at the commit frontier). ``serving``: the request
    scheduler's state of a served run (left out of the JSON when None: a fixed-arrival state reads as it always
    has)."""

    replicas: ReplicaState = Field(default_factory=ReplicaState)
    queue: CoreQueueState = Field(default_factory=CoreQueueState)
    next_evt_id: int = 0
    # weight tensors moved by migrate overlays that the replica state does not record (its ``shard_banks`` do)
    tensor_banks: dict[str, str] = Field(default_factory=dict)
    serving: ServingState | None = Field(default=None, exclude_if=_no_serving)


class PhysicalizeRequest(BaseModel):
    """``POST /v1/physicalize`` (lowering): one window's logical events plus everything needed to place them.

    The placement and the arch, fixed for a run, are given inline or by the hash their ``POST /v1/registry/placements``
    / ``POST /v1/registry/archs`` answered (exactly one of ``placement`` / ``placement_hash``; at most one of ``arch``
    / ``arch_hash``, neither = the default arch); an unknown hash is a 404 ``unknown_placement`` / ``unknown_arch``."""

    window: int = Field(ge=0)
    logical: LogicalWindow
    placement: Placement | None = None
    placement_hash: ContentHash | None = None
    overlays: Overlays = Field(default_factory=Overlays)
    state: PhysicalState | None = None  # None (and no state_ref): a fresh state
    state_ref: ContentHash | None = None  # or the previous state by the name its answer gave (404 unknown_...)
    replicas: ReplicaState | None = Field(default=None, description=(
        "Replaces the state's replicas: the replica state after this window's overlays (the placement service owns "
        "it, e.g. the TACS step's answer). The physicalizer reads it and carries it into its next state unchanged; "
        "an expert migration row it does not reflect is a 422 naming overlays.migrate[i].dst / .src."))
    return_state: bool = True  # false: answer only ``state_ref``
    events: bool = True  # false: answer the events' energy ``deposit`` only (what the thermal step needs)
    arch: ArchConfig | None = None
    arch_hash: ContentHash | None = None
    freq_ghz: list[float] | None = None  # per core; None = every core at its DVFS domain's top step
    window_ms: float = Field(gt=0, le=1e6, allow_inf_nan=False)  # up to 1000 s of simulated time in one window
    bw_eff_factor: float | list[float] = 1.0  # DRAM bandwidth left after refresh: one value or one per vault
    n_layers: int | None = Field(default=None, ge=1)  # model layers (a micro-batch completes after the last)
    serving: ServingConfig | None = Field(default=None, exclude_if=_no_serving, description=(
        "Serve requests (the workload's serving section): the window carries the requests arriving in it and no "
        "rows; the physicalizer's continuous-batching scheduler forms the micro-batches and asks the workload "
        "service for their rows (POST /v1/traces/{logical.trace_id}/microbatches). None: the window's rows."))


class PhysicalizeResponse(BaseModel):
    """The window's events (unless ``events: false``) and their energy ``deposit`` (the thermal step takes either),
    the state for the next window (unless ``return_state: false``) and its name ``state_ref``, and the timing."""

    compute: ComputeEvents | None = None
    memory: MemoryEvents | None = None
    deposit: EnergyDeposit | None = None
    state: PhysicalState | None = None
    state_ref: ContentHash | None = None
    timing: WindowTiming


class PhysicalizeEpochRequest(BaseModel):
    """``POST /v1/physicalize/epoch`` (lowering): windows ``window .. window + len(logical) − 1`` in one call, a
    control epoch in which the overlays, the clocks and the refresh factor do not change.

    The same as calling ``/v1/physicalize`` window after window (each with the previous answer's state, the overlays
    only at the first window, the same ``freq_ghz`` / ``bw_eff_factor`` / ``window_ms`` / ``n_layers``): every
    window's events, deposit and timing and the last state are those calls' answers, byte for byte, whatever the
    epoch's length. The placement and the arch inline or by the hash of their registration, as ``/v1/physicalize``."""

    window: int = Field(ge=0)  # the first window
    logical: list[LogicalWindow] = Field(min_length=1, max_length=MAX_EPOCH_WINDOWS)  # one per window, in order
    placement: Placement | None = None
    placement_hash: ContentHash | None = None
    overlays: Overlays = Field(default_factory=Overlays)  # TACS's decision: applied at the first window only
    state: PhysicalState | None = None  # the state after window - 1, whole (None: a fresh state)
    replicas: ReplicaState | None = Field(default=None, description=(
        "Replaces the state's replicas at the first window (as in /v1/physicalize): the replica state after the "
        "overlays, carried through the epoch unchanged."))
    arch: ArchConfig | None = None
    arch_hash: ContentHash | None = None
    freq_ghz: list[float] | None = None  # per core, for every window; None = every core at its domain's top step
    window_ms: float = Field(gt=0, le=1e6, allow_inf_nan=False)
    bw_eff_factor: float | list[float] = 1.0  # for every window: one value or one per vault
    n_layers: int | None = Field(default=None, ge=1)
    serving: ServingConfig | None = Field(default=None, exclude_if=_no_serving, description=(
        "Serve requests, for every window (as in /v1/physicalize)."))
    events: bool = True  # false: each window's energy ``deposit`` only
    return_state: bool = True  # false: no state (the epoch's caller keeps none)


class PhysicalWindow(BaseModel):
    """One window of an epoch: its events (unless ``events: false``), their energy deposit and the timing."""

    compute: ComputeEvents | None = None
    memory: MemoryEvents | None = None
    deposit: EnergyDeposit
    timing: WindowTiming


class PhysicalizeEpochResponse(BaseModel):
    """The epoch's windows in order, and the state after the last one (unless ``return_state: false``)."""

    windows: list[PhysicalWindow]
    state: PhysicalState | None = None
