"""Compiled passes of the spectral exponential window step (``SpectralSolver.step_exponential_modes``; numba, nogil).

The step is ``θ1 = Re Σ_k β_k·x_k`` with ``x_k = (G + α_k·C)⁻¹·(C·θ0 + q_k·P)``, ``q_k = 1/α_k``, one term per pole
``α_k`` of the rational exponential (``rational.exp_poles``), ``θ = T − T_amb``. In mode space every ``x_k`` is a
complex tridiagonal layers × layers solve per lateral mode plus the package-ring Woodbury correction, which needs
every mode's uncorrected solution on the last two layers. So the step is two passes over the modes for all poles,
``forward`` (the right-hand sides and their forward elimination, stored, and the last two layers of each uncorrected
solution) and, after one correction per pole (``edge``), ``backward`` (the corrections on the last two rows, the back
substitution and the weighted sum). Chunks of modes keep ``θ0`` and the power in cache across the poles; complex
numbers are split into real and imaginary arrays so that the inner loops over contiguous modes vectorise. No
fastmath in the passes: the same operations as a complex tridiagonal solve.

Notation as in ``spectral_kernels``: per pole the reciprocal pivots ``inv = 1/dd`` (complex, (L, P)), multipliers
``m[l] = off[l]·inv[l]``; forward ``x[l] = f[l] − m[l−1]·x[l−1]``; correction ``x[L−2] += wh0``,
``x[L−1] += wh1 − m[L−2]·wh0``; back ``s[L−1] = x[L−1]·inv[L−1]``, ``s[L−2] = x[L−2]·inv[L−2] − m[L−2]·s[L−1]``,
above them ``s[l] = (x[l] − off[l]·s[l+1])·inv[l]`` (the same value as ``x[l]·inv[l] − m[l]·s[l+1]`` with one
complex product instead of two).
"""

from __future__ import annotations

import numpy as np

from services.thermal.spectral_kernels import _jit, _jit_reassoc, border_to_modes, border_values

CHUNK = 512  # modes per block: theta0's and the power's rows of a block (2 x 12 x 512 x 8 B) stay in L2 for all poles


@_jit
def _eliminate_chunk(theta: np.ndarray, ph: np.ndarray, cap: np.ndarray, off: np.ndarray, ir: np.ndarray,
                     ii: np.ndarray, qr: float, qi: float, p0: int, n: int, xr: np.ndarray, xi: np.ndarray) -> None:
    """Forward elimination of ``f = cap·θ + q·ph`` for modes ``p0 .. p0+n`` of one pole into ``xr + i·xi`` (L, P).
    The real and imaginary parts are separate loops: fewer arrays per loop keep LLVM's runtime alias checks under
    its limit, so both loops vectorise."""
    L = theta.shape[0]
    for layer in range(L):
        c = cap[layer]
        t, pw = theta[layer, p0:p0 + n], ph[layer, p0:p0 + n]
        x_r, x_i = xr[layer, p0:p0 + n], xi[layer, p0:p0 + n]
        if layer == 0:
            for k in range(n):
                x_r[k] = c * t[k] + qr * pw[k]
            for k in range(n):
                x_i[k] = qi * pw[k]
        else:
            o = off[layer - 1]
            a_r, a_i = xr[layer - 1, p0:p0 + n], xi[layer - 1, p0:p0 + n]
            i_r, i_i = ir[layer - 1, p0:p0 + n], ii[layer - 1, p0:p0 + n]
            for k in range(n):
                x_r[k] = c * t[k] + qr * pw[k] - ((o * i_r[k]) * a_r[k] - (o * i_i[k]) * a_i[k])
            for k in range(n):
                x_i[k] = qi * pw[k] - ((o * i_r[k]) * a_i[k] + (o * i_i[k]) * a_r[k])


