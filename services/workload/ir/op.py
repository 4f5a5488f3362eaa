"""Op: one operator of a layer with its compute, memory and shapes (seed 003 ``op.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.workload.ir.specs import ComputeSpec, MemorySpec
from services.workload.ir.tensor import TensorDesc


@dataclass(frozen=True, slots=True)
class Op:
    name: str  # "layers.0.attn.q_proj"
    op_type: str  # "matmul", "softmax", "rmsnorm", "silu_mul", "topk", "gather", "dispatch", "combine"
    compute: ComputeSpec
    memory: MemorySpec
    inputs: list[TensorDesc] = field(default_factory=list)
    outputs: list[TensorDesc] = field(default_factory=list)
    # dtype_bytes; params_total / params_active (weight elements stored / used per token); role (e.g. "expert")
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def params_total(self) -> int:
        return int(self.attrs.get("params_total", 0))

    @property
    def params_active(self) -> int:
        return int(self.attrs.get("params_active", self.attrs.get("params_total", 0)))
