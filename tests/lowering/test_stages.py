"""Chiplet stage decomposition (seed 000)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.lowering.stages import (
    REFINE_COMMANDS,
    BlockSpec,
    StagesRequest,
    decompose,
    decompose_block,
    select_experts,
)
from shared.configs.arch import ArchConfig

ARCH = ArchConfig()


def names(stages: list) -> list[str]:  # type: ignore[type-arg]
    return [s.name.split(".", 1)[1] for s in stages]


def test_attention_block_order_and_commands() -> None:
    st = decompose_block(BlockSpec(layer=3, tokens=4, kv_cached=100, ffn="swiglu"), ARCH)
    n = names(st)
    assert n.index("host2d_kv_cache") < n.index("attention.qkv") < n.index("attention.softmax_max")
    sm = [s for s in st if s.type == "softmax"]
    assert [s.name.rsplit(".", 1)[1] for s in sm] == ["softmax_max", "softmax_sub", "softmax_exp", "softmax_sum",
                                                     "softmax_norm"]
    assert [s.metadata["op"] for s in sm] == ["reduce_max", "spu_sub", "vpu_exp", "reduce_sum", "spu_div"]
    for s in sm:
        assert s.command == REFINE_COMMANDS[s.name.rsplit(".", 1)[1]]
        assert s.metadata["nonlinear_kind"] == "softmax"
    assert n.index("attention.av") < n.index("postprocess.out_proj") < n.index("d2host_kv_cache")
    kv = [s for s in st if s.type == "transfer"]
    assert all(s.metadata["host_kind"] == "kv_cache" for s in kv)
    assert {s.direction for s in kv} == {"host_to_digital", "digital_to_host"}
    # FFN / SwiGLU: main matmul, nonlinear on the VPU, residual
    assert n.index("rram_linear.up") < n.index("nonlinear") < n.index("rram_linear.down") < n.index("residual")
    nl = next(s for s in st if s.type == "nonlinear")
    assert nl.metadata["nonlinear_kind"] == "swiglu" and nl.command == "pe_cmd_vpu_op"


def test_layernorm_refinement() -> None:
    st = decompose_block(BlockSpec(norm="layernorm", ffn="gelu"), ARCH)
    ln = [s for s in st if s.name.startswith("L0.attn_norm")]
    assert [s.name.rsplit(".", 1)[1] for s in ln] == ["reduce_mean", "reduce_var", "layernorm_norm",
                                                     "layernorm_affine"]
    assert [s.command for s in ln] == ["pe_cmd_reduce", "pe_cmd_reduce", "pe_cmd_spu_op", "pe_cmd_vpu_op"]
    assert ln[0].metadata["op"] == "layernorm_mean" and ln[1].metadata["op"] == "layernorm_var"


def test_moe_gating_is_reproducible_and_seeded_by_name_and_layer() -> None:
    a = decompose_block(BlockSpec(layer=5, tokens=8), ARCH)
    b = decompose_block(BlockSpec(layer=5, tokens=8), ARCH)
    topk = next(s for s in a if s.name.endswith("topk_select"))
    assert topk.command == "pe_cmd_reduce" and topk.metadata["reduce_kind"] == "topk"
    sel = topk.metadata["selected_experts"]
    assert sel == next(s for s in b if s.name.endswith("topk_select")).metadata["selected_experts"]
    assert len(sel) == 2 and set(sel) <= set(range(8)) and topk.metadata["randomize_experts"] is True
    # the seed is stage name + layer: over many layers the draws differ
    draws = {tuple(select_experts(f"L{ly}.topk_select", ly, list(range(8)), 2)) for ly in range(32)}
    assert len(draws) > 5
    lin = [s for s in a if ".moe_linear.E" in s.name and not s.name.endswith("nonlinear")]
    assert sorted(s.metadata["expert"] for s in lin) == sel
    assert all(s.chiplet == "rram" and s.metadata["selected_experts"] == sel for s in lin)
    assert names(a).index("topk_select") < names(a).index("moe_merge")
    # candidates restrict the draw
    c = decompose_block(BlockSpec(layer=5, candidate_experts=[1, 6, 7]), ARCH)
    assert set(next(s for s in c if s.name.endswith("topk_select")).metadata["selected_experts"]) <= {1, 6, 7}


def test_host_transfers_and_host_dma_bytes_per_kind() -> None:
    res = decompose(StagesRequest(blocks=[BlockSpec(layer=0, tokens=2, first_load=True),
                                          BlockSpec(layer=1, tokens=2)], arch=ARCH))
    st = res.stages
    c2 = [s for s in st if s.direction == "digital_to_rram"]
    assert c2, "host2c_weight must insert a Digital -> RRAM stage"
    for s in c2:
        tag = s.metadata["weight_tag"]
        h2d = [x for x in st if x.direction == "host_to_digital" and x.metadata.get("weight_tag") == tag
               and x.metadata["host_kind"] == "weight"]
        assert len(h2d) == 1 and h2d[0].bytes == s.bytes
        assert st.index(h2d[0]) == st.index(s) - 1
        assert "tile_id" in s.metadata and "array_id" in s.metadata
    assert any(s.metadata.get("host_kind") == "weight_meta" for s in st)
    for kind in ("kv_cache", "weight", "weight_meta"):
        want = sum(s.bytes for s in st if s.type == "transfer" and s.metadata["host_kind"] == kind
                   and s.direction != "digital_to_rram")
        assert res.host_dma_bytes[kind] == pytest.approx(want)
        assert want > 0
    # the second block (already loaded) has no weight transfers
    assert not [s for s in st if s.layer == 1 and s.metadata.get("host_kind") == "weight"]


def test_bad_block() -> None:
    with pytest.raises(ValidationError):
        BlockSpec(heads=6, kv_heads=4)
    with pytest.raises(ValidationError):
        BlockSpec(topk=9, n_experts=8)
