"""WorkloadIR fidelity: parameter counts and decode FLOPs against ../shared/reference/models, structure checks."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

from services.workload.ir import (
    CommSpec,
    DeepSeekModel,
    LlamaModel,
    ModelConfig,
    WorkloadIR,
    build_ir,
    from_hf_config,
)
from services.workload.zoo import ZOO_DIR, ModelZoo
from shared.errors import BadInput, NotFound

ZOO = ModelZoo()  # the shipped models (no models folder)

# reference model_configs.json key -> zoo name
REF_NAMES = {
    "Mixtral-8x7B": "mixtral-8x7b",
    "DeepSeek-V2 (236B)": "deepseek-v2",
    "DeepSeek-V3 (671B)": "deepseek-v3",
    "LLaMA-2-7B": "llama-2-7b",
    "LLaMA-2-70B": "llama-2-70b",
    "LLaMA-3-8B": "llama-3-8b",
    "LLaMA-3-70B": "llama-3-70b",
}


def _ref(reference_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((reference_dir / "models" / "model_configs.json").read_text())
    return data


def _published_billions(text: str) -> list[float]:
    """'46.7B (apxml model page)/47B (paper)' -> [46.7, 47.0]."""
    return [float(x) for x in re.findall(r"([\d.]+)B", text)]


def test_zoo_names_and_unknown_model() -> None:
    assert ZOO.known_models() == sorted(REF_NAMES.values())
    assert ZOO.get_model_config("Mixtral-8x7B").name == "mixtral-8x7b"
    with pytest.raises(NotFound) as exc:
        ZOO.get_model_config("gpt-5")
    assert "mixtral-8x7b" in str(exc.value) and exc.value.field == "model"


@pytest.mark.parametrize("ref_key", list(REF_NAMES))
def test_params_match_reference_computed_counts(reference_dir: Path, ref_key: str) -> None:
    entry = _ref(reference_dir)[ref_key]
    computed = entry["computed_params"]
    want_total = computed.get("total", computed.get("total_main_model"))
    m = build_ir(ZOO.get_model_config(REF_NAMES[ref_key]))
    assert m.params_total == pytest.approx(want_total, rel=5e-3)
    if "active" in computed:
        assert m.params_active == pytest.approx(computed["active"], rel=5e-3)
    else:  # dense model: every parameter is active
        assert m.params_active == m.params_total


@pytest.mark.parametrize("ref_key", ["Mixtral-8x7B"])
def test_params_match_published_within_half_percent(reference_dir: Path, ref_key: str) -> None:
    pub = _ref(reference_dir)[ref_key]["published_params"]
    m = build_ir(ZOO.get_model_config(REF_NAMES[ref_key]))
    total = _published_billions(pub["total"])[0] * 1e9  # the 3-significant-digit figure (46.7B)
    active = _published_billions(pub["active"])[0] * 1e9  # 12.9B
    assert m.params_total == pytest.approx(total, rel=5e-3)
    assert m.params_active == pytest.approx(active, rel=5e-3)


@pytest.mark.parametrize(("name", "total_b", "active_b"), [("deepseek-v2", 236, 21), ("deepseek-v3", 671, 37)])
def test_deepseek_published_counts_to_their_precision(name: str, total_b: float, active_b: float) -> None:
    """Published as whole billions: totals within 0.5%; the active counts (21.4B, 37.6B from the configs) are
    published truncated to whole billions (21B, 37B), so they must fall in [published, published + 1B)."""
    m = build_ir(ZOO.get_model_config(name))
    assert m.params_total == pytest.approx(total_b * 1e9, rel=5e-3)
    assert active_b * 1e9 <= m.params_active < (active_b + 1) * 1e9


def test_llama2_7b_is_6_74b() -> None:
    assert build_ir(ZOO.get_model_config("llama-2-7b")).params_total == pytest.approx(6.74e9, rel=5e-3)


def _decode_rows(reference_dir: Path) -> list[dict[str, str]]:
    with (reference_dir / "models" / "decode_flops_per_token.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_decode_flops_per_token_match_reference(reference_dir: Path) -> None:
    """The reference counts all matmuls (q,k,v,o, experts' SwiGLU GEMMs, router gate, LM head) and the QK and SV
    score GEMMs; softmax/norm excluded: that is exactly the IR's cube_ops."""
    rows = _decode_rows(reference_dir)
    assert rows, "reference table is empty"
    for row in rows:
        name = row["model"].lower()
        m = build_ir(ZOO.get_model_config(name), phase="decode", batch=int(row["batch"]),
                     seq_len=int(row["context_tokens"]))
        assert row["phase"] == "decode"
        per_token = m.get_ops_breakdown().cube_ops / m.shape.tokens
        assert per_token / 1e9 == pytest.approx(float(row["flops_per_token_G"]), rel=0.03), name
        # softmax/norm/SiLU terms are a small extra on top
        assert 0 < m.get_ops_breakdown().vector_ops / m.shape.tokens < 0.01 * per_token


@pytest.mark.parametrize("name", sorted(REF_NAMES.values()))
def test_flops_are_two_times_active_params_plus_attention_scores(name: str) -> None:
    """ARCHITECTURE §5.1: matmul FLOPs/token = 2 x active non-embedding weights + the score terms."""
    mc = ZOO.get_model_config(name)
    ctx = 1024
    m = build_ir(mc, phase="decode", batch=1, seq_len=ctx)
    norms = sum(op.params_total for la in m.layers for op in la.ops if op.op_type == "rmsnorm")
    embed = mc.vocab_size * mc.hidden_size
    weights = m.params_active - embed - norms
    H, L = mc.num_attention_heads, mc.num_hidden_layers
    if mc.mla is not None:  # absorbed: scores over the latent + rope, score·V over the latent
        score = 2 * ctx * H * (mc.mla.kv_lora_rank + mc.mla.qk_rope_head_dim) + 2 * ctx * H * mc.mla.kv_lora_rank
    else:
        score = 2 * 2 * ctx * H * mc.head_dim
    assert m.get_ops_breakdown().cube_ops == 2 * weights + L * score


def test_only_activated_experts_count() -> None:
    mc = ZOO.get_model_config("mixtral-8x7b")
    assert mc.moe is not None
    top1 = mc.model_copy(update={"moe": mc.moe.model_copy(update={"num_activated_experts": 1})})
    f2 = build_ir(mc).get_ops_breakdown().cube_ops
    f1 = build_ir(top1).get_ops_breakdown().cube_ops
    h, inter, L = mc.hidden_size, mc.moe.moe_intermediate_size, mc.num_hidden_layers
    assert f2 - f1 == L * 2 * 3 * h * inter  # one expert's SwiGLU per layer
    assert build_ir(top1).params_total == build_ir(mc).params_total  # storage does not depend on top-k


def test_deepseek_v3_structure() -> None:
    mc = ZOO.get_model_config("deepseek-v3")
    m = build_ir(mc, phase="decode")
    assert isinstance(m, DeepSeekModel) and isinstance(m, WorkloadIR)
    kinds = [la.op_type for la in m.get_layers()]
    assert kinds[0] == "embedding" and kinds[-1] == "lm_head"
    assert kinds.count("ffn") == 3 and kinds.count("moe") == 58 and kinds.count("mla_absorb") == 61
    assert [la.index for la in m.layers if la.op_type == "ffn"] == [0, 1, 2]
    prefill = build_ir(mc, phase="prefill", batch=1, seq_len=128)
    assert {la.op_type for la in prefill.layers} >= {"mla", "moe", "ffn"}
    assert prefill.params_total == m.params_total  # absorbed form reuses W_UK / W_UV
    assert mc.kv_bytes_per_token_layer() == 576 * 2
    moe = next(la for la in m.layers if la.op_type == "moe")
    assert moe.comm == CommSpec("all2all", 2 * 1 * 8 * 7168 * 2, 256, "ep_group")
    pattern = m.get_communication_pattern()
    assert len(pattern.entries) == 58 and set(pattern.by_pattern()) == {"all2all"}
    op_names = [op.name for op in moe.ops]
    assert any(".shared_experts." in n for n in op_names) and any(n.endswith(".dispatch") for n in op_names)


def test_prefill_and_decode_shapes() -> None:
    mc = ZOO.get_model_config("llama-2-7b")
    dec = build_ir(mc, phase="decode", batch=4, seq_len=2048)
    pre = build_ir(mc, phase="prefill", batch=2, seq_len=512)
    assert isinstance(dec, LlamaModel)
    assert dec.metadata.tokens == 4 and pre.metadata.tokens == 1024
    # decode attention scores grow linearly with the context
    d1 = build_ir(mc, phase="decode", batch=1, seq_len=1000).get_ops_breakdown().cube_ops
    d2 = build_ir(mc, phase="decode", batch=1, seq_len=2000).get_ops_breakdown().cube_ops
    assert d2 - d1 == 32 * 2 * 2 * 1000 * 32 * 128
    fp = dec.get_memory_footprint()
    assert fp.kv_cache_bytes == 4 * 2048 * 32 * 2 * 32 * 128 * 2
    assert fp.weight_bytes == dec.params_total * 2
    order = dec.get_graph().topological_order()
    assert order[0] == "embed" and order[-1] == "lm_head" and len(order) == 2 + 2 * 32


def test_bad_shape_rejected() -> None:
    with pytest.raises(ValueError, match="batch"):
        build_ir(ZOO.get_model_config("llama-2-7b"), batch=0)


def test_shipped_zoo_matches_reference(reference_dir: Path) -> None:
    """The configs shipped in the package are the reference numbers (no drift between the copy and the source)."""
    ref = _ref(reference_dir)
    pairs = {"hidden_size": ("hidden_size", "dim"), "num_hidden_layers": ("num_hidden_layers", "n_layers"),
             "num_attention_heads": ("num_attention_heads", "n_heads"), "vocab_size": ("vocab_size",),
             "q_lora_rank": ("q_lora_rank",), "kv_lora_rank": ("kv_lora_rank",),
             "moe_intermediate_size": ("moe_inter_dim",), "n_routed_experts": ("n_routed_experts",),
             "n_shared_experts": ("n_shared_experts",), "num_local_experts": ("num_local_experts",),
             "num_key_value_heads": ("num_key_value_heads",)}
    for ref_key, name in REF_NAMES.items():
        shipped = json.loads((ZOO_DIR / f"{name}.json").read_text())
        entry = ref[ref_key]
        compared = 0
        for zoo_key, ref_keys in pairs.items():
            for rk in ref_keys:
                if rk in entry and zoo_key in shipped:
                    assert shipped[zoo_key] == entry[rk], (name, zoo_key)
                    compared += 1
        assert compared >= 4, name


def test_hf_config_key_names() -> None:
    mixtral = from_hf_config({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 100}, name="tiny")
    assert mixtral.family == "mixtral" and mixtral.moe is not None
    assert mixtral.moe.num_routed_experts == 4 and mixtral.moe.moe_intermediate_size == 128
    assert mixtral.head_dim == 16 and mixtral.attention_kind == "gqa"


def test_hf_config_from_deepseek_short_names(reference_dir: Path) -> None:
    """DeepSeek's inference-config names (dim, n_layers, n_dense_layers, n_expert_groups...) build the same model."""
    entry = _ref(reference_dir)["DeepSeek-V2 (236B)"]
    with pytest.raises(BadInput, match="model_type"):  # no model_type: the generic mapping is an explicit choice
        from_hf_config(entry, name="deepseek-v2-ref")
    mc = from_hf_config(entry, name="deepseek-v2-ref", generic=True)
    assert mc.moe is not None and mc.mla is not None
    assert mc.moe.first_k_dense_replace == 1 and mc.moe.n_group == 8 and mc.moe.topk_group == 3
    assert build_ir(mc).params_total == build_ir(ZOO.get_model_config("deepseek-v2")).params_total


def test_register_model_from_config_file(tmp_path: Path) -> None:
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
           "moe_intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "n_routed_experts": 16,
           "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
           "first_k_dense_replace": 1, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
           "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 1000}
    path = tmp_path / "Tiny_DS.json"
    path.write_text(json.dumps(cfg))
    zoo = ModelZoo(tmp_path / "models")
    try:
        mc = zoo.register_model_file(path)
        assert mc.name == "tiny-ds" and "tiny-ds" in zoo.known_models()
        assert zoo.get_model_config("tiny_ds").moe is not None
        assert not (tmp_path / "models").exists()  # registered in this zoo only (persist=False)
        m = build_ir(mc)
        assert [la.index for la in m.layers if la.op_type == "moe"] == [1, 2, 3]
        # per token: 1 shared + 4 routed experts of 3·h·mi, out of 16 stored
        expert_elems = 3 * 256 * 64
        assert m.params_total - m.params_active == 3 * (16 - 4) * expert_elems
    finally:
        zoo.unregister_model("tiny-ds")
    assert "tiny-ds" not in zoo.known_models()


@pytest.mark.parametrize(("patch", "field"), [
    ({"hidden_size": None}, "hidden_size"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"num_attention_heads": 5}, "num_key_value_heads"),
])
def test_hf_config_errors_name_the_field(patch: dict[str, Any], field: str | None) -> None:
    base: dict[str, Any] = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                            "num_local_experts": 8,
                            "num_experts_per_tok": 2, "vocab_size": 100}
    base.update(patch)
    with pytest.raises(BadInput) as exc:
        ZOO.register_model("broken", {k: v for k, v in base.items() if v is not None})
    if field is not None:
        assert exc.value.field is not None and exc.value.field.startswith(field)
    assert "broken" not in ZOO.known_models()


def test_model_config_is_typed() -> None:
    mc = ZOO.get_model_config("deepseek-v3")
    assert isinstance(mc, ModelConfig)
    assert mc.moe is not None and mc.moe.score_func == "sigmoid" and mc.moe_layers[0] == 3
