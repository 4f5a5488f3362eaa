"""Layer: a named group of ops with its tensors, parameters and communication hint (seed 003 ``layer.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.workload.ir.op import Op
from services.workload.ir.specs import CommSpec, ComputeSpec, MemorySpec
from services.workload.ir.tensor import TensorDesc


@dataclass(frozen=True, slots=True)
class Layer:
    name: str  # "layers.0.mla"
    op_type: str  # "embedding", "attention", "mla", "mla_absorb", "ffn", "moe", "lm_head"
    inputs: list[TensorDesc]
    outputs: list[TensorDesc]
    ops: list[Op]
    comm: CommSpec | None = None
    params: dict[str, Any] = field(default_factory=dict)  # hidden_size, num_heads, layer index, ...

    @property
    def index(self) -> int:
        """Transformer block index (-1 for embedding, num_layers for the LM head)."""
        return int(self.params.get("layer", -1))

    @property
    def compute(self) -> ComputeSpec:
        out = ComputeSpec()
        for op in self.ops:
            out = out + op.compute
        return out

    @property
    def memory(self) -> MemorySpec:
        out = MemorySpec()
        for op in self.ops:
            out = out + op.memory
        return out

    @property
    def params_total(self) -> int:
        return sum(op.params_total for op in self.ops)

    @property
    def params_active(self) -> int:
        return sum(op.params_active for op in self.ops)
