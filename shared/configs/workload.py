"""Workload config (seed 001 §2.2): which model, how tokens arrive and how they are routed to experts."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from shared.configs.base import StrictModel
from shared.errors import first_validation_error


class RoutingConfig(StrictModel):
    # experts per token; None: the model's own (config.json's num_experts_per_tok), as the model was trained
    topk: PositiveInt | None = None
    seed: int = Field(default=42, ge=0)
    zipf_s: float = Field(default=1.2, ge=0)  # popularity exponent; 0 = uniform
    locality: float = Field(default=0.0, ge=0, le=1)  # P(token repeats its previous expert choice)
    n_group: PositiveInt | None = None  # DeepSeek group-limited routing: expert groups ...
    topk_group: PositiveInt | None = None  # ... of which a token may use this many
    # Replay recorded expert selections instead of drawing them (zipf_s, locality, groups then unused): a file name
    # in TASMOE_TRACES_DIR (default <configs_dir>/traces) or the shipped samples (services/workload/samples);
    # format by suffix (.csv, .jsonl, .parquet; .json = per-token ids) unless trace_format says
    trace: str | None = Field(default=None, min_length=1, max_length=255, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
    trace_format: Literal["csv", "jsonl", "parquet", "ids-json", "topk-parquet"] | None = None

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


class InlineModel(StrictModel):
    """A model given by its HuggingFace config.json instead of a zoo/registered name. ``config``: the JSON object, or
    (in a config file read by the CLI) a path to the file, relative to that config file; services accept only the
    object. ``name`` labels it (default ``user-<first 12 hex of the config's SHA-256>``)."""

    config: dict[str, Any] | str
    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
    generic: bool = False  # opt into the generic key mapping for a model_type tasmoe does not know

    @property
    def label(self) -> str:
        if self.name:
            return self.name.lower().replace("_", "-")
        if isinstance(self.config, str):
            return self.config.rsplit("/", 1)[-1].removesuffix(".json").lower().replace("_", "-") or "user-model"
        text = json.dumps(self.config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return "user-" + hashlib.sha256(text.encode()).hexdigest()[:12]


class WorkloadConfig(StrictModel):
    model: str | InlineModel = "mixtral-8x7b"  # a zoo or registered model name, or {config: ...}
    name: str | None = None  # label in results/<scenario>/<name>.csv; defaults to `model`
    phase: Literal["decode", "prefill"] = "decode"
    routing: RoutingConfig = RoutingConfig()
    sequence: SequenceConfig = SequenceConfig()
    operators: OperatorsConfig = OperatorsConfig()
    tensors: TensorsConfig = TensorsConfig()

    @field_validator("model", mode="before")
    @classmethod
    def _model_ref(cls, v: Any) -> Any:
        """An inline entry is validated here, so its error names its own key (``model: name: ...``); left to the
        union, every mistake in it was reported as ``model.str: Input should be a valid string``."""
        if isinstance(v, (str, InlineModel)):
            return v
        if isinstance(v, dict):
            try:
                return InlineModel.model_validate(v)
            except ValidationError as exc:
                field, msg = first_validation_error(exc)
                raise PydanticCustomError("inline_model", "{field}: {msg}", {"field": field, "msg": msg}) from None
        raise PydanticCustomError("model_ref", "a model name or an object with a config (config.json) expected, "
                                               "got {got}", {"got": type(v).__name__})

    @field_validator("model")
    @classmethod
    def _model_name(cls, v: str | InlineModel) -> str | InlineModel:
        if isinstance(v, str) and not v.strip():
            raise ValueError("must name a model")
        return v

    @property
    def model_name(self) -> str:
        """The model's name: the zoo/registered name, or the inline model's label."""
        return self.model if isinstance(self.model, str) else self.model.label

    @property
    def label(self) -> str:
        return self.name or self.model_name
