"""Rational approximation of ``e^x`` on ``(−∞, 0]`` for the exponential window step.

The window step is exact in time for constant power: ``T(t) = T_s + e^{−t·C⁻¹G}·(T0 − T_s)``. The matrix exponential
is applied through a rational function of type (n, n), ``e^x ≈ r(x) = Σ_k c_k/(x − z_k)``, so that
``e^{−tA}·v ≈ −(1/t)·Σ_k c_k·(G + (z_k/t)·C)⁻¹·C·v``: n/2 complex shifted solves (the poles come in conjugate pairs),
whatever the window length.

The poles and residues are the Carathéodory–Fejér (CF) approximation, which is near-best in the uniform norm on
``(−∞, 0]`` (Trefethen, Weideman & Schmelzer, "Talbot quadratures and rational approximations", BIT 46, 2006, Fig.
4.1; Schmelzer & Trefethen, ETNA 29, 2007): the error falls like ``9.28903^−n`` (Halphen's constant), 1.0e-6 at
n = 6 and 1.2e-8 at n = 8, about twice the digits per solve of a parabolic contour quadrature. CF's own function
``r_cf = r_∞ + Σ c_k/(x − z_k)`` has ``r_cf(0) = 1 − r_∞``; we drop the constant ``r_∞`` (of the size of the error)
and scale the residues so that ``r(0) = 1`` exactly. Then ``r(−∞) = 0`` (the fastest modes are damped completely, as
by an L-stable scheme) and ``r(0) = 1`` (a steady state is kept exactly, and the forcing term needs no steady solve,
``solvers.step_exponential``). The uniform error of the scaled ``r`` is about twice CF's (``exp_error``: 2.0e-6 at
n = 6); near 0, ``|r′(0) − 1| = 4.9e-5`` at n = 6, so a slow mode's decay rate is off by at most that fraction.
"""

from __future__ import annotations

from functools import cache

import numpy as np

DEGREES = (2, 4, 6, 8, 10, 12, 14)


def _hankel(c: np.ndarray) -> np.ndarray:
    """``H[i, j] = c[i + j]`` (0 past the end): scipy.linalg.hankel(c), whose import (~0.1 s) was a third of a
    whole ``tasmoe hotspot`` run."""
    k = np.add.outer(np.arange(c.size), np.arange(c.size))
    out: np.ndarray = np.where(k < c.size, c[np.minimum(k, c.size - 1)], 0.0)
    return out

def _cf_exp(n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """CF poles ``z_k`` (n,), residues ``c_k`` (n,) and ``r_∞`` of the type (n, n) approximation to ``e^x`` on
    ``(−∞, 0]``. ``e^x`` is transplanted to ``[−1, 1]`` by ``x = 9·(t − 1)/(t + 1)``; its Chebyshev coefficients
    (FFT on 1024 roots of unity) give a Hankel matrix whose (n+1)-th singular vector defines the CF approximant
    (a finite Blaschke product); its poles outside the unit disk are mapped back to the x-plane."""
    K, nf, scl = 75, 1024, 9.0
    w = np.exp(2j * np.pi * np.arange(nf) / nf)
    t = w.real
    with np.errstate(divide="ignore", over="ignore"):
        F = np.exp(scl * (t - 1.0) / (t + 1.0 + 1e-16))
    c = np.fft.fft(F).real / nf  # Chebyshev coefficients of the transplanted function
    f = np.polyval(c[K::-1], w)  # its analytic part
    U, S, Vh = np.linalg.svd(_hankel(c[1:K + 1]))
    s = S[n]
    u, v = U[::-1, n], Vh[n, :]
    pad = np.zeros(nf - K)
    blaschke = np.fft.fft(np.concatenate([u, pad])) / np.fft.fft(np.concatenate([v, pad]))
    rt = f - s * w ** K * blaschke  # the extended function r-tilde
    zr = np.roots(v)
    qk = zr[np.abs(zr) > 1.0]  # poles of r-tilde outside the unit disk
    numer = (np.fft.fft(rt * np.polyval(np.poly(qk), w)) / nf).real[n::-1]
    ck = np.array([np.polyval(numer, q) / np.polyval(np.poly(np.delete(qk, i)), q) for i, q in enumerate(qk)])
    zk = scl * (qk - 1.0) ** 2 / (qk + 1.0) ** 2  # poles in the x-plane
    ck = 4.0 * ck * zk / (qk ** 2 - 1.0)  # residues in the x-plane
    r_inf = 0.5 * (1.0 + np.sum(ck / zk)).real
    return zk, ck, float(r_inf)


@cache
def exp_poles(n: int) -> tuple[tuple[complex, ...], tuple[complex, ...]]:
    """The poles in the upper half plane and their residues of ``r(x) = Σ_k c_k/(x − z_k)`` (all n poles: these and
    their conjugates), scaled so that ``r(0) = 1``: ``e^{−tA}·v ≈ −(2/t)·Re Σ_k c_k·(G + (z_k/t)·C)⁻¹·C·v``."""
    if n not in DEGREES:
        raise ValueError(f"degree must be one of {DEGREES}, got {n}")
    zk, ck, _ = _cf_exp(n)
    upper = zk.imag > 0
    if int(upper.sum()) * 2 != n:
        raise ArithmeticError(f"CF approximation of degree {n}: poles are not {n // 2} conjugate pairs")
    r0 = float((-np.sum(ck / zk)).real)  # r(0) before scaling, = 1 − 2·r_∞
    order = np.argsort(zk[upper].real)
    z_up, c_up = zk[upper][order], ck[upper][order] / r0
    return tuple(complex(z) for z in z_up), tuple(complex(c) for c in c_up)


def rational_exp(x: np.ndarray, n: int) -> np.ndarray:
    """``r(x)`` for real ``x ≤ 0`` (the scalar function the window step applies to every decay rate)."""
    z, c = exp_poles(n)
    xs = np.asarray(x, dtype=float)[..., None]
    out: np.ndarray = 2.0 * np.sum(np.asarray(c) / (xs - np.asarray(z)), axis=-1).real
    return out


def exp_error(n: int) -> float:
    """``max |r(x) − e^x|`` over ``x ∈ (−∞, 0]``, sampled on 0 and 40 000 points log-spaced over 14 decades."""
    x = -np.concatenate([[0.0], np.logspace(-6, 8, 40_000)])
    return float(np.abs(rational_exp(x, n) - np.exp(x)).max())
