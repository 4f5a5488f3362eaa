"""The per-run power report (Science II, issue 15): the thermal service splits a window's power by component and by
die, the metrics service reduces a run's windows to energy and mean/peak power, conserving the total."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from services.metrics.app import create_app
from services.metrics.reduce import fold_windows, power_report, reduce_with_power
from services.metrics.synthetic import synthetic_windows
from services.thermal.service import thermal_step
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.metrics import POWER_COMPONENTS, WindowMetrics
from shared.contracts.thermal import PowerBreakdown
from shared.settings import Settings
from tests.thermal.conftest import small_arch


def _events(scale: float) -> tuple[ComputeEvents, MemoryEvents]:
    # energy_j above the MAC part (flops/2 · 1.5 pJ): the rest is scratchpad
    c = ComputeEvents.from_columns({"evt_id": [0, 1], "t_start_ns": [0, 0], "core_id": [5, 9],
                                    "duration_cycles": [1, 1], "flops": [4e9 * scale, 1e9], "op": ["mm", "mm"],
                                    "dvfs_domain": ["all", "all"], "power_hint": [0.0, 0.0],
                                    "energy_j": [4e9 * scale * 0.75e-12 + 1e-3, 1e9 * 0.75e-12 + 2e-4]})
    m = MemoryEvents.from_columns({"evt_id": [2], "t_start_ns": [0], "src_core": [0], "dst_bank": ["B(7,7,1)"],
                                   "bytes": [1e6 * scale], "rw": ["r"], "hops": [6], "noc_qos": ["normal"]})
    return c, m


def test_thermal_splits_power_by_component_and_die() -> None:
    arch = small_arch()
    c, m = _events(1.0)
    snap = thermal_step(arch, 0, 3.0, None, c, m).snapshot
    p = snap.power_w
    # MACs (flops/2 at 1.5 pJ) and the scratchpad rest, at V = V0 (top step)
    assert p.logic_dynamic == pytest.approx((4e9 + 1e9) / 2 * 1.5e-12 / 3e-3)
    assert p.spm == pytest.approx((1e-3 + 2e-4) / 3e-3)
    assert set(snap.power_layer_w) == {"logic", "dram_1", "dram_2"}
    assert sum(snap.power_layer_w.values()) == pytest.approx(p.total, rel=1e-12)
    assert snap.power_layer_w["logic"] == pytest.approx(sum(snap.power_core_w), rel=1e-12)


def _windows_with_power(n: int) -> list[WindowMetrics]:
    arch = small_arch()
    out = []
    st = None
    base = synthetic_windows(n, "baseline", seed=1)
    for k in range(n):
        c, m = _events(1.0 + k)
        r = thermal_step(arch, k, 3.0, st, c, m)
        st = r.state
        out.append(base[k].model_copy(update={"power": r.snapshot.power_w,
                                              "power_layer_w": r.snapshot.power_layer_w}))
    return out


def test_run_report_energy_mean_peak_and_conservation() -> None:
    ws = _windows_with_power(3)
    _row, rep = reduce_with_power(ws, scenario="baseline", workload="w", thot_c=80.0)
    assert rep is not None
    dt = np.array([w.dt_ms for w in ws])
    t_s = dt.sum() / 1e3
    assert rep.interval_ms == pytest.approx((ws[0].t_start_ms, ws[-1].t_start_ms + ws[-1].dt_ms))
    pws = [w.power for w in ws if w.power is not None]
    cols = {"logic_dynamic": [p.logic_dynamic for p in pws], "spm": [p.spm for p in pws],
            "dram_access": [p.dram_dynamic + p.dram_controller for p in pws],
            "dram_refresh": [p.dram_refresh for p in pws], "total": [p.total for p in pws]}
    for name, values in cols.items():
        col = np.array(values)
        st = rep.components[name]
        assert st.energy_j == pytest.approx(float(col @ dt) / 1e3)
        assert st.mean_w == pytest.approx(st.energy_j / t_s)
        assert st.peak_w == pytest.approx(col.max())
    assert list(rep.components) == [*POWER_COMPONENTS, "total"]
    total = rep.components["total"].energy_j
    assert sum(rep.components[k].energy_j for k in POWER_COMPONENTS) == pytest.approx(total, rel=1e-9)
    assert sum(st.energy_j for st in rep.layers.values()) == pytest.approx(total, rel=1e-9)
    # chunked folds give the same report
    p = fold_windows(ws[:2], thot_c=80.0)
    p = fold_windows(ws[2:], thot_c=80.0, partial=p)
    again = power_report(p)
    assert again is not None and again.components["total"].energy_j == pytest.approx(total, rel=1e-12)


def test_no_report_unless_every_window_has_power() -> None:
    ws = _windows_with_power(3)
    ws[1] = ws[1].model_copy(update={"power": None})
    _, rep = reduce_with_power(ws, scenario="baseline", workload="w", thot_c=80.0)
    assert rep is None


def test_negative_power_names_the_window() -> None:
    from shared.errors import BadInput

    ws = _windows_with_power(2)
    ws[1] = ws[1].model_copy(update={"power": PowerBreakdown(spm=-1.0)})
    with pytest.raises(BadInput) as exc:
        reduce_with_power(ws, scenario="baseline", workload="w", thot_c=80.0)
    assert exc.value.field == "windows[1].power"


def test_http_reduce_returns_the_report_and_the_table(settings: Settings) -> None:
    ws = _windows_with_power(2)
    client = TestClient(create_app(settings))
    r = client.post("/v1/reduce", json={"scenario": "baseline", "workload": "w", "thot_c": 80.0,
                                        "windows": [w.model_dump(mode="json") for w in ws]})
    assert r.status_code == 200, r.text
    rep = r.json()["power"]
    assert rep["components"]["total"]["energy_j"] > 0
    t = client.post("/v1/power/table", json={"reports": {"baseline": rep, "tacs": rep}})
    assert t.status_code == 200
    md = t.json()["markdown"]
    assert md.splitlines()[0].count("mean / peak W") == 2 and "| spm |" in md and "| dram_1 |" in md
