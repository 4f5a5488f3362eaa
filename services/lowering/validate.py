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
        bufs: dict[int, _BufState] = {}
        kv_valid = {base: v[4] for base, v in self.kv_regions.items()}
        kv_unsynced_store: set[int] = set()
        out: list[Violation] = []

        def bad(i: int, rule: str, msg: str) -> None:
            out.append(Violation(i, rule, msg))

        def spm_ok(i: int, off: int | None, nbytes: int, what: str) -> bool:
            if off is None or off < 0 or off + nbytes > self.spm_bytes:
                bad(i, "spm_capacity", f"{what} at SPM offset {off} with {nbytes} B exceeds the {self.spm_bytes} B SPM")
                return False
            return True

        def dtype_ok(i: int, imm: dict[str, Any]) -> str | None:
            dt = imm.get("dtype")
            if dt not in DTYPE_BYTES:
                bad(i, "dtype", f"unknown dtype {dt!r}")
                return None
            return str(dt)

        def read(i: int, off: int | None, what: str) -> _BufState | None:
            if off is None or off not in bufs:
                bad(i, "dependency", f"{what} reads SPM offset {off}, which holds no live buffer")
                return None
            b = bufs[off]
            if b.writer == "load" and not b.synced:
                bad(i, "dependency", f"{what} reads SPM offset {off} loaded by DMA/KV without a SYNC_WAIT")
            return b

        def write(off: int, st: _BufState) -> None:
            end = off + st.nbytes
            for o in [o for o, b in bufs.items() if o != off and o < end and off < o + b.nbytes]:
                del bufs[o]  # clobbered
            bufs[off] = st

        def in_dram(i: int, addr: int, rows: int, stride: int, cols_bytes: int, gather: bool) -> None:
            if addr % self.burst_bytes or stride % self.burst_bytes:
                bad(i, "burst_alignment", f"DRAM address {addr:#x} / pitch {stride} not a multiple of the "
                    f"{self.burst_bytes} B burst")
            if not self.dram_regions:
                return
            last = addr if gather else addr + (rows - 1) * stride + cols_bytes
            if not any(lo <= addr and last <= hi for lo, hi, _ in self.dram_regions):
                bad(i, "dram_range", f"tile [{addr:#x}, {last:#x}) is not inside one declared DRAM tensor")

        for i, ins in enumerate(instrs):
            op, imm = ins.opcode, ins.imm
            if op == Opcode.SYNC_WAIT:
                for st in bufs.values():
                    st.synced = True
                    st.pending_reader = False
                    st.pending_store = False
                    st.acc_open = False
                kv_unsynced_store.clear()
                continue
            dt = dtype_ok(i, imm)
            if dt is None:
                continue
            eb = DTYPE_BYTES[dt]
            rows, cols = int(imm.get("rows", 0)), int(imm.get("cols", 0))
            if op == Opcode.DMA_LOAD_TILE:
                if ins.src0 is None or ins.dst is None:
                    bad(i, "dependency", "DMA_LOAD_TILE needs dst (SPM) and src0 (DRAM)")
                    continue
                in_dram(i, ins.src0, rows, int(imm.get("stride", cols * eb)), cols * eb, "gather" in imm)
                if not spm_ok(i, ins.dst, rows * cols * eb, "DMA_LOAD_TILE destination"):
                    continue
                old = bufs.get(ins.dst)
                if old is not None and old.pending_reader:
                    bad(i, "dependency", f"DMA_LOAD_TILE overwrites SPM offset {ins.dst} before a SYNC_WAIT "
                        "retires its reader")
                write(ins.dst, _BufState(rows, cols, dt, rows * cols * eb, "load", False))
            elif op == Opcode.DMA_STORE_TILE:
                if ins.dst is None:
                    bad(i, "dependency", "DMA_STORE_TILE needs a DRAM destination")
                    continue
                in_dram(i, ins.dst, rows, int(imm.get("stride", cols * eb)), cols * eb, False)
                b = read(i, ins.src0, "DMA_STORE_TILE")
                if b is None:
                    continue
                if b.writer == "compute" and not b.synced:
                    bad(i, "dependency", f"DMA_STORE_TILE reads SPM offset {ins.src0} written by TE/VE without a "
                        "SYNC_WAIT")
                if (b.rows, b.cols) != (rows, cols) or b.dtype != dt:
                    bad(i, "tile_shape", f"store of a {rows}x{cols} {dt} tile from a {b.rows}x{b.cols} {b.dtype} "
                        "buffer")
                b.pending_reader = True
                b.pending_store = True
            elif op in TE_OPS:
                m, k, n = int(imm.get("m", 0)), int(imm.get("k", 0)), int(imm.get("n", 0))
                a = read(i, ins.src0, op.value)
                w = read(i, ins.src1, op.value)
                if a is None or w is None:
                    continue
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
                        bad(i, "tile_shape", f"{op.value} reads columns [{a_c0}, {a_c0 + k}) of a {a.cols}-column "
                            "tile")
                if a_shape != want_a or (w.rows, w.cols) != want_b:
                    bad(i, "tile_shape", f"{op.value} expects {want_a} and {want_b}, got "
                        f"{(a.rows, a.cols)} and {(w.rows, w.cols)}")
                if a.dtype != dt or w.dtype != dt:
                    bad(i, "dtype", f"{op.value} mixes {a.dtype}/{w.dtype} with {dt}")
                a.pending_reader = True
                w.pending_reader = True
                d_c0 = int(imm.get("dst_col0", 0))
                acc = bool(imm.get("acc", 0))
                out_cols = int(imm.get("dst_cols", n))
                nbytes = int(imm.get("dst_bytes", m * out_cols * eb))
                if not spm_ok(i, ins.dst, nbytes, f"{op.value} destination"):
                    continue
                if d_c0 + n > out_cols:
                    bad(i, "tile_shape", f"{op.value} writes columns [{d_c0}, {d_c0 + n}) of a {out_cols}-column tile")
                cur = bufs.get(ins.dst) if ins.dst is not None else None
                if cur is not None and cur.pending_store:
                    bad(i, "dependency", f"{op.value} overwrites SPM offset {ins.dst} before a SYNC_WAIT retires "
                        "the store reading it")
                if acc or d_c0:
                    if cur is None or cur.writer != "compute" or (cur.rows, cur.cols) != (m, out_cols):
                        bad(i, "dependency", f"{op.value} accumulates/writes part of SPM offset {ins.dst}, "
                            "which holds no initialised tile of that shape")
                        continue
                    if acc and cur.acc_open:
                        bad(i, "dependency", "accumulating MatMul tiles into one buffer need a SYNC_WAIT between "
                            "them")
                    cur.acc_open = True
                    cur.synced = False
                else:
                    assert ins.dst is not None
                    write(ins.dst, _BufState(m, out_cols, dt, nbytes, "compute", False, acc_open=True))
            elif op in VE_OPS:
                x = read(i, ins.src0, op.value)
                if x is None:
                    continue
                if (x.rows, x.cols) != (rows, cols) or x.dtype != dt:
                    bad(i, "tile_shape", f"{op.value} on a {rows}x{cols} {dt} tile but the source is "
                        f"{x.rows}x{x.cols} {x.dtype}")
                if op in VE_REDUCE:
                    if int(imm.get("axis", -1)) not in (-1, 1):
                        bad(i, "reduction_dim", f"{op.value} must reduce over the last axis")
                    rl = int(imm.get("reduce_len", -1))
                    full = int(imm.get("full_len", rl))
                    if rl != cols or full != cols:
                        bad(i, "reduction_dim", f"{op.value} reduces {rl} of {full} elements but the tile has "
                            f"{cols} columns: the whole reduced dimension must be in the tile")
                if ins.src1 is not None:
                    y = read(i, ins.src1, op.value)
                    if y is not None:
                        if y.dtype != dt:
                            bad(i, "dtype", f"{op.value} mixes {y.dtype} with {dt}")
                        ok = (y.rows, y.cols) in {(rows, cols), (1, cols), (rows, 1)}
                        if not ok:
                            bad(i, "tile_shape", f"{op.value} second operand {y.rows}x{y.cols} does not broadcast "
                                f"to {rows}x{cols}")
                        y.pending_reader = True
                elif op in {Opcode.VE_ADD_TILE, Opcode.VE_MUL_TILE}:
                    bad(i, "tile_shape", f"{op.value} needs two operands")
                if ins.dst in bufs and bufs[ins.dst].pending_store:
                    bad(i, "dependency", f"{op.value} overwrites SPM offset {ins.dst} before a SYNC_WAIT retires the "
                        "store reading it")
                x.pending_reader = True
                if not spm_ok(i, ins.dst, x.nbytes, f"{op.value} destination"):
                    continue
                assert ins.dst is not None
                if ins.dst == ins.src0:
                    x.writer, x.synced, x.rows, x.cols, x.dtype = "compute", False, rows, cols, dt
                else:
                    write(ins.dst, _BufState(rows, cols, dt, x.nbytes, "compute", False))
            elif op == Opcode.KV_STORE_TILE:
                base = int(imm.get("base", -1))
                reg = self.kv_regions.get(base)
                b = read(i, ins.src0, "KV_STORE_TILE")
                if reg is None:
                    bad(i, "kv_range", f"KV_STORE_TILE to an undeclared KV region {base:#x}")
                    continue
                _, _, max_seq, row_bytes, _ = reg
                pos, n_rows = int(imm.get("pos", -1)), rows
                if ins.dst is None or ins.dst != base + pos * row_bytes or ins.dst % self.burst_bytes:
                    bad(i, "burst_alignment" if ins.dst is not None and ins.dst % self.burst_bytes else "kv_range",
                        f"KV_STORE_TILE address {ins.dst} does not match position {pos} of its head's region")
                if pos < 0 or pos + n_rows > max_seq:
                    bad(i, "kv_range", f"KV_STORE_TILE rows [{pos}, {pos + n_rows}) outside the cache (0..{max_seq})")
                elif pos > kv_valid[base]:
                    bad(i, "kv_range", f"KV_STORE_TILE at row {pos} leaves a hole after row {kv_valid[base]}")
                else:
                    kv_valid[base] = max(kv_valid[base], pos + n_rows)
                if b is not None:
                    if b.writer == "compute" and not b.synced:
                        bad(i, "dependency", f"KV_STORE_TILE reads SPM offset {ins.src0} written by TE/VE without a "
                            "SYNC_WAIT")
                    if (b.rows, b.cols) != (rows, cols):
                        bad(i, "tile_shape", f"KV_STORE_TILE of {rows}x{cols} from a {b.rows}x{b.cols} buffer")
                    b.pending_reader = True
                    b.pending_store = True
                kv_unsynced_store.add(base)
            elif op == Opcode.KV_LOAD_TILE:
                base = int(imm.get("base", -1))
                reg = self.kv_regions.get(base)
                if reg is None:
                    bad(i, "kv_range", f"KV_LOAD_TILE from an undeclared KV region {base:#x}")
                    continue
                _, _, max_seq, row_bytes, _ = reg
                start, n_rows = int(imm.get("kv_start", -1)), int(imm.get("kv_len", rows))
                if ins.src0 is None or ins.src0 % self.burst_bytes:
                    bad(i, "burst_alignment", f"KV_LOAD_TILE address {ins.src0} not burst aligned")
                if start < 0 or n_rows != rows or start + n_rows > kv_valid[base]:
                    bad(i, "kv_range", f"KV_LOAD_TILE rows [{start}, {start + n_rows}) but rows "
                        f"[0, {kv_valid[base]}) are valid for this head")
                if base in kv_unsynced_store:
                    bad(i, "dependency", "KV_LOAD_TILE after a KV_STORE_TILE of the same head needs a SYNC_WAIT")
                if not spm_ok(i, ins.dst, rows * cols * eb, "KV_LOAD_TILE destination"):
                    continue
                assert ins.dst is not None
                old = bufs.get(ins.dst)
                if old is not None and old.pending_reader:
                    bad(i, "dependency", f"KV_LOAD_TILE overwrites SPM offset {ins.dst} before a SYNC_WAIT retires "
                        "its reader")
                write(ins.dst, _BufState(rows, cols, dt, rows * cols * eb, "load", False))
            else:  # pragma: no cover - Opcode is closed
                bad(i, "dependency", f"unknown opcode {op}")
        return out
