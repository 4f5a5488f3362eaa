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

A solve is one forward and one inverse DCT of the whole stack, two small DCTs (spreader and sink layers), one
tridiagonal sweep and one k × k mat-vec, exact to round-off against the sparse LU (tests: 1e-6 K). Factorisations
are cached per ``alpha``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import scipy.fft as sfft

from services.thermal.network import N_RING, RCNetwork


def _dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix D (n × n): ``X̂ = D·X``; its rows are the Neumann Laplacian's eigenvectors."""
    p = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    D = np.cos(np.pi * p * (2 * i + 1) / (2 * n)) * np.sqrt(2.0 / n)
    D[0] /= np.sqrt(2.0)
    out: np.ndarray = D
    return out


@dataclass
class _Factor:
    m: np.ndarray  # (L-1, P) Thomas multipliers
    inv_dd: np.ndarray  # (L, P) reciprocal pivots
    minv_cols: np.ndarray  # (2, L, P) columns sp, sink of the per-mode inverse
    K: np.ndarray  # (k, k) (I + E·S)⁻¹·E
    R_inv: np.ndarray  # (12, 12) ring block inverse
    Bk: np.ndarray  # (k, 12) edge-cell to ring conductances


class SpectralSolver:
    def __init__(self, net: RCNetwork) -> None:
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
        DR, DC = _dct_matrix(R), _dct_matrix(C)
        self._F = (DR[:, ei][:, None, :] * DC[:, ej][None, :, :]).reshape(R * C, ke)  # φ_pq(edge cell)
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
        self._factors: dict[float, _Factor] = {}
        self._lock = threading.Lock()

    # -- mode-space tridiagonal solves ---------------------------------------------------------------------------
    def _thomas_factor(self, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        b = self._diag0 + alpha * self._cap_layer[:, None]
        L = b.shape[0]
        m = np.empty((L - 1, b.shape[1]))
        dd = np.empty_like(b)
        dd[0] = b[0]
        for layer in range(1, L):
            m[layer - 1] = self._off[layer - 1] / dd[layer - 1]
            dd[layer] = b[layer] - m[layer - 1] * self._off[layer - 1]
        return m, 1.0 / dd

    def _thomas(self, m: np.ndarray, inv_dd: np.ndarray, f: np.ndarray) -> np.ndarray:
        L = f.shape[0]
        y = np.empty_like(f)
        y[0] = f[0]
        for layer in range(1, L):
            y[layer] = f[layer] - m[layer - 1] * y[layer - 1]
        x = y
        x[L - 1] = y[L - 1] * inv_dd[L - 1]
        for layer in range(L - 2, -1, -1):
            x[layer] = (y[layer] - self._off[layer] * x[layer + 1]) * inv_dd[layer]
        return x

    def factor(self, alpha: float) -> _Factor:
        with self._lock:
            fac = self._factors.get(alpha)
            if fac is not None:
                return fac
            m, inv_dd = self._thomas_factor(alpha)
            L, P = inv_dd.shape
            cols = np.zeros((2, L, P))
            for n, a in enumerate(self._layers):
                unit = np.zeros((L, P))
                unit[a] = 1.0
                cols[n] = self._thomas(m, inv_dd, unit)
            ke = self._ke
            F = self._F
            S = np.empty((2 * ke, 2 * ke))
            for n, a in enumerate(self._layers):
                for q, _b in enumerate(self._layers):
                    if q < n:
                        S[n * ke:(n + 1) * ke, q * ke:(q + 1) * ke] = S[q * ke:(q + 1) * ke, n * ke:(n + 1) * ke].T
                        continue
                    S[n * ke:(n + 1) * ke, q * ke:(q + 1) * ke] = F.T @ (cols[q, a][:, None] * F)
            R_mat = self._ring0 + alpha * np.diag(self.net.ring_cap)
            R_inv = np.linalg.inv(R_mat)
            E = np.diag(self._d) - self._Bk @ R_inv @ self._Bk.T
            K = np.linalg.solve(np.eye(2 * ke) + E @ S, E)
            fac = _Factor(m, inv_dd, cols, K, R_inv, self._Bk)
            self._factors[alpha] = fac
            return fac

    def solve(self, alpha: float, rhs: np.ndarray) -> np.ndarray:
        """``(alpha·C + G)⁻¹·rhs`` for node vectors (n_nodes,) or a batch (n_nodes, m)."""
        if rhs.ndim == 2:
            return np.stack([self.solve(alpha, rhs[:, c]) for c in range(rhs.shape[1])], axis=1)
        fac = self.factor(alpha)
        net = self.net
        L, R, C = self.shape
        nc = net.n_cells
        f = np.array(rhs[:nc], dtype=np.float64)
        g = np.asarray(rhs[nc:], dtype=np.float64)
        # eliminate the ring: f' = f + U·Bk·R⁻¹·g
        f[self._edge_nodes] += fac.Bk @ (fac.R_inv @ g)
        fh = sfft.dctn(f.reshape(L, R, C), type=2, axes=(1, 2), norm="ortho").reshape(L, R * C)
        yh = self._thomas(fac.m, fac.inv_dd, fh)
        # y at the spreader's and sink's edge cells: inverse DCT of those two layers only
        sl = list(self._layers)
        y2 = sfft.idctn(yh[sl].reshape(2, R, C), type=2, axes=(1, 2), norm="ortho").reshape(2, R * C)
        y_edge = y2[:, self._edge_flat].reshape(-1)
        z = fac.K @ y_edge
        # A0⁻¹·U·z in mode space: DCT of the edge values, times the per-mode inverse's spreader/sink columns
        zb = np.zeros((2, R * C))
        zb[:, self._edge_flat] = z.reshape(2, -1)
        zh = sfft.dctn(zb.reshape(2, R, C), type=2, axes=(1, 2), norm="ortho").reshape(2, R * C)
        yh -= fac.minv_cols[0] * zh[0][None, :] + fac.minv_cols[1] * zh[1][None, :]
        x = sfft.idctn(yh.reshape(L, R, C), type=2, axes=(1, 2), norm="ortho").reshape(-1)
        r = fac.R_inv @ (g + fac.Bk.T @ x[self._edge_nodes])
        return np.concatenate([x, r])


_CACHE: dict[str, SpectralSolver] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_MAX = 8


def make_solver(net: RCNetwork) -> SpectralSolver:
    """The spectral solver of ``net``, cached by the network spec's content hash (LRU of 8)."""
    key = net.spec.content_hash()
    with _CACHE_LOCK:
        s = _CACHE.pop(key, None)
        if s is None:
            s = SpectralSolver(net)
        _CACHE[key] = s
        while len(_CACHE) > _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        return s
