"""Stream validator (seed 002 §14): rejects a bad stream with the instruction index and the rule broken.

Rules (``rule`` names in the report):
- ``burst_alignment``: DRAM/KV addresses and row pitches are multiples of the DMA burst.
- ``dram_range``: a DMA tile lies inside one declared DRAM tensor (DRAM addresses consistent with the tensors).
- ``spm_capacity``: every SPM operand lies inside the scratchpad; a buffer holds the tile it is given.
- ``tile_shape``: TE/VE operand shapes agree (``(m,k)·(k,n) → (m,n)``, QKᵀ, AV, elementwise, row broadcast).
- ``dtype``: known dtype, operands of one op share it.
- ``reduction_dim``: LayerNorm/RMSNorm/Softmax reduce over the last axis and see the whole reduced dimension.
- ``dependency``: reads only written, unclobbered buffers; SYNC between a load and its reader, between
  accumulating MatMul tiles, between a compute op and the store that reads its result, and before a load overwrites
  a buffer with an outstanding reader; accumulation only into an initialised buffer.
- ``kv_range``: KV loads read stored rows only (``kv_start ≥ 0``, ``kv_start + kv_len ≤`` rows valid for that head);
  KV stores append inside the cache capacity without holes; a KV load after a store of the same head needs a SYNC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.lowering.costmodel import DTYPE_BYTES
from services.lowering.isa import TE_OPS, VE_OPS, VE_REDUCE, Instr, Opcode


@dataclass(frozen=True)
class Violation:
    index: int
    rule: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "rule": self.rule, "message": self.message}


@dataclass
class _BufState:
    rows: int
    cols: int
    dtype: str
    nbytes: int
    writer: str  # "load" | "compute"
    synced: bool
    pending_reader: bool = False
    pending_store: bool = False  # read by a DMA/KV store not yet retired by a SYNC
    acc_open: bool = False  # written by a TE op since the last SYNC (accumulation needs a SYNC in between)


@dataclass
class StreamValidator:
    spm_bytes: int
    burst_bytes: int
    dram_regions: Sequence[tuple[int, int, str]] = ()
    kv_regions: dict[int, tuple[int, str, int, int, int]] = field(default_factory=dict)
    # kv base addr -> (head, kind, max_seq, row_bytes, cached_rows)

    def validate(self, instrs: Sequence[Instr]) -> list[Violation]:
        check = _StreamCheck(self)
        for index, ins in enumerate(instrs):
            check.step(index, ins)
        return check.violations


@dataclass(frozen=True)
class _Tile:
    """The operands every non-SYNC instruction shares: its dtype, element size and tile shape."""

    dtype: str
    elem_bytes: int
    rows: int
    cols: int


class _StreamCheck:
    """One pass over a stream: the live SPM buffers, the valid KV rows per head, and the violations found so far."""

    def __init__(self, spec: StreamValidator) -> None:
        self.spec = spec
        self.bufs: dict[int, _BufState] = {}
        self.kv_valid = {base: v[4] for base, v in spec.kv_regions.items()}
        self.kv_unsynced_store: set[int] = set()
        self.violations: list[Violation] = []

    # -- the shared rules --------------------------------------------------------------------------------------------

    def bad(self, i: int, rule: str, msg: str) -> None:
        self.violations.append(Violation(i, rule, msg))

    def spm_ok(self, i: int, off: int | None, nbytes: int, what: str) -> bool:
        spm_bytes = self.spec.spm_bytes
        if off is None or off < 0 or off + nbytes > spm_bytes:
            self.bad(i, "spm_capacity", f"{what} at SPM offset {off} with {nbytes} B exceeds the {spm_bytes} B SPM")
            return False
        return True

    def dtype_ok(self, i: int, imm: dict[str, Any]) -> str | None:
        dt = imm.get("dtype")
        if dt not in DTYPE_BYTES:
            self.bad(i, "dtype", f"unknown dtype {dt!r}")
            return None
        return str(dt)

    def read(self, i: int, off: int | None, what: str) -> _BufState | None:
        if off is None or off not in self.bufs:
            self.bad(i, "dependency", f"{what} reads SPM offset {off}, which holds no live buffer")
            return None
        buf = self.bufs[off]
        if buf.writer == "load" and not buf.synced:
            self.bad(i, "dependency", f"{what} reads SPM offset {off} loaded by DMA/KV without a SYNC_WAIT")
        return buf

    def write(self, off: int, state: _BufState) -> None:
        end = off + state.nbytes
        for o in [o for o, b in self.bufs.items() if o != off and o < end and off < o + b.nbytes]:
            del self.bufs[o]  # clobbered
        self.bufs[off] = state

    def in_dram(self, i: int, addr: int, rows: int, stride: int, cols_bytes: int, gather: bool) -> None:
        burst = self.spec.burst_bytes
        if addr % burst or stride % burst:
            self.bad(i, "burst_alignment", f"DRAM address {addr:#x} / pitch {stride} not a multiple of the "
                     f"{burst} B burst")
        if not self.spec.dram_regions:
            return
        last = addr if gather else addr + (rows - 1) * stride + cols_bytes
        if not any(lo <= addr and last <= hi for lo, hi, _ in self.spec.dram_regions):
            self.bad(i, "dram_range", f"tile [{addr:#x}, {last:#x}) is not inside one declared DRAM tensor")

    # -- one instruction ---------------------------------------------------------------------------------------------

    def step(self, i: int, ins: Instr) -> None:
        op, imm = ins.opcode, ins.imm
        if op == Opcode.SYNC_WAIT:
            self.sync_wait()
            return
        dt = self.dtype_ok(i, imm)
        if dt is None:
            return
        tile = _Tile(dt, DTYPE_BYTES[dt], int(imm.get("rows", 0)), int(imm.get("cols", 0)))
        if op == Opcode.DMA_LOAD_TILE:
            self.dma_load(i, ins, tile)
        elif op == Opcode.DMA_STORE_TILE:
            self.dma_store(i, ins, tile)
        elif op in TE_OPS:
            self.tensor_op(i, ins, tile)
        elif op in VE_OPS:
            self.vector_op(i, ins, tile)
        elif op == Opcode.KV_STORE_TILE:
            self.kv_store(i, ins, tile)
        elif op == Opcode.KV_LOAD_TILE:
            self.kv_load(i, ins, tile)
        else:  # pragma: no cover - Opcode is closed
            self.bad(i, "dependency", f"unknown opcode {op}")

    def sync_wait(self) -> None:
        for state in self.bufs.values():
            state.synced = True
            state.pending_reader = False
            state.pending_store = False
            state.acc_open = False
        self.kv_unsynced_store.clear()

    def dma_load(self, i: int, ins: Instr, tile: _Tile) -> None:
        rows, cols, dt, eb = tile.rows, tile.cols, tile.dtype, tile.elem_bytes
        if ins.src0 is None or ins.dst is None:
            self.bad(i, "dependency", "DMA_LOAD_TILE needs dst (SPM) and src0 (DRAM)")
            return
        self.in_dram(i, ins.src0, rows, int(ins.imm.get("stride", cols * eb)), cols * eb, "gather" in ins.imm)
        if not self.spm_ok(i, ins.dst, rows * cols * eb, "DMA_LOAD_TILE destination"):
            return
        old = self.bufs.get(ins.dst)
        if old is not None and old.pending_reader:
            self.bad(i, "dependency", f"DMA_LOAD_TILE overwrites SPM offset {ins.dst} before a SYNC_WAIT "
                     "retires its reader")
        self.write(ins.dst, _BufState(rows, cols, dt, rows * cols * eb, "load", False))

    def dma_store(self, i: int, ins: Instr, tile: _Tile) -> None:
        rows, cols, dt, eb = tile.rows, tile.cols, tile.dtype, tile.elem_bytes
        if ins.dst is None:
            self.bad(i, "dependency", "DMA_STORE_TILE needs a DRAM destination")
            return
        self.in_dram(i, ins.dst, rows, int(ins.imm.get("stride", cols * eb)), cols * eb, False)
        src = self.read(i, ins.src0, "DMA_STORE_TILE")
        if src is None:
            return
        if src.writer == "compute" and not src.synced:
            self.bad(i, "dependency", f"DMA_STORE_TILE reads SPM offset {ins.src0} written by TE/VE without a "
                     "SYNC_WAIT")
        if (src.rows, src.cols) != (rows, cols) or src.dtype != dt:
            self.bad(i, "tile_shape", f"store of a {rows}x{cols} {dt} tile from a {src.rows}x{src.cols} "
                     f"{src.dtype} buffer")
        src.pending_reader = True
        src.pending_store = True

    def tensor_op(self, i: int, ins: Instr, tile: _Tile) -> None:
        """TE MatMul / QKᵀ / AV: operand shapes, then the destination (fresh, or accumulated into after a SYNC)."""
        op, imm, dt = ins.opcode, ins.imm, tile.dtype
        m, k, n = int(imm.get("m", 0)), int(imm.get("k", 0)), int(imm.get("n", 0))
        a = self.read(i, ins.src0, op.value)
        w = self.read(i, ins.src1, op.value)
        if a is None or w is None:
            return
        a_c0 = int(imm.get("src0_col0", 0))
        if op == Opcode.TE_MATMUL_TILE:
            want_a, want_b = (m, k), (k, n)
        elif op == Opcode.TE_QKT_TILE:  # S = Q · Kᵀ: Q (m, k=head_dim), K (n=kv rows, k)
            want_a, want_b = (m, k), (n, k)
        else:  # TE_AV: O = P · V: P columns [c0, c0+k) of (m, L), V (k, n)
            want_a, want_b = (m, k), (k, n)
        a_shape = (a.rows, a.cols)
        if op == Opcode.TE_AV_TILE:  # P may be a column slice of the score tile
            a_shape = (a.rows, k)
            if a_c0 + k > a.cols:
                self.bad(i, "tile_shape", f"{op.value} reads columns [{a_c0}, {a_c0 + k}) of a {a.cols}-column "
                         "tile")
        if a_shape != want_a or (w.rows, w.cols) != want_b:
            self.bad(i, "tile_shape", f"{op.value} expects {want_a} and {want_b}, got "
                     f"{(a.rows, a.cols)} and {(w.rows, w.cols)}")
        if a.dtype != dt or w.dtype != dt:
            self.bad(i, "dtype", f"{op.value} mixes {a.dtype}/{w.dtype} with {dt}")
        a.pending_reader = True
        w.pending_reader = True
        self.tensor_destination(i, ins, tile, m, n)

    def tensor_destination(self, i: int, ins: Instr, tile: _Tile, m: int, n: int) -> None:
        op, imm = ins.opcode, ins.imm
        d_c0 = int(imm.get("dst_col0", 0))
        acc = bool(imm.get("acc", 0))
        out_cols = int(imm.get("dst_cols", n))
        nbytes = int(imm.get("dst_bytes", m * out_cols * tile.elem_bytes))
        if not self.spm_ok(i, ins.dst, nbytes, f"{op.value} destination"):
            return
        if d_c0 + n > out_cols:
            self.bad(i, "tile_shape", f"{op.value} writes columns [{d_c0}, {d_c0 + n}) of a {out_cols}-column tile")
        cur = self.bufs.get(ins.dst) if ins.dst is not None else None
        if cur is not None and cur.pending_store:
            self.bad(i, "dependency", f"{op.value} overwrites SPM offset {ins.dst} before a SYNC_WAIT retires "
                     "the store reading it")
        if acc or d_c0:
            if cur is None or cur.writer != "compute" or (cur.rows, cur.cols) != (m, out_cols):
                self.bad(i, "dependency", f"{op.value} accumulates/writes part of SPM offset {ins.dst}, "
                         "which holds no initialised tile of that shape")
                return
            if acc and cur.acc_open:
                self.bad(i, "dependency", "accumulating MatMul tiles into one buffer need a SYNC_WAIT between "
                         "them")
            cur.acc_open = True
            cur.synced = False
        else:
            assert ins.dst is not None
            self.write(ins.dst, _BufState(m, out_cols, tile.dtype, nbytes, "compute", False, acc_open=True))

    def vector_op(self, i: int, ins: Instr, tile: _Tile) -> None:
        """VE elementwise / reduction: the source tile, the reduced axis, the broadcast operand, the destination."""
        op, imm = ins.opcode, ins.imm
        rows, cols, dt = tile.rows, tile.cols, tile.dtype
        x = self.read(i, ins.src0, op.value)
        if x is None:
            return
        if (x.rows, x.cols) != (rows, cols) or x.dtype != dt:
            self.bad(i, "tile_shape", f"{op.value} on a {rows}x{cols} {dt} tile but the source is "
                     f"{x.rows}x{x.cols} {x.dtype}")
        if op in VE_REDUCE:
            if int(imm.get("axis", -1)) not in (-1, 1):
                self.bad(i, "reduction_dim", f"{op.value} must reduce over the last axis")
            reduce_len = int(imm.get("reduce_len", -1))
            full_len = int(imm.get("full_len", reduce_len))
            if reduce_len != cols or full_len != cols:
                self.bad(i, "reduction_dim", f"{op.value} reduces {reduce_len} of {full_len} elements but the tile "
                         f"has {cols} columns: the whole reduced dimension must be in the tile")
        if ins.src1 is not None:
            y = self.read(i, ins.src1, op.value)
            if y is not None:
                if y.dtype != dt:
                    self.bad(i, "dtype", f"{op.value} mixes {y.dtype} with {dt}")
                if (y.rows, y.cols) not in {(rows, cols), (1, cols), (rows, 1)}:
                    self.bad(i, "tile_shape", f"{op.value} second operand {y.rows}x{y.cols} does not broadcast "
                             f"to {rows}x{cols}")
                y.pending_reader = True
        elif op in {Opcode.VE_ADD_TILE, Opcode.VE_MUL_TILE}:
            self.bad(i, "tile_shape", f"{op.value} needs two operands")
        if ins.dst in self.bufs and self.bufs[ins.dst].pending_store:
            self.bad(i, "dependency", f"{op.value} overwrites SPM offset {ins.dst} before a SYNC_WAIT retires the "
                     "store reading it")
        x.pending_reader = True
        if not self.spm_ok(i, ins.dst, x.nbytes, f"{op.value} destination"):
            return
        assert ins.dst is not None
        if ins.dst == ins.src0:
            x.writer, x.synced, x.rows, x.cols, x.dtype = "compute", False, rows, cols, dt
        else:
            self.write(ins.dst, _BufState(rows, cols, dt, x.nbytes, "compute", False))

    def kv_store(self, i: int, ins: Instr, tile: _Tile) -> None:
        """Append rows to one head's KV cache: inside the capacity, no hole after the valid rows."""
        rows, cols = tile.rows, tile.cols
        burst = self.spec.burst_bytes
        base = int(ins.imm.get("base", -1))
        region = self.spec.kv_regions.get(base)
        src = self.read(i, ins.src0, "KV_STORE_TILE")
        if region is None:
            self.bad(i, "kv_range", f"KV_STORE_TILE to an undeclared KV region {base:#x}")
            return
        _, _, max_seq, row_bytes, _ = region
        pos, n_rows = int(ins.imm.get("pos", -1)), rows
        if ins.dst is None or ins.dst != base + pos * row_bytes or ins.dst % burst:
            self.bad(i, "burst_alignment" if ins.dst is not None and ins.dst % burst else "kv_range",
                     f"KV_STORE_TILE address {ins.dst} does not match position {pos} of its head's region")
        if pos < 0 or pos + n_rows > max_seq:
            self.bad(i, "kv_range", f"KV_STORE_TILE rows [{pos}, {pos + n_rows}) outside the cache (0..{max_seq})")
        elif pos > self.kv_valid[base]:
            self.bad(i, "kv_range", f"KV_STORE_TILE at row {pos} leaves a hole after row {self.kv_valid[base]}")
        else:
            self.kv_valid[base] = max(self.kv_valid[base], pos + n_rows)
        if src is not None:
            if src.writer == "compute" and not src.synced:
                self.bad(i, "dependency", f"KV_STORE_TILE reads SPM offset {ins.src0} written by TE/VE without a "
                         "SYNC_WAIT")
            if (src.rows, src.cols) != (rows, cols):
                self.bad(i, "tile_shape", f"KV_STORE_TILE of {rows}x{cols} from a {src.rows}x{src.cols} buffer")
            src.pending_reader = True
            src.pending_store = True
        self.kv_unsynced_store.add(base)

    def kv_load(self, i: int, ins: Instr, tile: _Tile) -> None:
        """Read stored rows of one head's KV cache, after a SYNC if the head was just appended to."""
        rows, cols, dt, eb = tile.rows, tile.cols, tile.dtype, tile.elem_bytes
        base = int(ins.imm.get("base", -1))
        region = self.spec.kv_regions.get(base)
        if region is None:
            self.bad(i, "kv_range", f"KV_LOAD_TILE from an undeclared KV region {base:#x}")
            return
        start, n_rows = int(ins.imm.get("kv_start", -1)), int(ins.imm.get("kv_len", rows))
        if ins.src0 is None or ins.src0 % self.spec.burst_bytes:
            self.bad(i, "burst_alignment", f"KV_LOAD_TILE address {ins.src0} not burst aligned")
        if start < 0 or n_rows != rows or start + n_rows > self.kv_valid[base]:
            self.bad(i, "kv_range", f"KV_LOAD_TILE rows [{start}, {start + n_rows}) but rows "
                     f"[0, {self.kv_valid[base]}) are valid for this head")
        if base in self.kv_unsynced_store:
            self.bad(i, "dependency", "KV_LOAD_TILE after a KV_STORE_TILE of the same head needs a SYNC_WAIT")
        if not self.spm_ok(i, ins.dst, rows * cols * eb, "KV_LOAD_TILE destination"):
            return
        assert ins.dst is not None
        old = self.bufs.get(ins.dst)
        if old is not None and old.pending_reader:
            self.bad(i, "dependency", f"KV_LOAD_TILE overwrites SPM offset {ins.dst} before a SYNC_WAIT retires "
                     "its reader")
        self.write(ins.dst, _BufState(rows, cols, dt, rows * cols * eb, "load", False))
