"""Chiplet stage decomposition (seed 000): host transfers, attention / FFN / LayerNorm / Softmax / MoE gating stages.

Every stage has a ``type`` and a ``metadata`` map with the seed's keys (``host_kind``, ``nonlinear_kind``, ``op``,
``reduce_kind``, ``randomize_experts``, ``selected_experts``, ``weight_tag``/``tile_id``/``array_id``); the command a
chiplet runs (``pe_cmd_*``) follows the seed's tables. Host transfers are ``type = "transfer"`` with a
``direction`` and ``metadata.host_kind``; their bytes are counted per host kind in the block's cost.

MoE gating: ``selected_experts`` is drawn from ``candidate_experts`` with a generator seeded by the stage name and
the layer number (CRC-32 of ``"<stage name>:<layer>"``), so the draw is reproducible across processes.
"""

from __future__ import annotations

import zlib
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.lowering.costmodel import dtype_bytes, gemm_cost_for_arch, vector_cost
from shared.configs.arch import ArchConfig
from shared.errors import BadInput
from shared.limits import MAX_EXPERTS, MAX_ITEMS, MAX_LAYERS, MAX_STAGES, Dim, DimOrZero, Experts

HostKind = Literal["kv_cache", "weight", "weight_meta"]
Direction = Literal["host_to_digital", "digital_to_host", "digital_to_rram"]

# seed 000 "LayerNorm / Softmax 细化" table: stage -> chiplet command
REFINE_COMMANDS: dict[str, str] = {
    "reduce_mean": "pe_cmd_reduce",
    "reduce_var": "pe_cmd_reduce",
    "layernorm_norm": "pe_cmd_spu_op",
    "layernorm_affine": "pe_cmd_vpu_op",
    "softmax_max": "pe_cmd_reduce",
    "softmax_sub": "pe_cmd_spu_op",
    "softmax_exp": "pe_cmd_vpu_op",
    "softmax_sum": "pe_cmd_reduce",
    "softmax_norm": "pe_cmd_spu_op",
}
# the attention section's names of the softmax sub-steps, kept in metadata.op
SOFTMAX_OPS = {"softmax_max": "reduce_max", "softmax_sub": "spu_sub", "softmax_exp": "vpu_exp",
               "softmax_sum": "reduce_sum", "softmax_norm": "spu_div"}


class Stage(BaseModel):
    name: str
    type: str  # transfer | attention | postprocess | softmax | layernorm | rram_linear | nonlinear | residual | moe
    layer: int
    command: str  # pe_cmd_dma | pe_cmd_gemm | pe_cmd_reduce | pe_cmd_spu_op | pe_cmd_vpu_op | pe_cmd_rram_mvm
    chiplet: Literal["host", "digital", "rram"]
    direction: Direction | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    bytes: float = 0.0  # data moved (transfers) or touched (compute)
    flops: float = 0.0
    cycles: float = 0.0  # compute stages: on one core of arch.core (analytic model)


class BlockSpec(BaseModel):
    """One transformer block to decompose."""

    model_config = ConfigDict(extra="forbid")

    layer: int = Field(default=0, ge=0, le=MAX_LAYERS)
    tokens: Dim = 1  # S: tokens processed in this step
    d: Dim = 4096
    heads: Dim = 32
    kv_heads: Dim = 8
    head_dim: Dim = 128
    kv_cached: DimOrZero = 0
    ffn: Literal["swiglu", "gelu", "moe"] = "moe"
    f: Dim = 14336
    n_experts: Experts = 8
    topk: Experts = 2
    candidate_experts: list[int] | None = Field(default=None, max_length=MAX_EXPERTS)  # default: all
    randomize_experts: bool = True
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    first_load: bool = False  # include host2d_weight / host2c_weight stages (weights not yet on the chip)
    write_kv: bool = True  # include d2host_kv_cache
    cim_experts: bool = True  # experts live in RRAM chiplets (host2c_weight) rather than digital
    dtype: str | None = None

    @model_validator(mode="after")
    def _check(self) -> BlockSpec:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.ffn == "moe" and self.topk > self.n_experts:
            raise ValueError(f"topk ({self.topk}) must be <= n_experts ({self.n_experts})")
        return self


class StagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    blocks: list[BlockSpec] = Field(min_length=1, max_length=MAX_ITEMS)
    arch: ArchConfig = Field(default_factory=ArchConfig)

    @field_validator("blocks")
    @classmethod
    def _bounded(cls, blocks: list[BlockSpec]) -> list[BlockSpec]:
        # a block lowers to ~30 stages plus ~5 per selected expert (8 with first_load): bound the whole answer
        n = sum(30 + 8 * (b.topk if b.ffn == "moe" else 0) for b in blocks)
        if n > MAX_STAGES:
            raise ValueError(f"the blocks lower to about {n} stages; at most {MAX_STAGES} in one request (fewer "
                             "blocks or a smaller topk)")
        return blocks


class StagesResult(BaseModel):
    stages: list[Stage]
    host_dma_bytes: dict[str, float]  # per host_kind
    totals: dict[str, float]


def stage_seed(stage_name: str, layer: int) -> int:
    return zlib.crc32(f"{stage_name}:{layer}".encode())


def select_experts(stage_name: str, layer: int, candidates: list[int], topk: int) -> list[int]:
    """Seed 000 MoE gating step 3: reproducible random choice of ``topk`` of ``candidates``."""
    if topk > len(candidates):
        raise BadInput(f"topk {topk} > {len(candidates)} candidate experts", field="topk")
    rng = np.random.default_rng(stage_seed(stage_name, layer))
    pick = rng.choice(len(candidates), size=topk, replace=False)
    return sorted(candidates[int(i)] for i in pick)


def _transfer(name: str, layer: int, direction: Direction, host_kind: HostKind, nbytes: float,
              **meta: Any) -> Stage:
    chiplet: Literal["host", "digital", "rram"] = "rram" if direction == "digital_to_rram" else "host"
    return Stage(name=name, type="transfer", layer=layer, command="pe_cmd_dma", chiplet=chiplet,
                 direction=direction, metadata={"host_kind": host_kind, **meta}, bytes=nbytes)


def host2c_weight(layer: int, weight_tag: str, nbytes: float, tile_id: int, array_id: int) -> list[Stage]:
    """CIM weight fill: Host → Digital, then Digital → RRAM, both tagged with ``weight_tag``."""
    return [
        _transfer(f"L{layer}.host2d_weight.{weight_tag}", layer, "host_to_digital", "weight", nbytes,
                  weight_tag=weight_tag),
        _transfer(f"L{layer}.d2c_weight.{weight_tag}", layer, "digital_to_rram", "weight", nbytes,
                  weight_tag=weight_tag, tile_id=tile_id, array_id=array_id),
    ]


def _vec(name: str, layer: int, typ: str, cmd: str, elems: float, ve_op: str, arch: ArchConfig, eb: int,
         **meta: Any) -> Stage:
    vc = vector_cost(ve_op, elems, vector_width=arch.core.vector_width, arch=arch)
    return Stage(name=name, type=typ, layer=layer, command=cmd, chiplet="digital", metadata=meta,
                 bytes=2 * elems * eb, flops=elems, cycles=vc.cycles)


def _gemm(name: str, layer: int, typ: str, M: int, K: int, N: int, arch: ArchConfig, dtype: str,
          chiplet: Literal["digital", "rram"] = "digital", **meta: Any) -> Stage:
    g = gemm_cost_for_arch(M, K, N, arch, dtype=dtype)
    cmd = "pe_cmd_rram_mvm" if chiplet == "rram" else "pe_cmd_gemm"
    return Stage(name=name, type=typ, layer=layer, command=cmd, chiplet=chiplet, metadata={"M": M, "K": K, "N": N,
                 **meta}, bytes=g.dram_bytes, flops=2.0 * M * K * N, cycles=g.total_cycles)


