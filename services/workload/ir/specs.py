"""ComputeSpec, MemorySpec and CommSpec (seed 003 ``specs.py``).

Units: operations (FLOPs: a multiply-add counts 2) and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class ComputeSpec:
    cube_ops: int = 0  # GEMM FLOPs: 2·M·N·K
    vector_ops: int = 0  # element-wise / reduction work (softmax 5/elem, RMSNorm 3/elem, SiLU·mul, top-k)
    scalar_ops: int = 0
    hau_ops: int = 0  # hardware-accelerated units (none of our ops use them yet)

    @property
    def total(self) -> int:
        return self.cube_ops + self.vector_ops + self.scalar_ops + self.hau_ops

    def __add__(self, other: ComputeSpec) -> ComputeSpec:
        return ComputeSpec(self.cube_ops + other.cube_ops, self.vector_ops + other.vector_ops,
                           self.scalar_ops + other.scalar_ops, self.hau_ops + other.hau_ops)


@dataclass(frozen=True, slots=True)
class MemorySpec:
    weight_bytes: int = 0  # weights this op reads for the batch
    activation_bytes: int = 0  # activations (and KV cache) this op reads
    read_bytes: int = 0  # total bytes read = weights + activations
    write_bytes: int = 0  # total bytes written (outputs, new KV entries)

    def __add__(self, other: MemorySpec) -> MemorySpec:
        return MemorySpec(self.weight_bytes + other.weight_bytes, self.activation_bytes + other.activation_bytes,
                          self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes)


CommPatternName = Literal["allreduce", "allgather", "p2p", "all2all"]
CommScope = Literal["tp_group", "dp_group", "ep_group"]


@dataclass(frozen=True, slots=True)
class CommSpec:
    """A hint that the layer needs distributed communication; L3 inserts the real collective."""

    pattern: CommPatternName
    tensor_bytes: int  # bytes moved by one instance of the collective
    participants: int  # chips taking part (for EP: the number of routed experts)
    scope: CommScope
