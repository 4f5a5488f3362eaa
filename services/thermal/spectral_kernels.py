"""Compiled per-mode passes of the spectral TR-BDF2 window step (numba, ``nogil``: concurrent steps in one process
run on separate cores).

Why compiled: in mode space a TR-BDF2 stage is a tridiagonal layers × layers solve per lateral mode (12 × 4096 on
the default stack) with one global synchronisation (the package-ring Woodbury correction, which needs every mode)
between its forward elimination and its back substitution. In numpy every layer row is a separate call and every
intermediate (right-hand side, products) a separate array; here a stage is two passes over the modes: the back
substitution of the previous solve, then the next stage's right-hand side fused with its forward elimination. The
inner loops run over contiguous rows of modes (vectorised). Same floating-point operations as the numpy
formulation (no fastmath, no contraction into FMAs).

Notation (``spectral.SpectralSolver``): per mode ``p`` the uniform part of ``alpha·C + G`` is tridiagonal in the
layer index ``l``; it is symmetric, so its LU factors are the reciprocal pivots ``inv_dd[l, p]`` and one set of
multipliers ``m[l, p] = off[l]·inv_dd[l, p]`` (computed here as ``o * i``, not stored). Forward elimination
``x[l] = rhs[l] − m[l−1]·x[l−1]``; the Woodbury edge correction adds ``wh`` to the last two rows
(``x[L−2] += wh[0]``, ``x[L−1] += wh[1] − m[L−2]·wh[0]``); back substitution ``s[L−1] = x[L−1]·inv_dd[L−1]``,
``s[l] = x[l]·inv_dd[l] − m[l]·s[l+1]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np

F = TypeVar("F", bound=Callable[..., Any])
CHUNK = 512  # modes per block of the fused pass: 12 layers × 512 × 8 B = 48 kB of solution, cache-resident


def _jit_reassoc(fn: F) -> F:
    """As ``_jit`` but sums may be reassociated (vectorised reductions): results are deterministic for a given
    machine, like BLAS's, and differ from a sequential sum at round-off."""
    return cast(F, numba.njit(cache=True, nogil=True, fastmath={"reassoc", "nsz"}, boundscheck=False)(fn))


def _jit(fn: F) -> F:
    """``numba.njit`` keeping the function's signature for mypy (the dispatcher is called like the function)."""
    return cast(F, numba.njit(cache=True, nogil=True, fastmath=False, boundscheck=False)(fn))


@_jit
def back_substitute(x_el: np.ndarray, wh: np.ndarray, off: np.ndarray, inv_dd: np.ndarray, sol: np.ndarray) -> None:
    """``sol`` = the solution of the system eliminated into ``x_el``, with the Woodbury edge correction ``wh`` (2, P)
    added to its last two rows."""
    L, P = x_el.shape
    s_last, s_prev = sol[L - 1], sol[L - 2]
    x_last, x_prev = x_el[L - 1], x_el[L - 2]
    w0, w1 = wh[0], wh[1]
    i_last, i_prev = inv_dd[L - 1], inv_dd[L - 2]
    o = off[L - 2]
    for p in range(P):
        s_last[p] = (x_last[p] + w1[p] - (o * i_prev[p]) * w0[p]) * i_last[p]
    for p in range(P):
        s_prev[p] = (x_prev[p] + w0[p]) * i_prev[p] - (o * i_prev[p]) * s_last[p]
    for layer in range(L - 3, -1, -1):
        s, s_below, x, i_l = sol[layer], sol[layer + 1], x_el[layer], inv_dd[layer]
        o = off[layer]
        for p in range(P):
            s[p] = x[p] * i_l[p] - (o * i_l[p]) * s_below[p]


