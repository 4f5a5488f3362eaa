"""Fused graph expansion, typed op kinds, hardware-driven fusion and parallel strategy (seed 004)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.lowering.graph import (
    OP_CLASS,
    FusedKind,
    FusedOpSpec,
    GraphRequest,
    OpClass,
    OpKind,
    expand,
    plan_graph,
)
from shared.configs.arch import ArchConfig, DvfsConfig, DvfsDomain

ARCH = ArchConfig()


def plan(spec: FusedOpSpec, arch: ArchConfig = ARCH):  # type: ignore[no-untyped-def]
    return plan_graph(GraphRequest(ops=[spec], arch=arch)).plans[0]


def test_swiglu_expands_to_typed_atomic_ops() -> None:
    dag = expand(FusedOpSpec(kind=FusedKind.SWIGLU, tokens=4, d=256, f=512))
    assert [n.kind for n in dag.nodes] == [OpKind.MATMUL, OpKind.MATMUL, OpKind.SILU, OpKind.MUL, OpKind.MATMUL,
                                           OpKind.ADD]
    assert all(isinstance(n.kind, OpKind) for n in dag.nodes)
    assert OP_CLASS[OpKind.ROPE] == OpClass.INJECTIVE and OP_CLASS[OpKind.SILU] == OpClass.ELEMWISE


def test_unknown_kind_is_rejected_at_the_edge() -> None:
    with pytest.raises(ValidationError):
        FusedOpSpec.model_validate({"kind": "FlashAttention3"})


def test_epilogues_and_extra_inputs() -> None:
    p = plan(FusedOpSpec(kind="SwiGLU", tokens=1))
    gate = next(g for g in p.groups if g.epilogue)
    assert gate.epilogue == ["Silu", "Mul"] and gate.extra_inputs == ["up"]
    down = p.groups[-1]
    assert down.epilogue == ["Add"] and down.extra_inputs == ["X"]
    # the gate group needs "up": it is ordered after the up projection
    order = [g.root for g in p.groups]
    up_node = next(n.id for n in p.nodes if n.output == "up")
    assert order.index(up_node) < order.index(gate.root)


def test_rope_is_never_a_gemm_epilogue() -> None:
    p = plan(FusedOpSpec(kind="GQA", tokens=8, kv_heads=8, kv_cached=64))
    for g in p.groups:
        assert "RoPE" not in g.epilogue and "Concat" not in g.epilogue
    assert any(g.root_kind == "RoPE" for g in p.groups)


def test_compute_root_versus_tile_level_depends_on_the_device() -> None:
    small = plan(FusedOpSpec(kind="SwiGLU", tokens=1))
    big = plan(FusedOpSpec(kind="SwiGLU", tokens=64))
    e_small = {e.tensor: e for e in small.edges}
    e_big = {e.tensor: e for e in big.edges}
    assert e_small["h"].decision == "compute_root"  # 1 x 14336 bf16 = 28 KB <= 0.75 x 512 KB
    assert e_big["h"].decision == "tile_level"  # 64 x 14336 bf16 = 1.8 MB
    mc = int(0.75 * 512 * 1024 // (14336 * 2))
    assert e_big["h"].tile_rows == mc
    # the same DAG on a core with a 4 MB SPM keeps h resident
    roomy = ARCH.model_copy(update={"core": ARCH.core.model_copy(update={"spm_kb": 4096})})
    assert {e.tensor: e for e in plan(FusedOpSpec(kind="SwiGLU", tokens=64), roomy).edges}["h"].decision == \
        "compute_root"


def test_fusion_lowers_dram_bytes() -> None:
    p = plan(FusedOpSpec(kind="SwiGLU", tokens=64))
    assert p.cost["dram_bytes_fused"] < p.cost["dram_bytes_unfused"]
    assert p.cost["cycles_fused"] < p.cost["cycles_unfused"]
    # everything fused: only weights/inputs read and the final output written
    eb = 2
    M, d, f = 64, 4096, 14336
    reads = (M * d * 2 + 2 * d * f + f * d + M * d) * eb  # X (gate, up), Wg, Wu, Wd, X (residual)
    assert p.cost["dram_bytes_fused"] == reads + M * d * eb


def test_the_dram_time_is_counted_in_cycles_of_the_slowest_cores_clock() -> None:
    """A graph split over every core ends with its slowest one: the DRAM time added to the compute cycles is in
    cycles of the slowest core's top DVFS step, whichever domain lists it (``shared.dvfs.top_freqs``)."""
    spec = FusedOpSpec(kind="SwiGLU", tokens=64)
    one = plan(spec).cost
    slow = DvfsDomain(cores=(5,), steps_ghz=(1.0, 0.8), trip_c=(80.0,))
    for domains in ((DvfsDomain(), slow), (slow, DvfsDomain())):
        two = plan(spec, ArchConfig(dvfs=DvfsConfig(domains=domains))).cost
        assert two["compute_cycles"] == one["compute_cycles"]
        f0 = ARCH.dvfs.domains[0].steps_ghz[0]
        dram = one["cycles_fused"] - one["compute_cycles"]
        assert two["cycles_fused"] - two["compute_cycles"] == pytest.approx(dram * 1.0 / f0, rel=1e-12)