@_jit
def forward(theta: np.ndarray, ph: np.ndarray, cap: np.ndarray, off: np.ndarray, inv_r: np.ndarray,
            inv_i: np.ndarray, q_r: np.ndarray, q_i: np.ndarray, x_r: np.ndarray, x_i: np.ndarray,
            y2: np.ndarray) -> None:
    """For every pole ``k``: the forward elimination of ``(G0 + α_k·C)·x = C·θ + q_k·P`` into ``x_r[k] + i·x_i[k]``
    (L, P) and the uncorrected solution on the last two layers, ``y2[k] = (re L−2, im L−2, re L−1, im L−1)``
    (4, P). ``theta``, ``ph`` (L, P) modes of ``θ0`` and of the power; ``inv_r + i·inv_i`` (poles, L, P) the
    reciprocal pivots. Chunk by chunk of modes, so that ``theta`` and ``ph`` are read from cache by every pole."""
    L, P = theta.shape
    for p0 in range(0, P, CHUNK):
        n = min(CHUNK, P - p0)
        for pole in range(q_r.size):
            ir, ii, xr, xi = inv_r[pole], inv_i[pole], x_r[pole], x_i[pole]
            _eliminate_chunk(theta, ph, cap, off, ir, ii, q_r[pole], q_i[pole], p0, n, xr, xi)
            # y_last = x[L−1]·inv[L−1], y_prev = x[L−2]·inv[L−2] − m[L−2]·y_last, row by row (vectorised)
            o = off[L - 2]
            x1r, x1i, i1r, i1i = xr[L - 1, p0:p0 + n], xi[L - 1, p0:p0 + n], ir[L - 1, p0:p0 + n], ii[L - 1, p0:p0 + n]
            x2r, x2i, i2r, i2i = xr[L - 2, p0:p0 + n], xi[L - 2, p0:p0 + n], ir[L - 2, p0:p0 + n], ii[L - 2, p0:p0 + n]
            yr2, yi2, yr1, yi1 = (y2[pole, 0, p0:p0 + n], y2[pole, 1, p0:p0 + n], y2[pole, 2, p0:p0 + n],
                                  y2[pole, 3, p0:p0 + n])
            for k in range(n):
                yr1[k] = x1r[k] * i1r[k] - x1i[k] * i1i[k]
            for k in range(n):
                yi1[k] = x1r[k] * i1i[k] + x1i[k] * i1r[k]
            for k in range(n):
                yr2[k] = x2r[k] * i2r[k] - x2i[k] * i2i[k] - ((o * i2r[k]) * yr1[k] - (o * i2i[k]) * yi1[k])
            for k in range(n):
                yi2[k] = x2r[k] * i2i[k] + x2i[k] * i2r[k] - ((o * i2r[k]) * yi1[k] + (o * i2i[k]) * yr1[k])


