"""TACS's look-ahead (issue 16, module docstring step 6): the move, or none, with the lowest predicted peak over the
next N windows, from pulse responses. Synthetic first-order responses here (``first_order_pulse``: every entry of H
approached with one time constant), the thermal service's own through the HTTP endpoint."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.placement.tacs import tacs_step
from services.root_app import embedded
from shared.configs import ArchConfig, TasParams
from shared.configs.tas import TacsParams
from shared.contracts.placement import Overlays, ReplicaState, Telemetry
from shared.errors import BadInput
from shared.settings import Settings
from tests.placement.tacs_helpers import cores_now, placement_from, temps, window
from tests.placement.test_tacs import ARCH4, H4, _mixed_placement

WINDOW_S = 3e-3


def first_order_pulse(H: np.ndarray, n_windows: int, tau_s: float = 10e-3, vault: float = 0.8
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(Dc, Dv): rise at the end of window t after 1 W during window 0, ``D[t] = H·(1 − a)·a^t`` with
    ``a = exp(−window/τ)`` (so ``Σ D → H``); the vault's response ``vault`` times the core's."""
    a = np.exp(-WINDOW_S / tau_s)
    Dc = np.stack([H * (1 - a) * a**t for t in range(n_windows)])
    return Dc, vault * Dc


def _ahead(params: TacsParams, n: int) -> TacsParams:
    return params.model_copy(update={"lookahead_windows": n})


def test_lookahead_spreads_a_hot_spot_and_the_peak_never_rises(arch: ArchConfig, tas: TasParams,
                                                                kernel64: np.ndarray) -> None:
    """All 16 experts on core 27: the look-ahead moves them out window after window and the peak falls."""
    params = _ahead(tas.tacs, 8)
    pulse = first_order_pulse(kernel64, 8)
    cores = {f"L0E{e}": [27] for e in range(16)}
    watts = {eid: 2.0 for eid in cores}
    plc = placement_from(arch, cores)
    state, smoothed, peaks = ReplicaState(), None, []
    for k in range(20):
        T = temps(kernel64, cores_now(plc, state), watts)
        peaks.append(T.max())
        tele = Telemetry(temps_core=T.tolist(), util_core=[0.5] * 64, noc_load=0.1)
        _, state, smoothed = tacs_step(tele, plc, state, params, arch, kernel64, window(k + 1, watts), smoothed,
                                       (k + 1) * 3_000_000, pulse=pulse)
    assert peaks[0] > 100 and peaks[-1] < peaks[0] - 25
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(peaks))


def test_a_move_whose_relief_lies_past_the_horizon_is_not_made(tas: TasParams) -> None:
    """A hot core's 3 W expert: its weights stream during the first window, so with a one-window look-ahead the move
    only costs (its reads and writes) and is not made; eight windows ahead its relief outweighs that and it is."""
    hot = [60.0] * 16
    hot[6] = 81.0
    plc = placement_from(ARCH4, {"L0E0": [6]})
    late = window(10, {"L0E0": 3.0})
    moved = []
    for n in (1, 8):
        ov, _, _ = tacs_step(Telemetry(temps_core=hot, util_core=[0.5] * 16), plc, ReplicaState(),
                             _ahead(tas.tacs, n), ARCH4, H4, late, None, late.t0_ns, pulse=first_order_pulse(H4, n))
        moved.append(ov.migrate.obj_type.count("expert"))
    assert moved == [0, 1]


def test_power_over_the_window_counts_the_pending_work_as_continuous(tas: TasParams) -> None:
    """``power_over``: the pending window's energy over the 15 ms residency (default) or over the 3 ms window (the
    work goes on at that rate: 5x the power a move shifts). A 0.3 W expert is not worth moving on the first
    assumption and is on the second, for the reactive rule and the look-ahead alike."""
    hot = [60.0] * 16
    hot[6] = 81.0
    plc = placement_from(ARCH4, {"L0E0": [6]})
    late = window(10, {"L0E0": 0.3})
    moved = {}
    for over in ("residency", "window"):
        for n in (0, 8):
            params = _ahead(tas.tacs, n).model_copy(update={"power_over": over})
            ov, _, _ = tacs_step(Telemetry(temps_core=hot, util_core=[0.5] * 16), plc, ReplicaState(), params, ARCH4,
                                 H4, late, None, late.t0_ns, pulse=first_order_pulse(H4, 8) if n else None)
            moved[over, n] = ov.migrate.obj_type.count("expert")
    assert moved == {("residency", 0): 0, ("residency", 8): 0, ("window", 0): 1, ("window", 8): 1}


def test_every_hot_core_can_act_not_only_the_hottest(tas: TasParams) -> None:
    """Two hot spots far apart: the cooler one's move cannot lower the chip's peak (the other core), yet it is
    relieved too (each source scores the field as seen from it)."""
    hot = [60.0] * 16
    hot[0], hot[15] = 90.0, 85.0
    plc = placement_from(ARCH4, {"L0E0": [0], "L0E1": [15]})
    late = window(10, {"L0E0": 3.0, "L0E1": 3.0})
    ov, _, _ = tacs_step(Telemetry(temps_core=hot, util_core=[0.5] * 16), plc, ReplicaState(), _ahead(tas.tacs, 8),
                         ARCH4, H4, late, None, late.t0_ns, pulse=first_order_pulse(H4, 8))
    moved = {src for typ, src in zip(ov.migrate.obj_type, ov.migrate.src, strict=True) if typ == "expert"}
    assert moved == {"0", "15"}


