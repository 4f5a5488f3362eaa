"""The compiled passes of the spectral TR-BDF2 and exponential steps against plain numpy / dense linear algebra, and
the whole steps against the sparse oracle or the per-pole modal solves on the default stack (where the float32
Woodbury parts and the chunked passes run)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from services.thermal import solvers
from services.thermal.model import build_model
from services.thermal.spectral import SpectralSolver
from services.thermal.spectral_kernels import CHUNK, back_substitute, back_then_eliminate, edge_weights, eliminate
from shared.configs import ArchConfig

L, P = 5, CHUNK + 77  # one full chunk and a partial one


def _system(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-mode symmetric positive definite tridiagonal systems: diagonal (L, P), off-diagonal (L-1,), and the
    reciprocal pivots of their LU factorisation (multipliers ``off·inv_dd``), as ``SpectralSolver`` stores them."""
    rng = np.random.default_rng(seed)
    off = -(0.5 + rng.random(L - 1))
    diag = 3.0 + rng.random((L, P))
    inv_dd = np.empty((L, P))
    dd = diag[0]
    for layer in range(1, L):
        inv_dd[layer - 1] = 1.0 / dd
        dd = diag[layer] - off[layer - 1] * inv_dd[layer - 1] * off[layer - 1]
    inv_dd[L - 1] = 1.0 / dd
    return diag, off, inv_dd


