"""Spectral fast path: ``(alpha·C + G)⁻¹·rhs`` for the grid network in O(N log N).

Split ``alpha·C + G`` into

- the laterally uniform part ``A0``: per layer one lateral conductance per direction, one capacitance per cell, uniform
  vertical links and sink-to-ambient links. The 2-D DCT-II (orthonormal, Neumann edges) diagonalises each layer's
  lateral operator (eigenvalues ``g_ns·λ_p + g_ew·λ_q`` with ``λ_p = 2 − 2·cos(π·p/n)``), leaving one symmetric
  tridiagonal layers × layers system per lateral mode, solved by a vectorised Thomas sweep over all modes at once;
- the package ring (the spreader's and the sink's edge cells linked to the 12 ring nodes), which is not laterally
  uniform. The ring nodes are eliminated (Schur complement, 12 × 12), which leaves ``A0 + U·E·Uᵀ`` with ``U`` the
  k edge cells of the spreader and sink layers (k = 2·(2·rows + 2·cols − 4)) and ``E`` a dense k × k matrix. Woodbury:
  ``x = y − A0⁻¹·U·z`` with ``y = A0⁻¹·f`` and ``z = (I + E·S)⁻¹·E·Uᵀ·y``, ``S = Uᵀ·A0⁻¹·U`` computed in mode space.

A solve in mode space (``solve_modal``) is one tridiagonal sweep over all modes, two separable edge transforms
(O(n²) each) and one k × k mat-vec; ``solve`` adds one forward and one inverse DCT of the stack (two matrix
products per layer up to 128 × 128 cells). Both window steps run entirely in mode space, DCTs only at their ends:
the exponential step (``step_exponential_modes``, the service's default: one complex solve per pole, all poles in
two compiled passes, ``exp_kernels``) and the TR-BDF2 step (``step_trbdf2_modes``: two real solves per sub-step,
compiled fused passes, ``spectral_kernels``); the off-diagonal part of the k × k Woodbury matrix is in float32.
Exact to round-off against the sparse LU (tests: 1e-6 K; measured 1e-10 K for TR-BDF2, 1e-8 K for the exponential
step); factorisations are cached per shift ``alpha`` (complex shifts serve the exponential step).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from services.thermal.network import N_RING, RCNetwork
from services.thermal.rational import exp_poles
from shared.limits import over_thermal_budget
from shared.lru import LRU

MAX_FACTORS = 24  # cached shifts per solver: 0 (steady), 1/(d·h) (TR-BDF2), z_k/dt (the exponential step's poles)


def _dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix D (n × n): ``X̂ = D·X``; its rows are the Neumann Laplacian's eigenvectors."""
    p = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    D = np.cos(np.pi * p * (2 * i + 1) / (2 * n)) * np.sqrt(2.0 / n)
    D[0] /= np.sqrt(2.0)
    out: np.ndarray = D
    return out


