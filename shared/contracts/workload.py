"""Logical (scenario-agnostic) events of one window (seed 001 §3.1), columnar on the wire.

Owner: workload service. Consumers: placement (TACS pending view), lowering (physicalize), orchestrator (CSV export).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.contracts.columnar import Columnar


class LogicalCompute(Columnar):
    """One row per (micro-batch, layer, op, expert) with its token count (never one row per token)."""

    event_id: list[int]
    t_gen_ns: list[int]  # when the micro-batch's work for this layer becomes ready
    mb_id: list[int]
    layer: list[int]
    op_type: list[str]  # "attn" | "router" | "fc" (routed expert FFN) | "shared" (shared expert) | "dense" | "head"
    expert: list[int]  # expert index within the layer; -1 when the op is not bound to a routed expert
    tokens: list[int]
    flops: list[float]


class LogicalMemory(Columnar):
    event_id: list[int]  # the compute event this access belongs to
    tensor_id: list[str]  # W_L{l}E{e}_{shard}, KV_L{l}_MB{mb}, ACT_L{l}_MB{mb}
    access: list[str]  # "read" | "write"
    bytes: list[float]
    locality_hint: list[str]  # "shard<k>" | "kv" | "act"


class LogicalWindow(BaseModel):
    trace_id: str
    window: int = Field(ge=0)
    t0_ns: int
    t1_ns: int
    compute: LogicalCompute
    memory: LogicalMemory
    tokens_generated: int = 0  # new tokens whose micro-batch arrived in this window


class LogicalWindows(BaseModel):
    """``GET /v1/traces/{id}/windows``: consecutive windows of a trace in one answer (the window loop reads the trace
    a batch at a time: one call instead of one per window)."""

    windows: list[LogicalWindow]


MAX_WINDOWS_PER_CALL = 64  # windows one ``GET /v1/traces/{id}/windows`` answers at most (a bounded answer)


class RoutingStats(BaseModel):
    """Load skew and temporal locality of a trace's routing, per MoE layer (``services.workload.recorded``):
    ``skew`` = max / mean tokens per expert, ``cv`` = their coefficient of variation, ``reuse_next`` = mean fraction
    of a token's k experts that the next token in arrival order uses too, ``reuse_sequence`` = the same ``micro_batch``
    tokens later (the same slot of the next micro-batch: the same sequence's next token in decode). Measured over
    the first ``tokens`` tokens of the run."""

    layers: list[int]
    skew: list[float]
    cv: list[float]
    reuse_next: list[float]
    reuse_sequence: list[float]
    tokens: int


class TraceSummary(BaseModel):
    """``POST /v1/traces`` / ``GET /v1/traces/{id}``: what a caller needs to walk a trace window by window."""

    trace_id: str  # content hash of the workload config + window_ms
    model: str
    window_ms: float
    n_windows: int
    n_layers: int  # transformer blocks (the head's events carry layer = n_layers)
    n_experts: int  # routed experts per MoE layer (0 for a dense model)
    topk: int
    moe_layers: list[int]
    steps: int
    micro_batch: int
    tokens_total: int  # tokens of the whole run (steps x micro_batch)
    flops_per_token_expert: float  # FLOPs one token costs one routed expert (per MoE layer)
    expert_bytes: int  # weight bytes of one routed expert
    shard_bytes: list[int] = Field(default_factory=list)  # sizes of its W_L{l}E{e}_{k} shards
    # one micro-batch step's non-expert work (attention with its KV traffic, router, shared/dense FFN, head): FLOPs
    # and DRAM bytes, split by the physicalizer over the attention cores (``shared.chip.attention_groups``)
    nonexpert_flops_per_step: float = Field(default=0.0, ge=0)
    nonexpert_bytes_per_step: float = Field(default=0.0, ge=0)
    t_end_ns: int = 0  # end of the last window
    routing_source: str = "zipf"  # "zipf" (drawn) or "trace:<file>" (replayed recorded selections)
    routing_stats: RoutingStats | None = None  # per-layer load skew and temporal locality of the routing


class ExpertLoad(BaseModel):
    """Per (MoE layer, expert) share of the token→expert assignments of a trace; each row sums to 1."""

    trace_id: str
    layers: list[int]  # MoE layer indices, one row of `load` each
    load: list[list[float]]
