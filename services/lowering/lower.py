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
    p = b.profile
    M, K = A.rows, A.cols
    N = Bs[0].cols
    for j, w in enumerate(Bs):
        if w.rows != K or w.cols != N:
            raise BadInput(f"weight {w.name} is {w.rows}x{w.cols} but A is {M}x{K} and N = {N}",
                           field=f"weights[{j}]")
        if w.dtype != A.dtype:
            raise BadInput(f"weight {w.name} is {w.dtype} but A is {A.dtype}", field="dtype")
    eb = dtype_bytes(A.dtype)
    bias = next((e[1] for e in epilogue if e[0] == "bias"), None)
    scale = next((e[1] for e in epilogue if e[0] == "scale"), None)
    free = p.spm_bytes - sum(x.nbytes for x in b.spm.live.values())
    a_res = isinstance(A, Resident)
    if tiles is None:
        if isinstance(out, ToResident):  # the output blocks accumulate in the SPM: keep room for all of them
            free -= M * N * acc_elem_bytes(A.dtype)
        tiles = choose_tiling(M, K, N, array=p.array, spm_bytes=free - (M * eb * 2 if scale is not None else 0),
                              dtype=A.dtype, n_weights=len(Bs),
                              a_fixed=(A.Mt, A.Kt) if isinstance(A, Resident) else None, bias=bias is not None,
                              align_elems=max(1, p.burst_bytes // eb))
    Mt, Kt, Nt = tiles.Mt, tiles.Kt, tiles.Nt
    if isinstance(out, ToKV) and (Mt < M):
        raise BadInput(f"KV output needs all {M} token rows in one tile", field="spm_bytes")
    nM, nK, nN = math.ceil(M / Mt), math.ceil(K / Kt), math.ceil(N / Nt)
    b.reserve(nM * nN * nK * len(Bs))  # every step emits one matmul tile per weight
    nslot = 2 if tiles.double_buffered else 1
    a_slots = None if a_res else _Slots([b.spm.alloc(f"A{s}", Mt, Kt, A.dtype) for s in range(nslot)])
    b_slots = [_Slots([b.spm.alloc(f"B{j}{s}", Kt, Nt, A.dtype) for s in range(nslot)]) for j in range(len(Bs))]
    bias_slots = _Slots([b.spm.alloc(f"bias{s}", 1, Nt, A.dtype) for s in range(nslot)]) if bias else None
    scale_buf = None
    if scale is not None:  # per-row combine weights (t × 1), loaded once
        scale_buf = b.spm.alloc("scale", M, 1, A.dtype)
        b.load(scale_buf, scale, 0, 0, M, 1)
    acc_b = acc_elem_bytes(A.dtype)
    result = None
    if isinstance(out, ToResident):
        region = b.spm.alloc("resident", nM * nN * Mt, Nt, A.dtype, elem_bytes=acc_b, top=True)
        result = Resident(M, N, Mt, Nt, A.dtype, region=region)
        blk = Mt * Nt * acc_b
        for bi, (mi, ni) in enumerate((mi, ni) for mi in range(nM) for ni in range(nN)):
            result.blocks[(mi, ni)] = Buf(region.offset + bi * blk, Mt, Nt, A.dtype, blk, f"H{mi}_{ni}")
    c_bufs: list[Buf] = [b.spm.alloc(f"C{j}", Mt, Nt, A.dtype, elem_bytes=acc_b)
                         for j in range(len(Bs) if result is None else len(Bs) - 1)]
    if result is not None:
        c_bufs.insert(0, result.blocks[steps_first_block(tiles, nM, nN)])

    if tiles.order == "n_outer":
        steps = [(mi, ni, ki) for ni in range(nN) for mi in range(nM) for ki in range(nK)]
    else:
        steps = [(mi, ni, ki) for mi in range(nM) for ni in range(nN) for ki in range(nK)]

    def dims(mi: int, ni: int, ki: int) -> tuple[int, int, int]:
        return min(Mt, M - mi * Mt), min(Kt, K - ki * Kt), min(Nt, N - ni * Nt)

    def needs(t: int) -> list[tuple[_Slots, object, DramTensor, int, int, int, int]]:
        mi, ni, ki = steps[t]
        mt, kt, nt = dims(mi, ni, ki)
        out_l: list[tuple[_Slots, object, DramTensor, int, int, int, int]] = []
        if a_slots is not None:
            assert isinstance(A, DramTensor)
            out_l.append((a_slots, ("A", mi, ki), A, mi * Mt, ki * Kt, mt, kt))
        for j, w in enumerate(Bs):
            out_l.append((b_slots[j], ("B", j, ki, ni), w, ki * Kt, ni * Nt, kt, nt))
        if bias_slots is not None and bias is not None and ki == nK - 1:
            out_l.append((bias_slots, ("bias", ni), bias, 0, ni * Nt, 1, nt))
        return out_l

    def issue(t: int, avoid_current: bool) -> None:
        for slots, tile, src, r0, c0, rows, cols in needs(t):
            if slots.find(tile) is not None:
                continue
            s = (slots.cur + 1) % len(slots.bufs) if avoid_current else slots.cur
            slots.held[s] = tile
            b.load(slots.bufs[s], src, r0, c0, rows, cols)

    def select(t: int) -> None:
        for slots, tile, *_ in needs(t):
            i = slots.find(tile)
            assert i is not None
            slots.cur = i

    issue(0, avoid_current=False)
    b.sync()
    for t, (mi, ni, ki) in enumerate(steps):
        select(t)
        if nslot == 2 and t + 1 < len(steps):
            issue(t + 1, avoid_current=True)
        mt, kt, nt = dims(mi, ni, ki)
        if a_res:
            assert isinstance(A, Resident)
            a_buf = A.blocks[(mi, ki)]
        else:
            assert a_slots is not None
            a_buf = a_slots.bufs[a_slots.cur]
        for j in range(len(Bs)):
            b.emit(Opcode.TE_MATMUL_TILE, c_bufs[j].offset, a_buf.offset, b_slots[j].bufs[b_slots[j].cur].offset,
                   m=mt, k=kt, n=nt, acc=int(ki > 0), dtype=A.dtype, dst_bytes=c_bufs[j].nbytes)
        b.sync()
        if nslot == 1 and t + 1 < len(steps):
            issue(t + 1, avoid_current=False)
            b.sync()
        if ki != nK - 1:
            continue
        # ---- epilogue on the finished output tile ----
        c0 = c_bufs[0]
        imm: dict[str, Any] = {"rows": mt, "cols": nt, "dtype": A.dtype}
        for e in epilogue:
            kind = e[0]
            if kind == "bias":
                assert bias_slots is not None
                bb = bias_slots.bufs[bias_slots.find(("bias", ni)) or 0]
                b.emit(Opcode.VE_ADD_TILE, c0.offset, c0.offset, bb.offset, **imm)
            elif kind == "gelu":
                b.emit(Opcode.VE_GELU_TILE, c0.offset, c0.offset, None, **imm)
            elif kind == "silu":
                b.emit(Opcode.VE_SILU_TILE, c0.offset, c0.offset, None, **imm)
            elif kind == "swiglu":
                b.emit(Opcode.VE_SILU_TILE, c0.offset, c0.offset, None, **imm)
                b.emit(Opcode.VE_MUL_TILE, c0.offset, c0.offset, c_bufs[1].offset, **imm)
            elif kind == "scale":
                assert scale_buf is not None
                if mt != M:
                    raise BadInput("row scaling needs all rows in one tile", field="spm_bytes")
                b.emit(Opcode.VE_MUL_TILE, c0.offset, c0.offset, scale_buf.offset, **imm)
            else:
                raise BadInput(f"unknown epilogue {kind!r}", field="epilogue")
        if isinstance(out, ToResident):
            assert result is not None
            if t + 1 < len(steps):  # the next output tile accumulates straight into its resident block
                c_bufs[0] = result.blocks[(steps[t + 1][0], steps[t + 1][1])]
            if epilogue:
                b.sync()  # the epilogue read the bias buffer the next prefetch overwrites
            continue
        b.sync()
        if isinstance(out, ToDram):
            b.store(out.t, mi * Mt, out.c0 + ni * Nt, c0, mt, nt)
        else:
            head = out.head0 + ni
            if nt != Nt and ni != nN - 1:
                raise BadInput("KV output tiles must be one head wide", field="head_dim")
            base = b.kv_region(head, out.kind, out.max_seq, nt, out.cached)
            pitch = math.ceil(nt * dtype_bytes(A.dtype) / p.burst_bytes) * p.burst_bytes
            b.emit(Opcode.KV_STORE_TILE, base + out.pos * pitch, c0.offset, None, rows=mt, cols=nt, dtype=A.dtype,
                   head=head, kind=out.kind, pos=out.pos, base=base)
        b.sync()
    if a_slots is not None:
        b.spm.free(*a_slots.bufs)
    for s in b_slots:
        b.spm.free(*s.bufs)
    if bias_slots is not None:
        b.spm.free(*bias_slots.bufs)
    b.spm.free(scale_buf)
    if result is None:
        b.spm.free(*c_bufs)
    else:
        b.spm.free(*c_bufs[1:])
    return result


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
    L = kv_cached + S
    max_seq = max_seq or L
    if max_seq < L:
        raise BadInput(f"max_seq {max_seq} < kv_cached + S = {L}", field="max_seq")
    dt = b.profile.dtype
    eb = dtype_bytes(dt)
    X = b.dram.tensor("X", S, d, dt)
    Wq = b.dram.tensor("Wq", d, heads * head_dim, dt)
    Wk = b.dram.tensor("Wk", d, kv_heads * head_dim, dt)
    Wv = b.dram.tensor("Wv", d, kv_heads * head_dim, dt)
    Wo = b.dram.tensor("Wo", heads * head_dim, d, dt)
    Q = b.dram.tensor("Q", S, heads * head_dim, dt)
    O = b.dram.tensor("O", S, heads * head_dim, dt)
    Y = b.dram.tensor("Y", S, d, dt)
    R = b.profile.array[0]
    # ---- QKV with X reuse ----
    A: DramTensor | Resident = X
    acc_head = S * head_dim * acc_elem_bytes(dt)
    if _resident_fits(b, S, d, dt, 0.5):
        left = b.profile.spm_bytes - S * d * eb - acc_head
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
    # ---- per head attention ----
    group = heads // kv_heads
    pitch = math.ceil(head_dim * eb / b.profile.burst_bytes) * b.profile.burst_bytes
    lc = min(L, 128)
    cap = b.profile.spm_bytes
    sq = S
    while sq > 1 and (sq * head_dim * eb + sq * L * eb + 2 * lc * head_dim * eb + sq * head_dim * acc_elem_bytes(dt)
                      > cap):
        sq = (sq + 1) // 2
    if sq * head_dim * eb + sq * L * eb + 2 * lc * head_dim * eb + sq * head_dim * acc_elem_bytes(dt) > cap:
        raise BadInput(f"one query row's scores over {L} keys do not fit the SPM", field="kv_cached")
    b.sync()
    for h in range(heads):
        g = h // group
        kbase, vbase = b.kv[(g, "K")], b.kv[(g, "V")]
        for q0 in range(0, S, sq):
            rows = min(sq, S - q0)
            qb = b.spm.alloc("Qh", sq, head_dim, dt)
            sb = b.spm.alloc("S", sq, L, dt)
            kv = [b.spm.alloc(f"KV{s}", lc, head_dim, dt) for s in range(2)]
            ob = b.spm.alloc("Oh", sq, head_dim, dt, elem_bytes=acc_elem_bytes(dt))
            b.load(qb, Q, q0, h * head_dim, rows, head_dim)
            chunks = list(range(0, L, lc))

            def kv_load(i: int, base: int, kind: str, chunks: list[int] = chunks, g: int = g,
                        kv: list[Buf] = kv) -> None:
                c0 = chunks[i]
                n = min(lc, L - c0)
                b.emit(Opcode.KV_LOAD_TILE, kv[i % 2].offset, base + c0 * pitch, None, rows=n, cols=head_dim,
                       dtype=dt, head=g, kind=kind, kv_start=c0, kv_len=n, base=base)

            kv_load(0, kbase, "K")
            b.sync()
            for i, c0 in enumerate(chunks):
                n = min(lc, L - c0)
                if i + 1 < len(chunks):
                    kv_load(i + 1, kbase, "K")
                b.emit(Opcode.TE_QKT_TILE, sb.offset, qb.offset, kv[i % 2].offset, m=rows, k=head_dim, n=n,
                       dst_col0=c0, dst_cols=L, dtype=dt, dst_bytes=sb.nbytes, scale=1.0 / math.sqrt(head_dim),
                       causal=True, q_pos=kv_cached + q0)
                b.sync()
            b.emit(Opcode.VE_SOFTMAX_TILE, sb.offset, sb.offset, None, rows=rows, cols=L, dtype=dt, axis=-1,
                   reduce_len=L, full_len=L)
            kv_load(0, vbase, "V")
            b.sync()
            for i, c0 in enumerate(chunks):
                n = min(lc, L - c0)
                if i + 1 < len(chunks):
                    kv_load(i + 1, vbase, "V")
                b.emit(Opcode.TE_AV_TILE, ob.offset, sb.offset, kv[i % 2].offset, m=rows, k=n, n=head_dim,
                       src0_col0=c0, acc=int(i > 0), dtype=dt, dst_bytes=ob.nbytes)
                b.sync()
            b.store(O, q0, h * head_dim, ob, rows, head_dim)
            b.sync()
            b.spm.free(qb, sb, ob, *kv)
    # ---- output projection ----
    gemm(b, O, [Wo], ToDram(Y))
    return {"X": X, "Wq": Wq, "Wk": Wk, "Wv": Wv, "Wo": Wo, "Q": Q, "O": O, "Y": Y}


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