@_jit
def backward(x_r: np.ndarray, x_i: np.ndarray, off: np.ndarray, inv_r: np.ndarray, inv_i: np.ndarray,
             wh: np.ndarray, b_r: np.ndarray, b_i: np.ndarray, out: np.ndarray) -> None:
    """``out = Re Σ_k β_k·x_k`` (L, P) from the eliminated systems ``x_r + i·x_i`` (poles, L, P) of ``forward``:
    per pole the Woodbury correction ``wh[k]`` (4, P: re/im of the rows added to layers L−2 and L−1), the back
    substitution (into a chunk buffer ``s``, real and imaginary parts in separate loops so that every loop
    vectorises) and the weighted sum, layer by layer while ``s`` is in cache."""
    n_poles, L, P = x_r.shape
    sr, si = np.empty((L, CHUNK)), np.empty((L, CHUNK))
    for p0 in range(0, P, CHUNK):
        n = min(CHUNK, P - p0)
        for pole in range(n_poles):
            ir, ii, xr, xi = inv_r[pole], inv_i[pole], x_r[pole], x_i[pole]
            br, bi = b_r[pole], b_i[pole]
            w = wh[pole]
            o = off[L - 2]
            # the correction, then the last two rows of the back substitution, row by row (vectorised):
            # a = x[L−1] + wh1 − m[L−2]·wh0 (in the rows of s[L−2] until they are written), s[L−1] = a·inv[L−1],
            # s[L−2] = (x[L−2] + wh0)·inv[L−2] − m[L−2]·s[L−1]
            x1r, x1i, i1r, i1i = xr[L - 1, p0:p0 + n], xi[L - 1, p0:p0 + n], ir[L - 1, p0:p0 + n], ii[L - 1, p0:p0 + n]
            x2r, x2i, i2r, i2i = xr[L - 2, p0:p0 + n], xi[L - 2, p0:p0 + n], ir[L - 2, p0:p0 + n], ii[L - 2, p0:p0 + n]
            w0r, w0i, w1r, w1i = w[0, p0:p0 + n], w[1, p0:p0 + n], w[2, p0:p0 + n], w[3, p0:p0 + n]
            s1r, s1i, s2r, s2i = sr[L - 1, :n], si[L - 1, :n], sr[L - 2, :n], si[L - 2, :n]
            for k in range(n):
                s2r[k] = x1r[k] + w1r[k] - ((o * i2r[k]) * w0r[k] - (o * i2i[k]) * w0i[k])
            for k in range(n):
                s2i[k] = x1i[k] + w1i[k] - ((o * i2r[k]) * w0i[k] + (o * i2i[k]) * w0r[k])
            for k in range(n):
                s1r[k] = s2r[k] * i1r[k] - s2i[k] * i1i[k]
            for k in range(n):
                s1i[k] = s2r[k] * i1i[k] + s2i[k] * i1r[k]
            for k in range(n):
                s2r[k] = ((x2r[k] + w0r[k]) * i2r[k] - (x2i[k] + w0i[k]) * i2i[k]
                          - ((o * i2r[k]) * s1r[k] - (o * i2i[k]) * s1i[k]))
            for k in range(n):
                s2i[k] = ((x2r[k] + w0r[k]) * i2i[k] + (x2i[k] + w0i[k]) * i2r[k]
                          - ((o * i2r[k]) * s1i[k] + (o * i2i[k]) * s1r[k]))
            for layer in range(L - 1, -1, -1):
                t_r, t_i = sr[layer, :n], si[layer, :n]
                if layer < L - 2:
                    o = off[layer]
                    x_r_, x_i_ = xr[layer, p0:p0 + n], xi[layer, p0:p0 + n]
                    u_r, u_i = sr[layer + 1, :n], si[layer + 1, :n]
                    i_r, i_i = ir[layer, p0:p0 + n], ii[layer, p0:p0 + n]
                    # s[l] = (x[l] − off[l]·s[l+1])·inv[l]: the subtraction into t, then the complex product
                    for k in range(n):
                        t_r[k] = x_r_[k] - o * u_r[k]
                    for k in range(n):
                        t_i[k] = x_i_[k] - o * u_i[k]
                    for k in range(n):
                        a_r = t_r[k]
                        a_i = t_i[k]
                        t_r[k] = a_r * i_r[k] - a_i * i_i[k]
                        t_i[k] = a_r * i_i[k] + a_i * i_r[k]
                o_l = out[layer, p0:p0 + n]
                if pole == 0:
                    for k in range(n):
                        o_l[k] = br * t_r[k] - bi * t_i[k]
                else:
                    for k in range(n):
                        o_l[k] += br * t_r[k] - bi * t_i[k]


@_jit_reassoc
def sym_matvec(u_r: np.ndarray, u_i: np.ndarray, x_r: np.ndarray, x_i: np.ndarray, y_r: np.ndarray,
               y_i: np.ndarray) -> None:
    """``y = U·x`` for a complex symmetric k × k matrix with a zero diagonal, given by its strict upper triangle
    row by row (``u_r + i·u_i``, float32, row ``e`` holding columns ``e+1 .. k−1``): each stored entry is read once
    and serves ``y[e]`` (a dot product) and ``y[f]`` (an update), half the memory of the full matrix. float32
    arithmetic, as BLAS's ``sgemv`` on the real path."""
    k = x_r.size
    for e in range(k):
        y_r[e] = 0.0
        y_i[e] = 0.0
    a = 0
    for e in range(k - 1):
        n = k - 1 - e
        ur, ui = u_r[a:a + n], u_i[a:a + n]
        xr, xi = x_r[e + 1:], x_i[e + 1:]
        sr = np.float32(0.0)
        si = np.float32(0.0)
        for t in range(n):
            sr += ur[t] * xr[t] - ui[t] * xi[t]
            si += ur[t] * xi[t] + ui[t] * xr[t]
        y_r[e] += sr
        y_i[e] += si
        xe_r, xe_i = x_r[e], x_i[e]
        yr, yi = y_r[e + 1:], y_i[e + 1:]
        for t in range(n):
            yr[t] += ur[t] * xe_r - ui[t] * xe_i
            yi[t] += ur[t] * xe_i + ui[t] * xe_r
        a += n


