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