@_jit
def eliminate(c_s: np.ndarray, S: np.ndarray, c_x: np.ndarray, X: np.ndarray, c_b: np.ndarray, B: np.ndarray,
              off: np.ndarray, inv_dd: np.ndarray, x_el: np.ndarray, y2: np.ndarray) -> None:
    """Right-hand side ``rhs[l] = c_s[l]·S[l] + c_x[l]·X[l] + c_b[l]·B[l]`` (per-layer coefficients), its forward
    elimination into ``x_el`` and the uncorrected solution on the last two layers into ``y2`` (``y2[0]`` the
    next-to-last layer, ``y2[1]`` the last: the first two back-substitution steps), which the Woodbury edge
    correction needs. ``x_el`` must not alias ``S``, ``X`` or ``B``."""
    L, P = x_el.shape
    for layer in range(L):
        a, b, c = c_s[layer], c_x[layer], c_b[layer]
        xo, s, xx, bb = x_el[layer], S[layer], X[layer], B[layer]
        if layer == 0:
            for p in range(P):
                xo[p] = a * s[p] + b * xx[p] + c * bb[p]
        else:
            xa, ia = x_el[layer - 1], inv_dd[layer - 1]
            o = off[layer - 1]
            for p in range(P):
                xo[p] = a * s[p] + b * xx[p] + c * bb[p] - (o * ia[p]) * xa[p]
    y_last, y_prev = y2[1], y2[0]
    x_last, x_prev = x_el[L - 1], x_el[L - 2]
    i_last, i_prev = inv_dd[L - 1], inv_dd[L - 2]
    o = off[L - 2]
    for p in range(P):
        y_last[p] = x_last[p] * i_last[p]
    for p in range(P):
        y_prev[p] = x_prev[p] * i_prev[p] - (o * i_prev[p]) * y_last[p]


@_jit
def back_then_eliminate(x_el: np.ndarray, wh: np.ndarray, off: np.ndarray, inv_dd: np.ndarray,
                        c_s: np.ndarray, c_x: np.ndarray, X: np.ndarray, store_sol: bool, c_b: np.ndarray,
                        B: np.ndarray, y2: np.ndarray) -> None:
    """``back_substitute`` of the system in ``x_el`` (corrected by ``wh``) giving ``S``, then ``eliminate`` of
    ``c_s·S + c_x·X + c_b·B`` into ``x_el``, chunk by chunk of modes so that ``S`` never leaves the cache; ``S`` is
    written to ``X`` when ``store_sol`` (then ``c_x`` must be 0: ``X`` is the state the next stages start from)."""
    L, P = x_el.shape
    sol = np.empty((L, CHUNK))
    for p0 in range(0, P, CHUNK):
        n = min(CHUNK, P - p0)
        p1 = p0 + n
        # back substitution of this chunk
        s_last, s_prev = sol[L - 1, :n], sol[L - 2, :n]
        x_last, x_prev = x_el[L - 1, p0:p1], x_el[L - 2, p0:p1]
        w0, w1 = wh[0, p0:p1], wh[1, p0:p1]
        i_last, i_prev = inv_dd[L - 1, p0:p1], inv_dd[L - 2, p0:p1]
        o = off[L - 2]
        for k in range(n):
            s_last[k] = (x_last[k] + w1[k] - (o * i_prev[k]) * w0[k]) * i_last[k]
        for k in range(n):
            s_prev[k] = (x_prev[k] + w0[k]) * i_prev[k] - (o * i_prev[k]) * s_last[k]
        for layer in range(L - 3, -1, -1):
            sl, sb, xl, il = sol[layer, :n], sol[layer + 1, :n], x_el[layer, p0:p1], inv_dd[layer, p0:p1]
            o = off[layer]
            for k in range(n):
                sl[k] = xl[k] * il[k] - (o * il[k]) * sb[k]
        # the next right-hand side and its forward elimination (X is not read when it is being replaced: c_x = 0)
        for layer in range(L):
            a, b, c = c_s[layer], c_x[layer], c_b[layer]
            xo, sl, xx, bb = x_el[layer, p0:p1], sol[layer, :n], X[layer, p0:p1], B[layer, p0:p1]
            if layer == 0:
                if store_sol:
                    for k in range(n):
                        xo[k] = a * sl[k] + c * bb[k]
                else:
                    for k in range(n):
                        xo[k] = a * sl[k] + b * xx[k] + c * bb[k]
            else:
                xa, ia = x_el[layer - 1, p0:p1], inv_dd[layer - 1, p0:p1]
                o = off[layer - 1]
                if store_sol:
                    for k in range(n):
                        xo[k] = a * sl[k] + c * bb[k] - (o * ia[k]) * xa[k]
                else:
                    for k in range(n):
                        xo[k] = a * sl[k] + b * xx[k] + c * bb[k] - (o * ia[k]) * xa[k]
        y_last, y_prev = y2[1, p0:p1], y2[0, p0:p1]
        x_last, x_prev = x_el[L - 1, p0:p1], x_el[L - 2, p0:p1]
        o = off[L - 2]
        for k in range(n):
            y_last[k] = x_last[k] * i_last[k]
        for k in range(n):
            y_prev[k] = x_prev[k] * i_prev[k] - (o * i_prev[k]) * y_last[k]
        if store_sol:
            for layer in range(L):
                xs, sl = X[layer, p0:p1], sol[layer, :n]
                for k in range(n):
                    xs[k] = sl[k]


