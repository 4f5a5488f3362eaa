"""Thermal influence matrix for placement (ARCHITECTURE §5.2): ``H[i, j]`` = steady temperature rise (K) of core i
(mean over its cells) per watt dissipated uniformly in core j's area of the logic layer, so ``T̂ = H·p + T_amb``.

``influence_vault_matrix``: ``Hv[i, j]`` = rise of core i per watt spread evenly over the banks of vault j (all DRAM
dies), the memory side of the same superposition.

Linear superposition of ``cores`` steady solves of the model's network (package ring included), cached per model.

Both matrices are rounded to ``H_DECIMALS`` decimals (1e-9 K/W, three orders below the solvers' 1e-6 K agreement).
Entries that are equal in exact arithmetic (mirror-image core pairs on a symmetric die) then compare equal in floating
point, so a placement heuristic that breaks ties by index places the same way whichever solver, DCT or BLAS computed
H. Without it, a change of the spectral solver's round-off (1e-15 relative) moved TAPS's Mixtral peak by 1.2 K.
"""

from __future__ import annotations

import threading

import numpy as np

from services.thermal.model import StackModel, get_model
from shared.configs import ArchConfig
from shared.limits import thermal_cache_size

H_DECIMALS = 9
_H: dict[str, np.ndarray] = {}
_LOCK = threading.Lock()


def influence_for_model(model: StackModel) -> np.ndarray:
    with _LOCK:
        H = _H.get(model.key)
    if H is not None:
        return H.copy()
    n = model.n_cores
    nd, nb = len(model.dram_layers), model.n_banks_per_layer
    P = np.stack([model.node_power(np.eye(n)[j], np.zeros((nd, nb))) for j in range(n)], axis=1)
    T = model.solver.solve(0.0, P)  # G·ΔT = P: the rise over ambient
    H = np.round(np.stack([model.core_temps(T[:, j]) for j in range(n)], axis=1), H_DECIMALS)
    with _LOCK:
        _H[model.key] = H
        while len(_H) > 2 * thermal_cache_size():  # H and H_vault of TASMOE_THERMAL_CACHE_SIZE models
            _H.pop(next(iter(_H)))
    return H.copy()


def vault_influence_for_model(model: StackModel) -> np.ndarray:
    key = model.key + ":vault"
    with _LOCK:
        H = _H.get(key)
    if H is not None:
        return H.copy()
    n = model.n_cores
    nd, nb = len(model.dram_layers), model.n_banks_per_layer
    vault = model.vault_of_bank
    counts = np.bincount(vault, minlength=n)
    cols = []
    for j in range(n):
        bw = np.zeros((nd, nb))
        if nd:
            bw[:, vault == j] = 1.0 / (nd * counts[j])
        cols.append(model.node_power(np.zeros(n), bw))
    T = model.solver.solve(0.0, np.stack(cols, axis=1))
    H = np.round(np.stack([model.core_temps(T[:, j]) for j in range(n)], axis=1), H_DECIMALS)
    with _LOCK:
        _H[key] = H
        while len(_H) > 2 * thermal_cache_size():  # H and H_vault of TASMOE_THERMAL_CACHE_SIZE models
            _H.pop(next(iter(_H)))
    return H.copy()


def influence_vault_matrix(arch: ArchConfig) -> np.ndarray:
    """(cores × vaults) K/W: steady rise at core i per W spread over vault j's banks."""
    return vault_influence_for_model(get_model(arch))


def influence_matrix(arch: ArchConfig) -> np.ndarray:
    """(cores × cores) K/W: steady rise at core i per W at core j."""
    return influence_for_model(get_model(arch))
