"""Typed model configuration (``ModelConfig``) and the reader of HuggingFace-style ``config.json`` files.

``ModelConfig`` is the structured form every model builder takes (seed 003 ``from_model_config``): the attention kind
(MHA/GQA or MLA), the dense FFN, and an optional MoE block. ``from_hf_config`` understands the key names used by the
public configs of LLaMA (``num_key_value_heads``), Mixtral (``num_local_experts``, ``num_experts_per_tok``) and
DeepSeek (``n_routed_experts``, ``n_shared_experts``, ``moe_intermediate_size``, ``first_k_dense_replace``,
``n_group``/``topk_group``, ``q_lora_rank``/``kv_lora_rank``...), plus the short names of DeepSeek's inference configs
(``dim``, ``n_layers``, ``inter_dim``, ``moe_inter_dim``, ``n_activated_experts``, ``n_dense_layers``...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.errors import BadInput, first_validation_error
from shared.limits import MAX_EXPERTS, MAX_LAYERS, MAX_POSITIONS, Dim, Experts, Layers


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


class MoEConfig(_Frozen):
    num_routed_experts: Experts
    num_activated_experts: Experts  # top-k
    moe_intermediate_size: Dim  # per expert (routed and shared)
    num_shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    first_k_dense_replace: int = Field(default=0, ge=0, le=MAX_LAYERS)  # the first k layers use the dense FFN
    moe_layer_freq: Layers = 1  # every n-th layer after the dense ones is MoE
    n_group: Experts | None = None  # group-limited routing (DeepSeek)
    topk_group: Experts | None = None
    score_func: Literal["softmax", "sigmoid"] = "softmax"

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


class ModelConfig(_Frozen):
    name: str
    family: Literal["llama", "mixtral", "deepseek"]
    hidden_size: Dim
    num_hidden_layers: Layers
    num_attention_heads: Dim
    num_key_value_heads: Dim
    head_dim: Dim
    intermediate_size: Dim  # dense FFN (LLaMA, DeepSeek's dense layers); per expert for Mixtral
    vocab_size: Dim
    max_position_embeddings: int = Field(default=4096, ge=1, le=MAX_POSITIONS)
    tie_word_embeddings: bool = False
    dtype_bytes: int = Field(default=2, ge=1, le=16)  # bf16
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.moe is not None and self.moe.first_k_dense_replace > self.num_hidden_layers:
            raise ValueError("moe.first_k_dense_replace must be <= num_hidden_layers")
        return self

    @property
    def attention_kind(self) -> Literal["mha", "gqa", "mla"]:
        if self.mla is not None:
            return "mla"
        return "mha" if self.num_key_value_heads == self.num_attention_heads else "gqa"

    def is_moe_layer(self, layer: int) -> bool:
        moe = self.moe
        if moe is None or layer < moe.first_k_dense_replace:
            return False
        return (layer - moe.first_k_dense_replace) % moe.moe_layer_freq == 0

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    def kv_bytes_per_token_layer(self) -> int:
        """KV-cache bytes one token adds to one layer: 2·kv_heads·head_dim (MHA/GQA) or kv_lora+rope (MLA)."""
        if self.mla is not None:
            return self.mla.kv_cache_elems * self.dtype_bytes
        return 2 * self.num_key_value_heads * self.head_dim * self.dtype_bytes


# Key aliases, first match wins: HF names first, then DeepSeek's inference-config short names.
_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "dim", "d_model", "n_embd"),
    "num_hidden_layers": ("num_hidden_layers", "n_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "intermediate_size": ("intermediate_size", "inter_dim", "inter_dim_dense", "ffn_dim", "hidden_dim"),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "max_seq_len"),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "num_routed_experts": ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"),
    "num_activated_experts": ("num_experts_per_tok", "n_activated_experts", "moe_topk", "top_k"),
    "moe_intermediate_size": ("moe_intermediate_size", "moe_inter_dim"),
    "num_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "first_k_dense_replace": ("first_k_dense_replace", "n_dense_layers"),
    "moe_layer_freq": ("moe_layer_freq",),
    "n_group": ("n_group", "n_expert_groups"),
    "topk_group": ("topk_group", "n_limited_groups"),
    "score_func": ("scoring_func", "score_func"),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
}


def _get(raw: Mapping[str, Any], key: str) -> Any:
    for alias in _ALIASES[key]:
        if alias in raw and raw[alias] is not None:
            return raw[alias]
    return None


def _family(raw: Mapping[str, Any], is_moe: bool, is_mla: bool) -> Literal["llama", "mixtral", "deepseek"]:
    text = " ".join(str(raw.get(k, "")) for k in ("model_type", "architectures", "_name_or_path")).lower()
    if is_mla or "deepseek" in text:
        return "deepseek"
    if is_moe or "mixtral" in text:
        return "mixtral"
    return "llama"


def from_hf_config(raw: Mapping[str, Any], *, name: str) -> ModelConfig:
    """Build a ``ModelConfig`` from a HuggingFace-style ``config.json`` mapping.

    Raises ``BadInput`` naming the missing or invalid field (in ``ModelConfig`` terms) for a config that cannot
    describe a decoder-only transformer.
    """
    if not isinstance(raw, Mapping):
        raise BadInput("config.json must be a JSON object", field="config")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if _get(raw, key) is None:
            raise BadInput(f"config.json has no {' / '.join(_ALIASES[key])}", field=key)
    heads = int(_get(raw, "num_attention_heads"))
    hidden = int(_get(raw, "hidden_size"))
    n_experts = _get(raw, "num_routed_experts")
    kv_lora = _get(raw, "kv_lora_rank")
    is_moe = n_experts is not None and int(n_experts) > 0
    is_mla = kv_lora is not None
    family = _family(raw, is_moe, is_mla)
    inter = _get(raw, "intermediate_size")
    moe_inter = _get(raw, "moe_intermediate_size")
    data: dict[str, Any] = {
        "name": name,
        "family": family,
        "hidden_size": hidden,
        "num_hidden_layers": _get(raw, "num_hidden_layers"),
        "num_attention_heads": heads,
        # MLA has no separate K/V heads: every head has its own (decompressed) K and V.
        "num_key_value_heads": heads if is_mla else (_get(raw, "num_key_value_heads") or heads),
        "head_dim": _get(raw, "head_dim") or (hidden // heads),
        "intermediate_size": inter if inter is not None else moe_inter,
        "vocab_size": _get(raw, "vocab_size"),
        "tie_word_embeddings": bool(_get(raw, "tie_word_embeddings") or False),
    }
    if _get(raw, "max_position_embeddings") is not None:
        data["max_position_embeddings"] = _get(raw, "max_position_embeddings")
    if is_mla:
        data["mla"] = {k: _get(raw, k) for k in
                       ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
        if data["mla"]["v_head_dim"] is not None:
            data["head_dim"] = data["mla"]["v_head_dim"]
    if is_moe:
        moe: dict[str, Any] = {
            "num_routed_experts": n_experts,
            "num_activated_experts": _get(raw, "num_activated_experts"),
            "moe_intermediate_size": moe_inter if moe_inter is not None else inter,
        }
        for k in ("num_shared_experts", "first_k_dense_replace", "moe_layer_freq", "n_group", "topk_group",
                  "score_func"):
            v = _get(raw, k)
            if v is not None:
                moe[k] = v
        if moe.get("n_group") == 1 and moe.get("topk_group") == 1:
            moe.pop("n_group")  # one group = no group limit
            moe.pop("topk_group")
        data["moe"] = moe
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        field, msg = first_validation_error(exc)
        raise BadInput(f"{field}: {msg}" if field else msg, field=field or None) from None