def _dense_solve(diag: np.ndarray, off: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    out = np.empty_like(rhs)
    for p in range(rhs.shape[1]):
        A = np.diag(diag[:, p]) + np.diag(off, 1) + np.diag(off, -1)
        out[:, p] = np.linalg.solve(A, rhs[:, p])
    return out


def test_eliminate_then_back_substitute_solves_each_mode_with_the_edge_correction() -> None:
    diag, off, inv_dd = _system(0)
    rng = np.random.default_rng(1)
    S, X, B = rng.random((3, L, P))
    c_s, c_x, c_b = rng.random((3, L))
    wh = rng.random((2, P))
    x_el, y2, sol = np.empty((L, P)), np.empty((2, P)), np.empty((L, P))
    eliminate(c_s, S, c_x, X, c_b, B, off, inv_dd, x_el, y2)
    rhs = c_s[:, None] * S + c_x[:, None] * X + c_b[:, None] * B
    uncorrected = _dense_solve(diag, off, rhs)
    np.testing.assert_allclose(y2, uncorrected[-2:], rtol=1e-12, atol=1e-12)
    back_substitute(x_el, wh, off, inv_dd, sol)
    rhs[-2:] += wh  # the correction is a source on the last two layers
    np.testing.assert_allclose(sol, _dense_solve(diag, off, rhs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("store_sol", [False, True])
def test_fused_pass_is_bitwise_the_two_passes(store_sol: bool) -> None:
    _, off, inv_dd = _system(2)
    rng = np.random.default_rng(3)
    x_el0, X0, B = rng.random((3, L, P))
    wh = rng.random((2, P))
    c_s, c_b = rng.random((2, L))
    c_x = np.zeros(L) if store_sol else rng.random(L)
    # reference: back substitution into S, then elimination of the next right-hand side
    S, x_ref, y_ref, X_ref = np.empty((L, P)), np.empty((L, P)), np.empty((2, P)), X0.copy()
    back_substitute(x_el0.copy(), wh, off, inv_dd, S)
    eliminate(c_s, S, c_x, X_ref, c_b, B, off, inv_dd, x_ref, y_ref)
    if store_sol:
        X_ref = S
    x_el, X, y2 = x_el0.copy(), X0.copy(), np.empty((2, P))
    back_then_eliminate(x_el, wh, off, inv_dd, c_s, c_x, X, store_sol, c_b, B, y2)
    assert np.array_equal(x_el, x_ref) and np.array_equal(y2, y_ref) and np.array_equal(X, X_ref)


def test_edge_weights_match_float64_within_float32_rounding_of_the_off_diagonal() -> None:
    rng = np.random.default_rng(4)
    k, nr = 40, 12
    kd = 0.2 + rng.random(k)
    K_off = 1e-3 * rng.standard_normal((k, k))
    K_off = K_off + K_off.T
    np.fill_diagonal(K_off, 0.0)
    y0 = 320.0 + 5.0 * rng.random(k)  # edge temperatures, K
    g = rng.random(nr)
    Wg, R_inv, Ry, Rw = rng.random((k, nr)), rng.random((nr, nr)), rng.random((nr, k)), rng.random((nr, k))
    w, r = np.empty(k), np.empty(nr)
    edge_weights(y0, g, kd, K_off.astype(np.float32), K_off.sum(axis=1), Wg, R_inv, Ry, Rw, w, r)
    w_ref = Wg @ g - (np.diag(kd) + K_off) @ y0
    np.testing.assert_allclose(w, w_ref, rtol=0, atol=1e-6 * np.abs(w_ref).max())
    np.testing.assert_allclose(r, R_inv @ g + Ry @ y0 + Rw @ w, rtol=1e-12)


@pytest.fixture(scope="module")
def default_stack() -> tuple[SpectralSolver, solvers.SparseSolver, np.ndarray, np.ndarray]:
    m = build_model(ArchConfig())  # 64 x 64 x 12 layers: every kernel runs several chunks
    rng = np.random.default_rng(5)
    cw = np.zeros(m.n_cores)
    cw[27] = 30.0  # a hot core: steep lateral gradients at every layer
    P = m.node_power(cw + rng.random(m.n_cores), 0.004 * rng.random((len(m.dram_layers), m.n_banks_per_layer)))
    T0 = m.net.ambient + 20.0 * rng.random(m.net.n_nodes)
    return SpectralSolver(m.net), solvers.SparseSolver(m.net), P, T0


def test_default_stack_step_agrees_with_the_sparse_oracle(
        default_stack: tuple[SpectralSolver, solvers.SparseSolver, np.ndarray, np.ndarray]) -> None:
    fast, oracle, P, T0 = default_stack
    fast_T = solvers.step(fast, T0, P, 1e-3, 4)
    assert np.abs(fast_T - solvers.step(oracle, T0, P, 1e-3, 4)).max() < 1e-6
    assert np.abs(fast_T - T0).max() > 1.0  # the step moved the field: the comparison is not vacuous


def test_concurrent_steps_on_one_solver_equal_sequential_ones(
        default_stack: tuple[SpectralSolver, solvers.SparseSolver, np.ndarray, np.ndarray]) -> None:
    fast, _, P, T0 = default_stack
    inputs = [(T0 + d, P * s) for d, s in ((0.0, 1.0), (3.0, 0.5), (-2.0, 2.0), (1.0, 0.0))]
    sequential = [solvers.step(fast, T, p, 1e-3, 4) for T, p in inputs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = list(pool.map(lambda tp: solvers.step(fast, tp[0], tp[1], 1e-3, 4), inputs))
    for a, b in zip(sequential, concurrent, strict=True):
        assert np.array_equal(a, b)


def test_separable_factors_reproduce_a_tensor_product_map_and_reject_others() -> None:
    from services.thermal.hotspot_io import CellMap
    from services.thermal.model import _separable_factors

    def cell_map(A: np.ndarray) -> CellMap:
        r, c = np.nonzero(A)
        return CellMap(A[r, c], r, c, A.shape)

    rng = np.random.default_rng(6)
    Fy, Fx = rng.random((6, 3)), rng.random((5, 2))
    Fy /= Fy.sum(axis=0)
    Fx /= Fx.sum(axis=0)
    M = cell_map(np.kron(Fy, Fx))
    got = _separable_factors(M, 6, 5, 3, 2)
    assert got is not None
    np.testing.assert_allclose(np.kron(got[0], got[1]), M.toarray(), atol=1e-15)
    broken = M.toarray()
    broken[7, 1] *= 1.001  # one cell's share of one block off by 0.1 %
    assert _separable_factors(cell_map(broken), 6, 5, 3, 2) is None


@pytest.mark.parametrize("arch", [ArchConfig(), ArchConfig.model_validate(
    {"mesh": {"cores": [4, 2]}, "dram": {"banks": [8, 4, 8]}, "thermal": {"grid": [24, 20]}})])
def test_model_step_from_block_powers_equals_the_node_power_step(arch: ArchConfig) -> None:
    m = build_model(arch)
    assert m.source_modes(np.zeros(m.n_cores), np.zeros((len(m.dram_layers), m.n_banks_per_layer))) is not None
    rng = np.random.default_rng(7)
    cw, bw = 3.0 * rng.random(m.n_cores), 0.01 * rng.random((len(m.dram_layers), m.n_banks_per_layer))
    T0 = m.net.ambient + 10.0 * rng.random(m.net.n_nodes)
    via_nodes = solvers.step(m.solver, T0, m.node_power(cw, bw), 1e-3, 4)
    assert np.abs(m.step_trbdf2(T0, cw, bw, 1e-3, 4) - via_nodes).max() < 1e-9
    assert np.abs(via_nodes - T0).max() > 0.1
    # the default integrator: the exponential step, its power in modes without the ambient term
    exp_nodes = solvers.step_exponential(m.solver, T0, m.node_power(cw, bw), 3e-3, 6)
    assert np.abs(m.step(T0, cw, bw, 3e-3) - exp_nodes).max() < 1e-9
    assert np.abs(exp_nodes - T0).max() > 0.1


def _modal_exponential(fast: SpectralSolver, T0: np.ndarray, P: np.ndarray, dt: float, degree: int) -> np.ndarray:
    """``solvers.step_exponential`` written with ``solve_modal`` per pole (numpy; checked against the sparse LU on
    the small stacks by tests/thermal/test_model.py)."""
    from services.thermal.rational import exp_poles

    net = fast.net
    th, tr = fast.to_modes(T0 - net.ambient)
    ph, pr = fast.to_modes(P)
    acc_h, acc_r = np.zeros(th.shape), np.zeros(tr.shape)
    for z, c in zip(*exp_poles(degree), strict=True):
        a = z / dt
        yh, r = fast.solve_modal(a, fast._cap_layer[:, None] * th + ph / a, net.ring_cap * tr + pr / a)
        acc_h += (c * yh).real
        acc_r += (c * r).real
    out: np.ndarray = net.ambient - (2.0 / dt) * fast.from_modes(acc_h, acc_r)
    return out


@pytest.mark.parametrize("dt", [1e-3, 0.5])
def test_default_stack_exponential_kernels_equal_the_modal_solves(
        default_stack: tuple[SpectralSolver, solvers.SparseSolver, np.ndarray, np.ndarray], dt: float) -> None:
    """The compiled exponential step (several chunks of modes, complex64 Woodbury part) against one ``solve_modal``
    per pole; the sparse LU of the default stack's complex shifts is too big for the test suite (2.7 GB, 40 s)."""
    fast, _, P, T0 = default_stack
    got = solvers.step_exponential(fast, T0, P, dt)
    assert np.abs(got - _modal_exponential(fast, T0, P, dt, 6)).max() < 1e-6
    assert np.abs(got - T0).max() > 1.0


def test_concurrent_exponential_steps_equal_sequential_ones(
        default_stack: tuple[SpectralSolver, solvers.SparseSolver, np.ndarray, np.ndarray]) -> None:
    """Each thread has its own scratch arrays (``SpectralSolver._exp_workspace``)."""
    fast, _, P, T0 = default_stack
    inputs = [(T0 + d, P * s) for d, s in ((0.0, 1.0), (3.0, 0.5), (-2.0, 2.0), (1.0, 0.0))]
    sequential = [solvers.step_exponential(fast, T, p, 3e-3) for T, p in inputs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = list(pool.map(lambda tp: solvers.step_exponential(fast, tp[0], tp[1], 3e-3), inputs))
    for a, b in zip(sequential, concurrent, strict=True):
        assert np.array_equal(a, b)


def test_sym_matvec_equals_the_dense_product() -> None:
    from services.thermal.exp_kernels import sym_matvec

    rng = np.random.default_rng(11)
    k = 37
    A = (rng.standard_normal((k, k)) + 1j * rng.standard_normal((k, k))).astype(np.complex64)
    A = A + A.T
    np.fill_diagonal(A, 0.0)
    x = (rng.standard_normal(k) + 1j * rng.standard_normal(k)).astype(np.complex64)
    upper = A[np.triu_indices(k, 1)]
    y_r, y_i = np.empty(k, np.float32), np.empty(k, np.float32)
    sym_matvec(np.ascontiguousarray(upper.real), np.ascontiguousarray(upper.imag),
               np.ascontiguousarray(x.real), np.ascontiguousarray(x.imag), y_r, y_i)
    want = A.astype(np.complex128) @ x.astype(np.complex128)
    np.testing.assert_allclose(y_r + 1j * y_i, want, rtol=0, atol=1e-4 * np.abs(want).max())
