"""Logical (scenario-agnostic) events of one window (seed 001 §3.1), columnar on the wire.

Owner: workload service. Consumers: placement (TACS pending view), lowering (physicalize), orchestrator (CSV export).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class Requests(Columnar):
    """Requests of a serving trace (``WorkloadConfig.serving``), one row each, in arrival order."""

    request_id: list[int]  # the request's rank in arrival order within the run (0, 1, ...)
    t_arrival_ns: list[int]  # simulated arrival time (the trace's, rescaled to the offered rate)
    prompt_tokens: list[int]  # the trace's prompt length
    output_tokens: list[int]  # the trace's output length (tokens the request generates, the first one included)


def _no_requests(r: Requests) -> bool:
    return len(r) == 0


class LogicalWindow(BaseModel):
    """Window ``[t0_ns, t1_ns)`` of a trace. Fixed arrivals: the events of the micro-batches arriving in it. Serving
    (``WorkloadConfig.serving``): the requests arriving in it and no events (the lowering service's scheduler forms
    the micro-batches and asks ``POST /v1/traces/{id}/microbatches`` for their rows); ``requests`` is left out of
    the JSON when empty (a fixed-arrival window reads as it always has)."""

    trace_id: str
    window: int = Field(ge=0)
    t0_ns: int
    t1_ns: int
    compute: LogicalCompute
    memory: LogicalMemory
    tokens_generated: int = 0  # new tokens whose micro-batch arrived in this window (0 in serving mode)
    requests: Requests = Field(default_factory=Requests.empty, exclude_if=_no_requests)


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


def _false(v: bool) -> bool:
    return not v


def _zero(v: float) -> bool:
    return v == 0


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
    # Serving mode (``WorkloadConfig.serving``; each field left out of the JSON at its fixed-arrival default): the
    # offered requests of the run; ``tokens_total`` is then their output tokens, ``steps``, ``micro_batch`` and the
    # per-step non-expert work are 0 (no fixed micro-batches: the lowering service's scheduler forms them)
    serving: bool = Field(default=False, exclude_if=_false)
    n_requests: int = Field(default=0, ge=0, exclude_if=_zero)  # requests arriving in [0, duration)
    offered_prompt_tokens: int = Field(default=0, ge=0, exclude_if=_zero)  # their prompt tokens
    offered_output_tokens: int = Field(default=0, ge=0, exclude_if=_zero)  # their output tokens (= tokens_total)
    offered_rate_rps: float = Field(default=0.0, ge=0, exclude_if=_zero)  # n_requests / duration
    # the drain after which every offered request is judged by the SLO (``shared.slo.drain_to_judge_ms``), ms
    drain_to_judge_ms: float = Field(default=0.0, ge=0, exclude_if=_zero)
    # offered rate / the trace's own: simulated arrival = (trace arrival - start_s) / rate_factor (1: its own pace)
    rate_factor: float = Field(default=0.0, ge=0, exclude_if=_zero)
    # event ids of micro-batch m (POST .../microbatches) are m * mb_event_stride + its slot: unique across the run
    mb_event_stride: int = Field(default=0, ge=0, exclude_if=_zero)


class ExpertLoad(BaseModel):
    """Per (MoE layer, expert) share of the token→expert assignments of a trace; each row sums to 1."""

    trace_id: str
    layers: list[int]  # MoE layer indices, one row of `load` each
    load: list[list[float]]


# --- serving: the micro-batches a scheduler forms -------------------------------------------------------------------
MAX_MICROBATCHES_PER_CALL = 64  # micro-batches one ``POST /v1/traces/{id}/microbatches`` answers at most
MAX_MB_ID = (1 << 31) - 1  # micro-batches of one run (event ids: mb_id x slots per micro-batch + slot)
MAX_REQUEST_ID = (1 << 31) - 1  # requests of one run
MAX_TOKEN_OFFSET = 1 << 48  # tokens of one run before a micro-batch
MAX_CONTEXT_TOKENS = 1 << 24  # a request's context: 16.8M tokens, above the longest public context (~1e7)
MAX_NEW_TOKENS = 1 << 16  # one request's tokens in one micro-batch (the scheduler's budget bound)


class BatchSeqs(Columnar):
    """The requests of one micro-batch, one row each: ``new_tokens`` it processes now (a prompt chunk, or 1 for a
    decode step) on top of ``context`` tokens already in its KV cache; ``emits``: the micro-batch yields an output
    token for it (a decode step, or the last chunk of its prompt)."""

    request_id: list[Annotated[int, Field(ge=0, le=MAX_REQUEST_ID)]]
    new_tokens: list[Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)]]
    context: list[Annotated[int, Field(ge=0, le=MAX_CONTEXT_TOKENS)]]
    emits: list[bool]


class MicroBatchSpec(BaseModel):
    """One micro-batch a serving scheduler formed: ``mb_id`` its index in the run, ``t_ns`` when it starts,
    ``token_offset`` the tokens of all earlier micro-batches of the run (where its tokens sit in the run's token
    stream, which fixes their routing), ``seqs`` its requests (their tokens in this order follow ``token_offset``)."""

    model_config = ConfigDict(extra="forbid")

    mb_id: int = Field(ge=0, le=MAX_MB_ID)
    t_ns: int = Field(ge=0, le=1 << 62)
    token_offset: int = Field(ge=0, le=MAX_TOKEN_OFFSET)
    seqs: BatchSeqs

    @field_validator("seqs")
    @classmethod
    def _some(cls, v: BatchSeqs) -> BatchSeqs:
        if len(v) == 0:
            raise ValueError("a micro-batch holds at least one request")
        return v


class MicroBatchRows(BaseModel):
    """``POST /v1/traces/{id}/microbatches``: the logical events of the asked micro-batches, in their order, each
    micro-batch's rows as a fixed-arrival micro-batch's (``t_gen_ns`` = its ``t_ns``; event ids from its ``mb_id``)."""

    compute: LogicalCompute
    memory: LogicalMemory