@_jit
def edge_weights(y0: np.ndarray, g: np.ndarray, kd: np.ndarray, koff: np.ndarray, koff_sum: np.ndarray,
                 Wg: np.ndarray, R_inv: np.ndarray, Ry: np.ndarray, Rw: np.ndarray,
                 w: np.ndarray, r: np.ndarray) -> None:
    """The Woodbury weights on the edge cells and the ring temperatures of one solve (``SpectralSolver.solve_modal``):
    ``w = Wg·g − K·y0`` with ``K = diag(kd) + Koff`` (``Koff`` float32, applied to ``y0`` minus its mean, the mean
    through ``Koff·1 = koff_sum`` in float64), ``r = R⁻¹·g + Ry·y0 + Rw·w``."""
    k = y0.size
    ybar = 0.0
    for e in range(k):
        ybar += y0[e]
    ybar /= k
    dev = np.empty(k, dtype=np.float32)
    for e in range(k):
        dev[e] = np.float32(y0[e] - ybar)
    kx = np.dot(koff, dev)  # BLAS sgemv
    wg = np.dot(Wg, g)
    for e in range(k):
        w[e] = wg[e] - (kd[e] * y0[e] + np.float64(kx[e]) + ybar * koff_sum[e])
    r[:] = np.dot(R_inv, g) + np.dot(Ry, y0) + np.dot(Rw, w)


__all__ = ["CHUNK", "back_substitute", "back_then_eliminate", "border_to_modes", "border_values", "edge_correction",
           "edge_weights", "eliminate", "warm_up"]


@_jit_reassoc
def border_values(Y: np.ndarray, DR: np.ndarray, DC: np.ndarray, DCt: np.ndarray, out: np.ndarray) -> None:
    """Real-space values on the border cells of one layer given in modes ``Y`` (R, C), into ``out`` (ke,) in border
    order (row 0, the (west, east) pairs of rows 1..R−2, row R−1). With ``X = DRᵀ·Ŷ·DC``: a border row is
    ``(DR[:, i]ᵀ·Ŷ)·DC``, a border column ``DRᵀ·(Ŷ·DC[:, j])``, O(R·C) instead of a layer's inverse DCT."""
    R, C = DR.shape[0], DC.shape[0]
    ke = out.size
    dc0, dc1 = DCt[0], DCt[C - 1]  # DC[:, 0], DC[:, C-1]
    z0, z1 = np.zeros(C), np.zeros(C)
    for p in range(R):
        a0, a1, Yp = DR[p, 0], DR[p, R - 1], Y[p]
        for q in range(C):
            z0[q] += a0 * Yp[q]
            z1[q] += a1 * Yp[q]
    v0, v1 = np.zeros(C), np.zeros(C)
    for q in range(C):
        b0, b1, Dq = z0[q], z1[q], DC[q]
        for j in range(C):
            v0[j] += b0 * Dq[j]
            v1[j] += b1 * Dq[j]
    for j in range(C):
        out[j] = v0[j]
        out[ke - C + j] = v1[j]
    u0, u1 = np.empty(R), np.empty(R)
    for p in range(R):
        Yp = Y[p]
        s0 = 0.0
        s1 = 0.0
        for q in range(C):
            s0 += Yp[q] * dc0[q]
            s1 += Yp[q] * dc1[q]
        u0[p] = s0
        u1[p] = s1
    c0, c1 = np.zeros(R), np.zeros(R)
    for p in range(R):
        Dp, a, b = DR[p], u0[p], u1[p]
        for i in range(R):
            c0[i] += Dp[i] * a
            c1[i] += Dp[i] * b
    for i in range(1, R - 1):
        out[C + 2 * (i - 1)] = c0[i]
        out[C + 2 * (i - 1) + 1] = c1[i]


