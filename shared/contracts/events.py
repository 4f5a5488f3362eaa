"""Physical events of one window (seed 001 §3.4), columnar, plus what the physicalizer reports about timing.

Owner: lowering service (``physicalize_window``). Consumers: thermal (power), metrics, orchestrator (CSV export).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from shared.configs.arch import ArchConfig
from shared.contracts.columnar import Columnar
from shared.contracts.placement import Overlays, Placement, ReplicaState
from shared.contracts.registry import ContentHash
from shared.contracts.workload import LogicalCompute, LogicalMemory, LogicalWindow


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
    ``shared.energy.WindowDeposit`` reads it back; ~15 kB of JSON where the events are ~200 kB (issue 21).

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


class WindowTiming(BaseModel):
    """Timing outcome of one physicalized window (inputs of the metrics reduction)."""

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


class PhysicalState(BaseModel):
    """Everything the physicalizer carries across windows (saved at the commit frontier)."""

    replicas: ReplicaState = Field(default_factory=ReplicaState)
    queue: CoreQueueState = Field(default_factory=CoreQueueState)
    next_evt_id: int = 0
    # weight tensors moved by migrate overlays that the replica state does not record (its ``shard_banks`` do)
    tensor_banks: dict[str, str] = Field(default_factory=dict)


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


class PhysicalizeResponse(BaseModel):
    """The window's events (unless ``events: false``) and their energy ``deposit`` (the thermal step takes either),
    the state for the next window (unless ``return_state: false``) and its name ``state_ref``, and the timing."""

    compute: ComputeEvents | None = None
    memory: MemoryEvents | None = None
    deposit: EnergyDeposit | None = None
    state: PhysicalState | None = None
    state_ref: ContentHash | None = None
    timing: WindowTiming
