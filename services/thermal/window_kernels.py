"""Compiled passes of a window step around the solver (numba, nogil, cached; ``epoch.run_windows``): what follows
the transient step every window, fused into passes over the field that the solver's working set has just evicted
from the cache (separate numpy calls each streamed the 12-layer field again).

The same floating-point operations, in the same order, as the numpy definitions they replace (no fastmath, no
contraction into FMAs): the float32 rounding of the state vector (``np.asarray(v, "<f4").astype(float64)``), the
cells in °C with per-layer maxima (exact in any order), and each block's ``Σ w·T`` summed from 0.0 entry after entry
(``StackModel.block_temps``, itself ``CellMap.__matmul__`` bit for bit).
"""

from __future__ import annotations

import numpy as np

from services.thermal.spectral_kernels import _jit


@_jit
def round_state(v1: np.ndarray, v: np.ndarray) -> bool:
    """``v`` = ``v1`` rounded to float32 (the state vector a ``ThermalState`` carries, so what the next window starts
    from). Returns whether every value is finite."""
    ok = True
    for i in range(v1.size):
        x = np.float64(np.float32(v1[i]))
        v[i] = x
        if x - x != 0.0:  # NaN or ±inf
            ok = False
    return ok


@_jit
def layer_cells(T: np.ndarray, kelvin: float, cells_c: np.ndarray, peak: np.ndarray) -> bool:
    """``cells_c`` (layers, cells per layer) = the field's cells in °C (``T − kelvin``), ``peak`` (layers,) their
    maxima. Returns whether every node of ``T`` is a finite temperature > 0 K (what a state's field must hold)."""
    L, P = cells_c.shape
    ok = True
    for layer in range(L):
        row = cells_c[layer]
        hi = -np.inf
        for p in range(P):
            x = T[layer * P + p]
            if not (x > 0.0 and x < np.inf):
                ok = False
            c = x - kelvin
            row[p] = c
            if c > hi:
                hi = c
        peak[layer] = hi
    for i in range(L * P, T.size):
        x = T[i]
        if not (x > 0.0 and x < np.inf):
            ok = False
    return ok


@_jit
def block_sums(T: np.ndarray, core_nodes: np.ndarray, core_w: np.ndarray, bank_nodes: np.ndarray,
               bank_w: np.ndarray, core: np.ndarray, core_max: np.ndarray, bank: np.ndarray) -> None:
    """Block means and the cores' maxima from ``StackModel._block_grids`` (row k: every block's k-th cell and
    weight): ``core[c] = Σ_k w[k, c]·T[node[k, c]]`` from 0.0 in k order, ``core_max[c]`` the largest of those
    cells, ``bank`` likewise for every DRAM die's banks (flat)."""
    kc, nc = core_nodes.shape
    for c in range(nc):
        core[c] = 0.0
        core_max[c] = -np.inf
    for k in range(kc):
        for c in range(nc):
            x = T[core_nodes[k, c]]
            core[c] += core_w[k, c] * x
            if x > core_max[c]:
                core_max[c] = x
    kb, nb = bank_nodes.shape
    for b in range(nb):
        bank[b] = 0.0
    for k in range(kb):
        for b in range(nb):
            bank[b] += bank_w[k, b] * T[bank_nodes[k, b]]


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels for the argument types the window step uses."""
    L, P = 2, 4
    T = np.full(L * P + 3, 300.0)
    round_state(T, np.empty_like(T))
    layer_cells(T, 273.15, np.empty((L, P)), np.empty(L))
    nodes, w = np.zeros((2, 3), dtype=np.intp), np.ones((2, 3))
    block_sums(T, nodes, w, nodes, w, np.empty(3), np.empty(3), np.empty(3))


__all__ = ["block_sums", "layer_cells", "round_state", "warm_up"]


if __name__ == "__main__":  # pragma: no cover - `python -m services.thermal.window_kernels` (Makefile, Dockerfile)
    warm_up()
