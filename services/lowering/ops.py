"""Op specs (the ``POST /v1/lower/ops`` body) and ``lower_op``: spec → validated ISA stream + cost."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.lowering.costmodel import dtype_bytes, gemm_cost_for_arch
from services.lowering.isa import MAX_STREAM_INSTRUCTIONS, Builder, DeviceProfile
from services.lowering.lower import (
    kv_regions,
    lower_attention,
    lower_conv2d,
    lower_ffn,
    lower_matmul,
    lower_moe_experts,
    lower_qkv,
    lower_rowwise,
    lower_swiglu_ffn,
)
from services.lowering.streamcost import stream_cost
from services.lowering.validate import StreamValidator
from shared.configs.arch import ArchConfig
from shared.errors import BadInput
from shared.limits import MAX_DIM, MAX_EXPERTS, MAX_ITEMS, Dim, DimOrZero


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MatMulSpec(_Spec):
    kind: Literal["matmul"] = "matmul"
    M: Dim
    K: Dim
    N: Dim


class Conv2dSpec(_Spec):
    kind: Literal["conv2d"] = "conv2d"
    batch: Dim = 1
    cin: Dim
    h: Dim
    w: Dim
    cout: Dim
    kh: Dim
    kw: Dim
    stride: Dim = 1
    pad: int = Field(default=0, ge=0, le=MAX_DIM)


class FfnSpec(_Spec):
    kind: Literal["ffn"] = "ffn"
    M: Dim
    d: Dim
    f: Dim
    act: Literal["gelu", "silu"] = "gelu"


class SwigluSpec(_Spec):
    kind: Literal["swiglu_ffn"] = "swiglu_ffn"
    M: Dim
    d: Dim
    f: Dim


class RowwiseSpec(_Spec):
    kind: Literal["rmsnorm", "layernorm", "softmax", "gelu", "bias_add"]
    M: Dim
    N: Dim


class QkvSpec(_Spec):
    kind: Literal["qkv"] = "qkv"
    M: Dim
    d: Dim
    d_q: Dim
    d_kv: Dim


class AttentionSpec(_Spec):
    kind: Literal["attention"] = "attention"
    S: Dim
    d: Dim
    heads: Dim
    kv_heads: Dim
    head_dim: Dim
    kv_cached: DimOrZero = 0
    max_seq: Dim | None = None


class MoeExpertsSpec(_Spec):
    kind: Literal["moe_experts"] = "moe_experts"
    tokens_per_expert: list[DimOrZero] = Field(min_length=1, max_length=MAX_EXPERTS)
    d: Dim
    f: Dim


OpSpec = Annotated[MatMulSpec | Conv2dSpec | FfnSpec | SwigluSpec | RowwiseSpec | QkvSpec | AttentionSpec
                   | MoeExpertsSpec, Field(discriminator="kind")]


class LowerOpsRequest(_Spec):
    ops: list[OpSpec] = Field(min_length=1, max_length=MAX_ITEMS)
    arch: ArchConfig = Field(default_factory=ArchConfig)
    dtype: str | None = None  # overrides arch.core.dtype
    include_instructions: bool = True
    max_instructions: Dim | None = None  # truncate the returned stream (the cost covers all of it)


class LoweredOp(BaseModel):
    kind: str
    n_instructions: int
    instructions: list[tuple[str, int | None, int | None, int | None, dict[str, Any]]]
    truncated: bool
    violations: list[dict[str, Any]]
    cost: dict[str, Any]
    analytic: dict[str, Any] | None = None  # the closed-form GEMM cost (matmul only)
    spm_peak_bytes: int
    dram_tensors: dict[str, dict[str, Any]]


class LowerOpsResponse(BaseModel):
    results: list[LoweredOp]


def profile_for(arch: ArchConfig, dtype: str | None) -> DeviceProfile:
    p = DeviceProfile.from_arch(arch)
    if dtype is not None:
        dtype_bytes(dtype, "dtype")
        p = DeviceProfile(spm_bytes=p.spm_bytes, array=p.array, burst_bytes=p.burst_bytes, dtype=dtype,
                          vector_width=p.vector_width, dma_bytes_per_cycle=p.dma_bytes_per_cycle, dataflow=p.dataflow)
    return p


def build_stream(spec: Any, profile: DeviceProfile) -> Builder:
    b = Builder(profile)
    if isinstance(spec, MatMulSpec):
        lower_matmul(b, spec.M, spec.K, spec.N)
    elif isinstance(spec, Conv2dSpec):
        lower_conv2d(b, batch=spec.batch, cin=spec.cin, h=spec.h, w=spec.w, cout=spec.cout, kh=spec.kh, kw=spec.kw,
                     stride=spec.stride, pad=spec.pad)
    elif isinstance(spec, FfnSpec):
        lower_ffn(b, spec.M, spec.d, spec.f, act=spec.act)
    elif isinstance(spec, SwigluSpec):
        lower_swiglu_ffn(b, spec.M, spec.d, spec.f)
    elif isinstance(spec, RowwiseSpec):
        lower_rowwise(b, "bias" if spec.kind == "bias_add" else spec.kind, spec.M, spec.N)
    elif isinstance(spec, QkvSpec):
        lower_qkv(b, spec.M, spec.d, spec.d_q, spec.d_kv)
    elif isinstance(spec, AttentionSpec):
        lower_attention(b, S=spec.S, d=spec.d, heads=spec.heads, kv_heads=spec.kv_heads, head_dim=spec.head_dim,
                        kv_cached=spec.kv_cached, max_seq=spec.max_seq)
    elif isinstance(spec, MoeExpertsSpec):
        lower_moe_experts(b, spec.tokens_per_expert, spec.d, spec.f)
    else:  # pragma: no cover - the union is closed
        raise BadInput(f"unknown op {spec!r}", field="kind")
    return b


def validator_for(b: Builder) -> StreamValidator:
    p = b.profile
    return StreamValidator(p.spm_bytes, p.burst_bytes, b.dram.regions(), kv_regions(b))


def lower_op(spec: Any, arch: ArchConfig, *, dtype: str | None = None, include_instructions: bool = True,
             max_instructions: int | None = None) -> LoweredOp:
    profile = profile_for(arch, dtype)
    b = build_stream(spec, profile)
    violations = validator_for(b).validate(b.instrs)
    cost = stream_cost(b.instrs, profile, arch)
    instrs = b.tuples() if include_instructions else []
    truncated = max_instructions is not None and len(instrs) > max_instructions
    if max_instructions is not None:
        instrs = instrs[:max_instructions]
    analytic = None
    if isinstance(spec, MatMulSpec):
        analytic = gemm_cost_for_arch(spec.M, spec.K, spec.N, arch, dtype=profile.dtype).to_dict()
    return LoweredOp(
        kind=spec.kind, n_instructions=len(b.instrs), instructions=instrs, truncated=truncated,
        violations=[v.as_dict() for v in violations], cost=cost.to_dict(), analytic=analytic,
        spm_peak_bytes=b.spm.peak,
        dram_tensors={t.name: {"addr": t.addr, "rows": t.rows, "cols": t.cols, "dtype": t.dtype, "pitch": t.pitch}
                      for t in b.dram.tensors},
    )


def lower_ops(req: LowerOpsRequest) -> LowerOpsResponse:
    """Each op lowered; the ops of one request together emit at most ``MAX_STREAM_INSTRUCTIONS`` (one op's bound;
    4096 ops of 2048^3 GEMMs took minutes; four 4096^3 ones, 133k instructions, 1.2 s here), a 422 naming the op
    past it."""
    out = []
    total = 0
    for i, spec in enumerate(req.ops):
        try:
            out.append(lower_op(spec, req.arch, dtype=req.dtype, include_instructions=req.include_instructions,
                                max_instructions=req.max_instructions))
        except BadInput as exc:
            field = exc.field if exc.field == "dtype" else f"ops[{i}].{exc.field}" if exc.field else f"ops[{i}]"
            raise BadInput(exc.message, field=field) from None
        total += out[-1].n_instructions
        if total > MAX_STREAM_INSTRUCTIONS and i + 1 < len(req.ops):
            raise BadInput(f"ops[0..{i}] lower to {total} instructions, more than the {MAX_STREAM_INSTRUCTIONS} a "
                           "request may emit; send the ops in several requests", field=f"ops[{i + 1}]")
    return LowerOpsResponse(results=out)