def test_gqa_shapes_and_materialised_kv() -> None:
    p = plan(FusedOpSpec(kind="GQA", tokens=32, heads=32, kv_heads=8, head_dim=128, kv_cached=2048))
    out = {n.output: n for n in p.nodes}
    assert out["k"].shape == (32, 8 * 128) and out["q"].shape == (32, 32 * 128)
    assert out["scores"].attrs["group"] == 4 and out["scores"].attrs["transpose_b"] is True
    edges = {e.tensor: e.decision for e in p.edges}
    assert edges["k_all"] == "materialize"  # 2080 x 1024 bf16 K, read transposed: no row fusion
    assert edges["x_norm"] == "compute_root"


def test_mla_has_low_rank_latents_and_decoupled_rope() -> None:
    dag = expand(FusedOpSpec(kind="MLA", tokens=4, d=5120, heads=128, kv_cached=100))
    by_out = {n.output: n for n in dag.nodes}
    assert by_out["c_kv"].attrs["N"] == 512 and by_out["c_q"].attrs["N"] == 1536
    assert by_out["c_kv_norm"].kind == OpKind.RMSNORM and by_out["k_pe_rope"].kind == OpKind.ROPE
    assert by_out["k"].kind == OpKind.CONCAT
    assert by_out["scores"].attrs["K"] == 128 + 64


def test_parallel_strategy() -> None:
    p = plan(FusedOpSpec(kind="GQA", tokens=32, kv_heads=8, kv_cached=2048))
    for g in p.groups:
        if g.root_kind == "MatMul":
            assert g.parallel == "gemm_n" and 1 <= g.splits <= 64
        elif g.root_kind == "Softmax":
            assert g.parallel == "elementwise" and g.splits == 32  # rows split over cores
    tiny = plan(FusedOpSpec(kind="GQA", tokens=1, d=256, heads=4, kv_heads=2, head_dim=64))
    assert any(g.parallel == "sequential" for g in tiny.groups)


def test_bad_graph_input_names_the_op() -> None:
    from shared.errors import BadInput

    with pytest.raises(BadInput) as ei:
        plan_graph(GraphRequest(ops=[FusedOpSpec(kind="GQA", heads=8, kv_heads=8)]))
    assert ei.value.field == "ops[0].kv_heads"


def test_a_repeated_op_gets_the_plan_it_gets_alone() -> None:
    """Planning an op once and reusing its plan for its repeats changes no plan: every position of a request with
    repeats equals the plan of its op in a request of its own; a bad op still names its first position."""
    from shared.errors import BadInput

    gqa = FusedOpSpec(kind="GQA", tokens=64, d=1024, heads=8, kv_heads=2, head_dim=128)
    swiglu = FusedOpSpec(kind="SwiGLU", tokens=64, d=1024, f=2816)
    ops = [gqa, swiglu, gqa, gqa, swiglu]
    plans = plan_graph(GraphRequest(ops=ops, arch=ARCH)).plans
    for spec, got in zip(ops, plans, strict=True):
        assert got.model_dump() == plan(spec).model_dump()
    bad = FusedOpSpec(kind="GQA", heads=8, kv_heads=8)
    with pytest.raises(BadInput) as ei:
        plan_graph(GraphRequest(ops=[gqa, bad, bad]))
    assert ei.value.field == "ops[1].kv_heads"
