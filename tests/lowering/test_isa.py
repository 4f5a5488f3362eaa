"""ISA lowering (seed 002): every op lowers to a stream the validator accepts; the validator rejects bad streams
with the instruction index and the rule; the stream agrees with the analytic cost model."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from typing import Any

import pytest

from services.lowering.costmodel import fold_cycles, gemm_cost
from services.lowering.isa import Builder, DeviceProfile, Instr, Opcode
from services.lowering.lower import (
    lower_attention,
    lower_conv2d,
    lower_ffn,
    lower_matmul,
    lower_moe_experts,
    lower_qkv,
    lower_rowwise,
    lower_swiglu_ffn,
)
from services.lowering.ops import AttentionSpec, MatMulSpec, RowwiseSpec, lower_op, validator_for
from services.lowering.streamcost import stream_cost
from services.lowering.validate import Violation
from shared.configs.arch import ArchConfig
from shared.errors import BadInput

P = DeviceProfile()


def build(fn: Any, profile: DeviceProfile = P) -> Builder:
    b = Builder(profile)
    fn(b)
    return b


def check(b: Builder) -> list[Violation]:
    return validator_for(b).validate(b.instrs)


CASES: dict[str, Any] = {
    "matmul": lambda b: lower_matmul(b, 32, 4096, 1024),
    "matmul_odd": lambda b: lower_matmul(b, 7, 100, 33),
    "matmul_big_m": lambda b: lower_matmul(b, 512, 1024, 256),
    "conv2d": lambda b: lower_conv2d(b, batch=2, cin=3, h=16, w=16, cout=16, kh=3, kw=3, pad=1),
    "ffn_resident": lambda b: lower_ffn(b, 32, 512, 2048),
    "ffn_dram": lambda b: lower_ffn(b, 64, 1024, 4096),
    "swiglu": lambda b: lower_swiglu_ffn(b, 8, 1024, 3584),
    "rmsnorm": lambda b: lower_rowwise(b, "rmsnorm", 100, 4096),
    "layernorm": lambda b: lower_rowwise(b, "layernorm", 100, 4096),
    "softmax": lambda b: lower_rowwise(b, "softmax", 64, 2048),
    "gelu": lambda b: lower_rowwise(b, "gelu", 64, 1000),
    "bias": lambda b: lower_rowwise(b, "bias", 64, 1024),
    "qkv": lambda b: lower_qkv(b, 32, 1024, 1024, 256),
    "attention": lambda b: lower_attention(b, S=4, d=512, heads=8, kv_heads=2, head_dim=64, kv_cached=300),
    "attention_prefill": lambda b: lower_attention(b, S=64, d=256, heads=4, kv_heads=4, head_dim=64, kv_cached=0),
    "moe": lambda b: lower_moe_experts(b, [3, 0, 5], 512, 1024),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_op_lowers_to_a_valid_stream(name: str) -> None:
    b = build(CASES[name])
    assert b.instrs
    assert check(b) == []
    assert b.spm.peak <= P.spm_bytes
    # every DMA/KV address is burst aligned
    for ins in b.instrs:
        if ins.opcode in (Opcode.DMA_LOAD_TILE, Opcode.KV_LOAD_TILE):
            assert ins.src0 is not None and ins.src0 % P.burst_bytes == 0
        if ins.opcode in (Opcode.DMA_STORE_TILE, Opcode.KV_STORE_TILE):
            assert ins.dst is not None and ins.dst % P.burst_bytes == 0


def test_matmul_k_accumulation_and_sync() -> None:
    b = build(lambda b: lower_matmul(b, 32, 1024, 256))
    te = [i for i in b.instrs if i.opcode == Opcode.TE_MATMUL_TILE]
    ks = {i.imm["k"] for i in te}
    nk = 1024 // max(ks)
    assert nk > 1
    # per output tile: the first K tile writes, the later ones accumulate
    per_dst: dict[int | None, list[int]] = {}
    for i in te:
        per_dst.setdefault(i.dst, []).append(i.imm["acc"])
    accs = [a for v in per_dst.values() for a in v]
    assert accs.count(0) == (256 // te[0].imm["n"]) * 1  # one first tile per output tile
    # a SYNC separates consecutive accumulating tiles
    idx = [k for k, i in enumerate(b.instrs) if i.opcode == Opcode.TE_MATMUL_TILE]
    for a, c in itertools.pairwise(idx):
        assert any(b.instrs[j].opcode == Opcode.SYNC_WAIT for j in range(a + 1, c))


@pytest.mark.parametrize(("M", "K", "N"), [(32, 4096, 14336), (7, 100, 33), (128, 128, 128), (512, 1024, 256)])
def test_stream_matches_the_analytic_model(M: int, K: int, N: int) -> None:
    b = build(lambda b: lower_matmul(b, M, K, N))
    s = stream_cost(b.instrs, P)
    g = gemm_cost(M, K, N)
    assert s.dram_bytes == g.dram_bytes  # same tiling, same tiled-bytes formula
    assert s.macs == M * K * N
    if g.tiling.Mt == M:
        assert s.te_cycles == g.compute_cycles == fold_cycles(M, K, N, 32, 32, "ws")
    else:
        assert s.te_cycles > g.compute_cycles  # each M tile pays its own fill
    assert s.cycles == pytest.approx(g.total_cycles, rel=0.2)


def test_conv2d_is_im2col_on_the_matmul_path() -> None:
    b = build(lambda b: lower_conv2d(b, batch=2, cin=3, h=16, w=16, cout=16, kh=3, kw=3, pad=1))
    macs = sum(i.imm["m"] * i.imm["k"] * i.imm["n"] for i in b.instrs if i.opcode == Opcode.TE_MATMUL_TILE)
    assert macs == (2 * 16 * 16) * (3 * 3 * 3) * 16
    assert all("gather" in i.imm for i in b.instrs
               if i.opcode == Opcode.DMA_LOAD_TILE and i.imm["tensor"] == "X_im2col")


def test_ffn_keeps_the_hidden_tile_resident_when_it_fits() -> None:
    small = build(lambda b: lower_ffn(b, 32, 512, 2048))
    big = build(lambda b: lower_ffn(b, 64, 1024, 4096))
    assert "H" not in {t.name for t in small.dram.tensors}  # ComputeRoot: no DRAM round trip
    assert "H" in {t.name for t in big.dram.tensors}
    ops = Counter(i.opcode for i in small.instrs)
    assert ops[Opcode.VE_GELU_TILE] > 0 and ops[Opcode.VE_ADD_TILE] > 0


def test_swiglu_gate_and_up_share_the_a_tile() -> None:
    b = build(lambda b: lower_swiglu_ffn(b, 8, 1024, 3584))
    ops = Counter(i.opcode for i in b.instrs)
    assert ops[Opcode.VE_SILU_TILE] == ops[Opcode.VE_MUL_TILE] > 0
    x_loads = [i for i in b.instrs if i.opcode == Opcode.DMA_LOAD_TILE and i.imm["tensor"] == "X"]
    wg = [i for i in b.instrs if i.opcode == Opcode.DMA_LOAD_TILE and i.imm["tensor"] == "Wg"]
    wu = [i for i in b.instrs if i.opcode == Opcode.DMA_LOAD_TILE and i.imm["tensor"] == "Wu"]
    assert len(wg) == len(wu) > 0
    assert len(x_loads) <= len(wg)


def test_qkv_loads_x_once() -> None:
    b = build(lambda b: lower_qkv(b, 32, 1024, 1024, 256))
    x_bytes = sum(i.imm["rows"] * i.imm["cols"] for i in b.instrs
                  if i.opcode == Opcode.DMA_LOAD_TILE and i.imm["tensor"] == "X")
    assert x_bytes == 32 * 1024
    assert {i.imm["tensor"] for i in b.instrs if i.opcode == Opcode.DMA_STORE_TILE} == {"Q", "K", "V"}


def test_attention_flow_gqa_and_kv() -> None:
    b = build(lambda b: lower_attention(b, S=4, d=512, heads=8, kv_heads=2, head_dim=64, kv_cached=300))
    stores = [i for i in b.instrs if i.opcode == Opcode.KV_STORE_TILE]
    assert sorted((i.imm["kind"], i.imm["head"]) for i in stores) == [("K", 0), ("K", 1), ("V", 0), ("V", 1)]
    assert all(i.imm["pos"] == 300 and i.imm["rows"] == 4 for i in stores)
    loads = [i for i in b.instrs if i.opcode == Opcode.KV_LOAD_TILE]
    # every query head reads all 304 rows of its group's K and V
    rows = Counter((i.imm["kind"], i.imm["head"]) for i in loads for _ in range(i.imm["kv_len"]))
    assert rows[("K", 0)] == rows[("V", 1)] == 4 * 304  # 4 query heads per kv head
    sm = [i for i in b.instrs if i.opcode == Opcode.VE_SOFTMAX_TILE]
    assert len(sm) == 8 and all(i.imm["reduce_len"] == 304 for i in sm)
    order = [i.opcode for i in b.instrs]
    first_load = order.index(Opcode.KV_LOAD_TILE)
    assert order.index(Opcode.KV_STORE_TILE) < first_load
    assert b.instrs[-1].opcode == Opcode.SYNC_WAIT


def test_moe_skips_experts_without_tokens() -> None:
    b = build(lambda b: lower_moe_experts(b, [3, 0, 5], 512, 1024))
    names = {t.name for t in b.dram.tensors}
    assert "E0_Wg" in names and "E2_Wg" in names and "E1_Wg" not in names


# ---- validator: mutate valid streams and expect the rule and the index -----------------------------------------
def _matmul_stream() -> Builder:
    return build(lambda b: lower_matmul(b, 32, 256, 128))


def _first(b: Builder, op: Opcode) -> int:
    return next(k for k, i in enumerate(b.instrs) if i.opcode == op)


def test_validator_missing_sync() -> None:
    b = _matmul_stream()
    k = _first(b, Opcode.SYNC_WAIT)
    del b.instrs[k]
    v = check(b)
    assert v and v[0].rule == "dependency" and v[0].index == k  # the TE that now follows the loads


def test_validator_burst_alignment() -> None:
    b = _matmul_stream()
    k = _first(b, Opcode.DMA_LOAD_TILE)
    ins = b.instrs[k]
    b.instrs[k] = dataclasses.replace(ins, src0=(ins.src0 or 0) + 2)
    v = check(b)
    assert (k, "burst_alignment") in {(x.index, x.rule) for x in v}


def test_validator_dram_range() -> None:
    b = _matmul_stream()
    k = _first(b, Opcode.DMA_LOAD_TILE)
    b.instrs[k] = dataclasses.replace(b.instrs[k], src0=0x40)
    assert (k, "dram_range") in {(x.index, x.rule) for x in check(b)}


def test_validator_tile_shape_and_dtype() -> None:
    b = _matmul_stream()
    k = _first(b, Opcode.TE_MATMUL_TILE)
    ins = b.instrs[k]
    b.instrs[k] = dataclasses.replace(ins, imm={**ins.imm, "k": ins.imm["k"] + 1})
    assert (k, "tile_shape") in {(x.index, x.rule) for x in check(b)}
    b = _matmul_stream()
    b.instrs[k] = dataclasses.replace(ins, imm={**ins.imm, "dtype": "fp8"})
    assert (k, "dtype") in {(x.index, x.rule) for x in check(b)}
    b = _matmul_stream()
    b.instrs[k] = dataclasses.replace(ins, imm={**ins.imm, "dtype": "fp32"})
    assert (k, "dtype") in {(x.index, x.rule) for x in check(b)}


def test_validator_reduction_dim() -> None:
    b = build(lambda b: lower_rowwise(b, "softmax", 8, 256))
    k = _first(b, Opcode.VE_SOFTMAX_TILE)
    ins = b.instrs[k]
    b.instrs[k] = dataclasses.replace(ins, imm={**ins.imm, "reduce_len": 128})
    assert [(x.index, x.rule) for x in check(b)] == [(k, "reduction_dim")]
    b = build(lambda b: lower_rowwise(b, "rmsnorm", 8, 256))
    k = _first(b, Opcode.VE_RMSNORM_TILE)
    b.instrs[k] = dataclasses.replace(b.instrs[k], imm={**b.instrs[k].imm, "axis": 0})
    assert [(x.index, x.rule) for x in check(b)] == [(k, "reduction_dim")]


def test_validator_kv_range() -> None:
    b = build(lambda b: lower_attention(b, S=4, d=256, heads=2, kv_heads=1, head_dim=64, kv_cached=60))
    k = _first(b, Opcode.KV_LOAD_TILE)
    ins = b.instrs[k]
    b.instrs[k] = dataclasses.replace(ins, imm={**ins.imm, "kv_start": 10, "kv_len": ins.imm["kv_len"]})
    rules = {(x.index, x.rule) for x in check(b)}
    assert (k, "kv_range") in rules
    # a KV store that leaves a hole
    b = build(lambda b: lower_attention(b, S=4, d=256, heads=2, kv_heads=1, head_dim=64, kv_cached=60))
    k = _first(b, Opcode.KV_STORE_TILE)
    ins = b.instrs[k]
    b.instrs[k] = dataclasses.replace(ins, imm={**ins.imm, "pos": 62})
    assert (k, "kv_range") in {(x.index, x.rule) for x in check(b)}


def test_validator_spm_capacity() -> None:
    b = _matmul_stream()
    k = _first(b, Opcode.DMA_LOAD_TILE)
    b.instrs[k] = dataclasses.replace(b.instrs[k], dst=P.spm_bytes - 64)
    assert (k, "spm_capacity") in {(x.index, x.rule) for x in check(b)}


def test_validator_overwrite_before_sync() -> None:
    b = _matmul_stream()
    k = _first(b, Opcode.TE_MATMUL_TILE)
    a_off = b.instrs[k].src0
    # a load into the A buffer right after the TE that reads it, with no SYNC in between
    b.instrs.insert(k + 1, Instr(Opcode.DMA_LOAD_TILE, a_off, b.instrs[0].src0, None, dict(b.instrs[0].imm)))
    assert (k + 1, "dependency") in {(x.index, x.rule) for x in check(b)}


# ---- ops API -----------------------------------------------------------------------------------------------------
def test_lower_op_reports_cost_and_no_violations() -> None:
    arch = ArchConfig()
    r = lower_op(MatMulSpec(M=32, K=4096, N=1024), arch)
    assert r.violations == [] and r.n_instructions == len(r.instructions)
    assert r.analytic is not None and r.cost["dram_bytes"] == r.analytic["dram_bytes"]
    r = lower_op(AttentionSpec(S=4, d=512, heads=8, kv_heads=2, head_dim=64, kv_cached=100), arch,
                 include_instructions=False)
    assert r.instructions == [] and r.n_instructions > 0 and r.violations == []


def test_tile_that_cannot_fit_is_bad_input() -> None:
    arch = ArchConfig()
    tiny = arch.model_copy(update={"core": arch.core.model_copy(update={"spm_kb": 1})})
    with pytest.raises(BadInput) as ei:
        lower_op(RowwiseSpec(kind="softmax", M=4, N=4096), tiny)
    assert ei.value.field == "N"
    with pytest.raises(BadInput) as ei:
        lower_op(MatMulSpec(M=512, K=512, N=512), tiny)
    assert ei.value.field == "spm_bytes"
    with pytest.raises(BadInput) as ei:
        lower_op(MatMulSpec(M=4, K=4, N=4), arch, dtype="fp4")
    assert ei.value.field == "dtype"
    with pytest.raises(BadInput) as ei:
        lower_op(AttentionSpec(S=4, d=512, heads=6, kv_heads=4, head_dim=64), arch)
    assert ei.value.field == "kv_heads"


def test_an_op_too_large_to_lower_is_refused_naming_it() -> None:
    """Issue 17: one request must not build an unbounded stream: a 65536³ GEMM (~1.4e8 instructions) stops at the
    cap with 422 naming the op, and an op under the cap in the same request is still fine on its own."""
    from fastapi.testclient import TestClient

    from services.lowering.isa import MAX_STREAM_INSTRUCTIONS
    from services.root_app import create_service
    from shared.settings import Settings

    client = TestClient(create_service("lowering", Settings()))
    ok = {"kind": "matmul", "M": 1, "K": 4096, "N": 4096}
    huge = {"kind": "matmul", "M": 65536, "K": 65536, "N": 65536}
    r = client.post("/v1/lower/ops", json={"ops": [ok, huge], "include_instructions": False})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["field"] == "ops[1]" and str(MAX_STREAM_INSTRUCTIONS) in err["message"]
    assert client.post("/v1/lower/ops", json={"ops": [ok], "include_instructions": False}).status_code == 200


def test_an_op_too_large_to_lower_is_refused_before_it_takes_memory() -> None:
    """The cap is checked before the GEMM's step list is built: a 65536³ GEMM (~1.4e8 steps, GBs as a Python list)
    is refused in a process limited to 1.5 GB of address space beyond what it holds at start (it took 2.8 GB)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import resource\n"
            "from services.lowering.ops import MatMulSpec, lower_op\n"
            "from shared.configs.arch import ArchConfig\n"
            "from shared.errors import BadInput\n"
            "arch = ArchConfig()\n"
            "with open('/proc/self/status') as f:\n"
            "    vm = next(int(x.split()[1]) for x in f if x.startswith('VmSize')) * 1024\n"
            "resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 29), resource.RLIM_INFINITY))\n"
            "try:\n"
            "    lower_op(MatMulSpec(kind='matmul', M=65536, K=65536, N=65536), arch)\n"
            "except BadInput as e:\n"
            "    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={"OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("refused") and "instructions" in out.stdout