def norm_stages(layer: int, rows: int, d: int, kind: str, arch: ArchConfig, eb: int, prefix: str) -> list[Stage]:
    n = float(rows) * d
    if kind == "layernorm":
        return [
            _vec(f"{prefix}.reduce_mean", layer, "layernorm", REFINE_COMMANDS["reduce_mean"], n, "add", arch, eb,
                 op="layernorm_mean", nonlinear_kind="layernorm"),
            _vec(f"{prefix}.reduce_var", layer, "layernorm", REFINE_COMMANDS["reduce_var"], n, "mul", arch, eb,
                 op="layernorm_var", nonlinear_kind="layernorm"),
            _vec(f"{prefix}.layernorm_norm", layer, "layernorm", REFINE_COMMANDS["layernorm_norm"], n, "mul", arch,
                 eb, op="layernorm_norm", nonlinear_kind="layernorm"),
            _vec(f"{prefix}.layernorm_affine", layer, "layernorm", REFINE_COMMANDS["layernorm_affine"], n, "add",
                 arch, eb, op="layernorm_affine", nonlinear_kind="layernorm"),
        ]
    # RMSNorm: the mean-of-squares reduction, then the normalise and scale steps (no mean/bias)
    return [
        _vec(f"{prefix}.reduce_var", layer, "layernorm", REFINE_COMMANDS["reduce_var"], n, "mul", arch, eb,
             op="rmsnorm_ms", nonlinear_kind="rmsnorm"),
        _vec(f"{prefix}.layernorm_norm", layer, "layernorm", REFINE_COMMANDS["layernorm_norm"], n, "mul", arch, eb,
             op="rmsnorm_norm", nonlinear_kind="rmsnorm"),
        _vec(f"{prefix}.layernorm_affine", layer, "layernorm", REFINE_COMMANDS["layernorm_affine"], n, "mul", arch,
             eb, op="rmsnorm_scale", nonlinear_kind="rmsnorm"),
    ]


def softmax_stages(layer: int, rows: int, cols: int, arch: ArchConfig, eb: int, prefix: str) -> list[Stage]:
    n = float(rows) * cols
    kinds = {"softmax_max": "add", "softmax_sub": "add", "softmax_exp": "gelu", "softmax_sum": "add",
             "softmax_norm": "mul"}  # exp priced like the polynomial GELU pass count
    return [_vec(f"{prefix}.{s}", layer, "softmax", REFINE_COMMANDS[s], n, kinds[s], arch, eb, op=SOFTMAX_OPS[s],
                 nonlinear_kind="softmax") for s in REFINE_COMMANDS if s.startswith("softmax")]


