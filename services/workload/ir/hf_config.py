"""Reader of HuggingFace ``config.json`` files: one function per ``model_type``, following that family's modelling code
in transformers (which layers are MoE, which attend to a window, where the biases and norms are).

Supported ``model_type`` (``SUPPORTED``): llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2,
deepseek_v3, olmoe, phimoe, gpt_oss, dbrx, jamba, llama4 (its ``text_config``), llama4_text, granitemoe. A config
without ``model_type`` is identified by its ``architectures``. Anything else is refused with the list, unless the
caller opts into the **generic** mapping (``generic=True``; CLI ``--generic``; ``"generic": true`` in
``POST /v1/models``), which reads LLaMA/Mixtral/DeepSeek key names and their aliases (DeepSeek's inference-config
short names ``dim``, ``n_layers``, ``inter_dim``...) and assumes full attention, an all-dense or all-MoE stack after
``first_k_dense_replace`` layers, and no biases.

Validation names the config.json key (``num_experts_per_tok``, ``ffn_config.moe_top_k``,
``text_config.num_local_experts``) and the problem: its type (an integer is an integer: ``2048.7``, ``"abc"`` and
``true`` are refused, ``2048.0`` is 2048; a flag is a JSON boolean: ``"false"`` is refused), its sign, top-k ≤
experts, heads divisible by KV heads, layer patterns within the layer count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from services.workload.ir.model_config import Mixer, Mlp, ModelConfig
from shared.errors import BadInput, first_validation_error
from shared.limits import MAX_DIM, MAX_EXPERTS, MAX_LAYERS, MAX_POSITIONS

_MISSING: Any = object()

ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "OlmoeForCausalLM": "olmoe", "PhimoeForCausalLM": "phimoe",
    "GptOssForCausalLM": "gpt_oss", "DbrxForCausalLM": "dbrx", "JambaForCausalLM": "jamba",
    "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4_text",
    "GraniteMoeForCausalLM": "granitemoe",
}


class Raw:
    """Typed access to one (possibly nested) config.json object; errors name the key with its path."""

    def __init__(self, raw: Mapping[str, Any], prefix: str = "") -> None:
        self.raw, self.prefix = raw, prefix

    def key(self, k: str) -> str:
        return f"{self.prefix}{k}"

    def has(self, k: str) -> bool:
        return self.raw.get(k) is not None

    def bad(self, k: str, problem: str) -> BadInput:
        return BadInput(f"config.json {self.key(k)}: {problem}", field=self.key(k))

    def sub(self, k: str) -> Raw:
        v = self.raw.get(k)
        if v is None:
            return Raw({}, f"{self.key(k)}.")
        if not isinstance(v, Mapping):
            raise self.bad(k, f"must be a JSON object, got {_show(v)}")
        return Raw(v, f"{self.key(k)}.")

    def integer(self, k: str, default: Any = _MISSING, *, ge: int = 1, le: int = MAX_DIM) -> int:
        v = self.raw.get(k)
        if v is None:
            if default is _MISSING:
                raise self.bad(k, "is required")
            return int(default)
        return self._as_int(k, v, ge=ge, le=le)

    def opt_int(self, k: str, *, ge: int = 1, le: int = MAX_DIM) -> int | None:
        return self.integer(k, None, ge=ge, le=le) if self.has(k) else None

    def _as_int(self, k: str, v: Any, *, ge: int, le: int, what: str = "") -> int:
        name = what or "must be an integer"
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.bad(k, f"{name}, got {_show(v)}")
        if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
            raise self.bad(k, f"{name}, got {v!r}")
        n = int(v)
        if n < ge:
            raise self.bad(k, f"must be >= {ge}, got {n}")
        if n > le:
            raise self.bad(k, f"must be <= {le}, got {n}")
        return n

    def flag(self, k: str, default: bool) -> bool:
        v = self.raw.get(k)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.bad(k, f"must be true or false, got {_show(v)}")
        return v

    def text(self, k: str, default: str | None = None) -> str | None:
        v = self.raw.get(k)
        if v is None:
            return default
        if not isinstance(v, str):
            raise self.bad(k, f"must be a string, got {_show(v)}")
        return v

    def int_list(self, k: str, *, ge: int = 0, le: int = MAX_LAYERS) -> list[int] | None:
        v = self.raw.get(k)
        if v is None:
            return None
        if not isinstance(v, list):
            raise self.bad(k, f"must be a list of integers, got {_show(v)}")
        if len(v) > MAX_LAYERS:  # a per-layer list: at most one entry per layer
            raise self.bad(k, f"lists {len(v)} entries; at most {MAX_LAYERS}")
        return [self._as_int(k, x, ge=ge, le=le, what="must be a list of integers") for x in v]

    def str_list(self, k: str) -> list[str] | None:
        v = self.raw.get(k)
        if v is None:
            return None
        if isinstance(v, list) and len(v) > MAX_LAYERS:
            raise self.bad(k, f"lists {len(v)} entries; at most {MAX_LAYERS}")
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.bad(k, f"must be a list of strings, got {_show(v)}")
        return list(v)


def _show(v: Any) -> str:
    s = repr(v) if isinstance(v, str) else type(v).__name__ if isinstance(v, (list, dict)) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


# --- common pieces ---------------------------------------------------------------------------------------------
def _base(r: Raw, family: str, name: str, *, heads_key: str = "num_attention_heads",
          kv_key: str | None = "num_key_value_heads", hidden_key: str = "hidden_size",
          layers_key: str = "num_hidden_layers", positions_key: str = "max_position_embeddings") -> dict[str, Any]:
    hidden = r.integer(hidden_key)
    layers = r.integer(layers_key, le=MAX_LAYERS)
    heads = r.integer(heads_key)
    kv = r.integer(kv_key, heads) if kv_key else heads
    if heads % kv:
        raise r.bad(kv_key or heads_key, f"{heads_key} ({heads}) must be a multiple of {kv_key} ({kv})")
    if r.has("head_dim"):
        head_dim = r.integer("head_dim")
    else:
        if hidden % heads:
            raise r.bad(heads_key, f"{hidden_key} ({hidden}) must be a multiple of {heads_key} ({heads}) when "
                                   "head_dim is not given")
        head_dim = hidden // heads
    data: dict[str, Any] = {
        "name": name, "family": family, "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
        "vocab_size": r.integer("vocab_size"), "tie_word_embeddings": r.flag("tie_word_embeddings", False),
    }
    if r.has(positions_key):
        data["max_position_embeddings"] = r.integer(positions_key, le=MAX_POSITIONS)
    return data


def _topk(r: Raw, experts: int, k_key: str = "num_experts_per_tok", experts_key: str = "num_local_experts",
          default: int | None = None) -> int:
    k = r.integer(k_key, default if default is not None else _MISSING, le=MAX_EXPERTS)
    if k > experts:
        raise r.bad(k_key, f"must be <= {r.key(experts_key)} ({experts}), got {k}")
    return k


def _moe(experts: int, k: int, inter: int, **extra: Any) -> dict[str, Any]:
    return {"num_routed_experts": experts, "num_activated_experts": k, "moe_intermediate_size": inter, **extra}


def _layer_types(r: Raw, n: int, default: Callable[[int], Mixer]) -> tuple[Mixer, ...]:
    """``layer_types`` (transformers ≥ 4.53: ``full_attention`` / ``sliding_attention`` / ``chunked_attention``)
    when the config has it, else ``default(i)``."""
    given = r.str_list("layer_types")
    if given is None:
        return tuple(default(i) for i in range(n))
    if len(given) != n:
        raise r.bad("layer_types", f"lists {len(given)} layers, {r.key('num_hidden_layers')} is {n}")
    allowed = ("full_attention", "sliding_attention", "chunked_attention")
    for i, t in enumerate(given):
        if t not in allowed:
            raise r.bad("layer_types", f"entry {i} is {t!r}; expected one of {', '.join(allowed)}")
    return tuple(t for t in given if t in allowed)  # type: ignore[misc]


def _step(r: Raw, k: str, n: int, default: int = 1) -> int:
    """A layer step or period (``decoder_sparse_step``, ``interleave_moe_layer_step``, ``moe_layer_freq``): >= 1 and
    at most the layer count (a larger step selects no layer: the model would silently lose its MoE layers)."""
    step = r.integer(k, default, le=MAX_LAYERS)
    if step > n:
        raise r.bad(k, f"must be <= {r.key('num_hidden_layers')} ({n}), got {step}")
    return step


def _check_layers(r: Raw, k: str, layers: Sequence[int], n: int) -> None:
    for x in layers:
        if x >= n:
            raise r.bad(k, f"layer {x} is outside the {n} layers (0..{n - 1})")


def _sliding(r: Raw, data: dict[str, Any], *, flag_key: str | None = None) -> int | None:
    """``sliding_window`` when it applies (``use_sliding_window`` true where the family has that switch)."""
    if flag_key is not None and not r.flag(flag_key, False):
        return None
    w = r.opt_int("sliding_window", le=MAX_POSITIONS)
    if w is not None:
        data["sliding_window"] = w
    return w


# --- families --------------------------------------------------------------------------------------------------
def _llama(r: Raw, name: str, family: str = "llama") -> dict[str, Any]:
    data = _base(r, family, name)
    data["intermediate_size"] = r.integer("intermediate_size")
    bias = r.flag("attention_bias", False)
    data.update(attention_bias=bias, o_proj_bias=bias, mlp_bias=r.flag("mlp_bias", False))
    return data


def _mistral(r: Raw, name: str) -> dict[str, Any]:
    data = _base(r, "mistral", name)
    data["intermediate_size"] = r.integer("intermediate_size")
    w = _sliding(r, data)
    n = data["num_hidden_layers"]
    data["mixers"] = _layer_types(r, n, lambda i: "sliding_attention" if w else "full_attention")
    return data


def _mixtral(r: Raw, name: str) -> dict[str, Any]:
    data = _mistral(r, name)
    data["family"] = "mixtral"
    experts = r.integer("num_local_experts", le=MAX_EXPERTS)
    data["moe"] = _moe(experts, _topk(r, experts), data["intermediate_size"])
    data["mlps"] = ("moe",) * data["num_hidden_layers"]
    return data


def _qwen_mixers(r: Raw, data: dict[str, Any]) -> None:
    """Qwen2/3: sliding attention (when ``use_sliding_window``) on layers ``>= max_window_layers``."""
    n = data["num_hidden_layers"]
    w = _sliding(r, data, flag_key="use_sliding_window")
    first = r.integer("max_window_layers", n, ge=0, le=MAX_LAYERS)
    data["mixers"] = _layer_types(r, n, lambda i: "sliding_attention" if w and i >= first else "full_attention")
    if "sliding_attention" in data["mixers"] and "sliding_window" not in data:
        data["sliding_window"] = r.integer("sliding_window", le=MAX_POSITIONS)


def _experts_key(r: Raw) -> str:
    """Qwen-MoE/OLMoE checkpoints say ``num_experts``; configs saved by transformers ≥ 5 say ``num_local_experts``."""
    return "num_local_experts" if r.has("num_local_experts") and not r.has("num_experts") else "num_experts"


def _qwen_moe_mlps(r: Raw, n: int, experts: int) -> tuple[Mlp, ...]:
    """Qwen2-MoE/Qwen3-MoE: layer i is MoE iff i ∉ mlp_only_layers, experts > 0 and (i+1) % decoder_sparse_step = 0."""
    step = _step(r, "decoder_sparse_step", n)
    only = set(r.int_list("mlp_only_layers") or [])
    _check_layers(r, "mlp_only_layers", sorted(only), n)
    return tuple("moe" if (i not in only and experts > 0 and (i + 1) % step == 0) else "dense" for i in range(n))


def _qwen2(r: Raw, name: str, family: str = "qwen2") -> dict[str, Any]:
    data = _base(r, family, name)
    data["intermediate_size"] = r.integer("intermediate_size")
    data["attention_bias"] = r.flag("qkv_bias", True)  # q/k/v carry biases, o_proj does not
    _qwen_mixers(r, data)
    return data


def _qwen_moe(r: Raw, data: dict[str, Any], *, shared: bool) -> dict[str, Any]:
    """A Qwen2/3 dense config plus its MoE layers (``_qwen_moe_mlps``); Qwen2-MoE adds a gated shared expert."""
    n = data["num_hidden_layers"]
    ek = _experts_key(r)
    # required: transformers' default is a MoE (60/128 experts), so a missing count must not make a dense model;
    # an explicit 0 is transformers' all-dense switch
    experts = r.integer(ek, ge=0, le=MAX_EXPERTS)
    data["mlps"] = mlps = _qwen_moe_mlps(r, n, experts)
    if "moe" in mlps:
        extra: dict[str, Any] = {}
        if shared:  # required too: transformers' default is 5632, not "no shared expert"
            extra = {"shared_intermediate_size": r.integer("shared_expert_intermediate_size", ge=0),
                     "shared_expert_gate": True}
        data["moe"] = _moe(experts, _topk(r, experts, experts_key=ek), r.integer("moe_intermediate_size"), **extra)
    return data


def _qwen3(r: Raw, name: str, family: str = "qwen3") -> dict[str, Any]:
    data = _base(r, family, name)
    data["intermediate_size"] = r.integer("intermediate_size")
    bias = r.flag("attention_bias", False)
    data.update(attention_bias=bias, o_proj_bias=bias, qk_norm="head")
    _qwen_mixers(r, data)
    return data


def _deepseek(r: Raw, name: str, family: str) -> dict[str, Any]:
    data = _base(r, family, name, kv_key=None)  # MLA: every head has its own (decompressed) K and V
    n = data["num_hidden_layers"]
    data["intermediate_size"] = r.integer("intermediate_size")
    mla = {"q_lora_rank": r.opt_int("q_lora_rank"), "kv_lora_rank": r.integer("kv_lora_rank"),
           "qk_nope_head_dim": r.integer("qk_nope_head_dim"), "qk_rope_head_dim": r.integer("qk_rope_head_dim"),
           "v_head_dim": r.integer("v_head_dim")}
    data["mla"] = mla
    data["head_dim"] = mla["v_head_dim"]
    bias = r.flag("attention_bias", False)
    data.update(attention_bias=bias, o_proj_bias=bias)
    data["mixers"] = ("mla",) * n
    # DeepSeek-V2: no n_routed_experts (null) is transformers' dense model; V3 always has routed experts
    experts = r.integer("n_routed_experts", 0 if family == "deepseek_v2" else _MISSING, ge=0, le=MAX_EXPERTS)
    first = r.integer("first_k_dense_replace", 0, ge=0, le=MAX_LAYERS)
    if first > n:
        raise r.bad("first_k_dense_replace", f"must be <= num_hidden_layers ({n}), got {first}")
    freq = _step(r, "moe_layer_freq", n)
    if family == "deepseek_v3":  # transformers' DeepseekV3: every layer from first_k_dense_replace on
        mlps: tuple[Mlp, ...] = tuple("moe" if experts and i >= first else "dense" for i in range(n))
    else:  # DeepseekV2: i >= first_k_dense_replace and i % moe_layer_freq == 0
        mlps = tuple("moe" if experts and i >= first and i % freq == 0 else "dense" for i in range(n))
    data["mlps"] = mlps
    if "moe" in mlps:
        k = _topk(r, experts, experts_key="n_routed_experts")
        moe = _moe(experts, k, r.integer("moe_intermediate_size"),
                   num_shared_experts=r.integer("n_shared_experts", 0, ge=0, le=MAX_EXPERTS),
                   score_func=r.text("scoring_func", "softmax"),
                   first_k_dense_replace=first)
        if moe["score_func"] not in ("softmax", "sigmoid"):
            raise r.bad("scoring_func", f"must be softmax or sigmoid, got {moe['score_func']!r}")
        method = r.text("topk_method", "group_limited_greedy" if family == "deepseek_v2" else "noaux_tc")
        methods = ("greedy", "group_limited_greedy", "noaux_tc")
        if method not in methods:
            raise r.bad("topk_method", f"must be one of {', '.join(methods)}, got {method!r}")
        n_group, topk_group = r.opt_int("n_group"), r.opt_int("topk_group")
        if method != "greedy" and n_group and topk_group and n_group > 1:
            if experts % n_group:
                raise r.bad("n_group", f"must divide n_routed_experts ({experts}), got {n_group}")
            if topk_group > n_group:
                raise r.bad("topk_group", f"must be <= n_group ({n_group}), got {topk_group}")
            if k > topk_group * (experts // n_group):
                raise r.bad("num_experts_per_tok", f"({k}) exceeds the {topk_group * (experts // n_group)} "
                                                   f"experts of topk_group ({topk_group}) groups")
            moe.update(n_group=n_group, topk_group=topk_group)
        data["moe"] = moe
    return data


def _olmoe(r: Raw, name: str) -> dict[str, Any]:
    data = _base(r, "olmoe", name)
    data["intermediate_size"] = inter = r.integer("intermediate_size")
    bias = r.flag("attention_bias", False)
    data.update(attention_bias=bias, o_proj_bias=bias, qk_norm="full")
    ek = _experts_key(r)
    experts = r.integer(ek, le=MAX_EXPERTS)
    data["moe"] = _moe(experts, _topk(r, experts, experts_key=ek), inter)
    data["mlps"] = ("moe",) * data["num_hidden_layers"]
    return data


def _phimoe(r: Raw, name: str) -> dict[str, Any]:
    data = _mistral(r, name)
    data["family"] = "phimoe"
    bias = r.flag("attention_bias", False)
    data.update(attention_bias=bias, o_proj_bias=bias, norm="layernorm",
                lm_head_bias=r.flag("lm_head_bias", False))
    experts = r.integer("num_local_experts", le=MAX_EXPERTS)
    data["moe"] = _moe(experts, _topk(r, experts), data["intermediate_size"])
    data["mlps"] = ("moe",) * data["num_hidden_layers"]
    return data


def _gpt_oss(r: Raw, name: str) -> dict[str, Any]:
    data = _base(r, "gpt_oss", name)
    n = data["num_hidden_layers"]
    data["intermediate_size"] = inter = r.integer("intermediate_size")
    bias = r.flag("attention_bias", True)
    data.update(attention_bias=bias, o_proj_bias=bias, attention_sinks=True)
    w = _sliding(r, data)
    data["mixers"] = _layer_types(r, n, lambda i: "sliding_attention" if w and i % 2 == 0 else "full_attention")
    if "sliding_attention" in data["mixers"] and w is None:
        raise r.bad("sliding_window", "is required: layer_types has sliding_attention layers")
    experts = r.integer("num_local_experts", le=MAX_EXPERTS)
    k_key = "num_experts_per_tok" if r.has("num_experts_per_tok") else "experts_per_token"
    data["moe"] = _moe(experts, _topk(r, experts, k_key=k_key), inter, router_bias=True, expert_bias=True)
    data["mlps"] = ("moe",) * n
    return data


def _dbrx(r: Raw, name: str) -> dict[str, Any]:
    data = _base(r, "dbrx", name, heads_key="n_heads", kv_key=None, hidden_key="d_model", layers_key="n_layers",
                 positions_key="max_seq_len")
    attn, ffn = r.sub("attn_config"), r.sub("ffn_config")
    heads = data["num_attention_heads"]
    kv = attn.integer("kv_n_heads", 1)
    if heads % kv:
        raise attn.bad("kv_n_heads", f"n_heads ({heads}) must be a multiple of kv_n_heads ({kv})")
    data["num_key_value_heads"] = kv
    data["intermediate_size"] = inter = ffn.integer("ffn_hidden_size")
    experts = ffn.integer("moe_num_experts", le=MAX_EXPERTS)
    data["moe"] = _moe(experts, _topk(ffn, experts, k_key="moe_top_k", experts_key="moe_num_experts"), inter)
    data["mlps"] = ("moe",) * data["num_hidden_layers"]
    data["norm"] = "layernorm_nobias"
    return data


def _jamba(r: Raw, name: str) -> dict[str, Any]:
    data = _base(r, "jamba", name)
    n = data["num_hidden_layers"]
    data["intermediate_size"] = inter = r.integer("intermediate_size")
    a_period, a_offset = r.integer("attn_layer_period", 8, le=MAX_LAYERS), r.integer("attn_layer_offset", 4, ge=0)
    e_period, e_offset = r.integer("expert_layer_period", 2, le=MAX_LAYERS), r.integer("expert_layer_offset", 1, ge=0)
    if a_offset >= a_period:
        raise r.bad("attn_layer_offset", f"must be < attn_layer_period ({a_period}), got {a_offset}")
    if e_offset >= e_period:
        raise r.bad("expert_layer_offset", f"must be < expert_layer_period ({e_period}), got {e_offset}")
    _check_layers(r, "attn_layer_offset", [a_offset], n)  # an offset past the last layer selects none
    _check_layers(r, "expert_layer_offset", [e_offset], n)
    data["mixers"] = tuple("full_attention" if i % a_period == a_offset else "mamba" for i in range(n))
    experts = r.integer("num_experts", 16, le=MAX_EXPERTS)
    # transformers' Jamba: an expert layer with one expert is a plain MLP
    data["mlps"] = tuple("moe" if experts > 1 and i % e_period == e_offset else "dense" for i in range(n))
    if "moe" in data["mlps"]:
        data["moe"] = _moe(experts, _topk(r, experts, experts_key="num_experts", default=2), inter)
    h = data["hidden_size"]
    dt = r.raw.get("mamba_dt_rank", "auto")
    dt_rank = math.ceil(h / 16) if dt == "auto" else r.integer("mamba_dt_rank")
    if "mamba" in data["mixers"]:
        data["mamba"] = {"d_inner": r.integer("mamba_expand", 2) * h, "d_state": r.integer("mamba_d_state", 16),
                         "d_conv": r.integer("mamba_d_conv", 4), "dt_rank": dt_rank,
                         "conv_bias": r.flag("mamba_conv_bias", True), "proj_bias": r.flag("mamba_proj_bias", False),
                         "inner_norms": True}
    return data


def _llama4(r: Raw, name: str) -> dict[str, Any]:
    if r.has("text_config"):  # the checkpoint's multimodal config: the language model is its text_config
        r = r.sub("text_config")
    data = _base(r, "llama4", name)
    n = data["num_hidden_layers"]
    inter = r.integer("intermediate_size")
    data["intermediate_size"] = r.integer("intermediate_size_mlp")
    bias = r.flag("attention_bias", False)
    data.update(attention_bias=bias, o_proj_bias=bias)
    step = _step(r, "interleave_moe_layer_step", n)
    moe_layers = r.int_list("moe_layers")
    if moe_layers is None:
        moe_layers = list(range(step - 1, n, step))
    _check_layers(r, "moe_layers", moe_layers, n)
    moe_set = set(moe_layers)
    data["mlps"] = tuple("moe" if i in moe_set else "dense" for i in range(n))
    experts = r.integer("num_local_experts", le=MAX_EXPERTS)
    if "moe" in data["mlps"]:
        data["moe"] = _moe(experts, _topk(r, experts), inter, shared_intermediate_size=inter)
    chunk = r.opt_int("attention_chunk_size", le=MAX_POSITIONS)
    if chunk is not None:
        data["attention_chunk_size"] = chunk
    rope = r.int_list("no_rope_layers", ge=0, le=1)  # 1: the layer uses RoPE (and chunked attention)
    if not rope:  # missing or [] (the hub's Llama-4 configs): transformers' default, every interval-th layer NoPE
        interval = r.integer("no_rope_layer_interval", 4, le=MAX_LAYERS)
        rope = [int((i + 1) % interval != 0) for i in range(n)]
    if len(rope) != n:
        raise r.bad("no_rope_layers", f"lists {len(rope)} layers, num_hidden_layers is {n}")
    data["mixers"] = _layer_types(
        r, n, lambda i: "chunked_attention" if chunk and rope[i] else "full_attention")
    if "chunked_attention" in data["mixers"] and chunk is None:
        raise r.bad("attention_chunk_size", "is required: layer_types has chunked_attention layers")
    return data


def _granitemoe(r: Raw, name: str) -> dict[str, Any]:
    data = _base(r, "granitemoe", name)
    data["intermediate_size"] = inter = r.integer("intermediate_size")
    bias = r.flag("attention_bias", False)
    data.update(attention_bias=bias, o_proj_bias=bias)
    experts = r.integer("num_local_experts", le=MAX_EXPERTS)
    data["moe"] = _moe(experts, _topk(r, experts), inter)
    data["mlps"] = ("moe",) * data["num_hidden_layers"]
    return data


FAMILIES: dict[str, Callable[[Raw, str], dict[str, Any]]] = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2,
    "qwen2_moe": lambda r, n: _qwen_moe(r, _qwen2(r, n, "qwen2_moe"), shared=True),
    "qwen3": _qwen3, "qwen3_moe": lambda r, n: _qwen_moe(r, _qwen3(r, n, "qwen3_moe"), shared=False),
    "deepseek_v2": lambda r, n: _deepseek(r, n, "deepseek_v2"),
    "deepseek_v3": lambda r, n: _deepseek(r, n, "deepseek_v3"),
    "olmoe": _olmoe, "phimoe": _phimoe, "gpt_oss": _gpt_oss, "dbrx": _dbrx, "jamba": _jamba,
    "llama4": _llama4, "llama4_text": _llama4, "granitemoe": _granitemoe,
}
SUPPORTED: tuple[str, ...] = tuple(FAMILIES)


# --- the generic mapping (opt-in) ------------------------------------------------------------------------------
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
_INT_KEYS = frozenset(_ALIASES) - {"tie_word_embeddings", "score_func"}


def _alias(r: Raw, key: str, *, ge: int = 1) -> Any:
    """The value of the first alias of ``key`` present (typed: integers checked), None if absent."""
    for alias in _ALIASES[key]:
        if r.has(alias):
            if key == "tie_word_embeddings":
                return r.flag(alias, False)
            if key == "score_func":
                return r.text(alias)
            return r.integer(alias, ge=ge, le=MAX_POSITIONS if key == "max_position_embeddings" else MAX_DIM)
    return None


def _key(r: Raw, key: str) -> str:
    """The config.json key that gives ``key`` (the first alias present; the HF name when none is)."""
    return next((a for a in _ALIASES[key] if r.has(a)), _ALIASES[key][0])


def _generic(r: Raw, name: str) -> dict[str, Any]:
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if _alias(r, key) is None:
            raise BadInput(f"config.json has no {' / '.join(_ALIASES[key])}", field=_ALIASES[key][0])
    heads, hidden = _alias(r, "num_attention_heads"), _alias(r, "hidden_size")
    n = _alias(r, "num_hidden_layers")
    if n > MAX_LAYERS:
        raise r.bad(_key(r, "num_hidden_layers"), f"must be <= {MAX_LAYERS}, got {n}")
    kv = _alias(r, "num_key_value_heads")
    if kv is not None and heads % kv and _alias(r, "kv_lora_rank") is None:
        raise r.bad(_key(r, "num_key_value_heads"), f"{_key(r, 'num_attention_heads')} ({heads}) must be a "
                                                    f"multiple of {_key(r, 'num_key_value_heads')} ({kv})")
    if _alias(r, "head_dim") is None and _alias(r, "kv_lora_rank") is None and hidden % heads:
        raise r.bad(_key(r, "num_attention_heads"), f"{_key(r, 'hidden_size')} ({hidden}) must be a multiple of "
                                                    f"{_key(r, 'num_attention_heads')} ({heads}) when head_dim is "
                                                    "not given")
    n_experts = _alias(r, "num_routed_experts", ge=0)
    is_moe = bool(n_experts)
    is_mla = _alias(r, "kv_lora_rank") is not None
    inter, moe_inter = _alias(r, "intermediate_size"), _alias(r, "moe_intermediate_size")
    data: dict[str, Any] = {
        "name": name, "family": "generic", "hidden_size": hidden,
        "num_hidden_layers": _alias(r, "num_hidden_layers"), "num_attention_heads": heads,
        "num_key_value_heads": heads if is_mla else (_alias(r, "num_key_value_heads") or heads),
        "head_dim": _alias(r, "head_dim") or (hidden // heads),
        "intermediate_size": inter if inter is not None else moe_inter,
        "vocab_size": _alias(r, "vocab_size"), "tie_word_embeddings": bool(_alias(r, "tie_word_embeddings")),
    }
    if data["intermediate_size"] is None:
        raise BadInput("config.json has no " + " / ".join(_ALIASES["intermediate_size"]), field="intermediate_size")
    if _alias(r, "max_position_embeddings") is not None:
        data["max_position_embeddings"] = _alias(r, "max_position_embeddings")
    if is_mla:
        for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):  # MLA needs them all (q_lora_rank: optional)
            if _alias(r, k) is None:
                raise r.bad(k, "is required: the config has kv_lora_rank (multi-head latent attention)")
        data["mla"] = {k: _alias(r, k) for k in
                       ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
        if data["mla"]["v_head_dim"] is not None:
            data["head_dim"] = data["mla"]["v_head_dim"]
    if is_moe:
        if _alias(r, "num_activated_experts") is None:
            raise BadInput("config.json has no " + " / ".join(_ALIASES["num_activated_experts"]) + " (experts per "
                           "token)", field="num_experts_per_tok")
        k_key = next(a for a in _ALIASES["num_activated_experts"] if r.has(a))
        if _alias(r, "num_activated_experts") > n_experts:
            raise r.bad(k_key, f"must be <= the {n_experts} routed experts, got {_alias(r, 'num_activated_experts')}")
        moe: dict[str, Any] = {
            "num_routed_experts": n_experts,
            "num_activated_experts": _alias(r, "num_activated_experts"),
            "moe_intermediate_size": moe_inter if moe_inter is not None else inter,
        }
        for k in ("num_shared_experts", "first_k_dense_replace", "n_group", "topk_group", "moe_layer_freq"):
            v = _alias(r, k, ge=0 if k in ("num_shared_experts", "first_k_dense_replace") else 1)
            if v is not None:
                moe[k] = v
        if _alias(r, "score_func") is not None:
            moe["score_func"] = _alias(r, "score_func")
            if moe["score_func"] not in ("softmax", "sigmoid"):
                raise r.bad(_key(r, "score_func"), f"must be softmax or sigmoid, got {moe['score_func']!r}")
        if moe.get("first_k_dense_replace", 0) > n:
            raise r.bad(_key(r, "first_k_dense_replace"), f"must be <= {_key(r, 'num_hidden_layers')} ({n}), got "
                                                          f"{moe['first_k_dense_replace']}")
        if moe.get("moe_layer_freq", 1) > n:
            raise r.bad(_key(r, "moe_layer_freq"), f"must be <= {_key(r, 'num_hidden_layers')} ({n}), got "
                                                   f"{moe['moe_layer_freq']}")
        if moe.get("n_group") == 1 and moe.get("topk_group") == 1:
            moe.pop("n_group")  # one group = no group limit
            moe.pop("topk_group")
        if ("n_group" in moe) != ("topk_group" in moe):
            given, other = ("n_group", "topk_group") if "n_group" in moe else ("topk_group", "n_group")
            raise r.bad(_key(r, other), f"is required with {_key(r, given)} (group-limited routing)")
        if "n_group" in moe:
            g, tg = moe["n_group"], moe["topk_group"]
            if n_experts % g:
                raise r.bad(_key(r, "n_group"), f"must divide the {n_experts} routed experts, got {g}")
            if tg > g:
                raise r.bad(_key(r, "topk_group"), f"must be <= {_key(r, 'n_group')} ({g}), got {tg}")
        data["moe"] = moe
    return data


# --- entry point -----------------------------------------------------------------------------------------------
def model_type_of(raw: Mapping[str, Any]) -> str | None:
    """The config's ``model_type``, or the one its ``architectures`` names; None when neither says."""
    mt = raw.get("model_type")
    if isinstance(mt, str) and mt:
        return mt
    archs = raw.get("architectures")
    if isinstance(archs, list):
        for a in archs:
            if isinstance(a, str) and a in ARCHITECTURES:
                return ARCHITECTURES[a]
    return None


