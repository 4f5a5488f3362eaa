"""Typed model configuration (``ModelConfig``): the structure every model builder takes (seed 003
``from_model_config``), layer by layer.

Each decoder layer has a **mixer** and an **MLP**:
- mixer: ``full_attention`` (MHA/GQA over the whole context), ``sliding_attention`` (the last ``sliding_window``
  keys), ``chunked_attention`` (keys of the current ``attention_chunk_size`` chunk, Llama-4), ``mla`` (DeepSeek's
  multi-head latent attention) or ``mamba`` (Jamba's selective state-space mixer);
- MLP: ``dense`` (a SwiGLU of ``intermediate_size``) or ``moe`` (router, routed experts of
  ``moe.moe_intermediate_size``, optional always-on shared experts and their gate).

``ModelConfig.mixers`` / ``mlps`` hold that per layer; left empty they follow the DeepSeek-style fields
(``moe.first_k_dense_replace``, ``moe.moe_layer_freq``) and full attention (MLA when ``mla`` is set).

The ``*_bias``, ``qk_norm``, ``norm``, ``attention_sinks`` fields do not change the cost model noticeably; they make
the parameter counts exact (tested against transformers' own counts, ``tests/fixtures/hf_models``). The reader of
HuggingFace ``config.json`` files is ``services.workload.ir.hf_config``.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.limits import MAX_DIM, MAX_EXPERTS, MAX_LAYERS, MAX_POSITIONS, Dim, DimOrZero, Experts, Layers

Mixer = Literal["full_attention", "sliding_attention", "chunked_attention", "mla", "mamba"]
Mlp = Literal["dense", "moe"]
MIXERS: tuple[str, ...] = ("full_attention", "sliding_attention", "chunked_attention", "mla", "mamba")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MLAConfig(_Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3). ``q_lora_rank`` None = plain Q projection (V2-Lite)."""

    q_lora_rank: Dim | None = None
    kv_lora_rank: Dim
    qk_nope_head_dim: Dim
    qk_rope_head_dim: Dim
    v_head_dim: Dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_elems(self) -> int:
        """Cached elements per token per layer: the compressed latent plus the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class MambaConfig(_Frozen):
    """Selective state-space mixer (Mamba-1, as in Jamba): ``d_inner = expand · hidden``.

    Per layer: in_proj ``h → 2·d_inner``, a depthwise causal conv of width ``d_conv``, x_proj ``d_inner → dt_rank +
    2·d_state``, dt_proj ``dt_rank → d_inner``, ``A_log`` (d_inner × d_state), ``D`` (d_inner), out_proj
    ``d_inner → h``; Jamba adds RMSNorms over Δ, B and C (``inner_norms``). Per sequence the layer keeps a state of
    ``d_inner · (d_state + d_conv − 1)`` elements instead of a KV cache.
    """

    d_inner: Dim
    d_state: Dim
    d_conv: Dim
    dt_rank: Dim
    conv_bias: bool = True
    proj_bias: bool = False
    inner_norms: bool = True

    @property
    def state_elems(self) -> int:
        """Recurrent state of one sequence: SSM state ``d_inner·d_state`` + conv window ``d_inner·(d_conv−1)``."""
        return self.d_inner * (self.d_state + self.d_conv - 1)


class MoEConfig(_Frozen):
    num_routed_experts: Experts
    num_activated_experts: Experts  # top-k
    moe_intermediate_size: Dim  # per routed expert
    num_shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    # Width of the always-on shared-expert MLP (all shared experts together); None = num_shared · moe_intermediate
    shared_intermediate_size: DimOrZero | None = None
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(Linear(h, 1)) scales the shared expert's output
    first_k_dense_replace: int = Field(default=0, ge=0, le=MAX_LAYERS)  # the first k layers use the dense FFN
    moe_layer_freq: Layers = 1  # every n-th layer after the dense ones is MoE (used when ModelConfig.mlps is empty)
    n_group: Experts | None = None  # group-limited routing (DeepSeek)
    topk_group: Experts | None = None
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    router_bias: bool = False  # gpt-oss: the router Linear has a bias
    expert_bias: bool = False  # gpt-oss: each expert's gate_up and down projections have biases

    @model_validator(mode="after")
    def _check(self) -> MoEConfig:
        if self.num_activated_experts > self.num_routed_experts:
            raise ValueError("num_activated_experts must be <= num_routed_experts")
        if (self.n_group is None) != (self.topk_group is None):
            raise ValueError("n_group and topk_group go together")
        if self.n_group is not None and self.topk_group is not None:
            if self.num_routed_experts % self.n_group:
                raise ValueError("num_routed_experts must be a multiple of n_group")
            if self.topk_group > self.n_group:
                raise ValueError("topk_group must be <= n_group")
        return self

    @property
    def shared_width(self) -> int:
        """Intermediate width of the shared-expert SwiGLU (0: none)."""
        if self.shared_intermediate_size is not None:
            return self.shared_intermediate_size
        return self.num_shared_experts * self.moe_intermediate_size


class ModelConfig(_Frozen):
    name: str
    family: str  # the config's model_type ("mixtral", "deepseek_v3", ...) or "generic"
    hidden_size: Dim
    num_hidden_layers: Layers
    num_attention_heads: Dim
    num_key_value_heads: Dim
    head_dim: Dim
    intermediate_size: Dim  # dense MLP width (for an all-MoE model: the expert width)
    vocab_size: Dim
    max_position_embeddings: int = Field(default=4096, ge=1, le=MAX_POSITIONS)
    tie_word_embeddings: bool = False
    dtype_bytes: int = Field(default=2, ge=1, le=16)  # bf16
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    mamba: MambaConfig | None = None
    mixers: tuple[Mixer, ...] = ()  # per layer; () = all full attention (all MLA when mla is set)
    mlps: tuple[Mlp, ...] = ()  # per layer; () = from moe.first_k_dense_replace / moe_layer_freq
    sliding_window: int | None = Field(default=None, ge=1, le=MAX_POSITIONS)
    attention_chunk_size: int | None = Field(default=None, ge=1, le=MAX_POSITIONS)
    # parameter-exactness details (see the module docstring)
    attention_bias: bool = False  # q/k/v projections carry biases
    o_proj_bias: bool = False
    qk_norm: Literal["none", "head", "full"] = "none"  # RMSNorm over each head (Qwen3) or the whole q/k (OLMoE)
    norm: Literal["rms", "layernorm", "layernorm_nobias"] = "rms"
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head
    mlp_bias: bool = False  # dense MLP projections carry biases
    lm_head_bias: bool = False

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        n = self.num_hidden_layers
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.moe is not None and self.moe.first_k_dense_replace > n:
            raise ValueError("moe.first_k_dense_replace must be <= num_hidden_layers")
        if self.mixers and len(self.mixers) != n:
            raise ValueError(f"mixers lists {len(self.mixers)} layers, the model has {n}")
        if self.mlps and len(self.mlps) != n:
            raise ValueError(f"mlps lists {len(self.mlps)} layers, the model has {n}")
        if "moe" in self.mlps and self.moe is None:
            raise ValueError("mlps has MoE layers but the model has no moe block")
        if "mamba" in self.mixers and self.mamba is None:
            raise ValueError("mixers has Mamba layers but the model has no mamba block")
        if "mla" in self.mixers and self.mla is None:
            raise ValueError("mixers has MLA layers but the model has no mla block")
        if "sliding_attention" in self.mixers and self.sliding_window is None:
            raise ValueError("mixers has sliding-attention layers but sliding_window is not set")
        if "chunked_attention" in self.mixers and self.attention_chunk_size is None:
            raise ValueError("mixers has chunked-attention layers but attention_chunk_size is not set")
        return self

    # --- per-layer structure ----------------------------------------------------------------------------------
    @property
    def layer_mixers(self) -> tuple[Mixer, ...]:
        if self.mixers:
            return self.mixers
        kind: Mixer = "mla" if self.mla is not None else "full_attention"
        return (kind,) * self.num_hidden_layers

    @property
    def layer_mlps(self) -> tuple[Mlp, ...]:
        if self.mlps:
            return self.mlps
        moe = self.moe
        out: list[Mlp] = []
        for i in range(self.num_hidden_layers):
            is_moe = moe is not None and i >= moe.first_k_dense_replace and \
                (i - moe.first_k_dense_replace) % moe.moe_layer_freq == 0
            out.append("moe" if is_moe else "dense")
        return tuple(out)

    @property
    def attention_kind(self) -> Literal["mha", "gqa", "mla"]:
        if self.mla is not None:
            return "mla"
        return "mha" if self.num_key_value_heads == self.num_attention_heads else "gqa"

    def is_moe_layer(self, layer: int) -> bool:
        return self.layer_mlps[layer] == "moe"

    @property
    def moe_layers(self) -> list[int]:
        return [i for i, m in enumerate(self.layer_mlps) if m == "moe"]

    def keys_per_query(self, layer: int, ctx: int) -> int:
        """Keys one decode query of a ``ctx``-token context attends to at ``layer`` (0 for Mamba):
        full/MLA ``ctx``; sliding ``min(ctx, W)``; chunked ``((ctx − 1) mod C) + 1`` (the tokens of the current
        chunk, the last token included)."""
        mixer = self.layer_mixers[layer]
        if mixer == "mamba":
            return 0
        if mixer == "sliding_attention" and self.sliding_window is not None:
            return min(ctx, self.sliding_window)
        if mixer == "chunked_attention" and self.attention_chunk_size is not None:
            return (ctx - 1) % self.attention_chunk_size + 1 if ctx > 0 else 0
        return ctx

    def kv_bytes_per_token_layer(self, layer: int | None = None) -> int:
        """KV-cache bytes one token adds to one attention layer: 2·kv_heads·head_dim (MHA/GQA) or kv_lora+rope
        (MLA), times dtype bytes; 0 for a Mamba layer. ``layer`` None: the first attention layer's."""
        if layer is None:
            layer = next((i for i, m in enumerate(self.layer_mixers) if m != "mamba"), 0)
        mixer = self.layer_mixers[layer]
        if mixer == "mamba":
            return 0
        if mixer == "mla" and self.mla is not None:
            return self.mla.kv_cache_elems * self.dtype_bytes
        return 2 * self.num_key_value_heads * self.head_dim * self.dtype_bytes

    def state_bytes_per_sequence(self, layer: int) -> int:
        """Recurrent state one sequence keeps at a Mamba ``layer`` (bytes); 0 for attention layers."""
        if self.layer_mixers[layer] != "mamba" or self.mamba is None:
            return 0
        return self.mamba.state_elems * self.dtype_bytes

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert: gate, up and down projections (3·h·I) plus their biases."""
        moe = self.moe
        if moe is None:
            return 0
        h, inter = self.hidden_size, moe.moe_intermediate_size
        return 3 * h * inter + ((2 * inter + h) if moe.expert_bias else 0)

    @property
    def expert_bytes(self) -> int:
        """Weight bytes of one routed expert (what TAPS places and TACS moves)."""
        return self.expert_params * self.dtype_bytes


def mamba_dt_rank(hidden_size: int, value: object) -> int:
    """Mamba's ``dt_rank``: ``"auto"`` = ⌈hidden / 16⌉ (Mamba/Jamba convention)."""
    if value == "auto" or value is None:
        return math.ceil(hidden_size / 16)
    assert isinstance(value, int)
    return value


__all__ = ["MAX_DIM", "MIXERS", "MLAConfig", "MambaConfig", "Mixer", "Mlp", "MoEConfig", "ModelConfig",
           "mamba_dt_rank"]
