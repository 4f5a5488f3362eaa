"""Request bodies of the workload service's HTTP API (every contract is in ``shared/contracts``).

Owner: workload service. Consumers: orchestrator (traces, model checks), placement (expert counts), tests.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.configs import WorkloadConfig
from shared.contracts.workload import MAX_MICROBATCHES_PER_CALL, MicroBatchSpec
from shared.limits import Dim

DEFAULT_WINDOW_MS = 3.0  # the window of a trace unless the caller says (the orchestrator sends the arch's)


class IrRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="zoo model name (GET /v1/models), or the name of the inline `config`")
    phase: Literal["prefill", "decode"] = "decode"
    batch: Dim = 1
    seq_len: Dim = Field(default=2048, description="prompt length (prefill) or context length (decode)")
    config: dict[str, Any] | None = Field(default=None, description="inline HuggingFace-style config.json")
    generic: bool = Field(default=False, description="read an unsupported model_type with the generic key mapping")


class ModelRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "name": "my-moe", "config": {"model_type": "mixtral", "hidden_size": 1024, "intermediate_size": 2816,
                                     "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
                                     "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000}}]})

    name: str = Field(min_length=1, max_length=64, description="the name workloads use (lower-case, dashes)")
    config: dict[str, Any] = Field(description="the checkpoint's HuggingFace config.json")
    generic: bool = Field(default=False, description="read an unsupported model_type with the generic key mapping")


class TraceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: WorkloadConfig
    window_ms: float = Field(default=DEFAULT_WINDOW_MS, ge=1e-6, le=1e6, allow_inf_nan=False)  # 1 ns .. 1000 s


class MicroBatchesRequest(BaseModel):
    """``POST /v1/traces/{id}/microbatches``: the micro-batches of a serving trace whose logical events the caller
    wants (1 .. `MAX_MICROBATCHES_PER_CALL`, each answered alone: how they are grouped into calls changes nothing)."""

    model_config = ConfigDict(extra="forbid")

    batches: list[MicroBatchSpec] = Field(min_length=1, max_length=MAX_MICROBATCHES_PER_CALL)
