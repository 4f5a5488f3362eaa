"""Physical events of one window (seed 001 §3.4), columnar, plus what the physicalizer reports about timing.

Owner: lowering service (``physicalize_window``). Consumers: thermal (power), metrics, orchestrator (CSV export).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.contracts.columnar import Columnar
from shared.contracts.placement import ReplicaState


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


class CoreQueueState(BaseModel):
    """Work carried into the next window: per core, the time (ns, absolute) at which it becomes free."""

    busy_until_ns: list[int] = Field(default_factory=list)
    pending_tokens: list[list[int]] = Field(default_factory=list)  # per core: [gen_time_ns, ...] not yet finished


class WindowTiming(BaseModel):
    """Timing outcome of one physicalized window (inputs of the metrics reduction)."""

    tokens_completed: int = 0
    latencies_ms: list[float] = Field(default_factory=list)  # one per completed token: completion - generation
    queue_delay_ms: float = 0.0  # mean wait before a core started the work
    util_core: list[float] = Field(default_factory=list)  # busy fraction of the window per core
    bytes_moved: float = 0.0
    noc_link_util: list[float] = Field(default_factory=list)  # per directed mesh link, 0..1
    migrations: int = 0


class PhysicalState(BaseModel):
    """Everything the physicalizer carries across windows (saved at the commit frontier)."""

    replicas: ReplicaState = Field(default_factory=ReplicaState)
    queue: CoreQueueState = Field(default_factory=CoreQueueState)
    next_evt_id: int = 0
