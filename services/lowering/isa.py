"""Tile ISA (seed 002): instructions, device profile, SPM/DRAM allocation and the stream builder.

An instruction is ``(opcode, dst, src0, src1, imm)``:

- SPM operands are byte offsets into the scratchpad; DRAM operands are byte addresses; ``imm`` carries the tile
  shape (``rows``, ``cols``), ``dtype`` and the op's parameters (``acc`` for K accumulation, ``axis``/``reduce_len``
  for reductions, ``head``/``kind``/``pos``/``kv_len`` for KV ops, ``stride`` = DRAM row pitch in bytes).
- ``DMA_LOAD_TILE spm, dram`` / ``DMA_STORE_TILE dram, spm`` move one 2-D tile; ``TE_*`` run on the systolic array,
  ``VE_*`` on the vector unit; ``KV_STORE_TILE kv_addr, spm`` / ``KV_LOAD_TILE spm, kv_addr`` move K/V rows of one
  head; ``SYNC_WAIT`` waits for every outstanding DMA/KV transfer and compute op (a full fence).

SYNC rules (seed §13), enforced by the validator and followed by every lowering: a DMA/KV load must be followed by a
SYNC before anything reads its buffer; accumulating MatMul tiles into one buffer need a SYNC between them; a buffer
written by TE/VE needs a SYNC before a DMA/KV store reads it; a buffer with an outstanding reader (a store or a
compute op) needs a SYNC before a load overwrites it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from services.lowering.costmodel import ACC_BYTES, dtype_bytes
from shared.configs.arch import ArchConfig
from shared.errors import BadInput


class Opcode(StrEnum):
    DMA_LOAD_TILE = "DMA_LOAD_TILE"
    DMA_STORE_TILE = "DMA_STORE_TILE"
    TE_MATMUL_TILE = "TE_MATMUL_TILE"
    TE_QKT_TILE = "TE_QKT_TILE"
    TE_AV_TILE = "TE_AV_TILE"
    VE_ADD_TILE = "VE_ADD_TILE"
    VE_MUL_TILE = "VE_MUL_TILE"
    VE_GELU_TILE = "VE_GELU_TILE"
    VE_SILU_TILE = "VE_SILU_TILE"
    VE_RMSNORM_TILE = "VE_RMSNORM_TILE"
    VE_LAYERNORM_TILE = "VE_LAYERNORM_TILE"
    VE_SOFTMAX_TILE = "VE_SOFTMAX_TILE"
    KV_STORE_TILE = "KV_STORE_TILE"
    KV_LOAD_TILE = "KV_LOAD_TILE"
    SYNC_WAIT = "SYNC_WAIT"


TE_OPS = {Opcode.TE_MATMUL_TILE, Opcode.TE_QKT_TILE, Opcode.TE_AV_TILE}
VE_REDUCE = {Opcode.VE_RMSNORM_TILE, Opcode.VE_LAYERNORM_TILE, Opcode.VE_SOFTMAX_TILE}
VE_ELTWISE = {Opcode.VE_ADD_TILE, Opcode.VE_MUL_TILE, Opcode.VE_GELU_TILE, Opcode.VE_SILU_TILE}
VE_OPS = VE_REDUCE | VE_ELTWISE
LOADS = {Opcode.DMA_LOAD_TILE, Opcode.KV_LOAD_TILE}
STORES = {Opcode.DMA_STORE_TILE, Opcode.KV_STORE_TILE}


@dataclass(frozen=True)
class Instr:
    opcode: Opcode
    dst: int | None
    src0: int | None
    src1: int | None
    imm: dict[str, Any]

    def as_tuple(self) -> tuple[str, int | None, int | None, int | None, dict[str, Any]]:
        return (self.opcode.value, self.dst, self.src0, self.src1, self.imm)

    @classmethod
    def from_tuple(cls, t: Any) -> Instr:
        op, dst, s0, s1, imm = t
        return cls(Opcode(op), dst, s0, s1, dict(imm or {}))


@dataclass(frozen=True)
class DeviceProfile:
    """What tiling needs to know about one core (from ``arch.core``)."""

    spm_bytes: int = 512 * 1024
    array: tuple[int, int] = (32, 32)
    burst_bytes: int = 64
    dtype: str = "bf16"
    vector_width: int = 64
    dma_bytes_per_cycle: int = 64
    dataflow: str = "ws"

    @classmethod
    def from_arch(cls, arch: ArchConfig) -> DeviceProfile:
        c = arch.core
        return cls(spm_bytes=c.spm_kb * 1024, array=c.array, burst_bytes=c.dma_burst_bytes, dtype=c.dtype,
                   vector_width=c.vector_width, dma_bytes_per_cycle=c.dma_bytes_per_cycle, dataflow=c.dataflow)

    @property
    def elem(self) -> int:
        return dtype_bytes(self.dtype)


# ---- DRAM --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DramTensor:
    """A row-major 2-D tensor in DRAM; rows are padded to a burst multiple (``pitch`` bytes)."""

    name: str
    addr: int
    rows: int
    cols: int
    dtype: str
    pitch: int
    gather: dict[str, Any] | None = None  # e.g. im2col: loads gather patches from the source tensor's region
    region_bytes: int = 0  # bytes of the DRAM region the tile addresses must stay in

    def tile_addr(self, r0: int, c0: int) -> int:
        return self.addr + r0 * self.pitch + c0 * dtype_bytes(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.region_bytes or self.rows * self.pitch


@dataclass
class DramAllocator:
    burst: int
    next_addr: int = 0x1000_0000
    tensors: list[DramTensor] = field(default_factory=list)

    def tensor(self, name: str, rows: int, cols: int, dtype: str) -> DramTensor:
        b = dtype_bytes(dtype)
        pitch = math.ceil(cols * b / self.burst) * self.burst
        t = DramTensor(name, self.next_addr, rows, cols, dtype, pitch)
        self.next_addr += math.ceil(rows * pitch / self.burst) * self.burst + self.burst
        self.tensors.append(t)
        return t

    def view(self, base: DramTensor, name: str, rows: int, cols: int, gather: dict[str, Any]) -> DramTensor:
        """A virtual matrix gathered from ``base`` (im2col): its loads address ``base``'s region."""
        t = DramTensor(name, base.addr, rows, cols, base.dtype, base.pitch, gather=gather,
                       region_bytes=base.rows * base.pitch)
        return t

    def regions(self) -> list[tuple[int, int, str]]:
        return [(t.addr, t.addr + t.nbytes, t.name) for t in self.tensors]