def decompose_block(spec: BlockSpec, arch: ArchConfig) -> list[Stage]:
    dt = spec.dtype or arch.core.dtype
    eb = dtype_bytes(dt)
    ly, S, d = spec.layer, spec.tokens, spec.d
    hd, H, Hkv = spec.head_dim, spec.heads, spec.kv_heads
    L = spec.kv_cached + S
    p = f"L{ly}"
    out: list[Stage] = []
    # ---- attention ----
    if spec.first_load:
        wbytes = float(d) * (H + 2 * Hkv) * hd * eb + float(H) * hd * d * eb
        out.append(_transfer(f"{p}.host2d_weight.attn", ly, "host_to_digital", "weight", wbytes,
                             weight_tag=f"{p}.attn"))
        out.append(_transfer(f"{p}.host2d_meta.attn", ly, "host_to_digital", "weight_meta", 4.0 * (H + 2 * Hkv) * hd,
                             weight_tag=f"{p}.attn"))
    out.append(_transfer(f"{p}.host2d_kv_cache", ly, "host_to_digital", "kv_cache",
                         float(S) * d * eb + 2.0 * spec.kv_cached * Hkv * hd * eb))
    out.extend(norm_stages(ly, S, d, spec.norm, arch, eb, f"{p}.attn_norm"))
    out.append(_gemm(f"{p}.attention.qkv", ly, "attention", S, d, (H + 2 * Hkv) * hd, arch, dt))
    out.append(_gemm(f"{p}.attention.scores", ly, "attention", S, hd, L * H, arch, dt, heads=H))
    out.extend(softmax_stages(ly, S * H, L, arch, eb, f"{p}.attention"))
    out.append(_gemm(f"{p}.attention.av", ly, "attention", S, L, hd * H, arch, dt, heads=H))
    out.append(_gemm(f"{p}.postprocess.out_proj", ly, "postprocess", S, H * hd, d, arch, dt))
    out.append(_vec(f"{p}.postprocess.residual", ly, "postprocess", "pe_cmd_vpu_op", float(S) * d, "add", arch, eb))
    if spec.write_kv:
        out.append(_transfer(f"{p}.d2host_kv_cache", ly, "digital_to_host", "kv_cache", 2.0 * S * Hkv * hd * eb))
    # ---- FFN / MoE ----
    out.extend(norm_stages(ly, S, d, spec.norm, arch, eb, f"{p}.ffn_norm"))
    if spec.ffn == "moe":
        cands = spec.candidate_experts if spec.candidate_experts is not None else list(range(spec.n_experts))
        bad = [e for e in cands if not 0 <= e < spec.n_experts]
        if bad:
            raise BadInput(f"candidate expert {bad[0]} outside 0..{spec.n_experts - 1}", field="candidate_experts")
        out.append(_gemm(f"{p}.moe_gating_scores", ly, "moe", S, d, spec.n_experts, arch, dt))
        out[-1] = out[-1].model_copy(update={"command": "pe_cmd_vpu_op"})  # SPU/VPU logits (seed: gating on SPU/VPU)
        topk = _vec(f"{p}.topk_select", ly, "moe", "pe_cmd_reduce", float(S) * spec.n_experts, "topk", arch, eb,
                    reduce_kind="topk", k=spec.topk)
        name = f"{p}.topk_select"
        selected = (select_experts(name, ly, cands, spec.topk) if spec.randomize_experts
                    else sorted(cands)[: spec.topk])
        topk.metadata.update(randomize_experts=spec.randomize_experts, candidate_experts=cands,
                             selected_experts=selected)
        out.append(topk)
        chiplet: Literal["digital", "rram"] = "rram" if spec.cim_experts else "digital"
        for i, e in enumerate(selected):
            tag = f"{p}.E{e}"
            if spec.first_load:
                wb = 3.0 * d * spec.f * eb
                if spec.cim_experts:
                    out.extend(host2c_weight(ly, tag, wb, tile_id=e, array_id=i))
                else:
                    out.append(_transfer(f"{p}.host2d_weight.E{e}", ly, "host_to_digital", "weight", wb,
                                         weight_tag=tag))
                out.append(_transfer(f"{p}.host2d_meta.E{e}", ly, "host_to_digital", "weight_meta", 4.0 * 3 * spec.f,
                                     weight_tag=tag))
            # tokens routed to this expert: S·topk spread over the selected experts
            t = max(1, round(S * spec.topk / len(selected)))
            out.append(_gemm(f"{p}.moe_linear.E{e}", ly, "moe", t, d, 3 * spec.f, arch, dt, chiplet=chiplet,
                             expert=e, selected_experts=selected, weight_tag=tag, tile_id=e, array_id=i))
            out.append(_vec(f"{p}.moe_linear.E{e}.nonlinear", ly, "nonlinear", "pe_cmd_vpu_op", float(t) * spec.f,
                            "silu", arch, eb, nonlinear_kind="swiglu", expert=e))
        out.append(_vec(f"{p}.moe_merge", ly, "moe", "pe_cmd_vpu_op", float(S) * d * spec.topk, "add", arch, eb,
                        selected_experts=selected))
    else:
        if spec.first_load:
            n_mats = 3 if spec.ffn == "swiglu" else 2
            out.append(_transfer(f"{p}.host2d_weight.ffn", ly, "host_to_digital", "weight",
                                 float(n_mats) * d * spec.f * eb, weight_tag=f"{p}.ffn"))
        n_up = 2 if spec.ffn == "swiglu" else 1
        out.append(_gemm(f"{p}.rram_linear.up", ly, "rram_linear", S, d, n_up * spec.f, arch, dt))
        out.append(_vec(f"{p}.nonlinear", ly, "nonlinear", "pe_cmd_vpu_op", float(S) * spec.f,
                        "silu" if spec.ffn == "swiglu" else "gelu", arch, eb, nonlinear_kind=spec.ffn))
        out.append(_gemm(f"{p}.rram_linear.down", ly, "rram_linear", S, spec.f, d, arch, dt))
    out.append(_vec(f"{p}.residual", ly, "residual", "pe_cmd_vpu_op", float(S) * d, "add", arch, eb))
    return out


def decompose(req: StagesRequest) -> StagesResult:
    stages: list[Stage] = []
    for i, blk in enumerate(req.blocks):
        try:
            stages.extend(decompose_block(blk, req.arch))
        except BadInput as exc:
            raise BadInput(exc.message, field=f"blocks[{i}].{exc.field}" if exc.field else f"blocks[{i}]") from None
    host: dict[str, float] = {"kv_cache": 0.0, "weight": 0.0, "weight_meta": 0.0}
    for s in stages:
        if s.type == "transfer" and s.direction in ("host_to_digital", "digital_to_host"):
            host[str(s.metadata["host_kind"])] += s.bytes
    totals = {"stages": float(len(stages)), "flops": sum(s.flops for s in stages),
              "cycles": sum(s.cycles for s in stages), "host_dma_bytes": sum(host.values())}
    return StagesResult(stages=stages, host_dma_bytes=host, totals=totals)
