"""The spectral solver and HotSpot's block maps on any grid shape: not only powers of two, not only square."""

from __future__ import annotations

import numpy as np
import pytest

from services.thermal import solvers
from services.thermal.hotspot_io import DELTA, Floorplan, block_map
from services.thermal.model import build_model
from services.thermal.spectral import SpectralSolver
from tests.thermal.conftest import small_arch


def _dense_edge_block(fast: SpectralSolver, w: np.ndarray) -> np.ndarray:
    """The definition: ``Σ_p DR[p, i_e]·DR[p, i_f]·(DCᵀ·diag(W[p])·DC)[j_e, j_f]``."""
    R, C = fast.shape[1], fast.shape[2]
    W = w.reshape(R, C)
    Q = (fast._DC.T[None, :, :] * W[:, None, :]) @ fast._DC
    Qe = Q[:, fast._ej][:, :, fast._ej]
    Re = fast._DR[:, fast._ei]
    out: np.ndarray = np.einsum("pe,pf,pef->ef", Re, Re, Qe)
    return out


SHAPES = [(16, 16), (12, 20), (7, 3), (2, 9), (9, 2), (2, 2)]


@pytest.mark.parametrize("grid", SHAPES)
def test_edge_block_by_segments_equals_its_definition(grid: tuple[int, int]) -> None:
    fast = SpectralSolver(build_model(small_arch(grid=list(grid))).net)
    rng = np.random.default_rng(grid[0] * 31 + grid[1])
    w = rng.random(grid[0] * grid[1])
    np.testing.assert_allclose(fast._edge_block(w), _dense_edge_block(fast, w), rtol=1e-12, atol=1e-12)
    wc = w + 1j * rng.random(w.size)
    np.testing.assert_allclose(fast._edge_block(wc), _dense_edge_block(fast, wc), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("grid", [(12, 20), (7, 3), (24, 24), (2, 9)])
def test_spectral_solves_agree_with_the_sparse_solver_on_any_grid(grid: tuple[int, int]) -> None:
    net = build_model(small_arch(grid=list(grid))).net
    fast, ref = SpectralSolver(net), solvers.SparseSolver(net)
    P = np.random.default_rng(5).random(net.n_nodes) * (np.arange(net.n_nodes) < net.rows * net.cols)
    np.testing.assert_allclose(solvers.steady(fast, P), solvers.steady(ref, P), atol=1e-6, rtol=0)
    T0 = solvers.steady(ref, P)
    np.testing.assert_allclose(solvers.step(fast, T0, 2 * P, 1e-3, 4), solvers.step(ref, T0, 2 * P, 1e-3, 4),
                               atol=1e-6, rtol=0)


def _loop_block_map(flp: Floorplan, width: float, height: float, rows: int, cols: int) -> np.ndarray:
    """The per-block loop block_map replaced: cell coverage (cells × blocks), dense."""
    cw, ch = width / cols, height / rows
    occ = np.zeros((rows * cols, flp.n_units))
    for u in range(flp.n_units):
        lu, bu = flp.leftx[u], flp.bottomy[u]
        ru, tu = lu + flp.width[u], bu + flp.height[u]
        for i in range(rows):
            for j in range(cols):
                oh = min(tu, height - i * ch) - max(bu, height - (i + 1) * ch)
                ow = min(ru, (j + 1) * cw) - max(lu, j * cw)
                oh = 0.0 if abs(oh / ch) < DELTA else (ch if abs(oh / ch - 1) < DELTA else oh)
                ow = 0.0 if abs(ow / cw) < DELTA else (cw if abs(ow / cw - 1) < DELTA else ow)
                occ[i * cols + j, u] = max(oh, 0.0) * max(ow, 0.0) / (ch * cw)
    return occ


@pytest.mark.parametrize("rows,cols", [(8, 8), (6, 10), (13, 7)])
def test_vectorised_block_map_equals_the_per_block_loop(rows: int, cols: int) -> None:
    # three blocks of unequal size tiling a 3 mm x 2 mm die, none aligned with the grid
    flp = Floorplan(("a", "b", "c"), np.array([1.3e-3, 1.7e-3, 1.7e-3]), np.array([2e-3, 1.1e-3, 0.9e-3]),
                    np.array([0.0, 1.3e-3, 1.3e-3]), np.array([0.0, 0.9e-3, 0.0]), "t.flp")
    bm = block_map(flp, 3e-3, 2e-3, rows, cols)
    np.testing.assert_allclose(bm.occ.toarray(), _loop_block_map(flp, 3e-3, 2e-3, rows, cols), atol=1e-12)
    np.testing.assert_allclose(bm.occ.toarray().sum(axis=0) * (3e-3 * 2e-3 / (rows * cols)),
                               flp.width * flp.height, rtol=1e-9)  # coverage = block area
    np.testing.assert_allclose(bm.avg.toarray().sum(axis=1), 1.0)


def test_cell_map_is_the_sparse_matrix_it_replaces() -> None:
    """CellMap (numpy CSR, so the spectral path never imports scipy) against scipy.sparse on a random map with an
    explicit zero and an empty row."""
    import scipy.sparse as sp

    from services.thermal.hotspot_io import CellMap

    rng = np.random.default_rng(3)
    r = np.array([4, 0, 2, 2, 0, 4, 1])
    c = np.array([1, 0, 2, 0, 2, 0, 1])
    v = np.array([0.5, 1.0, 0.0, 2.0, 3.0, 0.25, 1.5])
    m, ref = CellMap(v, r, c, (6, 3)), sp.csr_matrix((v, (r, c)), shape=(6, 3))
    x = rng.random(3)
    np.testing.assert_allclose(m @ x, ref @ x, rtol=1e-15)
    np.testing.assert_allclose(m.row_sums(), np.asarray(ref.sum(axis=1)).ravel(), rtol=1e-15)
    np.testing.assert_array_equal(m.toarray(), ref.toarray())
    keep = np.array([2, 0])
    np.testing.assert_array_equal(m.columns(keep).toarray(), ref[:, keep].toarray())
    s = rng.random(3)
    np.testing.assert_allclose(m.scale_columns(s).toarray(), ref.toarray() * s[None, :], rtol=1e-15)
    assert list(m.indptr) == list(ref.indptr)