@_jit_reassoc
def edge(y2: np.ndarray, g: np.ndarray, DR: np.ndarray, DRt: np.ndarray, DC: np.ndarray, DCt: np.ndarray,
         kd: np.ndarray, koff_r: np.ndarray, koff_i: np.ndarray, koff_sum: np.ndarray, Wg: np.ndarray,
         R_inv: np.ndarray, Ry: np.ndarray, Rw: np.ndarray, wh: np.ndarray, r: np.ndarray) -> None:
    """The Woodbury correction of one pole (``SpectralSolver.solve_modal`` with a complex shift): the uncorrected
    border values ``y0`` of the last two layers from ``y2`` (4, P), the edge weights ``w = Wg·g − K·y0``, the ring
    temperatures ``r = R⁻¹·g + Ry·y0 + Rw·w`` (12,) and the weights in modes ``wh`` (4, P). The transforms are real,
    so they act on the real and imaginary parts separately. ``K`` is complex symmetric: ``K = diag(kd) + Koff``
    with ``Koff`` as its strict upper triangle in float32 (``sym_matvec``) applied to ``y0`` minus its mean (the mean
    through ``Koff·1 = koff_sum`` in float64), as in ``spectral_kernels.edge_weights``: a quarter of the memory
    traffic of the complex128 product, which dominates this step."""
    R, C = DR.shape[0], DC.shape[0]
    ke = 2 * C + 2 * (R - 2)
    k = 2 * ke
    y_r, y_i = np.empty(k), np.empty(k)
    for layer in range(2):
        border_values(y2[2 * layer].reshape((R, C)), DR, DC, DCt, y_r[layer * ke:(layer + 1) * ke])
        border_values(y2[2 * layer + 1].reshape((R, C)), DR, DC, DCt, y_i[layer * ke:(layer + 1) * ke])
    ybar_r, ybar_i = y_r.mean(), y_i.mean()
    d_r, d_i = np.empty(k, dtype=np.float32), np.empty(k, dtype=np.float32)
    for e in range(k):
        d_r[e] = np.float32(y_r[e] - ybar_r)
        d_i[e] = np.float32(y_i[e] - ybar_i)
    kx_r, kx_i = np.empty(k, dtype=np.float32), np.empty(k, dtype=np.float32)
    sym_matvec(koff_r, koff_i, d_r, d_i, kx_r, kx_i)
    ybar = ybar_r + 1j * ybar_i
    y0 = y_r + 1j * y_i
    w = np.dot(Wg, g)
    for e in range(k):
        w[e] -= kd[e] * y0[e] + (np.float64(kx_r[e]) + 1j * np.float64(kx_i[e])) + ybar * koff_sum[e]
    r[:] = np.dot(R_inv, g) + np.dot(Ry, y0) + np.dot(Rw, w)
    w_r, w_i = np.ascontiguousarray(w.real), np.ascontiguousarray(w.imag)
    for layer in range(2):
        border_to_modes(w_r[layer * ke:(layer + 1) * ke], DR, DRt, DCt, wh[2 * layer].reshape((R, C)))
        border_to_modes(w_i[layer * ke:(layer + 1) * ke], DR, DRt, DCt, wh[2 * layer + 1].reshape((R, C)))


