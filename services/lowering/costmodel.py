"""Analytic cost model: systolic-array GEMM cycles, tiled DMA bytes, SPM accesses and energy; vector-unit ops.

No cycle-by-cycle simulation. Formulas (R×C array, M×K · K×N GEMM):

- compute cycles, output stationary:  ``ceil(M/R)·ceil(N/C)·(K + R + C − 2)``   (fold count × fold length)
- compute cycles, weight stationary:  ``ceil(K/R)·ceil(N/C)·(M + 2R + C − 2)``
  SCALE-Sim v3 reports exactly these minus one cycle in every stall-free run (``../shared/reference/scalesim/``).
- DMA bytes: a blocked GEMM with tiles (Mt, Kt, Nt) chosen to fit the SPM (double-buffered A/B tiles + an fp32
  accumulator tile). With the n-outer order, A is re-read once per N tile unless the whole A stays resident
  (Mt = M and Kt = K) and B is read once per M tile unless a whole B column panel stays resident (Kt = K); the
  m-outer order is symmetric; C is written once. The cheaper order wins. Always >= the compulsory traffic
  ``(M·K + K·N)·b + M·N·b``.
- total cycles, double-buffered over n tiles with per-tile compute ``c`` and DMA ``d = bytes/(n·bw)``:
  ``d + (n − 1)·max(c, d) + c`` (load of the first tile exposed, compute of the last exposed); single-buffered when
  double buffers do not fit: ``n·(c + d)``. So ``max(compute, bytes/bw) <= total <= compute + bytes/bw``.
- SPM accesses (elements, the SCALE-Sim SRAM counters): OS reads A ``M·K·ceil(N/C)``, B ``K·N·ceil(M/R)``,
  writes C ``M·N``; WS reads A ``M·K·ceil(N/C)``, B ``K·N``, writes C ``M·N·ceil(K/R)``; plus the DMA fills
  and drains of the SPM.
- energy (J) = MACs·E_mac + SPM 64-bit accesses·E_spm + DRAM bits·E_dram (constants from ``arch.power`` /
  ``arch.dram.pj_per_bit``; defaults cite ``../shared/reference/energy/energy_anchors.csv``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from shared.configs.arch import ArchConfig
from shared.energy import ACC_BYTES, DTYPE_BYTES, SPM_ACCESS_BYTES, dtype_bytes
from shared.errors import BadInput

__all__ = ["ACC_BYTES", "DTYPE_BYTES", "SPM_ACCESS_BYTES", "dtype_bytes"]  # owned by shared.energy

RESIDENT_FRACTION = 0.75  # seed 004: a producer whose output fits in 0.75 × SPM stays resident (ComputeRoot)

Dataflow = Literal["os", "ws"]


# energy_anchors.csv (Horowitz ISSCC 2014, 45 nm): MAC = mult + add of the precision.
MAC_PJ_ANCHOR: dict[str, float] = {
    "fp16": 1.1 + 0.4,  # fp mult 16b + fp add 16b
    "bf16": 1.1 + 0.4,  # same as fp16 (no separate row)
    "fp32": 3.7 + 0.9,  # fp mult 32b + fp add 32b
    "int8": 0.2 + 0.03,  # int mult 8b + int add 8b
}


def fold_cycles(M: Any, K: Any, N: Any, R: int, C: int, dataflow: Dataflow) -> Any:
    """Compute cycles of the systolic array (numpy-broadcastable; scalars give a float)."""
    M_, K_, N_ = np.asarray(M, dtype=np.float64), np.asarray(K, dtype=np.float64), np.asarray(N, dtype=np.float64)
    if dataflow == "os":
        out = np.ceil(M_ / R) * np.ceil(N_ / C) * (K_ + R + C - 2)
    else:
        out = np.ceil(K_ / R) * np.ceil(N_ / C) * (M_ + 2 * R + C - 2)
    return out if out.ndim else float(out)


def cycles_from_macs(macs: NDArray[np.float64], tokens: NDArray[np.float64], R: int, C: int,
                     dataflow: Dataflow) -> NDArray[np.float64]:
    """Fold-formula cycles when only MACs and the row count M (tokens) are known (physicalization).

    The per-token work ``macs/tokens = Σ K·N`` over the op's GEMMs. WS: ``(ΣKN/(R·C))·(M + 2R + C − 2)`` (the fold
    formula with K, N multiples of the array). OS: ``ceil(M/R)·(ΣKN/C)·(1 + (R + C − 2)/K)`` with the reduction
    length approximated by ``K ≈ sqrt(ΣKN)`` (square weights). Rows with no tokens cost ``macs/(R·C)``.
    """
    m = np.maximum(tokens, 0.0)
    kn = np.divide(macs, m, out=np.zeros_like(macs), where=m > 0)
    if dataflow == "ws":
        cyc = kn / (R * C) * (m + 2 * R + C - 2)
    else:
        k_eff = np.sqrt(np.maximum(kn, 1.0))
        cyc = np.ceil(m / R) * kn / C * (1.0 + (R + C - 2) / k_eff)
    return np.where(m > 0, cyc, macs / (R * C))


@dataclass(frozen=True)
class Tiling:
    Mt: int
    Kt: int
    Nt: int
    double_buffered: bool
    order: Literal["n_outer", "m_outer"]
    spm_bytes_used: int

    @property
    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _traffic(M: int, K: int, N: int, Mt: Any, Kt: Any, Nt: Any, b: int) -> tuple[Any, Any]:
    """DMA bytes of both loop orders (n_outer, m_outer) for candidate tiles (numpy arrays)."""
    nM, nN = np.ceil(M / Mt), np.ceil(N / Nt)
    a_bytes, b_bytes, c_bytes = M * K * b, K * N * b, M * N * b
    a_res = (Mt >= M) & (Kt >= K)
    b_res = (Nt >= N) & (Kt >= K)
    # n outer: for n, for m, for k -> A re-read per n (unless all of A resident), B per m (unless Kt = K panel).
    n_outer = np.where(a_res, a_bytes, a_bytes * nN) + np.where(Kt >= K, b_bytes, b_bytes * nM) + c_bytes
    m_outer = np.where(Kt >= K, a_bytes, a_bytes * nN) + np.where(b_res, b_bytes, b_bytes * nM) + c_bytes
    return n_outer, m_outer


def _candidates(dim: int, unit: int, align: int = 1) -> NDArray[np.int64]:
    """Tile sizes for one dimension: multiples of the array side (powers of two) capped at the dimension; a tile
    that does not cover the dimension must be a multiple of ``align`` elements (DMA burst alignment)."""
    vals = {dim}
    t = max(unit, 1)
    while t < dim:
        vals.add(t)
        t *= 2
    if dim < unit:
        vals.add(dim)
    out = [v for v in vals if v >= dim or v % align == 0]
    if len(out) == 1 and out[0] == dim and dim > align and align > 1:
        a = align
        while a < dim:  # no power-of-two multiple of the array side is aligned: use multiples of the burst
            out.append(a)
            a *= 2
    return np.array(sorted(set(out)), dtype=np.int64)


def choose_tiling(M: int, K: int, N: int, *, array: tuple[int, int], spm_bytes: int, dtype: str,
                  n_weights: int = 1, a_fixed: tuple[int, int] | None = None, bias: bool = False,
                  align_elems: int = 1) -> Tiling:
    """Smallest-traffic tile shape that fits the SPM, preferring double buffering (ties: fewer, larger tiles).

    SPM need: A tiles (none when A is resident, ``a_fixed = (Mt, Kt)``), ``n_weights`` B tiles and fp32 output tiles
    (SwiGLU's gate and up share the A tile), an optional bias row; double buffering doubles the A/B/bias tiles.
    """
    R, C = array
    b = dtype_bytes(dtype)
    if a_fixed is not None:
        mc, kc = np.array([a_fixed[0]]), np.array([a_fixed[1]])
    else:
        mc, kc = _candidates(M, R), _candidates(K, R, align_elems)
    nc = _candidates(N, C, align_elems)
    Mt, Kt, Nt = (g.ravel() for g in np.meshgrid(mc, kc, nc, indexing="ij"))
    a_tile = np.zeros_like(Mt) if a_fixed is not None else Mt * Kt * b
    ab = a_tile + n_weights * Kt * Nt * b + (Nt * b if bias else 0)
    acc = n_weights * Mt * Nt * ACC_BYTES
    single = ab + acc
    double = 2 * ab + acc
    n_outer, m_outer = _traffic(M, K, N, Mt, Kt, Nt, b)
    if a_fixed is not None:  # A costs nothing to re-read
        n_outer = n_outer - np.where((Mt >= M) & (Kt >= K), M * K * b, M * K * b * np.ceil(N / Nt))
        m_outer = m_outer - np.where(Kt >= K, M * K * b, M * K * b * np.ceil(N / Nt))
    traffic = np.minimum(n_outer, m_outer)
    for db, need in ((True, double), (False, single)):
        ok = need <= spm_bytes
        if not ok.any():
            continue
        n_tiles = np.ceil(M / Mt) * np.ceil(K / Kt) * np.ceil(N / Nt)
        key = np.where(ok, traffic, np.inf)
        best_t = key.min()
        cand = np.flatnonzero(ok & (traffic == best_t))
        i = int(cand[np.argmin(n_tiles[cand])])
        order: Literal["n_outer", "m_outer"] = "n_outer" if n_outer[i] <= m_outer[i] else "m_outer"
        return Tiling(int(Mt[i]), int(Kt[i]), int(Nt[i]), db, order, int(need[i]))
    smallest = int(single.min())
    raise BadInput(f"no tile fits the SPM: the smallest tile needs {smallest} bytes but {spm_bytes} are free",
                   field="spm_bytes")


class DramBytesReport:
    """Mixin of the cost reports (dataclasses): total DRAM bytes and a JSON-ready dict that includes them."""

    dram_read_bytes: float
    dram_write_bytes: float

    @property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)  # type: ignore[call-overload]  # subclasses are dataclasses
        d["dram_bytes"] = self.dram_bytes
        return dict(d)


@dataclass(frozen=True)
class GemmCost(DramBytesReport):
    M: int
    K: int
    N: int
    dataflow: str
    macs: float
    compute_cycles: float
    dma_cycles: float
    total_cycles: float
    dram_read_bytes: float
    dram_write_bytes: float
    compulsory_bytes: float
    spm_accesses: float  # 64-bit accesses
    sram_reads_a: float  # elements (SCALE-Sim counter semantics)
    sram_reads_b: float
    sram_writes_c: float
    n_tiles: int
    tiling: Tiling
    energy_j: float
    energy_breakdown_j: dict[str, float]


def mac_pj_for(dtype: str, arch: ArchConfig | None) -> float:
    if arch is not None and dtype == arch.core.dtype:
        return arch.power.mac_pj
    return MAC_PJ_ANCHOR[dtype]


def gemm_cost(M: int, K: int, N: int, *, array: tuple[int, int] = (32, 32), dataflow: Dataflow = "ws",
              spm_bytes: int = 512 * 1024, dma_bytes_per_cycle: float = 64.0, dtype: str = "bf16",
              arch: ArchConfig | None = None, burst_bytes: int = 64) -> GemmCost:
    """Cycles, bytes and energy of ``C[M,N] = A[M,K] · B[K,N]`` on one core (see the module docstring)."""
    for name, v in (("M", M), ("K", K), ("N", N)):
        if v < 1:
            raise BadInput(f"{name} must be >= 1, got {v}", field=name)
    R, C = array
    if R < 1 or C < 1:
        raise BadInput(f"array must be positive, got {R}x{C}", field="array")
    if dataflow not in ("os", "ws"):
        raise BadInput(f"dataflow must be 'os' or 'ws', got {dataflow!r}", field="dataflow")
    if dma_bytes_per_cycle <= 0:
        raise BadInput("dma_bytes_per_cycle must be > 0", field="dma_bytes_per_cycle")
    b = dtype_bytes(dtype)
    tiling = choose_tiling(M, K, N, array=array, spm_bytes=spm_bytes, dtype=dtype,
                           align_elems=max(1, burst_bytes // b))
    compute = float(fold_cycles(M, K, N, R, C, dataflow))
    n_o, m_o = _traffic(M, K, N, np.array(tiling.Mt), np.array(tiling.Kt), np.array(tiling.Nt), b)
    traffic = float(min(n_o, m_o))
    write = float(M * N * b)
    read = traffic - write
    n_tiles = math.ceil(M / tiling.Mt) * math.ceil(K / tiling.Kt) * math.ceil(N / tiling.Nt)
    c_t = compute / n_tiles
    d_t = traffic / dma_bytes_per_cycle / n_tiles
    total = d_t + (n_tiles - 1) * max(c_t, d_t) + c_t if tiling.double_buffered else n_tiles * (c_t + d_t)
    macs = float(M) * K * N
    nfold_n = math.ceil(N / C)
    sram_a = float(M) * K * nfold_n
    if dataflow == "os":
        sram_b = float(K) * N * math.ceil(M / R)
        sram_c = float(M) * N
    else:
        sram_b = float(K) * N
        sram_c = float(M) * N * math.ceil(K / R)
    spm_bytes_touched = (sram_a + sram_b + sram_c) * b + traffic  # array traffic + DMA fills/drains
    spm_acc = spm_bytes_touched / SPM_ACCESS_BYTES
    e_mac = macs * mac_pj_for(dtype, arch) * 1e-12
    spm_pj = arch.power.spm_pj_per_access if arch is not None else 10.0
    dram_pj = arch.dram.pj_per_bit if arch is not None else 3.9
    e_spm = spm_acc * spm_pj * 1e-12
    e_dram = traffic * 8 * dram_pj * 1e-12
    return GemmCost(
        M=M, K=K, N=N, dataflow=dataflow, macs=macs, compute_cycles=compute,
        dma_cycles=traffic / dma_bytes_per_cycle, total_cycles=total,
        dram_read_bytes=read, dram_write_bytes=write, compulsory_bytes=float((M * K + K * N + M * N) * b),
        spm_accesses=spm_acc, sram_reads_a=sram_a, sram_reads_b=sram_b, sram_writes_c=sram_c,
        n_tiles=n_tiles, tiling=tiling, energy_j=e_mac + e_spm + e_dram,
        energy_breakdown_j={"mac": e_mac, "spm": e_spm, "dram": e_dram},
    )


def gemm_cost_for_arch(M: int, K: int, N: int, arch: ArchConfig, *, dtype: str | None = None) -> GemmCost:
    core = arch.core
    return gemm_cost(M, K, N, array=core.array, dataflow=core.dataflow, spm_bytes=core.spm_kb * 1024,
                     dma_bytes_per_cycle=core.dma_bytes_per_cycle, dtype=dtype or core.dtype, arch=arch,
                     burst_bytes=core.dma_burst_bytes)


# Vector-unit passes per element of each VE op (a documented estimate: each pass is one vector instruction per
# element group; transcendental ops count their polynomial steps).
VE_PASSES: dict[str, int] = {
    "add": 1, "mul": 1, "gelu": 8, "silu": 6, "softmax": 5, "rmsnorm": 4, "layernorm": 6, "copy": 1, "topk": 2,
}


@dataclass(frozen=True)
class VectorCost:
    op: str
    elements: float
    cycles: float
    dram_bytes: float
    energy_j: float


def vector_cost(op: str, elements: float, *, vector_width: int, dram_bytes: float = 0.0,
                dma_bytes_per_cycle: float = 64.0, arch: ArchConfig | None = None) -> VectorCost:
    """VE op: ``cycles = max(ceil(elements/width)·passes, dram_bytes/bw)``; energy per element-op + SPM + DRAM."""
    if op not in VE_PASSES:
        raise BadInput(f"unknown vector op {op!r}; known: {', '.join(sorted(VE_PASSES))}", field="op")
    passes = VE_PASSES[op]
    compute = math.ceil(elements / vector_width) * passes
    cycles = max(float(compute), dram_bytes / dma_bytes_per_cycle)
    vpj = arch.power.vector_pj_per_op if arch is not None else 0.4
    spm_pj = arch.power.spm_pj_per_access if arch is not None else 10.0
    dram_pj = arch.dram.pj_per_bit if arch is not None else 3.9
    e = (elements * passes * vpj + 2 * dram_bytes / SPM_ACCESS_BYTES * spm_pj + dram_bytes * 8 * dram_pj) * 1e-12
    return VectorCost(op=op, elements=float(elements), cycles=cycles, dram_bytes=dram_bytes, energy_j=e)