def from_hf_config(raw: Mapping[str, Any], *, name: str, generic: bool = False) -> ModelConfig:
    """Build a ``ModelConfig`` from a HuggingFace ``config.json`` mapping (see the module docstring).

    Raises ``BadInput`` naming the config.json key for an invalid config, and listing the supported model types
    for an unknown one (unless ``generic``).
    """
    if not isinstance(raw, Mapping):
        raise BadInput("config.json must be a JSON object", field="config")
    r = Raw(raw)
    if raw.get("model_type") is not None and not isinstance(raw.get("model_type"), str):
        raise r.bad("model_type", f"must be a string, got {_show(raw['model_type'])}")
    mt = model_type_of(raw)
    if generic and (mt is None or mt not in FAMILIES):
        data = _generic(r, name)
    elif mt is None:
        raise BadInput("config.json has no model_type (nor an architectures entry naming a supported model); "
                       f"supported: {', '.join(SUPPORTED)}; or register it with the generic mapping "
                       "(generic: true / --generic)", field="model_type")
    elif mt not in FAMILIES:
        raise BadInput(f"config.json model_type {mt!r} is not supported; supported: {', '.join(SUPPORTED)}; or "
                       "register it with the generic mapping (generic: true / --generic)", field="model_type")
    else:
        data = FAMILIES[mt](r, name)
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        field, msg = first_validation_error(exc)
        raise BadInput(f"config.json: {field}: {msg}" if field else f"config.json: {msg}",
                       field=field or None) from None
