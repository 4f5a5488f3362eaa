"""Physical events of one window (seed 001 §3.4), columnar, plus what the physicalizer reports about timing.

Owner: lowering service (``physicalize_window``). Consumers: thermal (power), metrics, orchestrator (CSV export).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.configs.arch import ArchConfig
from shared.contracts.columnar import Columnar
from shared.contracts.placement import Overlays, Placement, ReplicaState
from shared.contracts.workload import LogicalWindow


class ComputeEvents(Columnar):
    """``traces/physical/compute_events.csv`` columns, in order."""

    evt_id: list[int]
    t_start_ns: list[int]
    core_id: list[int]
    duration_cycles: list[int]
    flops: list[float]
    op: list[str]
    dvfs_domain: list[str]
    power_hint: list[float]  # estimated average dynamic power of the event, W


class MemoryEvents(Columnar):
    """``traces/physical/memory_events.csv`` columns, in order."""

    evt_id: list[int]
    t_start_ns: list[int]
    src_core: list[int]
    dst_bank: list[str]  # "B(x,y,layer)"
    bytes: list[float]
    rw: list[str]  # "r" | "w"
    hops: list[int]
    noc_qos: list[str]  # "normal" | "migration"


class CarryCompute(Columnar):
    """Scheduled compute not yet run by the end of its window, aggregated per (core, part, op).

    The head runs back to back from the next window's start; the tail runs at a uniform duty over
    ``[carry_start_ns, carry_end_ns]`` (CoreQueueState). Each later window emits the share that falls inside it.
    """

    core_id: list[int]
    part: list[int]  # 0 = head (remainder of an event that straddled the window end), 1 = tail (not started)
    op: list[str]
    duration_ns: list[float]
    cycles: list[float]
    flops: list[float]
    energy_j: list[float]


class CarryMemory(Columnar):
    """Memory traffic of the carried compute, per (core, part, vault, rw, qos); emitted pro rata with its part."""

    src_core: list[int]
    part: list[int]
    dst_bank: list[str]
    bytes: list[float]
    rw: list[str]
    hops: list[int]
    noc_qos: list[str]


class PendingTokens(BaseModel):
    """Tokens of a scheduled micro-batch whose completion falls in a later window."""

    mb_id: int
    arrival_ns: int
    finish_ns: int
    tokens: int


class OpenMicroBatch(BaseModel):
    """A micro-batch whose last layer has not been physicalized yet (its layers span windows)."""

    mb_id: int
    arrival_ns: int
    ready_ns: int  # when its last physicalized stage finished: the next layer may not start earlier
    tokens: int


class CoreQueueState(BaseModel):
    """Work carried into the next window: per core, the time (ns, absolute) at which it becomes free."""

    busy_until_ns: list[int] = Field(default_factory=list)
    pending_tokens: list[list[int]] = Field(default_factory=list)  # per core: [gen_time_ns, ...] not yet finished
    carry_compute: CarryCompute = Field(default_factory=CarryCompute.empty)
    carry_memory: CarryMemory = Field(default_factory=CarryMemory.empty)
    carry_start_ns: list[float] = Field(default_factory=list)  # per core: where its carried tail resumes
    carry_end_ns: list[float] = Field(default_factory=list)  # per core: where its carried tail ends
    # Per ``carry_compute`` / ``carry_memory`` row: the routed-expert instance ("L{l}E{e}") of a not-started (tail)
    # record, "" otherwise; empty list = no row is tagged. A reroute or migration of that expert away from the row's
    # core moves the record with it (ARCHITECTURE §4: work not yet physicalized may still be changed by TACS).
    carry_compute_expert: list[str] = Field(default_factory=list)
    carry_memory_expert: list[str] = Field(default_factory=list)
    pending: list[PendingTokens] = Field(default_factory=list)
    open_mbs: list[OpenMicroBatch] = Field(default_factory=list)


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


class PhysicalState(BaseModel):
    """Everything the physicalizer carries across windows (saved at the commit frontier)."""

    replicas: ReplicaState = Field(default_factory=ReplicaState)
    queue: CoreQueueState = Field(default_factory=CoreQueueState)
    next_evt_id: int = 0
    tensor_banks: dict[str, str] = Field(default_factory=dict)  # weight tensors moved by migrate overlays


class PhysicalizeRequest(BaseModel):
    """``POST /v1/physicalize`` (lowering): one window's logical events plus everything needed to place them."""

    window: int = Field(ge=0)
    logical: LogicalWindow
    placement: Placement
    overlays: Overlays = Field(default_factory=Overlays)
    state: PhysicalState = Field(default_factory=PhysicalState)
    arch: ArchConfig = Field(default_factory=ArchConfig)
    freq_ghz: list[float] | None = None  # per core; None = every core at its DVFS domain's top step
    window_ms: float = Field(gt=0)
    bw_eff_factor: float | list[float] = 1.0  # DRAM bandwidth left after refresh: one value or one per vault
    n_layers: int | None = Field(default=None, ge=1)  # model layers (a micro-batch completes after the last)


class PhysicalizeResponse(BaseModel):
    compute: ComputeEvents
    memory: MemoryEvents
    state: PhysicalState
    timing: WindowTiming
