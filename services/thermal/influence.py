"""Thermal influence matrix for placement (ARCHITECTURE §5.2): ``H[i, j]`` = steady temperature rise (K) of core i
(mean over its cells) per watt dissipated uniformly in core j's area of the logic layer, so ``T̂ = H·p + T_amb``.

Linear superposition of ``cores`` steady solves of the model's network (package ring included), cached per model.
"""

from __future__ import annotations

import threading

import numpy as np

from services.thermal.model import StackModel, get_model
from shared.configs import ArchConfig

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
    H = np.stack([model.core_temps(T[:, j]) for j in range(n)], axis=1)
    with _LOCK:
        _H[model.key] = H
        while len(_H) > 8:
            _H.pop(next(iter(_H)))
    return H.copy()


def influence_matrix(arch: ArchConfig) -> np.ndarray:
    """(cores × cores) K/W: steady rise at core i per W at core j."""
    return influence_for_model(get_model(arch))