@_jit
def step(theta: np.ndarray, ph: np.ndarray, tr: np.ndarray, pr: np.ndarray, cap: np.ndarray, off: np.ndarray,
         rcap: np.ndarray, inv_r: np.ndarray, inv_i: np.ndarray, q: np.ndarray, beta: np.ndarray,
         DR: np.ndarray, DRt: np.ndarray, DC: np.ndarray, DCt: np.ndarray, kd: np.ndarray, koff_r: np.ndarray,
         koff_i: np.ndarray, koff_sum: np.ndarray, Wg: np.ndarray, R_inv: np.ndarray, Ry: np.ndarray,
         Rw: np.ndarray, x_r: np.ndarray, x_i: np.ndarray, y2: np.ndarray, wh: np.ndarray, out: np.ndarray,
         ring: np.ndarray) -> None:
    """The whole exponential window step in mode space in one call (``SpectralSolver.step_exponential_modes``):
    ``θ1 = Re Σ_k β_k·(G + α_k·C)⁻¹·(C·θ0 + q_k·P)`` with ``θ = T − T_amb`` (K), ``q_k = 1/α_k`` (s),
    ``β_k = −(2/dt)·c_k`` (1/s). ``theta``, ``ph`` (L, P) cell modes of ``θ0`` (K) and of the power (W); ``tr``,
    ``pr`` (12,) the ring's. Writes the cell modes of ``θ1`` into ``out`` (L, P) and the ring's into ``ring``.
    Per pole (stacked on the first axis): reciprocal pivots ``inv_r + i·inv_i`` (L, P), the Woodbury data of
    ``edge`` (``kd``, ``koff_r``/``koff_i`` float32 triangles, ``koff_sum``, ``Wg``, ``R_inv``, ``Ry``, ``Rw``);
    ``x_r``, ``x_i`` (poles, L, P) and ``y2``, ``wh`` (poles, 4, P) scratch. One call instead of a Python loop over
    the poles: the ring's 12-vectors and the per-pole slicing cost no interpreter time."""
    n_poles = q.size
    q_r, q_i = np.empty(n_poles), np.empty(n_poles)
    b_r, b_i = np.empty(n_poles), np.empty(n_poles)
    for k in range(n_poles):
        q_r[k], q_i[k] = q[k].real, q[k].imag
        b_r[k], b_i[k] = beta[k].real, beta[k].imag
    forward(theta, ph, cap, off, inv_r, inv_i, q_r, q_i, x_r, x_i, y2)
    g = np.empty(rcap.size, dtype=np.complex128)
    r = np.empty(rcap.size, dtype=np.complex128)
    for e in range(ring.size):
        ring[e] = 0.0
    for k in range(n_poles):
        for e in range(g.size):
            g[e] = rcap[e] * tr[e] + q[k] * pr[e]  # the ring's right-hand side C·θ0 + q_k·P (W)
        edge(y2[k], g, DR, DRt, DC, DCt, kd[k], koff_r[k], koff_i[k], koff_sum[k], Wg[k], R_inv[k], Ry[k], Rw[k],
             wh[k], r)
        for e in range(ring.size):
            ring[e] += (beta[k] * r[e]).real
    backward(x_r, x_i, off, inv_r, inv_i, wh, b_r, b_i, out)

def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels for the argument types the solver uses."""
    L, n_p, n = 3, 2, 4
    theta, ph = np.ones((L, n * n)), np.ones((L, n * n))
    cap, off = np.ones(L), -0.1 * np.ones(L - 1)
    inv_r, inv_i = np.ones((n_p, L, n * n)), np.zeros((n_p, L, n * n))
    cq = np.ones(n_p, dtype=np.complex128)
    y2, wh = np.empty((n_p, 4, n * n)), np.zeros((n_p, 4, n * n))
    D = np.eye(n)
    k = 2 * (2 * n + 2 * (n - 2))
    cv = np.zeros((n_p, k), dtype=np.complex128)
    tri = np.zeros((n_p, k * (k - 1) // 2), dtype=np.float32)
    ring = np.zeros(12)
    step(theta, ph, ring, ring, cap, off, ring, inv_r, inv_i, cq, cq, D, D, D, D, cv, tri, tri, cv,
         np.zeros((n_p, k, 12), dtype=np.complex128), np.zeros((n_p, 12, 12), dtype=np.complex128),
         np.zeros((n_p, 12, k), dtype=np.complex128), np.zeros((n_p, 12, k), dtype=np.complex128),
         np.empty((n_p, L, n * n)), np.empty((n_p, L, n * n)), y2, wh, np.empty((L, n * n)), np.empty(12))


__all__ = ["backward", "edge", "forward", "step", "sym_matvec", "warm_up"]


if __name__ == "__main__":  # pragma: no cover - `python -m services.thermal.exp_kernels` (Dockerfile)
    warm_up()
