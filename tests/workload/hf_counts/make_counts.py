"""Exact parameter counts of published checkpoints, computed by transformers itself (issue 18, item 2).

For every model below: its config.json is made by the transformers configuration class with the checkpoint's
architecture values (the HF repo id is the comment beside each) and written to ``tests/fixtures/hf_models/<name>.json``
as ``save_pretrained`` writes it; the CausalLM is built on the **meta** device (no weights, no memory) and counted:

- ``total``: ``sum(p.numel() for p in model.parameters())`` (tied tensors once; buffers such as DeepSeek-V3's
  ``e_score_correction_bias`` or rotary tables are not parameters and are not counted);
- ``active``: ``total`` minus, on every MoE layer, the routed experts' parameters times ``(1 − k/E)``. Routed-expert
  parameters are those whose name is under the layer's routed-expert module: ``*.experts.*`` (Mixtral, PhiMoE,
  Qwen2/3-MoE, DeepSeek, OLMoE, gpt-oss, Jamba, Llama-4, DBRX's ``ffn.experts``) and GraniteMoE's
  ``block_sparse_moe.input_linear`` / ``output_linear``; never the router/gate, the shared experts
  (``shared_expert(s)``) or Qwen2-MoE's ``shared_expert_gate``;
- ``breakdown``: per layer, the parameters under each submodule (first two name components after the layer index).

The counts are committed (``tests/fixtures/hf_models/counts.json``) and ``tests/workload/test_hf_counts.py`` checks
our transformers-free counter against them. transformers and torch are NOT dependencies of the project. To make them
again (a venv outside the repository; torch's CPU wheel first, pinned, so pip does not fetch a CUDA build):

    python3 -m venv /work/hfvenv
    /work/hfvenv/bin/pip install torch==2.13.0
    /work/hfvenv/bin/pip install transformers          # 5.24.0 made the committed counts
    /work/hfvenv/bin/python tests/workload/hf_counts/make_counts.py
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers as tf

OUT = Path(__file__).resolve().parents[2] / "fixtures" / "hf_models"

ROUTED = re.compile(r"\.experts\.|\.experts$|block_sparse_moe\.(input|output)_linear\.")
SHARED = re.compile(r"shared_expert")


def models() -> dict[str, tuple[str, Any]]:
    """name -> (HF checkpoint, configuration)."""
    m: dict[str, tuple[str, Any]] = {}
    m["llama-3.1-8b"] = ("meta-llama/Llama-3.1-8B", tf.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False))
    m["mistral-7b-v0.1"] = ("mistralai/Mistral-7B-v0.1", tf.MistralConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768, sliding_window=4096))
    m["mixtral-8x7b"] = ("mistralai/Mixtral-8x7B-v0.1", tf.MixtralConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768, num_local_experts=8,
        num_experts_per_tok=2, rope_theta=1e6, sliding_window=None))
    m["mixtral-8x22b"] = ("mistralai/Mixtral-8x22B-v0.1", tf.MixtralConfig(
        hidden_size=6144, intermediate_size=16384, num_hidden_layers=56, num_attention_heads=48,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=65536, num_local_experts=8,
        num_experts_per_tok=2, rope_theta=1e6, sliding_window=None))
    m["qwen2-7b"] = ("Qwen/Qwen2-7B", tf.Qwen2Config(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, max_position_embeddings=131072, rope_theta=1e6,
        sliding_window=131072, use_sliding_window=False, max_window_layers=28, tie_word_embeddings=False))
    m["qwen1.5-moe-a2.7b"] = ("Qwen/Qwen1.5-MoE-A2.7B", tf.Qwen2MoeConfig(
        hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
        num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16, num_experts=60,
        num_experts_per_tok=4, vocab_size=151936, max_position_embeddings=8192, decoder_sparse_step=1,
        mlp_only_layers=[], tie_word_embeddings=False))
    m["qwen2-57b-a14b"] = ("Qwen/Qwen2-57B-A14B", tf.Qwen2MoeConfig(
        hidden_size=3584, intermediate_size=18944, moe_intermediate_size=2560, shared_expert_intermediate_size=20480,
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, num_experts=64, num_experts_per_tok=8,
        vocab_size=151936, max_position_embeddings=131072, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False))
    m["qwen3-8b"] = ("Qwen/Qwen3-8B", tf.Qwen3Config(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
        tie_word_embeddings=False))
    m["qwen3-30b-a3b"] = ("Qwen/Qwen3-30B-A3B", tf.Qwen3MoeConfig(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        vocab_size=151936, max_position_embeddings=40960, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False))
    m["qwen3-235b-a22b"] = ("Qwen/Qwen3-235B-A22B", tf.Qwen3MoeConfig(
        hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536, num_hidden_layers=94,
        num_attention_heads=64, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        vocab_size=151936, max_position_embeddings=40960, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False))
    m["deepseek-v2-lite"] = ("deepseek-ai/DeepSeek-V2-Lite", tf.DeepseekV2Config(
        hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27,
        num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64,
        num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=512, q_lora_rank=None,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=102400,
        max_position_embeddings=163840, topk_method="greedy", n_group=1, topk_group=1, tie_word_embeddings=False))
    m["deepseek-v2"] = ("deepseek-ai/DeepSeek-V2", tf.DeepseekV2Config(
        hidden_size=5120, intermediate_size=12288, moe_intermediate_size=1536, num_hidden_layers=60,
        num_attention_heads=128, num_key_value_heads=128, n_shared_experts=2, n_routed_experts=160,
        num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=512, q_lora_rank=1536,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=102400,
        max_position_embeddings=163840, topk_method="group_limited_greedy", n_group=8, topk_group=3,
        tie_word_embeddings=False))
    m["deepseek-v3"] = ("deepseek-ai/DeepSeek-V3", tf.DeepseekV3Config(
        hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
        num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
        num_experts_per_tok=8, first_k_dense_replace=3, kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280, max_position_embeddings=163840, n_group=8,
        topk_group=4, routed_scaling_factor=2.5, tie_word_embeddings=False))
    m["olmoe-1b-7b"] = ("allenai/OLMoE-1B-7B-0924", tf.OlmoeConfig(
        hidden_size=2048, intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, vocab_size=50304,
        max_position_embeddings=4096, tie_word_embeddings=False))
    m["phi-3.5-moe"] = ("microsoft/Phi-3.5-MoE-instruct", tf.PhimoeConfig(
        hidden_size=4096, intermediate_size=6400, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=16, num_experts_per_tok=2, vocab_size=32064,
        max_position_embeddings=131072, sliding_window=131072, attention_bias=True, lm_head_bias=True,
        tie_word_embeddings=False))
    layer_types_20b = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(24)]
    m["gpt-oss-20b"] = ("openai/gpt-oss-20b", tf.GptOssConfig(
        hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088,
        sliding_window=128, max_position_embeddings=131072, layer_types=layer_types_20b, attention_bias=True,
        tie_word_embeddings=False))
    layer_types_120b = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)]
    m["gpt-oss-120b"] = ("openai/gpt-oss-120b", tf.GptOssConfig(
        hidden_size=2880, intermediate_size=2880, num_hidden_layers=36, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, num_local_experts=128, num_experts_per_tok=4, vocab_size=201088,
        sliding_window=128, max_position_embeddings=131072, layer_types=layer_types_120b, attention_bias=True,
        tie_word_embeddings=False))
    m["dbrx-base"] = ("databricks/dbrx-base", tf.DbrxConfig(
        d_model=6144, n_heads=48, n_layers=40, max_seq_len=32768, vocab_size=100352,
        attn_config={"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
        ffn_config={"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4, "moe_jitter_eps": 0.0,
                    "moe_loss_weight": 0.05, "moe_normalize_expert_weights": 1.0}, tie_word_embeddings=False))
    m["jamba-v0.1"] = ("ai21labs/Jamba-v0.1", tf.JambaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_experts=16, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
        attn_layer_period=8, attn_layer_offset=4, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        mamba_dt_rank=256, mamba_conv_bias=True, mamba_proj_bias=False, vocab_size=65536,
        max_position_embeddings=262144, tie_word_embeddings=False))
    scout_text = dict(hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_hidden_layers=48,
                      num_attention_heads=40, num_key_value_heads=8, head_dim=128, vocab_size=202048,
                      num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=1,
                      attention_chunk_size=8192, max_position_embeddings=10485760, rope_theta=500000.0,
                      use_qk_norm=True, tie_word_embeddings=False)
    m["llama-4-scout-17b-16e"] = ("meta-llama/Llama-4-Scout-17B-16E", tf.Llama4Config(text_config=scout_text))
    maverick_text = {**scout_text, "num_local_experts": 128, "interleave_moe_layer_step": 2,
                     "max_position_embeddings": 1048576, "use_qk_norm": False}
    m["llama-4-maverick-17b-128e"] = ("meta-llama/Llama-4-Maverick-17B-128E",
                                      tf.Llama4Config(text_config=maverick_text))
    m["granite-3.0-1b-a400m"] = ("ibm-granite/granite-3.0-1b-a400m-base", tf.GraniteMoeConfig(
        hidden_size=1024, intermediate_size=512, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=8, vocab_size=49155,
        max_position_embeddings=4096, tie_word_embeddings=True))
    m["granite-3.0-3b-a800m"] = ("ibm-granite/granite-3.0-3b-a800m-base", tf.GraniteMoeConfig(
        hidden_size=1536, intermediate_size=512, num_hidden_layers=32, num_attention_heads=24,
        num_key_value_heads=8, num_local_experts=40, num_experts_per_tok=8, vocab_size=49155,
        max_position_embeddings=4096, tie_word_embeddings=True))
    return m


def _experts_topk(cfg: Any) -> tuple[int, int]:
    c = getattr(cfg, "text_config", cfg)
    if c.model_type == "dbrx":
        return int(c.ffn_config.moe_num_experts), int(c.ffn_config.moe_top_k)
    for e_key in ("num_local_experts", "n_routed_experts", "num_experts"):
        if getattr(c, e_key, None):
            return int(getattr(c, e_key)), int(c.num_experts_per_tok)
    return 0, 0


def _layer_of(name: str) -> tuple[int, str] | None:
    m = re.search(r"\.(?:layers|blocks)\.(\d+)\.(.*)$", name)
    if m is None:
        return None
    rest = m.group(2).split(".")
    return int(m.group(1)), ".".join(rest[:2]) if len(rest) > 2 else rest[0]


def count(name: str, checkpoint: str, cfg: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        cfg.save_pretrained(d)
        config_json = json.loads((Path(d) / "config.json").read_text())
    (OUT / f"{name}.json").write_text(json.dumps(config_json, indent=2, sort_keys=True) + "\n")
    text_cfg = getattr(cfg, "text_config", None) if cfg.model_type == "llama4" else None
    with torch.device("meta"):
        model = tf.Llama4ForCausalLM(text_cfg) if text_cfg is not None else tf.AutoModelForCausalLM.from_config(cfg)
    E, k = _experts_topk(cfg)
    total = 0
    routed_by_layer: dict[int, int] = {}
    layers: dict[int, dict[str, int]] = {}
    other: dict[str, int] = {}
    for pname, p in model.named_parameters():
        n = p.numel()
        total += n
        where = _layer_of(pname)
        if where is None:
            other[pname] = other.get(pname, 0) + n
            continue
        li, sub = where
        layers.setdefault(li, {})
        layers[li][sub] = layers[li].get(sub, 0) + n
        if ROUTED.search(pname) and not SHARED.search(pname):
            routed_by_layer[li] = routed_by_layer.get(li, 0) + n
    active = total - sum(r * (1 - k / E) for r in routed_by_layer.values()) if E else total
    return {"model_type": config_json.get("model_type"), "checkpoint": checkpoint, "total": total,
            "active": round(active), "n_moe_layers": len(routed_by_layer), "experts": E, "topk": k,
            "breakdown": {"other": other, "layers": [layers[i] for i in sorted(layers)]}}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[1:])
    out: dict[str, Any] = {"transformers": tf.__version__, "torch": torch.__version__, "models": {}}
    path = OUT / "counts.json"
    if only and path.is_file():
        out["models"] = json.loads(path.read_text())["models"]
    for name, (ckpt, cfg) in models().items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        c = count(name, ckpt, cfg)
        out["models"][name] = c
        print(f"{name:28s} total {c['total'] / 1e9:9.3f} B  active {c['active'] / 1e9:8.3f} B  "
              f"moe layers {c['n_moe_layers']:3d}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
