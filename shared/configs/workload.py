"""Workload config (seed 001 §2.2): which model, how tokens arrive and how they are routed to experts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from shared.configs.base import StrictModel


class RoutingConfig(StrictModel):
    topk: PositiveInt = 2
    seed: int = Field(default=42, ge=0)
    zipf_s: float = Field(default=1.2, ge=0)  # popularity exponent; 0 = uniform
    locality: float = Field(default=0.0, ge=0, le=1)  # P(token repeats its previous expert choice)
    n_group: PositiveInt | None = None  # DeepSeek group-limited routing: expert groups ...
    topk_group: PositiveInt | None = None  # ... of which a token may use this many

    @model_validator(mode="after")
    def _groups(self) -> RoutingConfig:
        if (self.n_group is None) != (self.topk_group is None):
            raise ValueError("n_group and topk_group go together")
        if self.n_group is not None and self.topk_group is not None and self.topk_group > self.n_group:
            raise ValueError("topk_group must be <= n_group")
        return self


class SequenceConfig(StrictModel):
    # Bounds: a trace holds steps · layers · (experts used) rows; 1e5 steps of a 60-layer model is already ~1e8 rows.
    tokens: int = Field(default=2048, ge=1, le=1 << 20)  # context length of each sequence
    micro_batch: int = Field(default=32, ge=1, le=1 << 16)  # sequences per step (decode: one new token each)
    steps: int = Field(default=500, ge=1, le=100_000)  # decode steps (micro-batches) in the run
    step_interval_ms: float = Field(default=1.0, ge=1e-3, le=1e6)  # arrival interval between micro-batches


class FcOperator(StrictModel):
    flop_per_token: PositiveFloat | None = None  # None: derived from the model's WorkloadIR


class AttnOperator(StrictModel):
    flop_per_token: PositiveFloat | None = None
    kv_bytes_per_token: PositiveFloat | None = None


class OperatorsConfig(StrictModel):
    fc: FcOperator = FcOperator()
    attn: AttnOperator = AttnOperator()


class TensorsConfig(StrictModel):
    weight_shard_mb: float = Field(default=64.0, ge=1 / 64, le=1 << 16)  # 16 KiB .. 64 GiB (shards per expert)


class WorkloadConfig(StrictModel):
    model: str = "mixtral-8x7b"
    name: str | None = None  # label in results/<scenario>/<name>.csv; defaults to `model`
    phase: Literal["decode", "prefill"] = "decode"
    routing: RoutingConfig = RoutingConfig()
    sequence: SequenceConfig = SequenceConfig()
    operators: OperatorsConfig = OperatorsConfig()
    tensors: TensorsConfig = TensorsConfig()

    @property
    def label(self) -> str:
        return self.name or self.model
