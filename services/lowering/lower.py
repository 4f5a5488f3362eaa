"""Tensor ops → tile ISA streams (seed 002, every section).

The workhorse is ``gemm``: a blocked, double-buffered (when it fits) MatMul with K accumulation (seed §3.3-3.4)
whose A operand comes from DRAM or stays resident in the SPM (QKV's reuse of X, §10-11), with one or two weight
matrices (SwiGLU's gate and up share the A tile), epilogues run on the output tile (bias, GELU, SiLU, gate·up) and
the result stored to DRAM, written into the KV cache (KV_STORE, §11) or kept resident for the next GEMM. Every
other op is built from it or is a row-tiled vector op whose reduced dimension stays whole in a tile (§6-9).

Loop order per GEMM: ``for n: for m: for k`` (or m outer, whichever the tiling picked); step ``t+1``'s tiles are
loaded into the other half of each double buffer while step ``t`` computes; a tile already in a buffer is not
loaded again (A once when it is one tile, a B column panel across M tiles when ``Kt = K``), so the stream's DMA
bytes equal the cost model's tiled-bytes formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from services.lowering.costmodel import RESIDENT_FRACTION, Tiling, choose_tiling, dtype_bytes
from services.lowering.isa import Buf, Builder, DeviceProfile, DramTensor, Opcode, acc_elem_bytes
from shared.errors import BadInput


@dataclass
class Resident:
    """An SPM-resident matrix stored as a grid of blocks ``(mi, ki) → Buf`` of ``Mt × Kt``."""

    rows: int
    cols: int
    Mt: int
    Kt: int
    dtype: str
    blocks: dict[tuple[int, int], Buf] = field(default_factory=dict)
    region: Buf | None = None  # one contiguous SPM allocation holding every block (no fragmentation)

    def bufs(self) -> list[Buf]:
        return [self.region] if self.region is not None else list(self.blocks.values())


@dataclass(frozen=True)
class ToDram:
    t: DramTensor
    c0: int = 0  # column offset inside the destination tensor


@dataclass(frozen=True)
class ToKV:
    kind: Literal["K", "V"]
    head0: int  # head of output column tile 0 (the tile width is the head dim)
    pos: int  # KV row of output row 0
    max_seq: int
    cached: int


@dataclass(frozen=True)
class ToResident:
    pass


Out = ToDram | ToKV | ToResident
Epilogue = tuple[Any, ...]  # ("bias", DramTensor) | ("gelu",) | ("silu",) | ("swiglu",) | ("scale", DramTensor)


def _check_dims(**dims: int) -> None:
    for k, v in dims.items():
        if v < 1:
            raise BadInput(f"{k} must be >= 1, got {v}", field=k)


class _Slots:
    """Ping-pong buffers of one operand; remembers which tile each holds."""

    def __init__(self, bufs: list[Buf]) -> None:
        self.bufs = bufs
        self.held: list[object] = [None] * len(bufs)
        self.cur = 0

    def find(self, tile: object) -> int | None:
        for i, h in enumerate(self.held):
            if h == tile:
                return i
        return None


def gemm(b: Builder, A: DramTensor | Resident, Bs: list[DramTensor], out: Out, *,
         epilogue: tuple[Epilogue, ...] = (), tiles: Tiling | None = None) -> Resident | None:
    """``C = A · B`` (or, with two weights and the ``swiglu`` epilogue, ``silu(A·B0) ⊙ (A·B1)``)."""
    M, K = A.rows, A.cols
    N = Bs[0].cols
    for j, w in enumerate(Bs):
        if w.rows != K or w.cols != N:
            raise BadInput(f"weight {w.name} is {w.rows}x{w.cols} but A is {M}x{K} and N = {N}",
                           field=f"weights[{j}]")
        if w.dtype != A.dtype:
            raise BadInput(f"weight {w.name} is {w.dtype} but A is {A.dtype}", field="dtype")
    bias = next((e[1] for e in epilogue if e[0] == "bias"), None)
    scale = next((e[1] for e in epilogue if e[0] == "scale"), None)
    if tiles is None:
        tiles = _gemm_tiling(b, A, N, len(Bs), out, has_bias=bias is not None, has_scale=scale is not None)
    if isinstance(out, ToKV) and (tiles.Mt < M):
        raise BadInput(f"KV output needs all {M} token rows in one tile", field="spm_bytes")
    run = _GemmRun(b, A, Bs, out, epilogue, tiles, bias, scale)
    run.emit()
    run.free()
    return run.result


def _gemm_tiling(b: Builder, A: DramTensor | Resident, N: int, n_weights: int, out: Out, *, has_bias: bool,
                 has_scale: bool) -> Tiling:
    """The cost model's tiling in the SPM left free (less every resident output block, and the row scale)."""
    p = b.profile
    M, K = A.rows, A.cols
    eb = dtype_bytes(A.dtype)
    free = p.spm_bytes - sum(x.nbytes for x in b.spm.live.values())
    if isinstance(out, ToResident):  # the output blocks accumulate in the SPM: keep room for all of them
        free -= M * N * acc_elem_bytes(A.dtype)
    return choose_tiling(M, K, N, array=p.array, spm_bytes=free - (M * eb * 2 if has_scale else 0),
                         dtype=A.dtype, n_weights=n_weights,
                         a_fixed=(A.Mt, A.Kt) if isinstance(A, Resident) else None, bias=has_bias,
                         align_elems=max(1, p.burst_bytes // eb))


_Need = tuple[_Slots, object, DramTensor, int, int, int, int]  # (slots, tile key, source, row0, col0, rows, cols)


class _GemmRun:
    """One GEMM's buffers and step schedule: allocates its SPM buffers (in this order: A, B, bias, scale, the
    resident output region, C), emits the steps with their loads, epilogues and stores, then frees them."""

    def __init__(self, b: Builder, A: DramTensor | Resident, Bs: list[DramTensor], out: Out,
                 epilogue: tuple[Epilogue, ...], tiles: Tiling, bias: DramTensor | None,
                 scale: DramTensor | None) -> None:
        self.b, self.A, self.Bs, self.out, self.epilogue, self.tiles = b, A, Bs, out, epilogue, tiles
        self.bias = bias
        M, N = A.rows, Bs[0].cols
        Mt, Kt, Nt = tiles.Mt, tiles.Kt, tiles.Nt
        self.nM, self.nK, self.nN = math.ceil(M / Mt), math.ceil(A.cols / Kt), math.ceil(N / Nt)
        nM, nK, nN = self.nM, self.nK, self.nN
        b.reserve(nM * nN * nK * len(Bs))  # every step emits one matmul tile per weight
        self.nslot = nslot = 2 if tiles.double_buffered else 1
        self.a_slots = (None if isinstance(A, Resident)
                        else _Slots([b.spm.alloc(f"A{s}", Mt, Kt, A.dtype) for s in range(nslot)]))
        self.b_slots = [_Slots([b.spm.alloc(f"B{j}{s}", Kt, Nt, A.dtype) for s in range(nslot)])
                        for j in range(len(Bs))]
        self.bias_slots = _Slots([b.spm.alloc(f"bias{s}", 1, Nt, A.dtype) for s in range(nslot)]) if bias else None
        self.scale_buf = None
        if scale is not None:  # per-row combine weights (t × 1), loaded once
            self.scale_buf = b.spm.alloc("scale", M, 1, A.dtype)
            b.load(self.scale_buf, scale, 0, 0, M, 1)
        acc_b = acc_elem_bytes(A.dtype)
        self.result: Resident | None = None
        if isinstance(out, ToResident):
            region = b.spm.alloc("resident", nM * nN * Mt, Nt, A.dtype, elem_bytes=acc_b, top=True)
            self.result = Resident(M, N, Mt, Nt, A.dtype, region=region)
            blk = Mt * Nt * acc_b
            for bi, (mi, ni) in enumerate((mi, ni) for mi in range(nM) for ni in range(nN)):
                self.result.blocks[(mi, ni)] = Buf(region.offset + bi * blk, Mt, Nt, A.dtype, blk, f"H{mi}_{ni}")
        self.c_bufs: list[Buf] = [b.spm.alloc(f"C{j}", Mt, Nt, A.dtype, elem_bytes=acc_b)
                                  for j in range(len(Bs) if self.result is None else len(Bs) - 1)]
        if self.result is not None:
            self.c_bufs.insert(0, self.result.blocks[steps_first_block(tiles, nM, nN)])
        if tiles.order == "n_outer":
            self.steps = [(mi, ni, ki) for ni in range(nN) for mi in range(nM) for ki in range(nK)]
        else:
            self.steps = [(mi, ni, ki) for mi in range(nM) for ni in range(nN) for ki in range(nK)]

    def dims(self, mi: int, ni: int, ki: int) -> tuple[int, int, int]:
        """(rows, depth, cols) of step (mi, ni, ki)'s tiles: the last tile of an axis may be short."""
        t, A = self.tiles, self.A
        return min(t.Mt, A.rows - mi * t.Mt), min(t.Kt, A.cols - ki * t.Kt), min(t.Nt, self.Bs[0].cols - ni * t.Nt)

    def needs(self, t: int) -> list[_Need]:
        """The tiles step t reads: its A tile (unless A is resident), each weight's tile, and on the last K step
        the bias row."""
        mi, ni, ki = self.steps[t]
        mt, kt, nt = self.dims(mi, ni, ki)
        Mt, Kt, Nt = self.tiles.Mt, self.tiles.Kt, self.tiles.Nt
        out_l: list[_Need] = []
        if self.a_slots is not None:
            assert isinstance(self.A, DramTensor)
            out_l.append((self.a_slots, ("A", mi, ki), self.A, mi * Mt, ki * Kt, mt, kt))
        for j, w in enumerate(self.Bs):
            out_l.append((self.b_slots[j], ("B", j, ki, ni), w, ki * Kt, ni * Nt, kt, nt))
        if self.bias_slots is not None and self.bias is not None and ki == self.nK - 1:
            out_l.append((self.bias_slots, ("bias", ni), self.bias, 0, ni * Nt, 1, nt))
        return out_l

    def issue(self, t: int, avoid_current: bool) -> None:
        """Load step t's tiles not already in a buffer (into the other half of a double buffer when
        ``avoid_current``: the current half is being computed on)."""
        for slots, tile, src, r0, c0, rows, cols in self.needs(t):
            if slots.find(tile) is not None:
                continue
            s = (slots.cur + 1) % len(slots.bufs) if avoid_current else slots.cur
            slots.held[s] = tile
            self.b.load(slots.bufs[s], src, r0, c0, rows, cols)

    def select(self, t: int) -> None:
        """Point every operand's slots at the buffer holding step t's tile."""
        for slots, tile, *_ in self.needs(t):
            i = slots.find(tile)
            assert i is not None
            slots.cur = i

    def emit(self) -> None:
        """The steps: prefetch the next step's tiles while this one computes (double buffered), or load after it."""
        b, A, steps, nslot = self.b, self.A, self.steps, self.nslot
        self.issue(0, avoid_current=False)
        b.sync()
        for t, (mi, ni, ki) in enumerate(steps):
            self.select(t)
            if nslot == 2 and t + 1 < len(steps):
                self.issue(t + 1, avoid_current=True)
            mt, kt, nt = self.dims(mi, ni, ki)
            if isinstance(A, Resident):
                a_buf = A.blocks[(mi, ki)]
            else:
                assert self.a_slots is not None
                a_buf = self.a_slots.bufs[self.a_slots.cur]
            for j, slots in enumerate(self.b_slots):
                b.emit(Opcode.TE_MATMUL_TILE, self.c_bufs[j].offset, a_buf.offset, slots.bufs[slots.cur].offset,
                       m=mt, k=kt, n=nt, acc=int(ki > 0), dtype=A.dtype, dst_bytes=self.c_bufs[j].nbytes)
            b.sync()
            if nslot == 1 and t + 1 < len(steps):
                self.issue(t + 1, avoid_current=False)
                b.sync()
            if ki != self.nK - 1:
                continue
            self.emit_epilogue(ni, mt, nt)
            self.write_out(t, mi, ni, mt, nt)

    def emit_epilogue(self, ni: int, mt: int, nt: int) -> None:
        """The epilogue on the finished output tile: bias, GELU, SiLU, gate·up, row scale, in the given order."""
        b, c0 = self.b, self.c_bufs[0]
        imm: dict[str, Any] = {"rows": mt, "cols": nt, "dtype": self.A.dtype}
        for e in self.epilogue:
            kind = e[0]
            if kind == "bias":
                assert self.bias_slots is not None
                bb = self.bias_slots.bufs[self.bias_slots.find(("bias", ni)) or 0]
                b.emit(Opcode.VE_ADD_TILE, c0.offset, c0.offset, bb.offset, **imm)
            elif kind == "gelu":
                b.emit(Opcode.VE_GELU_TILE, c0.offset, c0.offset, None, **imm)
            elif kind == "silu":
                b.emit(Opcode.VE_SILU_TILE, c0.offset, c0.offset, None, **imm)
            elif kind == "swiglu":
                b.emit(Opcode.VE_SILU_TILE, c0.offset, c0.offset, None, **imm)
                b.emit(Opcode.VE_MUL_TILE, c0.offset, c0.offset, self.c_bufs[1].offset, **imm)
            elif kind == "scale":
                assert self.scale_buf is not None
                if mt != self.A.rows:
                    raise BadInput("row scaling needs all rows in one tile", field="spm_bytes")
                b.emit(Opcode.VE_MUL_TILE, c0.offset, c0.offset, self.scale_buf.offset, **imm)
            else:
                raise BadInput(f"unknown epilogue {kind!r}", field="epilogue")

    def write_out(self, t: int, mi: int, ni: int, mt: int, nt: int) -> None:
        """The finished output tile: kept in its resident block, stored to DRAM, or appended to the KV cache."""
        b, out, c0 = self.b, self.out, self.c_bufs[0]
        if isinstance(out, ToResident):
            assert self.result is not None
            if t + 1 < len(self.steps):  # the next output tile accumulates straight into its resident block
                self.c_bufs[0] = self.result.blocks[(self.steps[t + 1][0], self.steps[t + 1][1])]
            if self.epilogue:
                b.sync()  # the epilogue read the bias buffer the next prefetch overwrites
            return
        b.sync()
        if isinstance(out, ToDram):
            b.store(out.t, mi * self.tiles.Mt, out.c0 + ni * self.tiles.Nt, c0, mt, nt)
        else:
            head = out.head0 + ni
            if nt != self.tiles.Nt and ni != self.nN - 1:
                raise BadInput("KV output tiles must be one head wide", field="head_dim")
            base = b.kv_region(head, out.kind, out.max_seq, nt, out.cached)
            burst = b.profile.burst_bytes
            pitch = math.ceil(nt * dtype_bytes(self.A.dtype) / burst) * burst
            b.emit(Opcode.KV_STORE_TILE, base + out.pos * pitch, c0.offset, None, rows=mt, cols=nt,
                   dtype=self.A.dtype, head=head, kind=out.kind, pos=out.pos, base=base)
        b.sync()

    def free(self) -> None:
        """Free every buffer but the resident output's blocks (the caller's)."""
        spm = self.b.spm
        if self.a_slots is not None:
            spm.free(*self.a_slots.bufs)
        for s in self.b_slots:
            spm.free(*s.bufs)
        if self.bias_slots is not None:
            spm.free(*self.bias_slots.bufs)
        spm.free(self.scale_buf)
        if self.result is None:
            spm.free(*self.c_bufs)
        else:
            spm.free(*self.c_bufs[1:])


def steps_first_block(tiles: Tiling, nM: int, nN: int) -> tuple[int, int]:
    """The (mi, ni) of the first output tile (both loop orders start at (0, 0))."""
    return (0, 0)


def load_resident(b: Builder, t: DramTensor, Mt: int, Kt: int) -> Resident:
    """Load a whole matrix into SPM blocks once (seed §11 SPM reuse)."""
    res = Resident(t.rows, t.cols, Mt, Kt, t.dtype)
    for mi in range(math.ceil(t.rows / Mt)):
        for ki in range(math.ceil(t.cols / Kt)):
            mt, kt = min(Mt, t.rows - mi * Mt), min(Kt, t.cols - ki * Kt)
            buf = b.spm.alloc(f"X{mi}_{ki}", Mt, Kt, t.dtype, top=True)
            b.load(buf, t, mi * Mt, ki * Kt, mt, kt)
            res.blocks[(mi, ki)] = buf
    b.sync()
    return res


def _resident_fits(b: Builder, rows: int, cols: int, dtype: str, frac: float = RESIDENT_FRACTION) -> bool:
    return rows * cols * dtype_bytes(dtype) <= frac * b.profile.spm_bytes


def _block(dim: int, unit: int, cap: int) -> int:
    """Block size along one axis of a resident matrix: the whole dim if small, else a burst-aligned cap."""
    return dim if dim <= cap else max(unit, cap)


# ---- ops -------------------------------------------------------------------------------------------------------
def lower_matmul(b: Builder, M: int, K: int, N: int, *, dtype: str | None = None) -> dict[str, DramTensor]:
    """Seed §3."""
    _check_dims(M=M, K=K, N=N)
    dt = dtype or b.profile.dtype
    A = b.dram.tensor("A", M, K, dt)
    W = b.dram.tensor("B", K, N, dt)
    C = b.dram.tensor("C", M, N, dt)
    gemm(b, A, [W], ToDram(C))
    return {"A": A, "B": W, "C": C}


def lower_conv2d(b: Builder, *, batch: int, cin: int, h: int, w: int, cout: int, kh: int, kw: int, stride: int = 1,
                 pad: int = 0) -> dict[str, DramTensor]:
    """Seed §4: im2col onto the MatMul path. ``M = batch·Ho·Wo``, ``K = cin·kh·kw``, ``N = cout``."""
    _check_dims(batch=batch, cin=cin, h=h, w=w, cout=cout, kh=kh, kw=kw, stride=stride)
    if pad < 0:
        raise BadInput("pad must be >= 0", field="pad")
    ho = (h + 2 * pad - kh) // stride + 1
    wo = (w + 2 * pad - kw) // stride + 1
    if ho < 1 or wo < 1:
        raise BadInput(f"kernel {kh}x{kw} larger than the padded input {h}x{w}", field="kh")
    dt = b.profile.dtype
    X = b.dram.tensor("X", batch * cin * h, w, dt)  # NCHW, rows = (n, c, y)
    Wt = b.dram.tensor("W", cin * kh * kw, cout, dt)  # pre-transposed filter matrix
    Y = b.dram.tensor("Y", batch * ho * wo, cout, dt)
    cols = b.dram.view(X, "X_im2col", batch * ho * wo, cin * kh * kw,
                       {"kind": "im2col", "n": batch, "c": cin, "h": h, "w": w, "kh": kh, "kw": kw,
                        "stride": stride, "pad": pad})
    gemm(b, cols, [Wt], ToDram(Y))
    return {"X": X, "W": Wt, "Y": Y}


def lower_ffn(b: Builder, M: int, d: int, f: int, *, act: Literal["gelu", "silu"] = "gelu") -> dict[str, DramTensor]:
    """Seed §5: ``H = act(X·W1 + b1)``, ``Out = H·W2 + b2``. H stays resident when it fits 0.75 × SPM."""
    _check_dims(M=M, d=d, f=f)
    dt = b.profile.dtype
    X, W1, B1 = b.dram.tensor("X", M, d, dt), b.dram.tensor("W1", d, f, dt), b.dram.tensor("b1", 1, f, dt)
    W2, B2, O = b.dram.tensor("W2", f, d, dt), b.dram.tensor("b2", 1, d, dt), b.dram.tensor("Out", M, d, dt)
    H = _first_then_second(b, X, [W1], (("bias", B1), (act,)), W2, (("bias", B2),), O, f)
    return {"X": X, "W1": W1, "b1": B1, "W2": W2, "b2": B2, "Out": O, **H}


def lower_swiglu_ffn(b: Builder, M: int, d: int, f: int, *, prefix: str = "",
                     X: DramTensor | None = None, scale: DramTensor | None = None) -> dict[str, DramTensor]:
    """``Out = (silu(X·Wg) ⊙ (X·Wu)) · Wd`` (LLaMA/Mixtral FFN); gate and up share each A tile."""
    _check_dims(M=M, d=d, f=f)
    dt = b.profile.dtype
    X = X or b.dram.tensor(f"{prefix}X", M, d, dt)
    Wg, Wu = b.dram.tensor(f"{prefix}Wg", d, f, dt), b.dram.tensor(f"{prefix}Wu", d, f, dt)
    Wd, O = b.dram.tensor(f"{prefix}Wd", f, d, dt), b.dram.tensor(f"{prefix}Out", M, d, dt)
    second: tuple[Epilogue, ...] = (("scale", scale),) if scale is not None else ()
    H = _first_then_second(b, X, [Wg, Wu], (("swiglu",),), Wd, second, O, f, prefix=prefix)
    return {"X": X, "Wg": Wg, "Wu": Wu, "Wd": Wd, "Out": O, **H}


def _first_then_second(b: Builder, X: DramTensor, W1s: list[DramTensor], ep1: tuple[Epilogue, ...], W2: DramTensor,
                       ep2: tuple[Epilogue, ...], O: DramTensor, f: int, prefix: str = "") -> dict[str, DramTensor]:
    """Two chained GEMMs: the hidden tensor stays in SPM when it fits (ComputeRoot), else a DRAM round trip."""
    M = X.rows
    if _resident_fits(b, M, f, X.dtype, RESIDENT_FRACTION / 2):
        H = gemm(b, X, W1s, ToResident(), epilogue=ep1)
        assert H is not None
        gemm(b, H, [W2], ToDram(O), epilogue=ep2)
        b.spm.free(*H.bufs())
        return {}
    Hd = b.dram.tensor(f"{prefix}H", M, f, X.dtype)
    gemm(b, X, W1s, ToDram(Hd), epilogue=ep1)
    gemm(b, Hd, [W2], ToDram(O), epilogue=ep2)
    return {"H": Hd}


def _row_tile(b: Builder, rows: int, row_bytes: int, n_param_rows: int, field_name: str) -> int:
    """Rows per tile so that two ping-pong tiles of whole rows plus the parameter rows fit the SPM."""
    align = b.profile.burst_bytes
    slot = math.ceil(row_bytes / align) * align
    cap = (b.profile.spm_bytes // slot - n_param_rows) // 2
    if cap < 1:
        raise BadInput(f"two rows of {row_bytes} B (+{n_param_rows} parameter rows) do not fit the "
                       f"{b.profile.spm_bytes} B SPM: the reduced dimension must stay whole in a tile",
                       field=field_name)
    return min(rows, cap)


def lower_rowwise(b: Builder, kind: Literal["rmsnorm", "layernorm", "softmax", "gelu", "bias"], M: int, N: int,
                  ) -> dict[str, DramTensor]:
    """Seed §6-9: row tiles (the whole row when the op reduces over it), ping-pong buffers."""
    _check_dims(M=M, N=N)
    dt = b.profile.dtype
    eb = dtype_bytes(dt)
    X, Y = b.dram.tensor("X", M, N, dt), b.dram.tensor("Y", M, N, dt)
    params: list[DramTensor] = []
    if kind in ("rmsnorm", "layernorm", "bias"):
        params.append(b.dram.tensor("gamma" if kind != "bias" else "bias", 1, N, dt))
    if kind == "layernorm":
        params.append(b.dram.tensor("beta", 1, N, dt))
    pbufs = [b.spm.alloc(t.name, 1, N, dt) for t in params]
    for pb, t in zip(pbufs, params, strict=True):
        b.load(pb, t, 0, 0, 1, N)
    rt = _row_tile(b, M, N * eb, len(params), "N")
    bufs = [b.spm.alloc(f"X{s}", rt, N, dt) for s in range(2)]
    op = {"rmsnorm": Opcode.VE_RMSNORM_TILE, "layernorm": Opcode.VE_LAYERNORM_TILE,
          "softmax": Opcode.VE_SOFTMAX_TILE, "gelu": Opcode.VE_GELU_TILE, "bias": Opcode.VE_ADD_TILE}[kind]
    for i, r0 in enumerate(range(0, M, rt)):
        rows = min(rt, M - r0)
        buf = bufs[i % 2]
        b.load(buf, X, r0, 0, rows, N)
        b.sync()
        imm: dict[str, Any] = {"rows": rows, "cols": N, "dtype": dt}
        if op in (Opcode.VE_RMSNORM_TILE, Opcode.VE_LAYERNORM_TILE, Opcode.VE_SOFTMAX_TILE):
            imm.update(axis=-1, reduce_len=N, full_len=N)
        if kind == "layernorm":
            imm["beta"] = pbufs[1].offset
        src1 = pbufs[0].offset if pbufs else None
        b.emit(op, buf.offset, buf.offset, src1, **imm)
        b.sync()
        b.store(Y, r0, 0, buf, rows, N)
    b.sync()
    b.spm.free(*bufs, *pbufs)
    return {"X": X, "Y": Y, **{t.name: t for t in params}}


def lower_qkv(b: Builder, M: int, d: int, d_q: int, d_kv: int) -> dict[str, DramTensor]:
    """Seed §10-11: X loaded once (when it fits) and reused by the three projections."""
    _check_dims(M=M, d=d, d_q=d_q, d_kv=d_kv)
    dt = b.profile.dtype
    X = b.dram.tensor("X", M, d, dt)
    ws = {n: b.dram.tensor(f"W{n}", d, dd, dt) for n, dd in (("q", d_q), ("k", d_kv), ("v", d_kv))}
    outs = {n: b.dram.tensor(n.upper(), M, ws[n].cols, dt) for n in ws}
    A: DramTensor | Resident = X
    if _resident_fits(b, M, d, dt, 0.5):
        A = load_resident(b, X, M, _block(d, b.profile.array[0], 512))
    for n in ("q", "k", "v"):
        gemm(b, A, [ws[n]], ToDram(outs[n]))
    if isinstance(A, Resident):
        b.spm.free(*A.bufs())
    return {"X": X, **{f"W{n}": w for n, w in ws.items()}, **{o.name: o for o in outs.values()}}


def lower_attention(b: Builder, *, S: int, d: int, heads: int, kv_heads: int, head_dim: int, kv_cached: int,
                    max_seq: int | None = None) -> dict[str, DramTensor]:
    """Seed §12, the full LLaMA attention flow with GQA:

    QKV projections (X resident and reused; K and V written straight into the KV cache with KV_STORE_TILE per kv
    head), then per query head: load Q_h, KV_LOAD the head's K in row chunks, ``S_h = Q_h·Kᵀ`` into one score tile
    holding the whole key length, softmax over it (the reduced dimension stays whole), KV_LOAD V in chunks and
    ``O_h = P·V`` accumulated over the chunks, store O_h; finally ``Y = O·Wo``.
    """
    _check_dims(S=S, d=d, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    if kv_cached < 0:
        raise BadInput("kv_cached must be >= 0", field="kv_cached")
    if heads % kv_heads:
        raise BadInput(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})", field="kv_heads")
    n_keys = kv_cached + S  # the key length: cached rows plus this step's tokens
    max_seq = max_seq or n_keys
    if max_seq < n_keys:
        raise BadInput(f"max_seq {max_seq} < kv_cached + S = {n_keys}", field="max_seq")
    dt = b.profile.dtype
    X = b.dram.tensor("X", S, d, dt)
    Wq = b.dram.tensor("Wq", d, heads * head_dim, dt)
    Wk = b.dram.tensor("Wk", d, kv_heads * head_dim, dt)
    Wv = b.dram.tensor("Wv", d, kv_heads * head_dim, dt)
    Wo = b.dram.tensor("Wo", heads * head_dim, d, dt)
    Q = b.dram.tensor("Q", S, heads * head_dim, dt)
    O = b.dram.tensor("O", S, heads * head_dim, dt)
    Y = b.dram.tensor("Y", S, d, dt)
    _qkv_into_kv_cache(b, X, Wq, Wk, Wv, Q, head_dim=head_dim, kv_cached=kv_cached, max_seq=max_seq)
    # ---- per head attention ----
    head = _HeadShape(S=S, head_dim=head_dim, kv_cached=kv_cached, n_keys=n_keys, key_chunk=min(n_keys, 128))
    q_rows = _query_rows_per_tile(b, head)
    b.sync()
    group = heads // kv_heads
    for h in range(heads):
        for q0 in range(0, S, q_rows):
            _attend(b, head, Q, O, h, h // group, q0, q_rows)
    # ---- output projection ----
    gemm(b, O, [Wo], ToDram(Y))
    return {"X": X, "Wq": Wq, "Wk": Wk, "Wv": Wv, "Wo": Wo, "Q": Q, "O": O, "Y": Y}


def _qkv_into_kv_cache(b: Builder, X: DramTensor, Wq: DramTensor, Wk: DramTensor, Wv: DramTensor, Q: DramTensor, *,
                       head_dim: int, kv_cached: int, max_seq: int) -> None:
    """The QKV projections with X resident and reused when it fits: Q to DRAM, K and V straight into the KV cache
    (KV_STORE_TILE per kv head), one head per output tile with all tokens in it."""
    S, d, dt = X.rows, X.cols, X.dtype
    eb = dtype_bytes(dt)
    A: DramTensor | Resident = X
    acc_head = S * head_dim * acc_elem_bytes(dt)
    if _resident_fits(b, S, d, dt, 0.5):
        left = b.profile.spm_bytes - S * d * eb - acc_head
        R = b.profile.array[0]
        kt = next((k for k in (512, 256, 128, 64, 32) if 2 * k * head_dim * eb <= left and k % R == 0), 0)
        if kt:
            A = load_resident(b, X, S, min(d, kt))
    free = b.profile.spm_bytes - sum(x.nbytes for x in b.spm.live.values())

    def head_tiles(n_cols: int) -> Tiling:
        t = choose_tiling(S, d, n_cols, array=b.profile.array, spm_bytes=free, dtype=dt,
                          a_fixed=(A.Mt, A.Kt) if isinstance(A, Resident) else None,
                          align_elems=max(1, b.profile.burst_bytes // eb))
        # one head per output tile and all tokens in it (KV_STORE writes whole head rows)
        need = (0 if isinstance(A, Resident) else 2 * S * t.Kt * eb) + 2 * t.Kt * head_dim * eb + \
            S * head_dim * acc_elem_bytes(dt)
        if need > free:
            raise BadInput(f"a {S}-token x {head_dim} head tile does not fit the SPM", field="S")
        return Tiling(S, t.Kt, head_dim, True, "n_outer", need)

    gemm(b, A, [Wq], ToDram(Q), tiles=head_tiles(Wq.cols))
    gemm(b, A, [Wk], ToKV("K", 0, kv_cached, max_seq, kv_cached), tiles=head_tiles(Wk.cols))
    gemm(b, A, [Wv], ToKV("V", 0, kv_cached, max_seq, kv_cached), tiles=head_tiles(Wv.cols))
    if isinstance(A, Resident):
        b.spm.free(*A.bufs())


@dataclass(frozen=True)
class _HeadShape:
    """One attention head's dimensions: ``S`` query tokens, ``n_keys`` keys read in chunks of ``key_chunk`` rows."""

    S: int
    head_dim: int
    kv_cached: int
    n_keys: int
    key_chunk: int


def _query_rows_per_tile(b: Builder, head: _HeadShape) -> int:
    """Query rows per tile: halved from S until Q_h, the whole score tile (every key), two K/V chunks and O_h fit
    the SPM; BadInput when one row does not."""
    dt = b.profile.dtype
    eb = dtype_bytes(dt)
    hd, n_keys, lc = head.head_dim, head.n_keys, head.key_chunk

    def spm_bytes(sq: int) -> int:
        return sq * hd * eb + sq * n_keys * eb + 2 * lc * hd * eb + sq * hd * acc_elem_bytes(dt)

    sq = head.S
    while sq > 1 and spm_bytes(sq) > b.profile.spm_bytes:
        sq = (sq + 1) // 2
    if spm_bytes(sq) > b.profile.spm_bytes:
        raise BadInput(f"one query row's scores over {n_keys} keys do not fit the SPM", field="kv_cached")
    return sq


def _attend(b: Builder, head: _HeadShape, Q: DramTensor, O: DramTensor, h: int, g: int, q0: int, q_rows: int
            ) -> None:
    """Query head h (kv head g), query rows [q0, q0 + q_rows): ``S_h = Q_h·Kᵀ`` over K chunks into one score tile
    holding every key, softmax over it, ``O_h = P·V`` accumulated over V chunks, O_h stored."""
    dt = b.profile.dtype
    hd, n_keys, lc = head.head_dim, head.n_keys, head.key_chunk
    burst = b.profile.burst_bytes
    pitch = math.ceil(hd * dtype_bytes(dt) / burst) * burst
    kbase, vbase = b.kv[(g, "K")], b.kv[(g, "V")]
    rows = min(q_rows, head.S - q0)
    qb = b.spm.alloc("Qh", q_rows, hd, dt)
    sb = b.spm.alloc("S", q_rows, n_keys, dt)
    kv = [b.spm.alloc(f"KV{s}", lc, hd, dt) for s in range(2)]
    ob = b.spm.alloc("Oh", q_rows, hd, dt, elem_bytes=acc_elem_bytes(dt))
    b.load(qb, Q, q0, h * hd, rows, hd)
    chunks = list(range(0, n_keys, lc))

    def kv_load(i: int, base: int, kind: str) -> None:
        c0 = chunks[i]
        n = min(lc, n_keys - c0)
        b.emit(Opcode.KV_LOAD_TILE, kv[i % 2].offset, base + c0 * pitch, None, rows=n, cols=hd,
               dtype=dt, head=g, kind=kind, kv_start=c0, kv_len=n, base=base)

    kv_load(0, kbase, "K")
    b.sync()
    for i, c0 in enumerate(chunks):
        n = min(lc, n_keys - c0)
        if i + 1 < len(chunks):
            kv_load(i + 1, kbase, "K")
        b.emit(Opcode.TE_QKT_TILE, sb.offset, qb.offset, kv[i % 2].offset, m=rows, k=hd, n=n,
               dst_col0=c0, dst_cols=n_keys, dtype=dt, dst_bytes=sb.nbytes, scale=1.0 / math.sqrt(hd),
               causal=True, q_pos=head.kv_cached + q0)
        b.sync()
    b.emit(Opcode.VE_SOFTMAX_TILE, sb.offset, sb.offset, None, rows=rows, cols=n_keys, dtype=dt, axis=-1,
           reduce_len=n_keys, full_len=n_keys)
    kv_load(0, vbase, "V")
    b.sync()
    for i, c0 in enumerate(chunks):
        n = min(lc, n_keys - c0)
        if i + 1 < len(chunks):
            kv_load(i + 1, vbase, "V")
        b.emit(Opcode.TE_AV_TILE, ob.offset, sb.offset, kv[i % 2].offset, m=rows, k=n, n=hd,
               src0_col0=c0, acc=int(i > 0), dtype=dt, dst_bytes=ob.nbytes)
        b.sync()
    b.store(O, q0, h * hd, ob, rows, hd)
    b.sync()
    b.spm.free(qb, sb, ob, *kv)


def lower_moe_experts(b: Builder, tokens_per_expert: list[int], d: int, f: int) -> dict[str, DramTensor]:
    """MoE expert FFN: for every expert with tokens, a SwiGLU FFN over its gathered tokens, scaled by the router's
    combine weights (``VE_MUL`` with a per-row weight column) and stored for the merge."""
    if not tokens_per_expert or any(t < 0 for t in tokens_per_expert):
        raise BadInput("tokens_per_expert must be a non-empty list of counts >= 0", field="tokens_per_expert")
    out: dict[str, DramTensor] = {}
    for e, t in enumerate(tokens_per_expert):
        if t == 0:
            continue
        gate = b.dram.tensor(f"E{e}_gate", t, 1, b.profile.dtype)
        out.update(lower_swiglu_ffn(b, t, d, f, prefix=f"E{e}_", scale=gate))
        out[gate.name] = gate
    return out


def kv_regions(b: Builder) -> dict[int, tuple[int, str, int, int, int]]:
    """KV regions of a builder for the validator: base → (head, kind, max_seq, row bytes, cached rows)."""
    out: dict[int, tuple[int, str, int, int, int]] = {}
    for (head, kind), base in b.kv.items():
        t = next(x for x in b.dram.tensors if x.addr == base)
        out[base] = (head, kind, t.rows, t.pitch, b.kv_cached[(head, kind)])
    return out


def new_builder(profile: DeviceProfile) -> Builder:
    return Builder(profile)