# ---- SPM ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Buf:
    offset: int
    rows: int
    cols: int
    dtype: str
    nbytes: int
    name: str


@dataclass
class SpmAllocator:
    """First-fit allocator over the scratchpad with explicit frees; raises BadInput when a tile cannot fit."""

    capacity: int
    align: int = 64
    live: dict[int, Buf] = field(default_factory=dict)
    peak: int = 0

    def alloc(self, name: str, rows: int, cols: int, dtype: str, *, elem_bytes: int | None = None,
              top: bool = False) -> Buf:
        """First fit from the bottom (transient tiles) or from the top (long-lived resident data), which keeps
        the two apart and the free space contiguous."""
        nbytes = rows * cols * (elem_bytes or dtype_bytes(dtype))
        size = math.ceil(nbytes / self.align) * self.align
        gaps: list[tuple[int, int]] = []
        pos = 0
        for o in sorted(self.live):
            if o > pos:
                gaps.append((pos, o))
            pos = max(pos, o + math.ceil(self.live[o].nbytes / self.align) * self.align)
        if pos < self.capacity:
            gaps.append((pos, self.capacity))
        fits = [(lo, hi) for lo, hi in gaps if hi - lo >= size]
        if not fits:
            used = sum(b.nbytes for b in self.live.values())
            raise BadInput(f"tile {name} ({rows}x{cols} {dtype}, {nbytes} B) does not fit the SPM: "
                           f"{used} of {self.capacity} B in use", field="spm_bytes")
        off = (fits[-1][1] - size) // self.align * self.align if top else fits[0][0]
        buf = Buf(off, rows, cols, dtype, nbytes, name)
        self.live[off] = buf
        self.peak = max(self.peak, max(o + b.nbytes for o, b in self.live.items()))
        return buf

    def free(self, *bufs: Buf | None) -> None:
        for b in bufs:
            if b is not None:
                self.live.pop(b.offset, None)


