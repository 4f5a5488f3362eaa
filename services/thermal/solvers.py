"""Solvers of the RC network ``C·dT/dt = −G·T + P + g_amb·T_amb`` (SI: K, W, W/K, J/K, s).

Every solver provides ``solve(alpha, rhs)`` = ``(alpha·C + G)⁻¹·rhs`` with the factorisation cached per ``alpha``:
``alpha = 0`` is the steady state, ``alpha = 1/(d·h)`` a time-step stage. Time stepping is shared code on top:

- ``steady``: ``G·T = P + g_amb·T_amb``.
- ``step``: TR-BDF2 (Bank et al. 1985, γ = 2 − √2) with ``n_sub`` equal sub-steps per window; both stages use the
  same matrix ``C + d·h·G`` with ``d = 1 − 1/√2``, so one factorisation serves the whole run. L-stable and second
  order: on the S8 reference stack 2/5/10 sub-steps per 1 ms give 0.30/0.030/0.007 K max error against the exact
  solution of the network.
- ``step_euler``: ``n_sub`` implicit-Euler sub-steps (``(C/h + G)·T⁺ = C/h·T + P + g_amb·T_amb``, ARCHITECTURE §5.4).
- ``step_exponential``: the exact solution ``T_s + e^{−dt·C⁻¹G}·(T − T_s)`` with the exponential replaced by a
  Carathéodory–Fejér rational function (``rational.py``; degree 6: 3 complex shifted solves, 2e-6 relative, whatever
  ``dt``; tested against scipy's ``expm_multiply``). The service's window step (``arch.thermal.integrator``).

``SparseSolver`` (SuperLU, prefactored) is the oracle; ``services.thermal.spectral.SpectralSolver`` is the fast path
with the same interface.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Protocol

import numpy as np

from services.thermal.network import RCNetwork
from services.thermal.rational import exp_poles

if TYPE_CHECKING:  # imported by SparseSolver: the spectral path never loads scipy.sparse (~0.14 s of start-up)
    import scipy.sparse.linalg as spla

GAMMA = 2.0 - math.sqrt(2.0)
D_TRBDF2 = 1.0 - 1.0 / math.sqrt(2.0)  # = γ/2 = (1−γ)/(2−γ)


class Solver(Protocol):
    net: RCNetwork

    def solve(self, alpha: complex, rhs: np.ndarray) -> np.ndarray: ...


MAX_SPARSE_FACTORS = 8  # a complex LU of the default stack is ~0.9 GB: keep the most recent shifts only


class SparseSolver:
    """Prefactored sparse LU of ``alpha·C + G`` (one factorisation per alpha, the most recent ones kept)."""

    def __init__(self, net: RCNetwork) -> None:
        self.net = net
        self._G = net.conductance.tocsc()
        self._lu: dict[complex, spla.SuperLU] = {}
        self._lock = threading.Lock()

    def factor(self, alpha: complex) -> spla.SuperLU:
        with self._lock:
            lu = self._lu.get(alpha)
            if lu is None:
                import scipy.sparse as sp
                import scipy.sparse.linalg as spla

                A = self._G + sp.diags(alpha * self.net.capacitance) if alpha else self._G
                lu = spla.splu(sp.csc_matrix(A), permc_spec="COLAMD")
                self._lu[alpha] = lu
                while len(self._lu) > MAX_SPARSE_FACTORS:
                    self._lu.pop(next(iter(self._lu)))
            return lu

    def solve(self, alpha: complex, rhs: np.ndarray) -> np.ndarray:
        dtype = np.result_type(rhs, alpha, np.float64)
        out: np.ndarray = self.factor(alpha).solve(np.ascontiguousarray(rhs, dtype=dtype))
        return out


def source(net: RCNetwork, p_nodes: np.ndarray) -> np.ndarray:
    """``P + g_amb·T_amb`` (W) for a node power vector."""
    return p_nodes + net.g_amb * net.ambient


def steady(solver: Solver, p_nodes: np.ndarray) -> np.ndarray:
    """Steady node temperatures (K) for node powers ``p_nodes`` (W)."""
    return solver.solve(0.0, source(solver.net, p_nodes))


def step(solver: Solver, T: np.ndarray, p_nodes: np.ndarray, dt: float, n_sub: int) -> np.ndarray:
    """Advance ``T`` (K) by ``dt`` seconds at constant power with ``n_sub`` TR-BDF2 sub-steps."""
    net = solver.net
    b = source(net, p_nodes)
    modal = getattr(solver, "step_trbdf2", None)
    if modal is not None:  # the spectral solver runs the same scheme in mode space
        out: np.ndarray = modal(T, b, dt, n_sub)
        return out
    C = net.capacitance
    G = net.conductance
    h = dt / n_sub
    alpha = 1.0 / (D_TRBDF2 * h)
    c1 = 1.0 / (GAMMA * (2.0 - GAMMA))
    c2 = (1.0 - GAMMA) ** 2 / (GAMMA * (2.0 - GAMMA))
    x = np.asarray(T, dtype=np.float64)
    for _ in range(n_sub):
        # stage 1 (trapezoid over γh): (C + dhG)·Tγ = (C − dhG)·T + γh·b   [divided by d·h]
        rhs1 = alpha * C * x - G @ x + (GAMMA / D_TRBDF2) * b
        xg = solver.solve(alpha, rhs1)
        # stage 2 (BDF2): (C + dhG)·T⁺ = C·(c1·Tγ − c2·T) + dh·b        [divided by d·h]
        rhs2 = alpha * C * (c1 * xg - c2 * x) + b
        x = solver.solve(alpha, rhs2)
    return x


def step_euler(solver: Solver, T: np.ndarray, p_nodes: np.ndarray, dt: float, n_sub: int) -> np.ndarray:
    """Advance ``T`` by ``dt`` with ``n_sub`` implicit-Euler sub-steps."""
    net = solver.net
    b = source(net, p_nodes)
    alpha = n_sub / dt
    x = np.asarray(T, dtype=np.float64)
    for _ in range(n_sub):
        x = solver.solve(alpha, alpha * net.capacitance * x + b)
    return x


EXP_DEGREE = 6  # CF degree of the service's exponential step: |r − exp| ≤ 2.0e-6 on (−∞, 0], 3 complex solves


def step_exponential(solver: Solver, T: np.ndarray, p_nodes: np.ndarray, dt: float,
                     degree: int = EXP_DEGREE) -> np.ndarray:
    """Advance ``T`` (K) by ``dt`` seconds at constant power ``p_nodes`` (W): the exact solution of the network,
    ``T(dt) = T_s + e^{−dt·C⁻¹G}·(T − T_s)`` (``T_s`` the steady state of ``p_nodes``), with the exponential replaced
    by the rational function ``r`` of ``rational.exp_poles(degree)`` (``r(0) = 1``, ``r(−∞) = 0``).

    With ``θ = T − T_amb`` (``G·θ = P`` in steady state) and ``α_k = z_k/dt``, the partial fractions of ``r`` give
    ``θ(dt) = r(−dt·A)·θ0 + (I − r(−dt·A))·θ_s = −(2/dt)·Re Σ_k c_k·(G + α_k·C)⁻¹·(C·θ0 + P/α_k)``, using
    ``(G + αC)⁻¹·C·G⁻¹ = (G⁻¹ − (G + αC)⁻¹)/α`` and ``Σ_k c_k/z_k = −r(0) = −1``: ``degree/2`` complex shifted solves
    and no steady solve, independent of ``dt``. Error ≤ ``max|r − exp|·|θ0 − θ_s|`` (``rational.exp_error``)."""
    net = solver.net
    modal = getattr(solver, "step_exponential", None)
    if modal is not None:  # the spectral solver runs the same scheme in mode space
        out: np.ndarray = modal(T, p_nodes, dt, degree)
        return out
    theta = np.asarray(T, dtype=np.float64) - net.ambient
    c_theta = net.capacitance * theta
    acc = np.zeros(net.n_nodes)
    for z, c in zip(*exp_poles(degree), strict=True):
        alpha = z / dt
        acc += (c * solver.solve(alpha, c_theta + p_nodes / alpha)).real
    res: np.ndarray = net.ambient - (2.0 / dt) * acc
    return res
