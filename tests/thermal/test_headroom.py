"""`scripts/headroom.py`: a scenario's peak split into the even field, the mean map's pattern and the bursts. The
even spread keeps each die's power; concentrating a die's power raises its steady peak; the mean map is the one the
warm start is solved from."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from scripts.headroom import MeanMap, steady_peaks
from services.thermal.model import get_model
from services.thermal.service import mean_power_map
from shared.contracts.thermal import ThermalState
from shared.errors import BadInput
from tests.thermal.conftest import small_arch


def test_spread_keeps_each_dies_power_and_evens_it() -> None:
    model = get_model(small_arch())
    rng = np.random.default_rng(3)
    m = MeanMap(core_w=rng.uniform(0, 2, model.n_cores),
                bank_w=rng.uniform(0, 0.1, (len(model.dram_layers), model.n_banks_per_layer)))
    for logic in (False, True):
        for dram in (False, True):
            s = m.spread(logic=logic, dram=dram)
            assert np.isclose(s.core_w.sum(), m.core_w.sum())
            np.testing.assert_allclose(s.bank_w.sum(axis=1), m.bank_w.sum(axis=1))
            assert (np.ptp(s.core_w) == 0) == logic
            assert bool(np.all(np.ptp(s.bank_w, axis=1) == 0)) == dram


def test_a_concentrated_die_is_hotter_than_its_even_spread() -> None:
    arch = small_arch()
    model = get_model(arch)
    nd, nb = len(model.dram_layers), model.n_banks_per_layer
    zero = MeanMap(core_w=np.zeros(model.n_cores), bank_w=np.zeros((nd, nb)))
    amb = arch.geometry.cooling.ambient_c
    assert np.allclose(steady_peaks(model, zero), (amb, amb), atol=1e-6)
    core = np.zeros(model.n_cores)
    core[5] = 8.0  # one core dissipates the logic die's 8 W, the DRAM dies nothing
    hot = MeanMap(core_w=core, bank_w=np.zeros((nd, nb)))
    assert steady_peaks(model, hot)[0] > steady_peaks(model, hot.spread(logic=True, dram=False))[0] + 1.0
    bank = np.zeros((nd, nb))
    bank[0, 17] = 1.0  # one bank of the first DRAM die dissipates its 1 W, the logic die nothing
    hot = MeanMap(core_w=np.zeros(model.n_cores), bank_w=bank)
    hot_dram, even_dram = steady_peaks(model, hot)[1], steady_peaks(model, hot.spread(logic=False, dram=True))[1]
    assert hot_dram > even_dram + 1.0 and even_dram > amb


def test_the_mean_map_is_the_warm_ups_energy_over_its_length() -> None:
    model = get_model(small_arch())
    nd, nb = len(model.dram_layers), model.n_banks_per_layer
    e = np.arange(model.n_cores + nd * nb, dtype="<f8") * 1e-3
    state = ThermalState(t_ns=0, field_b64="", dvfs_level=[], window=3, warm_s=0.012,
                         warm_energy_b64=base64.b64encode(e.tobytes()).decode("ascii"))
    m = MeanMap.of_state(model, state)
    np.testing.assert_allclose(m.core_w, e[:model.n_cores] / 0.012)
    np.testing.assert_allclose(m.bank_w.ravel(), e[model.n_cores:] / 0.012)
    with pytest.raises(BadInput, match="warm_s"):  # the thermal service's own check (warm_state's map)
        mean_power_map(model, state.model_copy(update={"warm_s": 0.0}))
