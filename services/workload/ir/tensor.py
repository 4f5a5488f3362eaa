"""TensorDesc: shape, dtype and size of a tensor in the WorkloadIR (seed 003 ``tensor.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int32": 4}


@dataclass(frozen=True, slots=True)
class TensorDesc:
    name: str
    shape: tuple[int, ...]
    dtype: str = "bf16"

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        return self.numel * self.dtype_bytes