def test_lookahead_without_pulse_responses_names_the_parameter(tas: TasParams) -> None:
    plc = placement_from(ARCH4, {"L0E0": [6]})
    hot = [60.0] * 16
    hot[6] = 81.0
    for pulse in (None, first_order_pulse(H4, 2)):  # none, or fewer windows than asked
        with pytest.raises(BadInput) as exc:
            tacs_step(Telemetry(temps_core=hot), plc, ReplicaState(), _ahead(tas.tacs, 4), ARCH4, H4,
                      window(10, {"L0E0": 3.0}), None, 0, pulse=pulse)
        assert exc.value.field == "params.lookahead_windows"


THOTS = (70.0, 78.0, 82.0, 86.0, 89.5)
MUS = (0.0, 0.5, 2.0, 8.0, 64.0, 1000.0)
PULSE4 = first_order_pulse(H4, 8)


def _run(params: TacsParams, t: list[float], u: list[float], noc: float) -> Overlays:
    cores, watts = _mixed_placement()
    ov, _, _ = tacs_step(Telemetry(temps_core=t, util_core=u, noc_load=noc), placement_from(ARCH4, cores),
                         ReplicaState(), _ahead(params, 8), ARCH4, H4, window(9, watts), None, 27_000_000,
                         pulse=PULSE4)
    return ov


def _noc(ov: Overlays) -> float:
    from tests.placement.test_tacs import _noc_bytes_hops

    return _noc_bytes_hops(ov)


warm_st = st.lists(st.floats(min_value=55.0, max_value=100.0), min_size=16, max_size=16)
util_st = st.lists(st.floats(min_value=0.0, max_value=0.8), min_size=16, max_size=16)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=warm_st, u=util_st, noc=st.floats(min_value=0.0, max_value=0.7))
def test_with_lookahead_raising_thot_never_increases_migrations(tas: TasParams, t: list[float], u: list[float],
                                                                noc: float) -> None:
    counts = []
    for thot in THOTS:
        ov = _run(tas.tacs.model_copy(update={"thresholds": tas.tacs.thresholds.model_copy(update={"Thot": thot})}),
                  t, u, noc)
        counts.append(ov.migrate.obj_type.count("expert"))
    assert all(b <= a for a, b in itertools.pairwise(counts)), counts


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=warm_st, u=util_st, noc=st.floats(min_value=0.0, max_value=0.7))
def test_with_lookahead_raising_mu_never_increases_added_noc_load(tas: TasParams, t: list[float], u: list[float],
                                                                  noc: float) -> None:
    loads = [_noc(_run(tas.tacs.model_copy(update={"cost": tas.tacs.cost.model_copy(update={"mu_noc": mu})}),
                       t, u, noc)) for mu in MUS]
    assert all(b <= a + 1e-6 for a, b in itertools.pairwise(loads)), loads


def test_the_lookahead_properties_are_not_vacuous(tas: TasParams) -> None:
    rng = np.random.default_rng(7)
    moves = mu_drops = 0
    for _ in range(12):
        t, u = rng.uniform(55, 100, 16).tolist(), rng.uniform(0, 0.8, 16).tolist()
        moves += _run(tas.tacs, t, u, 0.2).migrate.obj_type.count("expert")
        loads = [_noc(_run(tas.tacs.model_copy(update={"cost": tas.tacs.cost.model_copy(update={"mu_noc": mu})}),
                           t, u, 0.2)) for mu in (0.0, 1000.0)]
        mu_drops += loads[1] < loads[0]
    assert moves >= 3 and mu_drops >= 1


def test_the_step_endpoint_asks_the_thermal_service_for_the_pulse_responses(settings: Settings) -> None:
    """Over HTTP the placement service fetches the chip's pulse responses from the thermal service (once per chip,
    window and look-ahead) and the look-ahead step moves the hot core's expert."""
    arch = ARCH4
    plc = placement_from(arch, {"L0E0": [6]})
    hot = [60.0] * 16
    hot[6] = 81.0
    body: dict[str, Any] = {
        "telemetry": {"temps_core": hot, "util_core": [0.5] * 16}, "placement": plc.model_dump(mode="json"),
        "arch": arch.model_dump(mode="json"), "H": H4.tolist(),
        "params": _ahead(TacsParams(), 8).model_dump(mode="json"),
        "pending": window(10, {"L0E0": 3.0}).model_dump(mode="json"), "now_ns": 30_000_000}
    with embedded(settings) as emb:
        client = TestClient(emb.apps["placement"])
        r = client.post("/v1/tacs/step", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["overlays"]["migrate"]["obj_type"].count("expert") == 1
        assert len(emb.apps["placement"].state.run_data.pulses._items) == 1
        again = client.post("/v1/tacs/step", json=body)
        assert again.json() == r.json()
        assert len(emb.apps["placement"].state.run_data.pulses._items) == 1