@_jit_reassoc
def border_to_modes(w: np.ndarray, DR: np.ndarray, DRt: np.ndarray, DCt: np.ndarray, out: np.ndarray) -> None:
    """The modes ``out`` (R, C) of a layer that is zero except on its border cells, which hold ``w`` (ke,) in border
    order: rows contribute ``DR[p, i]·(DC·w_row)[q]``, columns ``(DR·w_col)[p]·DC[q, j]``."""
    R, C = DR.shape[0], DCt.shape[0]
    ke = w.size
    dc0, dc1 = DCt[0], DCt[C - 1]
    a0, a1 = np.zeros(C), np.zeros(C)
    for j in range(C):
        wa, wb, Dj = w[j], w[ke - C + j], DCt[j]
        for q in range(C):
            a0[q] += wa * Dj[q]
            a1[q] += wb * Dj[q]
    b0, b1 = np.zeros(R), np.zeros(R)
    for i in range(1, R - 1):
        wa, wb, Di = w[C + 2 * (i - 1)], w[C + 2 * (i - 1) + 1], DRt[i]
        for p in range(R):
            b0[p] += wa * Di[p]
            b1[p] += wb * Di[p]
    for p in range(R):
        x0, x1, e0, e1, o = DR[p, 0], DR[p, R - 1], b0[p], b1[p], out[p]
        for q in range(C):
            o[q] = x0 * a0[q] + x1 * a1[q] + e0 * dc0[q] + e1 * dc1[q]


@_jit_reassoc
def edge_correction(y2: np.ndarray, g: np.ndarray, DR: np.ndarray, DRt: np.ndarray, DC: np.ndarray, DCt: np.ndarray,
                    kd: np.ndarray, koff: np.ndarray, koff_sum: np.ndarray, Wg: np.ndarray, R_inv: np.ndarray,
                    Ry: np.ndarray, Rw: np.ndarray, y0: np.ndarray, w: np.ndarray, r: np.ndarray,
                    wh: np.ndarray) -> None:
    """The whole Woodbury step of a solve (``SpectralSolver.solve_modal``) in one call: the uncorrected solution's
    values on the border cells of the last two layers from their modes ``y2`` (``y0``, ``border_values``), the edge
    weights ``w`` and ring temperatures ``r`` (``edge_weights``), and the weights back in modes (``wh``,
    ``border_to_modes``: the source added to the last two rows)."""
    R, C = DR.shape[0], DC.shape[0]
    ke = 2 * C + 2 * (R - 2)
    for layer in range(2):
        border_values(y2[layer].reshape((R, C)), DR, DC, DCt, y0[layer * ke:(layer + 1) * ke])
    edge_weights(y0, g, kd, koff, koff_sum, Wg, R_inv, Ry, Rw, w, r)
    for layer in range(2):
        border_to_modes(w[layer * ke:(layer + 1) * ke], DR, DRt, DCt, wh[layer].reshape((R, C)))


def warm_up() -> None:
    """Compile (or load from numba's cache, ``cache=True``) every kernel for the argument types the solver uses. The
    Docker build runs it so that containers start with the compiled kernels (``NUMBA_CACHE_DIR``); elsewhere the
    first window step compiles them once (~10 s) and later processes load them from the cache (~1 s)."""
    L, P = 3, CHUNK + 3
    x, sol, X, B = (np.ones((L, P)) for _ in range(4))
    inv_dd, wh, y2 = np.ones((L, P)), np.zeros((2, P)), np.empty((2, P))
    off, c = -0.1 * np.ones(L - 1), np.ones(L)
    back_substitute(x, wh, off, inv_dd, sol)
    eliminate(c, sol, c, X, c, B, off, inv_dd, x, y2)
    back_then_eliminate(x, wh, off, inv_dd, c, c, X, False, c, B, y2)
    k, nr = 4, 2
    edge_weights(np.ones(k), np.ones(nr), np.ones(k), np.ones((k, k), dtype=np.float32), np.ones(k),
                 np.ones((k, nr)), np.ones((nr, nr)), np.ones((nr, k)), np.ones((nr, k)), np.empty(k), np.empty(nr))


if __name__ == "__main__":  # pragma: no cover - `python -m services.thermal.spectral_kernels` (Dockerfile)
    warm_up()