def _split_k(K: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``K = diag(kd) + Koff``: ``kd``, ``Koff`` (zero diagonal) and ``Koff·1``, in K's precision. Both window steps
    store ``Koff`` in float32 and apply it to the edge values minus their mean, the mean through ``Koff·1``."""
    kd = np.ascontiguousarray(np.diag(K))
    off = K - np.diag(kd)
    return kd, off, off.sum(axis=1)


@dataclass
class _Factor:
    m: np.ndarray  # (L-1, P) off·inv_dd: the multipliers of both sweeps (symmetric tridiagonal LU)
    inv_dd: np.ndarray  # (L, P) reciprocal pivots
    K: np.ndarray  # (k, k) (I + E·S)⁻¹·E
    R_inv: np.ndarray  # (12, 12) ring block inverse
    Bk: np.ndarray  # (k, 12) edge-cell to ring conductances
    S: np.ndarray  # (k, k) Uᵀ·A0⁻¹·U
    Wg: np.ndarray  # (k, 12) (I − K·S)·Bk·R⁻¹: ring values -> Woodbury edge weights
    Ry: np.ndarray  # (12, k) R⁻¹·Bkᵀ
    Rw: np.ndarray  # (12, k) R⁻¹·Bkᵀ·S


@dataclass(frozen=True)
class _ExpData:
    """The exponential step's factors for one (dt, degree), per pole in the upper half plane stacked on the first
    axis of every array (what ``exp_kernels.step`` takes)."""

    facs: tuple[_Factor, ...]
    inv_r: np.ndarray  # (poles, L, P) real part of the reciprocal pivots
    inv_i: np.ndarray  # (poles, L, P) imaginary part
    q: np.ndarray  # (poles,) complex 1/α_k
    beta: np.ndarray  # (poles,) complex −(2/dt)·c_k
    # K = diag(kd) + Koff: kd (poles, k), Koff's strict upper triangle (re, im; float32, row by row), Koff·1
    kd: np.ndarray
    koff_r: np.ndarray
    koff_i: np.ndarray
    koff_sum: np.ndarray
    Wg: np.ndarray  # (poles, k, 12)
    R_inv: np.ndarray  # (poles, 12, 12)
    Ry: np.ndarray  # (poles, 12, k)
    Rw: np.ndarray  # (poles, 12, k)


class SpectralSolver:
    def __init__(self, net: RCNetwork) -> None:
        if not net.uniform:
            raise ValueError("the spectral solver needs laterally uniform layers; use solvers.SparseSolver")
        self.net = net
        L, R, C = net.n_layers, net.rows, net.cols
        self.shape = (L, R, C)
        lam_r = 2.0 - 2.0 * np.cos(np.pi * np.arange(R) / R)
        lam_c = 2.0 - 2.0 * np.cos(np.pi * np.arange(C) / C)
        # per-mode lateral + vertical + ambient diagonal at alpha = 0: (L, P)
        lat = net.g_ns[:, None, None] * lam_r[None, :, None] + net.g_ew[:, None, None] * lam_c[None, None, :]
        vert = np.zeros(L)
        vert[:-1] += net.g_z
        vert[1:] += net.g_z
        vert[-1] += net.g_amb_cell
        self._diag0 = (lat + vert[:, None, None]).reshape(L, R * C)
        self._off = -net.g_z  # (L-1,)
        # edge cells of one layer (same set on the spreader and the sink), border order
        border = np.zeros((R, C), bool)
        border[0, :] = border[-1, :] = border[:, 0] = border[:, -1] = True
        ei, ej = np.nonzero(border)
        self._edge_flat = ei * C + ej  # (ke,)
        ke = ei.size
        self._ke = ke
        # the border as segments (kind, fixed index, varying indices, positions in border order) for _edge_block:
        # rows 0 and R-1 (every column), columns 0 and C-1 (rows 1..R-2)
        at = np.full((R, C), -1)
        at[ei, ej] = np.arange(ke)
        inner = np.arange(1, R - 1)
        self._segments: list[tuple[str, int, np.ndarray, np.ndarray]] = [
            (kind, fix, var, at[fix, var] if kind == "row" else at[var, fix])
            for kind, fix, var in (("row", 0, np.arange(C)), ("row", R - 1, np.arange(C)),  # R, C >= 2 (network)
                                   ("col", 0, inner), ("col", C - 1, inner))
            if var.size]
        DR, DC = _dct_matrix(R), _dct_matrix(C)
        self._DR, self._DC, self._ei, self._ej = DR, DC, ei, ej
        self._DRt, self._DCt = np.ascontiguousarray(DR.T), np.ascontiguousarray(DC.T)
        self._gemm_dct = max(R, C) <= 128
        self._DRperm = np.ascontiguousarray(DR[:, np.r_[0, R - 1, 1:R - 1]])  # DR's columns in border order
        self._DRe = np.ascontiguousarray(DR[:, [0, R - 1]])  # (R, 2): basis values on the north/south rows
        self._DCe = np.ascontiguousarray(DC[:, [0, C - 1]])  # (C, 2): on the west/east columns
        self._layers = (L - 2, L - 1)  # spreader, sink
        nrc = R * C
        self._edge_nodes = np.concatenate([a * nrc + self._edge_flat for a in self._layers])  # (k,)
        k = 2 * ke
        pos = {int(c): n for n, c in enumerate(self._edge_nodes)}
        d = np.zeros(k)
        Bk = np.zeros((k, N_RING))
        for e in net.ring_edges:
            for c in net.edge_cells(e):
                n = pos[int(c)]
                d[n] += e.g
                Bk[n, e.ring] += e.g
        self._d = d
        self._Bk = Bk
        ring_lap = np.zeros((N_RING, N_RING))
        for a, b, g in net.ring_links:
            ring_lap[a, a] += g
            ring_lap[b, b] += g
            ring_lap[a, b] -= g
            ring_lap[b, a] -= g
        self._ring0 = ring_lap + np.diag(net.ring_g_amb + Bk.sum(axis=0))
        self._cap_layer = net.cap
        self._factors: dict[complex, _Factor] = {}
        self._k32: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._exp: dict[tuple[float, int], _ExpData] = {}
        self._tls = threading.local()
        self._lock = threading.Lock()

    # -- mode-space tridiagonal solves ---------------------------------------------------------------------------
    def _thomas_factor(self, alpha: complex) -> tuple[np.ndarray, np.ndarray]:
        b = self._diag0 + alpha * self._cap_layer[:, None]
        L = b.shape[0]
        m = np.empty((L - 1, b.shape[1]), dtype=b.dtype)
        inv_dd = np.empty_like(b)
        dd = b[0]
        for layer in range(1, L):
            inv_dd[layer - 1] = 1.0 / dd
            m[layer - 1] = self._off[layer - 1] * inv_dd[layer - 1]  # symmetric: also the back-substitution factor
            dd = b[layer] - m[layer - 1] * self._off[layer - 1]
        inv_dd[L - 1] = 1.0 / dd
        return m, inv_dd

    def _thomas(self, m: np.ndarray, inv_dd: np.ndarray, f: np.ndarray,
                overwrite: bool = False) -> np.ndarray:
        """Solve every mode's tridiagonal system at once (in ``f`` when ``overwrite``, else in a copy). Forward
        elimination with the multipliers ``m``, then ``x = y·inv_dd`` and ``x[l] −= m[l]·x[l+1]`` going up (the
        factorisation is symmetric: ``m = off·inv_dd`` serves both sweeps)."""
        L = f.shape[0]
        dtype = np.result_type(f, m, np.float64)
        x = f if overwrite and f.dtype == dtype else np.array(f, dtype=dtype)
        tmp = np.empty(x.shape[1], dtype=x.dtype)
        for layer in range(1, L):
            np.multiply(m[layer - 1], x[layer - 1], out=tmp)
            x[layer] -= tmp
        x *= inv_dd
        for layer in range(L - 2, -1, -1):
            np.multiply(m[layer], x[layer + 1], out=tmp)
            x[layer] -= tmp
        return x

    def _edge_block(self, w: np.ndarray) -> np.ndarray:
        """``Fᵀ·diag(w)·F`` (edge cells × edge cells) for mode weights ``w`` (P,), using the separable DCT basis:
        ``S[e, f] = Σ_p Σ_q DR[p, i_e]·DR[p, i_f]·DC[q, j_e]·DC[q, j_f]·W[p, q]`` (``W`` = ``w`` as R × C).

        The border is four segments, each a row (fixed ``i``) or a column (fixed ``j``); the block of ``S`` between
        two segments is two matrix products, ``R·C·max(R, C)`` operations, and no (R, ke, ke) array is formed:
        row × row: ``DC[:, J]ᵀ·diag(a)·DC[:, J']`` with ``a = (DR[:, i]·DR[:, i'])ᵀ·W``; column × column:
        ``DR[:, I]ᵀ·diag(b)·DR[:, I']`` with ``b = W·(DC[:, j]·DC[:, j'])``; row × column:
        ``DC[:, J]ᵀ·Xᵀ·DR[:, I']`` with ``X = diag(DR[:, i])·W·diag(DC[:, j'])``."""
        R, C = self.shape[1], self.shape[2]
        W = w.reshape(R, C)
        DR, DC = self._DR, self._DC
        out = np.empty((self._ke, self._ke), dtype=np.result_type(w, np.float64))
        segs = self._segments
        for s, (kind_s, fix_s, var_s, pos_s) in enumerate(segs):
            for kind_t, fix_t, var_t, pos_t in segs[s:]:
                if kind_s == "row" and kind_t == "row":
                    a = (DR[:, fix_s] * DR[:, fix_t]) @ W
                    block = DC[:, var_s].T @ (a[:, None] * DC[:, var_t])
                elif kind_s == "col" and kind_t == "col":
                    b = W @ (DC[:, fix_s] * DC[:, fix_t])
                    block = DR[:, var_s].T @ (b[:, None] * DR[:, var_t])
                elif kind_s == "row":  # row s × column t
                    X = DR[:, fix_s][:, None] * W * DC[:, fix_t][None, :]
                    block = (DC[:, var_s].T @ X.T) @ DR[:, var_t]
                else:  # column s × row t: the transpose of row t × column s
                    X = DR[:, fix_t][:, None] * W * DC[:, fix_s][None, :]
                    block = ((DC[:, var_t].T @ X.T) @ DR[:, var_s]).T
                out[np.ix_(pos_s, pos_t)] = block
                out[np.ix_(pos_t, pos_s)] = block.T
        return out

    def factor(self, alpha: complex) -> _Factor:
        with self._lock:
            fac = self._factors.get(alpha)
            if fac is not None:
                return fac
            m, inv_dd = self._thomas_factor(alpha)
            L, P = inv_dd.shape
            dt = inv_dd.dtype
            cols = np.zeros((2, L, P), dtype=dt)
            for n, a in enumerate(self._layers):
                unit = np.zeros((L, P), dtype=dt)
                unit[a] = 1.0
                cols[n] = self._thomas(m, inv_dd, unit)
            ke = self._ke
            S = np.empty((2 * ke, 2 * ke), dtype=dt)
            a0, a1 = self._layers
            S[:ke, :ke] = self._edge_block(cols[0, a0])
            S[ke:, ke:] = self._edge_block(cols[1, a1])
            S[:ke, ke:] = self._edge_block(cols[1, a0])
            S[ke:, :ke] = S[:ke, ke:].T
            R_mat = self._ring0 + alpha * np.diag(self.net.ring_cap)
            R_inv = np.linalg.inv(R_mat)
            E = np.diag(self._d) - self._Bk @ R_inv @ self._Bk.T
            K = np.linalg.solve(np.eye(2 * ke) + E @ S, E)
            Ug = self._Bk @ R_inv
            Ry = R_inv @ self._Bk.T
            fac = _Factor(m, inv_dd, K, R_inv, self._Bk, S, Ug - K @ (S @ Ug), Ry, Ry @ S)
            self._factors[alpha] = fac
            while len(self._factors) > MAX_FACTORS:  # a few MB each; keep the most recent shifts
                self._factors.pop(next(iter(self._factors)))
            return fac

    # -- transforms between node vectors and (modes, ring) -------------------------------------------------------
    @staticmethod
    def _per_layer(left: np.ndarray, X: np.ndarray, right: np.ndarray) -> np.ndarray:
        """``left·X[i]·right`` for every layer ``i`` of ``X`` (n, R, C): one product for all layers, then one per
        layer (BLAS)."""
        n, R, C = X.shape
        out: np.ndarray = np.matmul(left, (X.reshape(n * R, C) @ right).reshape(n, R, C))
        return out

    def _dct_layers(self, X: np.ndarray) -> np.ndarray:
        """Orthonormal 2-D DCT-II of each layer, ``X̂ = DR·X·DCᵀ`` (n, R, C) -> (n, R, C). Up to 128 × 128 cells as
        two matrix products (BLAS; ~2x faster than pocketfft at 64 × 64), beyond that by FFT."""
        if self._gemm_dct:
            return self._per_layer(self._DR, X, self._DCt)
        import scipy.fft as sfft  # grids beyond 128 cells a side only (~50 ms of start-up otherwise)

        res: np.ndarray = sfft.dctn(X, type=2, axes=(1, 2), norm="ortho")
        return res

    def _idct_layers(self, Xh: np.ndarray) -> np.ndarray:
        """Inverse of ``_dct_layers``: ``X = DRᵀ·X̂·DC``."""
        if self._gemm_dct:
            return self._per_layer(self._DRt, Xh, self._DC)
        import scipy.fft as sfft

        res: np.ndarray = sfft.idctn(Xh, type=2, axes=(1, 2), norm="ortho")
        return res

    def to_modes(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cell modes (L, P) and ring values (12,) of a node vector (real, or complex: the DCT is real)."""
        L, R, C = self.shape
        nc = self.net.n_cells
        dtype = np.result_type(v, np.float64)
        vh = self._dct_layers(np.asarray(v[:nc], dtype=dtype).reshape(L, R, C))
        return vh.reshape(L, R * C), np.array(v[nc:], dtype=dtype)

    def from_modes(self, xh: np.ndarray, r: np.ndarray) -> np.ndarray:
        L, R, C = self.shape
        nc = self.net.n_cells
        Xh = np.asarray(xh).reshape(L, R, C)
        out = np.empty(nc + r.size, dtype=np.result_type(Xh, r, np.float64))
        if self._gemm_dct:  # the inverse DCT written straight into the node vector (no concatenation copy)
            np.matmul(self._DRt, (Xh.reshape(L * R, C) @ self._DC).reshape(L, R, C), out=out[:nc].reshape(L, R, C))
        else:
            out[:nc] = self._idct_layers(Xh).reshape(-1)
        out[nc:] = r
        return out

    def _modes_to_edges(self, yh2: np.ndarray) -> np.ndarray:
        """Real-space values on the border cells (border order) of two layers given in modes (2, P) -> (2·ke,).
        Separable: rows 0 and R−1 are ``DR[:, {0,R−1}]ᵀ·Ŷ·DC``, columns 0 and C−1 are ``DRᵀ·Ŷ·DC[:, {0,C−1}]``."""
        _, R, C = self.shape
        Y = yh2.reshape(2, R, C)
        rows = self._DRe.T @ Y @ self._DC  # (2, 2, C)
        cols = self._DR.T @ (Y @ self._DCe)  # (2, R, 2)
        return np.concatenate([rows[:, 0, :], cols[:, 1:-1, :].reshape(2, -1), rows[:, 1, :]], axis=1).reshape(-1)

    def _edges_to_modes(self, w: np.ndarray) -> np.ndarray:
        """Modes (2, P) of two layers that are zero except on their border cells (values ``w``, border order):
        ``DR·B`` with ``B`` (R, C) per layer = the border rows times ``DCᵀ`` and the border columns' two values times
        ``DC[:, {0, C−1}]ᵀ``, the rows of ``DR`` taken in the matching order (0, R−1, 1, …, R−2)."""
        _, R, C = self.shape
        W = w.reshape(2, -1)
        B = np.empty((2, R, C), dtype=W.dtype)
        B[:, 0, :] = W[:, :C] @ self._DCt
        B[:, 1, :] = W[:, -C:] @ self._DCt
        B[:, 2:, :] = W[:, C:-C].reshape(2, R - 2, 2) @ self._DCe.T
        out: np.ndarray = np.matmul(self._DRperm, B).reshape(2, R * C)
        return out

    def solve_modal(self, alpha: complex, fh: np.ndarray, g: np.ndarray,
                    overwrite: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(alpha·C + G)⁻¹`` on a right-hand side given as cell modes ``fh`` (L, P) and ring values ``g`` (12,).

        ``y0 = A0⁻¹·f`` (per-mode tridiagonal), ``w = Wg·g − K·y0_edge`` (the ring eliminated onto the edge cells and
        the Woodbury correction, with ``u = Bk·R⁻¹·g``, ``z = K·(y0_edge + S·u)``, ``w = u − z``),
        ``x = y0 + A0⁻¹·U·w = A0⁻¹·(f + U·w)``, ``r = R⁻¹·(g + Bkᵀ·x_edge)`` with ``x_edge = y0_edge + S·w``.
        Only the spreader and sink layers of ``y0`` are needed for ``w``, and those are the first two rows of the back
        substitution; ``U·w`` lives on those two rows too, so the correction costs three row operations.
        """
        fac = self.factor(alpha)
        m, inv_dd = fac.m, fac.inv_dd
        L = fh.shape[0]
        dtype = np.result_type(fh, m, np.float64)
        x = fh if overwrite and fh.dtype == dtype else np.array(fh, dtype=dtype)
        tmp = np.empty(x.shape[1], dtype=dtype)
        for layer in range(1, L):  # forward elimination of every mode's tridiagonal system
            np.multiply(m[layer - 1], x[layer - 1], out=tmp)
            x[layer] -= tmp
        # y0 on the sink (L-1) and spreader (L-2) layers: the first two steps of the back substitution
        y_sink = x[L - 1] * inv_dd[L - 1]
        y_sp = x[L - 2] * inv_dd[L - 2] - m[L - 2] * y_sink
        y0 = self._modes_to_edges(np.stack([y_sp, y_sink]))
        w = fac.Wg @ g - fac.K @ y0
        wh = self._edges_to_modes(w)
        # x = A0⁻¹·(f + U·w): add U·w (rows L-2, L-1 only) to the eliminated right-hand side, then back-substitute
        x[L - 2] += wh[0]
        np.multiply(m[L - 2], wh[0], out=tmp)
        x[L - 1] += wh[1]
        x[L - 1] -= tmp
        x *= inv_dd
        for layer in range(L - 2, -1, -1):
            np.multiply(m[layer], x[layer + 1], out=tmp)
            x[layer] -= tmp
        yh = x
        r = fac.R_inv @ g + fac.Ry @ y0 + fac.Rw @ w
        return yh, r

    def solve(self, alpha: complex, rhs: np.ndarray) -> np.ndarray:
        """``(alpha·C + G)⁻¹·rhs`` for node vectors (n_nodes,) or a batch (n_nodes, m)."""
        if rhs.ndim == 2:
            return np.stack([self.solve(alpha, rhs[:, c]) for c in range(rhs.shape[1])], axis=1)
        fh, g = self.to_modes(rhs)
        xh, r = self.solve_modal(alpha, fh, g)
        return self.from_modes(xh, r)

    def _koff(self, alpha: float, fac: _Factor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``K = diag(kd) + Koff`` with ``Koff`` in float32 (half the memory traffic of the k × k mat-vec inside
        every Woodbury correction). For the transient shifts ``|Koff| ≤ 3e-3·|kd|`` and it is applied
        to the edge temperatures minus their mean (the mean goes through ``Koff·1`` in float64), so the float32
        rounding is ~1e-9 K in the result (tests compare with the sparse LU to 1e-6 K)."""
        with self._lock:
            hit = self._k32.get(alpha)
            if hit is None:
                kd, off, off_sum = _split_k(np.asarray(fac.K.real, dtype=np.float64))
                hit = (kd, np.ascontiguousarray(off, dtype=np.float32), off_sum)
                self._k32[alpha] = hit
                while len(self._k32) > MAX_FACTORS:
                    self._k32.pop(next(iter(self._k32)))
            return hit

    @property
    def dct_rows(self) -> np.ndarray:
        """``DR`` (R × R): the modes of a layer ``X`` (R × C) are ``DR·X·DCᵀ``."""
        return self._DR

    @property
    def dct_cols(self) -> np.ndarray:
        """``DC`` (C × C)."""
        return self._DC

    def _exp_data(self, dt: float, degree: int) -> _ExpData:
        """The factors of the exponential step's shifts ``α_k = z_k/dt`` (``rational.exp_poles``), the reciprocal
        pivots split into real and imaginary arrays (poles, L, P), ``q_k = 1/α_k`` and the weights
        ``β_k = −(2/dt)·c_k``; cached per (dt, degree)."""
        key = (dt, degree)
        with self._lock:
            hit = self._exp.get(key)
        if hit is not None:
            return hit
        poles, residues = exp_poles(degree)
        alphas = [z / dt for z in poles]
        facs = tuple(self.factor(a) for a in alphas)
        q = np.array([1.0 / a for a in alphas])
        beta = -(2.0 / dt) * np.array(residues)
        kd, koff_r, koff_i, koff_sum = [], [], [], []
        for f in facs:
            d, off, off_sum = _split_k(f.K)
            upper = off[np.triu_indices(d.size, 1)]  # row by row; K is complex symmetric (E and S are)
            kd.append(d)
            koff_r.append(upper.real.astype(np.float32))
            koff_i.append(upper.imag.astype(np.float32))
            koff_sum.append(off_sum)

        def stack(arrays: list[np.ndarray]) -> np.ndarray:
            return np.ascontiguousarray(np.stack(arrays))

        data = _ExpData(facs, stack([f.inv_dd.real for f in facs]), stack([f.inv_dd.imag for f in facs]), q, beta,
                        stack(kd), stack(koff_r), stack(koff_i), stack(koff_sum), stack([f.Wg for f in facs]),
                        stack([f.R_inv for f in facs]), stack([f.Ry for f in facs]), stack([f.Rw for f in facs]))
        with self._lock:
            self._exp[key] = data
            while len(self._exp) > MAX_FACTORS // 4:
                self._exp.pop(next(iter(self._exp)))
        return data

    def _exp_workspace(self, n_poles: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """This thread's scratch arrays of the exponential step (the eliminated systems (poles, L, P) re/im, the two
        last layers (poles, 4, P) and their corrections): ~2.6 MB that a fresh allocation would page-fault in at
        every step."""
        L, R, C = self.shape
        ws: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = self._tls.__dict__.setdefault("exp", {})
        hit = ws.get(n_poles)
        if hit is None:
            P = R * C
            hit = (np.empty((n_poles, L, P)), np.empty((n_poles, L, P)), np.empty((n_poles, 4, P)),
                   np.empty((n_poles, 4, P)))
            ws[n_poles] = hit
        return hit

    def step_exponential(self, T: np.ndarray, p_nodes: np.ndarray, dt: float, degree: int) -> np.ndarray:
        """``solvers.step_exponential`` with the power as a node vector: its DCT, then ``step_exponential_modes``."""
        ph, pr = self.to_modes(p_nodes)
        return self.step_exponential_modes(T, ph, pr, dt, degree)

    def step_exponential_modes(self, T: np.ndarray, ph: np.ndarray, pr: np.ndarray, dt: float,
                               degree: int) -> np.ndarray:
        """The exponential window step (``solvers.step_exponential``: ``θ1 = −(2/dt)·Re Σ_k c_k·(G + α_k·C)⁻¹·(C·θ0 +
        P/α_k)``, ``θ = T − T_amb``) in mode space, with the power already in modes (cell modes ``ph`` (L, P), ring
        ``pr`` (12,); ``StackModel.step`` builds them from block powers without a DCT). One DCT of the state, one
        inverse DCT, and between them two compiled passes over the modes for all poles at once (``exp_kernels``)
        around one Woodbury correction per pole. ``T_amb`` is uniform: in modes it is only mode 0 of each layer."""
        _, R, C = self.shape
        P = R * C
        amb = self.net.ambient
        amb0 = amb * np.sqrt(float(P))  # mode (0, 0) of a uniform layer at T_amb (orthonormal DCT)
        th, tr = self.to_modes(np.asarray(T, dtype=np.float64))
        th[:, 0] -= amb0
        tr -= amb
        out, ring = self.step_exponential_theta(th, tr, ph, pr, dt, degree)
        out[:, 0] += amb0
        return self.from_modes(out, ring + amb)

    def step_exponential_theta(self, th: np.ndarray, tr: np.ndarray, ph: np.ndarray, pr: np.ndarray, dt: float,
                               degree: int) -> tuple[np.ndarray, np.ndarray]:
        """The exponential window step on ``θ = T − T_amb`` given in modes (cell modes ``th`` (L, P), ring ``tr``
        (12,), K), the power in modes (``ph`` (L, P), ``pr`` (12,), W): ``θ1``'s cell modes and ring values. No DCT:
        the epoch's window steps carry ``θ`` in modes from window to window (``StackModel.step_state``)."""
        # numba is imported on the first step, not with the module (~1 s that the CLI and the other services skip)
        from services.thermal.exp_kernels import step

        d = self._exp_data(dt, degree)
        x_r, x_i, y2, wh = self._exp_workspace(d.q.size)
        out, ring = np.empty(th.shape), np.empty(tr.size)
        step(np.ascontiguousarray(th, dtype=np.float64), np.ascontiguousarray(ph, dtype=np.float64),
             np.ascontiguousarray(tr, dtype=np.float64), np.ascontiguousarray(pr, dtype=np.float64),
             self._cap_layer, self._off, self.net.ring_cap, d.inv_r, d.inv_i, d.q, d.beta, self._DR, self._DRt,
             self._DC, self._DCt, d.kd, d.koff_r, d.koff_i, d.koff_sum, d.Wg, d.R_inv, d.Ry, d.Rw, x_r, x_i, y2, wh,
             out, ring)
        return out, ring

    def step_trbdf2(self, T: np.ndarray, b: np.ndarray, dt: float, n_sub: int) -> np.ndarray:
        """The same TR-BDF2 scheme as ``solvers.step`` (``b = P + g_amb·T_amb``) carried in mode space; see
        ``step_trbdf2_modes``."""
        bh, br = self.to_modes(b)
        return self.step_trbdf2_modes(T, bh, br, dt, n_sub)

    def step_trbdf2_modes(self, T: np.ndarray, bh: np.ndarray, br: np.ndarray, dt: float, n_sub: int) -> np.ndarray:
        """TR-BDF2 window step with the source already in mode space (cell modes ``bh`` (L, P), ring ``br`` (12,);
        ``StackModel.step`` builds them from block powers without a DCT): one DCT of the state at the start, one
        inverse DCT at the end, compiled passes in between (``spectral_kernels``). With ``A = alpha·C + G``,
        ``alpha = 1/(d·h)``:

        - stage 1 ``A·T_γ = (2·alpha·C − A)·T + cg·b`` is solved as ``y₁ = A⁻¹·(2·alpha·C·T + cg·b)``,
          ``T_γ = y₁ − T`` (no product with ``G`` needed);
        - stage 2 ``A·T⁺ = alpha·C·(c1·T_γ − c2·T) + b = alpha·C·(c1·y₁ − (c1 + c2)·T) + b``.
        """
        # numba is imported on the first step, not with the module (~1 s that the CLI and the other services skip)
        from services.thermal.solvers import D_TRBDF2, GAMMA
        from services.thermal.spectral_kernels import back_substitute, back_then_eliminate, edge_correction, eliminate

        h = dt / n_sub
        alpha = 1.0 / (D_TRBDF2 * h)
        c1 = 1.0 / (GAMMA * (2.0 - GAMMA))
        c2 = (1.0 - GAMMA) ** 2 / (GAMMA * (2.0 - GAMMA))
        cg = GAMMA / D_TRBDF2
        fac = self.factor(alpha)
        kd, koff, koff_sum = self._koff(alpha, fac)
        L = self.shape[0]
        cap = self._cap_layer
        rcap = self.net.ring_cap
        zero, one = np.zeros(L), np.ones(L)
        s1 = (2.0 * alpha * cap, zero, cg * one)
        s2 = (c1 * alpha * cap, -(c1 + c2) * alpha * cap, one)
        xh, xr = self.to_modes(np.asarray(T, dtype=np.float64))
        bh = np.ascontiguousarray(bh, dtype=np.float64)
        off, inv_dd = self._off, fac.inv_dd
        x_el = np.empty_like(xh)
        y2 = np.empty((2, xh.shape[1]))
        y0, w, wh = np.empty(kd.size), np.empty(kd.size), np.empty((2, xh.shape[1]))
        mats = (self._DR, self._DRt, self._DC, self._DCt, kd, koff, koff_sum, fac.Wg, fac.R_inv, fac.Ry, fac.Rw)

        def edge(g: np.ndarray) -> np.ndarray:
            """The Woodbury correction of the solve eliminated into ``x_el`` (into ``wh``); returns the ring
            temperatures."""
            r = np.empty(g.size)
            edge_correction(y2, g, *mats, y0, w, r, wh)
            return r

        eliminate(s1[0], xh, s1[1], xh, s1[2], bh, off, inv_dd, x_el, y2)
        for i in range(n_sub):
            g1 = 2.0 * alpha * rcap * xr + cg * br
            r1 = edge(g1)
            back_then_eliminate(x_el, wh, off, inv_dd, s2[0], s2[1], xh, False, s2[2], bh, y2)
            g2 = alpha * rcap * (c1 * r1 - (c1 + c2) * xr) + br
            xr = edge(g2)
            if i < n_sub - 1:
                back_then_eliminate(x_el, wh, off, inv_dd, s1[0], s1[1], xh, True, s1[2], bh, y2)
            else:
                back_substitute(x_el, wh, off, inv_dd, xh)
        return self.from_modes(xh, xr)


_SOLVERS: LRU[str, SpectralSolver] = LRU(over=over_thermal_budget)


def make_solver(net: RCNetwork) -> SpectralSolver:
    """The spectral solver of ``net``, cached by the network spec's content hash (LRU within the thermal budget:
    ``TASMOE_THERMAL_CACHE_SIZE`` entries, ``THERMAL_CACHE_NODES`` nodes); built under the cache's lock (its factors
    can take GBs: two concurrent builds must not both hold them)."""
    return _SOLVERS.get_or_build(net.spec.content_hash(), lambda: SpectralSolver(net))
