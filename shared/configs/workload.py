"""Workload config (seed 001 §2.2): which model, how tokens arrive and how they are routed to experts."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

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
    # Query tokens of one sequence in a served micro-batch that share one read of the keys and values they attend
    # to (the query block of a tiled attention kernel: FlashAttention-2 runs blocks of 128 query rows at head dim
    # 128 on A100/H100, and 64 in the split-KV kernel a paged KV cache forces, flash_fwd_launch_template.h and
    # flash_api.cpp). 1: every query token streams its keys from DRAM, as a decode step does; a prompt chunk then
    # reads its context once per token. Serving only (services/workload/serving.py).
    query_block: int = Field(default=1, ge=1, le=1 << 20, exclude_if=lambda v: v == 1)


class OperatorsConfig(StrictModel):
    fc: FcOperator = FcOperator()
    attn: AttnOperator = AttnOperator()


class TensorsConfig(StrictModel):
    weight_shard_mb: float = Field(default=64.0, ge=1 / 64, le=1 << 16)  # 16 KiB .. 64 GiB (shards per expert)


def _field_error(title: str, loc: tuple[str | int, ...], code: str, message: str, value: Any) -> ValidationError:
    """A validation error located at ``loc`` (a cross-field check names the field to change, not its parent)."""
    return ValidationError.from_exception_data(title, [InitErrorDetails(
        type=PydanticCustomError(code, message), loc=loc, input=value)])


class ServingSlo(StrictModel):
    """The latency SLO that serving capacity is measured against: 99th percentiles of time to first token (arrival to
    the first output token) and of time per output token (the mean gap between a request's later tokens). Defaults:
    MLPerf Inference's server scenario for Mixtral-8x7B (mlcommons/inference ``loadgen/mlperf.conf``:
    ``mixtral-8x7b.Server.ttft_latency = 2000``, ``tpot_latency = 200`` ms, ``*.Server.target_latency_percentile =
    99``); Llama-2-70B's server scenario has the same limits."""

    ttft_p99_ms: float = Field(default=2000.0, gt=0, le=1e7)
    tpot_p99_ms: float = Field(default=200.0, gt=0, le=1e6)


SERVING_TRACE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._\-]*$"


class ServingConfig(StrictModel):
    """Serving like a server: requests arrive from a recorded arrival trace and a continuous-batching scheduler (in the
    lowering service) forms the micro-batches at run time, prefill chunks and decode steps together.

    - ``trace``: an arrival trace by name, never a path: a file of ``TASMOE_TRACES_DIR`` or a packaged one
      (``services/workload/serving_traces/``), one row per request with its arrival time, prompt and output lengths,
      in one of the published formats ``services/workload/arrival_files.py`` reads (Azure 2023 and 2024, BurstGPT,
      Mooncake, or ``arrival_s,prompt_tokens,output_tokens``).
    - ``start_s``: where in the trace the run starts (trace seconds since its first request); ``duration_ms``: the
      arrivals' span: the requests arriving in ``[0, duration_ms)`` are offered; ``drain_ms``: simulated time after
      it with no arrival, in which the chip serves what is queued (0: the run ends with the arrivals). A run lasts
      ``duration_ms + drain_ms``.
    - ``rate_rps``: the offered request rate. The trace's arrival times (since ``start_s``) are divided by one factor
      so that the ``round(rate_rps · duration)`` requests that follow ``start_s`` arrive within the run (its mean rate
      is ``rate_rps`` up to that rounding); prompt and output lengths are never scaled. None: the trace's own pace.
    - The scheduler's knobs (used by the lowering service, validated here): ``max_batch_tokens`` the token budget of
      one micro-batch (prefill chunks + one token per decoding request), ``max_running`` the requests decoding at
      once, ``queue_limit`` the requests waiting for admission (an arrival beyond it is shed and reported),
      ``prefill_chunk`` the largest prompt chunk of one request in one micro-batch. Defaults: vLLM's, for its OpenAI
      API server on a GPU below 70 GiB (``EngineArgs.get_batch_defaults``: ``max_num_batched_tokens`` 2048,
      ``max_num_seqs`` 256), with chunked prefill and no per-request chunk cap below the budget
      (``long_prefill_token_threshold`` 0: ``prefill_chunk`` = the budget). vLLM's waiting queue is unbounded; a
      bounded one keeps an overloaded run's state finite: 1024 = 4 x ``max_running`` (no published default).
    - ``slo``: `ServingSlo`.
    """

    trace: str = Field(default="azure_llm_inference_2023_conv", min_length=1, max_length=128,
                       pattern=SERVING_TRACE_NAME)
    start_s: float = Field(default=0.0, ge=0, le=1e7)
    duration_ms: float = Field(gt=0, le=1e7)  # the arrivals' span: 1 ns .. ~2.8 h
    drain_ms: float = Field(default=0.0, ge=0, le=1e7)  # then no arrival; the run lasts duration_ms + drain_ms
    rate_rps: float | None = Field(default=None, gt=0, le=1e6)
    max_batch_tokens: int = Field(default=2048, ge=1, le=1 << 16)
    max_running: int = Field(default=256, ge=1, le=1 << 16)
    queue_limit: int = Field(default=1024, ge=0, le=1 << 20)
    prefill_chunk: int = Field(default=2048, ge=1, le=1 << 16)
    slo: ServingSlo = ServingSlo()

    @model_validator(mode="after")
    def _budget(self) -> ServingConfig:
        # vLLM's own rule (SchedulerConfig: max_num_batched_tokens >= max_num_seqs): every running request decodes one
        # token a micro-batch, so more of them than the budget could never all run
        if self.max_running > self.max_batch_tokens:
            raise _field_error("ServingConfig", ("max_running",), "serving_budget",
                               f"max_running ({self.max_running}) must be <= max_batch_tokens "
                               f"({self.max_batch_tokens}): every running request decodes one token a micro-batch",
                               self.max_running)
        if self.prefill_chunk > self.max_batch_tokens:
            raise _field_error("ServingConfig", ("prefill_chunk",), "serving_budget",
                               f"prefill_chunk ({self.prefill_chunk}) must be <= max_batch_tokens "
                               f"({self.max_batch_tokens}): a chunk is part of one micro-batch", self.prefill_chunk)
        return self


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
    # None: fixed arrivals (``sequence``), and the config's JSON (hence every hash of it) reads as without the key
    serving: ServingConfig | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _serving(self) -> WorkloadConfig:
        """Serving mode forms its micro-batches from requests: both phases at once, and no fixed slots for locality
        to follow (``routing.locality`` repeats the choice of the same slot one micro-batch earlier, the same
        sequence only under fixed arrivals). ``operators.attn.query_block`` groups a served request's query tokens,
        so it is refused without a serving section."""
        if self.serving is None:
            if self.operators.attn.query_block != 1:
                raise _field_error("WorkloadConfig", ("operators", "attn", "query_block"), "query_block_serving",
                                   "applies to served micro-batches (a serving section): a fixed-arrival "
                                   "micro-batch's tokens each read their own context", self.operators.attn.query_block)
            return self
        if self.phase != "decode":
            raise _field_error("WorkloadConfig", ("phase",), "serving_phase",
                               "serving batches prefill chunks and decode steps together: leave phase at decode",
                               self.phase)
        if self.routing.locality > 0:
            raise _field_error("WorkloadConfig", ("routing", "locality"), "serving_locality",
                               "must be 0 with serving: a micro-batch's slots are not the same sequences from one "
                               "micro-batch to the next under continuous batching", self.routing.locality)
        return self

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
