"""thermal.init: steady with a warm-up pass: the thermal service accumulates the pass's energy in the state it
returns, and ``warm_state`` gives the steady state of the pass's mean power map (Science II, issue 15)."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from fastapi.testclient import TestClient

from services.thermal.app import create_app
from services.thermal.model import KELVIN, get_model
from services.thermal.power import compute_power_from_events
from services.thermal.service import decode_field, solve_power_map, thermal_step, warm_state
from shared.configs import ArchConfig
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.thermal import ThermalState
from shared.errors import BadInput
from shared.settings import Settings
from tests.thermal.conftest import small_arch


def _events(core: int, flops: float, bank: str) -> tuple[ComputeEvents, MemoryEvents]:
    c = ComputeEvents.from_columns({"evt_id": [0], "t_start_ns": [0], "core_id": [core], "duration_cycles": [1],
                                    "flops": [flops], "op": ["mm"], "dvfs_domain": ["all"], "power_hint": [0.0],
                                    "energy_j": [flops * 0.75e-12]})
    m = MemoryEvents.from_columns({"evt_id": [1], "t_start_ns": [0], "src_core": [core], "dst_bank": [bank],
                                   "bytes": [2e6], "rw": ["r"], "hops": [1], "noc_qos": ["normal"]})
    return c, m


def _warm_arch(**kw: object) -> ArchConfig:
    # leakage off: the power of a window does not depend on the temperature, so the mean power map is known exactly
    a = small_arch(init="steady", warmup_ms=6.0, **kw)
    return a.model_copy(update={"power": a.power.model_copy(update={"leak_model": "none"})})


def test_warmup_windows_follow_the_config() -> None:
    assert _warm_arch().thermal.warmup_windows(3.0) == 2
    assert _warm_arch().thermal.warmup_windows(4.0) == 2  # ceil(6 / 4)
    assert small_arch(init="steady", warmup_ms=0.0).thermal.warmup_windows(3.0) == 0
    assert small_arch(init="ambient", warmup_ms=50.0).thermal.warmup_windows(3.0) == 0


def test_warm_state_is_the_steady_state_of_the_warmup_mean_power() -> None:
    """Two warm-up windows with different power maps: the start is the steady solve of their time-average,
    compared with an independent steady solve (`solve_power_map`) of that average."""
    arch = _warm_arch()
    model = get_model(arch)
    wins = [_events(5, 8e9, "B(7,7,1)"), _events(10, 2e9, "B(0,0,0)")]
    st = None
    powers = []
    for k, (c, m) in enumerate(wins):
        T_prev = decode_field(st.field_b64 if st else None, model)
        r = thermal_step(arch, k, 3.0, st, c, m)
        powers.append(compute_power_from_events(c, m, arch, core_temp_c=model.core_temps(T_prev) - KELVIN,
                                                bank_temp_c=model.bank_temps(T_prev) - KELVIN,
                                                freq_ghz=np.full(16, 2.0), window_s=3e-3))
        st = r.state
        assert st.warm_energy_b64 is not None and st.warm_s == pytest.approx(3e-3 * (k + 1))
    assert st is not None
    core_w = np.mean([p.core_w for p in powers], axis=0)
    bank_w = np.mean([p.bank_w for p in powers], axis=0)
    warm = warm_state(arch, st)
    assert warm.window == -1 and warm.warm_energy_b64 is None and warm.dvfs_level == []
    T = decode_field(warm.field_b64, model)
    solved = solve_power_map(arch, core_w.tolist(), bank_w.tolist())
    np.testing.assert_allclose(model.core_temps(T) - KELVIN, solved.temps_core_c, atol=1e-3)
    # the local pattern of the mean map is kept: core 5 (8e9 FLOP per 3 ms) is the hottest core
    assert int(np.argmax(model.core_temps(T))) == 5
    # the run proper starts from it: window 0 with that state accumulates nothing and is hotter than from ambient
    c, m = wins[0]
    r0 = thermal_step(arch, 0, 3.0, warm, c, m)
    assert r0.state.warm_energy_b64 is None
    cold = thermal_step(small_arch(), 0, 3.0, None, c, m)
    assert min(r0.snapshot.temps_core_c) > min(cold.snapshot.temps_core_c) + 0.1


def test_the_warmup_stops_accumulating_after_its_windows() -> None:
    arch = _warm_arch()
    c, m = _events(3, 1e9, "B(1,1,0)")
    st = None
    for k in range(3):
        st = thermal_step(arch, k, 3.0, st, c, m).state
    assert st is not None and st.warm_energy_b64 is None and st.warm_s == 0.0


@pytest.mark.parametrize(("energy", "warm_s", "field"), [
    (None, 1.0, "state.warm_energy_b64"),
    ("not base64!", 1.0, "state.warm_energy_b64"),
    (base64.b64encode(np.zeros(3).tobytes()).decode(), 1.0, "state.warm_energy_b64"),
    (base64.b64encode(np.full(16 + 128, np.nan).tobytes()).decode(), 1.0, "state.warm_energy_b64"),
    (base64.b64encode(np.ones(16 + 128).tobytes()).decode(), 0.0, "state.warm_s"),
])
def test_warm_state_refuses_a_bad_state_naming_the_field(energy: str | None, warm_s: float, field: str) -> None:
    with pytest.raises(BadInput) as exc:
        warm_state(_warm_arch(), ThermalState(warm_energy_b64=energy, warm_s=warm_s))
    assert exc.value.field == field


def test_http_warm_start(settings: Settings) -> None:
    arch = _warm_arch()
    c, m = _events(5, 8e9, "B(7,7,1)")
    client = TestClient(create_app(settings))
    st = thermal_step(arch, 0, 3.0, None, c, m).state
    r = client.post("/v1/warm_start", json={"arch": arch.model_dump(mode="json"), "state": st.model_dump()})
    assert r.status_code == 200, r.text
    assert ThermalState.model_validate(r.json()) == warm_state(arch, st)
    bad = client.post("/v1/warm_start", json={"arch": arch.model_dump(mode="json"),
                                              "state": {**st.model_dump(), "warm_energy_b64": "xx"}})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "state.warm_energy_b64"
