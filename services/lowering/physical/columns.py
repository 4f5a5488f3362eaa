"""Columns the physicalizer's stages share: strings coded as ints (``Strings``) and `LogicalMemory` as columns
(``LogicalMem``), coded by a run's tables (``CodeTables``: the ``carry.Context`` is one)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from shared.contracts.workload import LogicalMemory

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
B = NDArray[np.bool_]


class Strings:
    """Strings coded as ints, in order of first sight (codes never change, so coded columns stay valid)."""

    def __init__(self, first: Sequence[str] = ()) -> None:
        self._code: dict[str, int] = {}
        self._names: list[str] = []
        self._array: NDArray[np.object_] = np.zeros(0, dtype=object)
        self.codes(first)

    def codes(self, values: Sequence[str]) -> I64:
        code = self._code
        if any(v not in code for v in values):
            for v in values:
                if v not in code:
                    code[v] = len(self._names)
                    self._names.append(v)
            self._array = np.array(self._names, dtype=object)
        return np.fromiter((code[v] for v in values), dtype=np.int64, count=len(values))

    def code(self, value: str) -> int:
        return int(self.codes([value])[0])

    @property
    def names(self) -> NDArray[np.object_]:
        """Every string by its code."""
        return self._array

    def decode(self, codes: I64) -> list[str]:
        out: list[str] = self._array[codes].tolist() if codes.size else []
        return out

    def __len__(self) -> int:
        return len(self._names)


class CodeTables(Protocol):
    """The string tables memory rows are coded by."""

    tensors: Strings
    access: Strings
    hints: Strings


@dataclass
class LogicalMem:
    """`LogicalMemory` as columns (tensor, access and hint coded by the Context's tables)."""

    event_id: I64
    tensor: I64
    access: I64
    nbytes: F64
    hint: I64

    @classmethod
    def empty(cls) -> LogicalMem:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, np.zeros(0), z)

    @classmethod
    def of(cls, lm: LogicalMemory, ctx: CodeTables, idx: Sequence[int] | None = None) -> LogicalMem:
        """Rows ``idx`` of ``lm`` (all when None), in that order."""
        ev, tid, acc, nb, hint = lm.event_id, lm.tensor_id, lm.access, lm.bytes, lm.locality_hint
        if idx is not None:
            ev, nb = [ev[i] for i in idx], [nb[i] for i in idx]
            tid, acc, hint = [tid[i] for i in idx], [acc[i] for i in idx], [hint[i] for i in idx]
        if not len(ev):
            return cls.empty()
        return cls(event_id=np.asarray(ev).astype(np.int64), tensor=ctx.tensors.codes(tid),
                   access=ctx.access.codes(acc), nbytes=np.asarray(nb).astype(np.float64),
                   hint=ctx.hints.codes(hint))

    def to_contract(self, ctx: CodeTables) -> LogicalMemory:
        return LogicalMemory.model_construct(
            event_id=self.event_id.tolist(), tensor_id=ctx.tensors.decode(self.tensor),
            access=ctx.access.decode(self.access), bytes=self.nbytes.tolist(),
            locality_hint=ctx.hints.decode(self.hint))

    def __len__(self) -> int:
        return int(self.event_id.size)

    def take(self, idx: I64 | B) -> LogicalMem:
        return LogicalMem(*(getattr(self, k)[idx] for k in self.__dataclass_fields__))

    @staticmethod
    def cat(a: LogicalMem, b: LogicalMem) -> LogicalMem:
        if not len(a):
            return b
        if not len(b):
            return a
        return LogicalMem(*(np.concatenate([getattr(a, k), getattr(b, k)]) for k in a.__dataclass_fields__))


def index_of(keys: I64, values: I64) -> I64:
    """Per value: its index in ``keys`` (unique), -1 when absent (a sorted search: O((n + m) log n))."""
    if not keys.size or not values.size:
        return np.full(values.size, -1, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    at = np.minimum(np.searchsorted(keys[order], values), keys.size - 1)
    out: I64 = np.where(keys[order][at] == values, order[at], -1)
    return out
