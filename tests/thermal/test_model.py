"""StackModel from an ArchConfig: spectral fast path vs sparse oracle, and physical sanity."""

from __future__ import annotations

import numpy as np
import pytest

from services.thermal import solvers
from services.thermal.model import build_model, get_model
from services.thermal.network import C_FACTOR
from services.thermal.spectral import SpectralSolver
from shared.configs import ArchConfig
from tests.thermal.conftest import small_arch


def _random_power(model_cores: int, dies: int, banks: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random(model_cores) * 2.0, rng.random((dies, banks)) * 0.01


@pytest.mark.parametrize("variant", ["physical", "hotspot"])
def test_spectral_agrees_with_sparse(variant: str) -> None:
    m = build_model(small_arch(variant=variant))
    cw, bw = _random_power(m.n_cores, len(m.dram_layers), m.n_banks_per_layer, 1)
    P = m.node_power(cw, bw)
    fast, oracle = SpectralSolver(m.net), solvers.SparseSolver(m.net)
    assert np.abs(solvers.steady(fast, P) - solvers.steady(oracle, P)).max() < 1e-6
    T0 = np.full(m.net.n_nodes, m.net.ambient) + np.random.default_rng(2).random(m.net.n_nodes) * 5
    assert np.abs(solvers.step(fast, T0, P, 3e-3, 3) - solvers.step(oracle, T0, P, 3e-3, 3)).max() < 1e-6
    assert np.abs(solvers.step_euler(fast, T0, P, 1e-3, 2) - solvers.step_euler(oracle, T0, P, 1e-3, 2)).max() < 1e-6


def test_model_is_cached_by_content_hash(arch_small: ArchConfig) -> None:
    a = get_model(arch_small)
    assert get_model(ArchConfig.model_validate(arch_small.model_dump())) is a
    other = get_model(small_arch(variant="hotspot"))
    assert other.key != a.key and other.key == small_arch(variant="hotspot").content_hash()
    assert a.layer_names == ("logic", "dram_1", "dram_2", "tim", "spreader", "sink")
    assert a.net.n_nodes == 6 * 16 * 16 + 12


def test_variants_differ_as_documented(arch_small: ArchConfig, arch_small_hotspot: ArchConfig) -> None:
    phys, hs = build_model(arch_small).net, build_model(arch_small_hotspot).net
    assert np.allclose(hs.cap[:-1], C_FACTOR * phys.cap[:-1])  # C_FACTOR everywhere (sink also has c_convec)
    rz = [lay.thickness / (lay.k * phys.cell_area) for lay in phys.spec.layers]
    assert hs.g_z[0] == pytest.approx(1.0 / rz[0])  # hotspot: full rz of the upper layer
    assert phys.g_z[0] == pytest.approx(1.0 / (rz[0] / 2 + rz[1] / 2))  # physical: two half cells


def test_energy_balance(arch_small: ArchConfig) -> None:
    m = get_model(arch_small)
    cw, bw = _random_power(m.n_cores, len(m.dram_layers), m.n_banks_per_layer, 3)
    P = m.node_power(cw, bw)
    assert P.sum() == pytest.approx(cw.sum() + bw.sum(), rel=1e-12)
    T = solvers.steady(m.solver, P)
    assert m.net.heat_to_ambient(T) == pytest.approx(P.sum(), rel=1e-6)


def test_symmetric_power_gives_symmetric_field(arch_small: ArchConfig) -> None:
    m = get_model(arch_small)
    core = np.zeros((4, 4))
    core[1:3, 1:3] = 2.0
    core[0, 0] = core[0, 3] = core[3, 0] = core[3, 3] = 0.5
    T = solvers.steady(m.solver, m.node_power(core.ravel(), np.zeros((2, 64))))
    cells = T[:m.net.n_cells].reshape(m.net.n_layers, 16, 16)
    assert np.abs(cells - cells[:, ::-1, :]).max() < 1e-9
    assert np.abs(cells - cells[:, :, ::-1]).max() < 1e-9
    assert np.abs(cells - cells.transpose(0, 2, 1)).max() < 1e-9
    ring = T[m.net.n_cells:]
    assert ring[0] == pytest.approx(ring[1]) and ring[2] == pytest.approx(ring[3])  # SP_W = SP_E, SP_N = SP_S


def test_superposition(arch_small: ArchConfig) -> None:
    m = get_model(arch_small)
    amb = m.net.ambient
    p1 = m.node_power(*_random_power(16, 2, 64, 4))
    p2 = m.node_power(*_random_power(16, 2, 64, 5))
    t1, t2, t12 = (solvers.steady(m.solver, p) - amb for p in (p1, p2, p1 + p2))
    assert np.abs(t12 - (t1 + t2)).max() < 1e-9
    assert np.abs((solvers.steady(m.solver, 3 * p1) - amb) - 3 * t1).max() < 1e-9


def test_monotonic_in_power_and_h() -> None:
    arch = small_arch()
    m = get_model(arch)
    cw, bw = _random_power(16, 2, 64, 6)
    base = solvers.steady(m.solver, m.node_power(cw, bw))
    more = cw.copy()
    more[5] += 1.0
    hotter = solvers.steady(m.solver, m.node_power(more, bw))
    assert np.all(hotter >= base - 1e-12) and (hotter - base).max() > 0.1
    data = arch.model_dump()
    data["geometry"]["cooling"]["h_wmk2k"] = 20000.0
    m2 = get_model(ArchConfig.model_validate(data))
    cooler = solvers.steady(m2.solver, m2.node_power(cw, bw))
    assert np.all(cooler < base)


def test_steady_is_long_time_limit_of_transient(arch_small: ArchConfig) -> None:
    m = get_model(arch_small)
    P = m.node_power(*_random_power(16, 2, 64, 7))
    Ts = solvers.steady(m.solver, P)
    T = np.full(m.net.n_nodes, m.net.ambient)
    for dt, n in ((1.0, 20), (100.0, 20), (1e4, 20)):  # L-stable TR-BDF2 takes long steps
        T = solvers.step(m.solver, T, P, dt, n)
    assert np.abs(T - Ts).max() < 1e-6
    # and a short transient is still far from it
    T_short = solvers.step(m.solver, np.full(m.net.n_nodes, m.net.ambient), P, 1e-3, 4)
    assert np.abs(T_short - Ts).max() > 1.0


def test_transient_substeps_converge(arch_small_hotspot: ArchConfig) -> None:
    """TR-BDF2 is second order: halving the sub-step cuts the error about four times."""
    m = get_model(arch_small_hotspot)
    P = m.node_power(*_random_power(16, 2, 64, 8))
    T0 = np.full(m.net.n_nodes, m.net.ambient)
    ref = solvers.step(m.solver, T0, P, 2e-3, 64)
    e1 = np.abs(solvers.step(m.solver, T0, P, 2e-3, 2) - ref).max()
    e2 = np.abs(solvers.step(m.solver, T0, P, 2e-3, 4) - ref).max()
    assert 2.5 < e1 / e2 < 6.0


@pytest.mark.parametrize("variant", ["physical", "hotspot"])
def test_spectral_agrees_with_sparse_on_a_rectangular_die(variant: str) -> None:
    """rows != cols and cw != ch: checks the north/south vs east/west conductances and the ring sides."""
    arch = ArchConfig.model_validate({
        "mesh": {"cores": [4, 2]}, "dram": {"banks": [8, 4, 1]},
        "geometry": {"die_mm": [12.0, 5.0], "stack": [
            {"name": "logic", "kind": "logic", "thickness_um": 50, "k_wmk": 120},
            {"name": "dram", "kind": "dram", "thickness_um": 50, "k_wmk": 30},
            {"name": "tim", "kind": "tim", "thickness_um": 20, "k_wmk": 5, "rho_c_jm3k": 4.0e6}]},
        "thermal": {"grid": [24, 10], "variant": variant},
    })
    m = build_model(arch)
    assert (m.net.rows, m.net.cols) == (10, 24)
    rng = np.random.default_rng(9)
    P = m.node_power(rng.random(8) * 3, rng.random((1, 32)) * 0.05)
    fast, oracle = SpectralSolver(m.net), solvers.SparseSolver(m.net)
    a, b = solvers.steady(fast, P), solvers.steady(oracle, P)
    assert np.abs(a - b).max() < 1e-6
    assert m.net.heat_to_ambient(a) == pytest.approx(P.sum(), rel=1e-9)
    T0 = b + rng.random(m.net.n_nodes)
    assert np.abs(solvers.step(fast, T0, P, 2e-3, 3) - solvers.step(oracle, T0, P, 2e-3, 3)).max() < 1e-6


@pytest.mark.parametrize("variant", ["physical", "hotspot"])
def test_exponential_step_is_the_exact_solution(variant: str) -> None:
    """The rational exponential step vs scipy's expm_multiply of −C⁻¹G: within its bound max|r − exp|·|θ0 − θs|,
    the same on the spectral and the sparse solver, and TR-BDF2 converges to it."""
    import scipy.sparse as sps
    from scipy.sparse.linalg import expm_multiply

    from services.thermal.rational import exp_error

    m = build_model(small_arch(variant=variant))
    rng = np.random.default_rng(12)
    P = m.node_power(rng.random(16) * 3, rng.random((2, 64)) * 0.01)
    T0 = np.full(m.net.n_nodes, m.net.ambient) + rng.random(m.net.n_nodes) * 20
    fast, oracle = SpectralSolver(m.net), solvers.SparseSolver(m.net)
    dt = 3e-3
    a = solvers.step_exponential(fast, T0, P, dt)
    assert np.abs(a - solvers.step_exponential(oracle, T0, P, dt)).max() < 1e-6
    Ts = solvers.steady(oracle, P)
    A = -(sps.diags(1.0 / m.net.capacitance) @ m.net.conductance)
    exact = Ts + expm_multiply(A * dt, T0 - Ts)
    dist = np.abs(T0 - Ts).max()
    for degree in (4, 6, 8):
        err = np.abs(solvers.step_exponential(fast, T0, P, dt, degree) - exact).max()
        assert err < 2.0 * exp_error(degree) * dist + 1e-9  # the C-weighted norm bound, with a safety factor
    assert np.abs(a - exact).max() < 1e-4
    e4 = np.abs(solvers.step(fast, T0, P, dt, 4) - exact).max()
    e16 = np.abs(solvers.step(fast, T0, P, dt, 16) - exact).max()
    assert e16 < e4 / 8 and e16 < 0.01


def test_spectral_complex_shifted_solve_equals_the_sparse_lu() -> None:
    """``solve`` with a complex shift and a complex right-hand side (the exponential step's building block)."""
    m = build_model(small_arch())
    rng = np.random.default_rng(15)
    rhs = rng.standard_normal(m.net.n_nodes) + 1j * rng.standard_normal(m.net.n_nodes)
    alpha = (1.2 + 3.6j) / 3e-3
    a = SpectralSolver(m.net).solve(alpha, rhs)
    b = solvers.SparseSolver(m.net).solve(alpha, rhs)
    assert np.abs(b.imag).max() > 1e-6  # the imaginary parts matter
    assert np.abs(a - b).max() < 1e-9 * np.abs(b).max()


def test_exponential_step_keeps_the_steady_state_and_reaches_it() -> None:
    """``r(0) = 1``: from the steady state the step stays there for any window; a long window lands on it (to the
    float32 rounding of the spectral solver's Woodbury part, ~3e-7 K at long windows)."""
    m = build_model(small_arch())
    P = m.node_power(*_random_power(16, 2, 64, 13))
    Ts = solvers.steady(m.solver, P)
    for dt in (1e-3, 1.0, 1e4):
        assert np.abs(solvers.step_exponential(m.solver, Ts, P, dt) - Ts).max() < 1e-6
    cold = np.full(m.net.n_nodes, m.net.ambient)
    assert np.abs(solvers.step_exponential(m.solver, cold, P, 1e4) - Ts).max() < 1e-6
    assert np.abs(solvers.step_exponential(m.solver, cold, P, 1e-3) - Ts).max() > 1.0


def test_model_step_uses_the_configured_integrator() -> None:
    base = small_arch()
    tr = ArchConfig.model_validate({**base.model_dump(), "thermal": {**base.thermal.model_dump(),
                                                                     "integrator": "trbdf2"}})
    m_exp, m_tr = build_model(base), build_model(tr)
    cw, bw = _random_power(16, 2, 64, 14)
    T0 = np.full(m_exp.net.n_nodes, m_exp.net.ambient)
    a, b = m_exp.step(T0, cw, bw, 3e-3), m_tr.step(T0, cw, bw, 3e-3)
    assert np.array_equal(b, m_tr.step_trbdf2(T0, cw, bw, 3e-3, 12))  # ceil(3 / 0.25) sub-steps
    assert np.array_equal(a, m_exp.step_exponential(T0, cw, bw, 3e-3, 6))
    assert 0 < np.abs(a - b).max() < 0.05  # two integrators of one network: close, not identical


@pytest.mark.parametrize("variant", ["hotspot", "physical"])
def test_the_state_step_in_modes_is_the_sparse_exponential_step(variant: str) -> None:
    """A run's window step carries ``θ = T − T_amb`` in the spectral modes (``StackModel.step_state``, no DCT):
    through ``state_of``/``field_of`` it is the sparse LU's exponential step to round-off, also after the float32
    rounding a state's modes go through (which moves the field by ~1e-6 K of the ~20 K here), and ``field_of``
    inverts ``state_of`` without writing its argument."""
    m = build_model(small_arch(variant=variant))
    rng = np.random.default_rng(5)
    cw, bw = rng.random(16) * 3, rng.random((2, 64)) * 0.01
    T0 = np.full(m.net.n_nodes, m.net.ambient) + rng.random(m.net.n_nodes) * 20
    oracle = solvers.SparseSolver(m.net)
    v0 = m.state_of(T0)
    keep = v0.copy()
    assert np.abs(m.field_of(v0) - T0).max() < 1e-10 and np.array_equal(v0, keep)
    want = solvers.step_exponential(oracle, T0, m.node_power(cw, bw), 3e-3)
    v1 = m.step_state(v0, cw, bw, 3e-3)
    # round-off: 1e-10 of the field (~340 K: 3.4e-8 K), the sparse LU's and the modes' double-precision error through
    # the network's conditioning; the hotspot variant's package nodes make it ~1e-8 K, which BLAS kernels move (1.07e-8
    # on an AVX-512 machine's OpenBLAS kernels, below 1e-8 on others); the physical variant's is ~1e-9 K
    assert np.abs(m.field_of(v1) - want).max() < 1e-10 * np.abs(want).max()
    v32 = v1.astype(np.float32).astype(np.float64)
    assert np.abs(m.field_of(v32) - want).max() < 1e-5
