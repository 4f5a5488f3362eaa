"""OpsBreakdown, MemoryFootprint and CommPattern: whole-model summaries of a WorkloadIR (seed 003 ``breakdown.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.workload.ir.specs import CommSpec


@dataclass(frozen=True, slots=True)
class OpsBreakdown:
    cube_ops: int
    vector_ops: int
    scalar_ops: int
    hau_ops: int
    by_op_type: dict[str, int] = field(default_factory=dict)  # total ops per op type ("matmul", "softmax", ...)
    by_layer_type: dict[str, int] = field(default_factory=dict)  # total ops per layer type ("mla", "moe", ...)

    @property
    def total(self) -> int:
        return self.cube_ops + self.vector_ops + self.scalar_ops + self.hau_ops


@dataclass(frozen=True, slots=True)
class MemoryFootprint:
    weight_bytes: int  # every parameter stored (all experts)
    active_weight_bytes: int  # the parameters one token uses (activated experts only)
    kv_cache_bytes: int  # KV cache of the whole batch at seq_len
    activation_peak_bytes: int  # largest single-op activation traffic (input + output)

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_cache_bytes + self.activation_peak_bytes


@dataclass(frozen=True, slots=True)
class CommPattern:
    entries: list[tuple[str, CommSpec]]  # (layer name, its communication hint)

    @property
    def total_bytes(self) -> int:
        return sum(c.tensor_bytes for _, c in self.entries)

    def by_pattern(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, c in self.entries:
            out[c.pattern] = out.get(c.pattern, 0) + c.tensor_bytes
        return out