# ---- builder -----------------------------------------------------------------------------------------------------
# A stream is held in memory while it is built and validated (~300 B per instruction with its immediates): one op may
# emit at most this many instructions (a 4096³ GEMM on the default core emits 33k; a 65536³ one would emit ~1.4e8).
MAX_STREAM_INSTRUCTIONS = 1 << 17


@dataclass
class Builder:
    profile: DeviceProfile
    instrs: list[Instr] = field(default_factory=list)
    max_instrs: int = MAX_STREAM_INSTRUCTIONS
    spm: SpmAllocator = field(init=False)
    dram: DramAllocator = field(init=False)
    kv: dict[tuple[int, str], int] = field(default_factory=dict)  # (head, kind) -> KV region base address
    kv_max_seq: int = 0
    kv_cached: dict[tuple[int, str], int] = field(default_factory=dict)  # rows valid before the stream

    def __post_init__(self) -> None:
        self.spm = SpmAllocator(self.profile.spm_bytes, align=self.profile.burst_bytes)
        self.dram = DramAllocator(self.profile.burst_bytes)

    def reserve(self, n: int) -> None:
        """Refuse before building when ``n`` more instructions are known to be coming and would pass the cap (a
        65536³ GEMM's step list alone would take GBs before the first emit hit the cap)."""
        if len(self.instrs) + n > self.max_instrs:
            raise BadInput(f"the op lowers to more than {self.max_instrs} instructions; split it into smaller ops "
                           "(the GEMM's M, K or N)")

    def emit(self, op: Opcode, dst: int | None, src0: int | None, src1: int | None, **imm: Any) -> None:
        self.reserve(1)
        self.instrs.append(Instr(op, dst, src0, src1, imm))

    def sync(self) -> None:
        if not self.instrs or self.instrs[-1].opcode != Opcode.SYNC_WAIT:
            self.emit(Opcode.SYNC_WAIT, None, None, None)

    def load(self, buf: Buf, t: DramTensor, r0: int, c0: int, rows: int, cols: int) -> None:
        imm: dict[str, Any] = {"rows": rows, "cols": cols, "dtype": t.dtype, "stride": t.pitch, "tensor": t.name}
        if t.gather is not None:
            imm["gather"] = {**t.gather, "r0": r0, "c0": c0}
            addr = t.addr
        else:
            addr = t.tile_addr(r0, c0)
        self.emit(Opcode.DMA_LOAD_TILE, buf.offset, addr, None, **imm)

    def store(self, t: DramTensor, r0: int, c0: int, buf: Buf, rows: int, cols: int) -> None:
        self.emit(Opcode.DMA_STORE_TILE, t.tile_addr(r0, c0), buf.offset, None, rows=rows, cols=cols,
                  dtype=t.dtype, stride=t.pitch, tensor=t.name)

    def kv_region(self, head: int, kind: str, max_seq: int, head_dim: int, cached: int) -> int:
        key = (head, kind)
        if key not in self.kv:
            t = self.dram.tensor(f"KV_{kind}{head}", max_seq, head_dim, self.profile.dtype)
            self.kv[key] = t.addr
            self.kv_cached[key] = cached
            self.kv_max_seq = max(self.kv_max_seq, max_seq)
        return self.kv[key]

    def tuples(self) -> list[tuple[str, int | None, int | None, int | None, dict[str, Any]]]:
        return [i.as_tuple() for i in self.instrs]


def acc_elem_bytes(dtype: str) -> int:
    """SPM bytes per element of an accumulating output tile (fp32/int32 partial sums)."""
    return max(ACC_BYTES, dtype_bytes(dtype))
