"""Op specs (the ``POST /v1/lower/ops`` body) and ``lower_op``: spec → validated ISA stream + cost."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from services.lowering.costmodel import dtype_bytes, gemm_cost_for_arch
from services.lowering.isa import Builder, DeviceProfile
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


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MatMulSpec(_Spec):
    kind: Literal["matmul"] = "matmul"
    M: PositiveInt
    K: PositiveInt
    N: PositiveInt


class Conv2dSpec(_Spec):
    kind: Literal["conv2d"] = "conv2d"
    batch: PositiveInt = 1
    cin: PositiveInt
    h: PositiveInt
    w: PositiveInt
    cout: PositiveInt
    kh: PositiveInt
    kw: PositiveInt
    stride: PositiveInt = 1
    pad: int = Field(default=0, ge=0)


class FfnSpec(_Spec):
    kind: Literal["ffn"] = "ffn"
    M: PositiveInt
    d: PositiveInt
    f: PositiveInt
    act: Literal["gelu", "silu"] = "gelu"


class SwigluSpec(_Spec):
    kind: Literal["swiglu_ffn"] = "swiglu_ffn"
    M: PositiveInt
    d: PositiveInt
    f: PositiveInt


class RowwiseSpec(_Spec):
    kind: Literal["rmsnorm", "layernorm", "softmax", "gelu", "bias_add"]
    M: PositiveInt
    N: PositiveInt


class QkvSpec(_Spec):
    kind: Literal["qkv"] = "qkv"
    M: PositiveInt
    d: PositiveInt
    d_q: PositiveInt
    d_kv: PositiveInt


class AttentionSpec(_Spec):
    kind: Literal["attention"] = "attention"
    S: PositiveInt
    d: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    kv_cached: int = Field(default=0, ge=0)
    max_seq: PositiveInt | None = None


class MoeExpertsSpec(_Spec):
    kind: Literal["moe_experts"] = "moe_experts"
    tokens_per_expert: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    d: PositiveInt
    f: PositiveInt


OpSpec = Annotated[MatMulSpec | Conv2dSpec | FfnSpec | SwigluSpec | RowwiseSpec | QkvSpec | AttentionSpec
                   | MoeExpertsSpec, Field(discriminator="kind")]


class LowerOpsRequest(_Spec):
    ops: list[OpSpec] = Field(min_length=1)
    arch: ArchConfig = Field(default_factory=ArchConfig)
    dtype: str | None = None  # overrides arch.core.dtype
    include_instructions: bool = True
    max_instructions: PositiveInt | None = None  # truncate the returned stream (the cost covers all of it)


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
    out = []
    for i, spec in enumerate(req.ops):
        try:
            out.append(lower_op(spec, req.arch, dtype=req.dtype, include_instructions=req.include_instructions,
                                max_instructions=req.max_instructions))
        except BadInput as exc:
            field = exc.field if exc.field == "dtype" else f"ops[{i}].{exc.field}" if exc.field else f"ops[{i}]"
            raise BadInput(exc.message, field=field) from None
    return LowerOpsResponse(results=out)
