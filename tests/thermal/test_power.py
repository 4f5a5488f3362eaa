"""Power from events, leakage, DVFS and refresh models."""

from __future__ import annotations

import numpy as np
import pytest

from services.thermal.dvfs import busy_fraction, bw_eff_factor, refresh_mhz
from services.thermal.power import WindowPower, compute_power_from_events
from shared.configs import ArchConfig
from shared.configs.arch import DvfsDomain, RefreshConfig
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.dvfs import freq_volt, level_step, step_levels, volts_for
from shared.energy import leakage_scale, liao, refresh_multiplier, trefi_us
from shared.errors import BadInput


def _compute(cores: list[int], flops: list[float]) -> ComputeEvents:
    """Events whose energy is their MACs at 1.5 pJ (no scratchpad share)."""
    n = len(cores)
    return ComputeEvents.from_columns({"evt_id": list(range(n)), "t_start_ns": [0] * n, "core_id": cores,
                                       "duration_cycles": [1] * n, "flops": flops, "op": ["mm"] * n,
                                       "dvfs_domain": ["all"] * n, "power_hint": [0.0] * n,
                                       "energy_j": [f / 2 * 1.5e-12 for f in flops]})


def _memory(src: list[int], banks: list[str], nbytes: list[float], hops: list[int]) -> MemoryEvents:
    n = len(src)
    return MemoryEvents.from_columns({"evt_id": list(range(n)), "t_start_ns": [0] * n, "src_core": src,
                                      "dst_bank": banks, "bytes": nbytes, "rw": ["r"] * n, "hops": hops,
                                      "noc_qos": ["normal"] * n})


def _power(arch: ArchConfig, c: ComputeEvents, m: MemoryEvents, temp_c: float = 45.0,
           freq: float = 2.0, window_s: float = 1e-3) -> WindowPower:
    n = arch.mesh.n_cores
    bx, by, nd = arch.dram.banks
    return compute_power_from_events(c, m, arch, core_temp_c=np.full(n, temp_c),
                                     bank_temp_c=np.full((nd, bx * by), temp_c), freq_ghz=np.full(n, freq),
                                     window_s=window_s)


def test_logic_dynamic_power_from_event_energy_and_voltage(arch_small: ArchConfig) -> None:
    p = _power(arch_small, _compute([3, 3, 7], [1e9, 1e9, 1e9]), MemoryEvents.empty())
    # 2e9 FLOPs = 1e9 MACs x 1.5 pJ = 1.5 mJ in 1 ms = 1.5 W on core 3; 0.75 W on core 7
    assert p.core_dynamic_w[3] == pytest.approx(1.5) and p.core_dynamic_w[7] == pytest.approx(0.75)
    assert p.core_dynamic_w[[0, 1, 2, 4]].sum() == 0
    slow = _power(arch_small, _compute([3], [2e9]), MemoryEvents.empty(), freq=1.2)
    assert slow.core_dynamic_w[3] == pytest.approx(1.5 * (1.2 / 2.0) ** 2)  # V ∝ f, energy ∝ V²


def test_dram_and_noc_power_land_on_bank_vault_controller_and_routers(arch_small: ArchConfig) -> None:
    # core 0 = (0,0); bank (7,7) of die 1 belongs to vault core (3,3) = 15 (banks x 6..7, y 6..7 of each die):
    # XY route 0-1-2-3-7-11-15, 6 links
    p = _power(arch_small, _compute([], []), _memory([0], ["B(7,7,1)"], [1e6], [6]))
    dram = 1e6 * 8 * 3.9e-12 / 1e-3
    sp = arch_small.dram.energy_split
    dyn = p.bank_w - p.bank_w[0, 0]  # leakage and refresh are uniform at a uniform temperature
    vault_banks = [y * 8 + x for y in (6, 7) for x in (6, 7)]
    assert dyn[1, 7 * 8 + 7] == pytest.approx(dram * (sp.array + sp.tsv_io / 4))
    assert dyn[1, vault_banks].sum() == pytest.approx(dram * (sp.array + sp.tsv_io))
    assert np.delete(dyn[1], vault_banks).sum() == pytest.approx(0.0, abs=1e-12) and dyn[0].sum() == 0
    link = 1e6 * 8 * arch_small.mesh.noc.pj_per_bit_hop * 1e-12 / 1e-3
    route = [0, 1, 2, 3, 7, 11, 15]
    expect = np.zeros(16)
    expect[route] = link  # an inner router gets half of each of its two links
    expect[[0, 15]] = link / 2
    expect[15] += dram * sp.controller
    assert p.core_memory_w == pytest.approx(expect)
    assert p.breakdown.noc == pytest.approx(6 * link)
    assert p.breakdown.dram_dynamic == pytest.approx(dram * (sp.array + sp.tsv_io))
    assert p.breakdown.dram_controller == pytest.approx(dram * sp.controller)
    # dispatch/combine traffic is core to core: NoC only
    d = _memory([0], ["B(7,7,1)"], [1e6], [6])
    d.noc_qos = ["dispatch"]
    q = _power(arch_small, _compute([], []), d)
    assert q.breakdown.dram_dynamic == 0 and q.breakdown.noc == pytest.approx(6 * link)


def test_leakage_and_refresh_grow_with_temperature(arch_small: ArchConfig) -> None:
    # energy_anchors.csv: Liao fit at V = 1.0, ratio vs 25 °C = 1.72 at 85 °C and 1.20 at 45 °C
    assert liao(np.array(358.15), 1.0) / liao(np.array(298.15), 1.0) == pytest.approx(1.72, abs=0.01)
    assert liao(np.array(318.15), 1.0) / liao(np.array(298.15), 1.0) == pytest.approx(1.20, abs=0.01)
    assert leakage_scale(np.array(318.15), 1.0, arch_small) == pytest.approx(1.0)
    cool = _power(arch_small, _compute([], []), MemoryEvents.empty(), temp_c=45.0)
    hot = _power(arch_small, _compute([], []), MemoryEvents.empty(), temp_c=90.0)
    assert cool.breakdown.logic_leakage == pytest.approx(16 * 0.05)
    assert hot.breakdown.logic_leakage > 1.3 * cool.breakdown.logic_leakage
    ratio = refresh_multiplier(90.0, arch_small.refresh) / refresh_multiplier(45.0, arch_small.refresh)
    assert ratio > 1
    assert hot.breakdown.dram_refresh == pytest.approx(ratio * cool.breakdown.dram_refresh)


def test_refresh_model() -> None:
    jedec = RefreshConfig()  # the default: JEDEC, 1x up to 85 °C, 2x in (85, 95]
    assert [float(refresh_multiplier(t, jedec)) for t in (20.0, 45.0, 85.0, 85.01, 90.0, 95.0, 120.0)] == \
        [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert float(trefi_us(85.0, jedec)) == 7.8 and float(trefi_us(90.0, jedec)) == 3.9
    assert float(busy_fraction(90.0, jedec)) == pytest.approx(0.35 / 3.9)
    # the seed's curve, interpolated linearly (configs/arch_seed.yaml)
    cfg = RefreshConfig(tref_curve=((40.0, 1.0), (55.0, 2.0), (70.0, 4.0), (85.0, 8.0)), tref_interp="linear")
    assert float(refresh_multiplier(40.0, cfg)) == 1.0 and float(refresh_multiplier(85.0, cfg)) == 8.0
    assert float(refresh_multiplier(62.5, cfg)) == pytest.approx(3.0)  # halfway between (55, 2) and (70, 4)
    assert float(refresh_multiplier(20.0, cfg)) == 1.0 and float(refresh_multiplier(120.0, cfg)) == 8.0
    assert float(busy_fraction(30.0, cfg)) == pytest.approx(0.35 / 7.8)  # 4.5 % (energy_anchors.csv)
    assert float(bw_eff_factor(85.0, cfg)) == pytest.approx(1 - 0.35 * 8 / 7.8)
    assert refresh_mhz(np.full((2, 4), 30.0), cfg) == pytest.approx(8 / 7.8)


def test_dvfs_trips_and_hysteresis() -> None:
    dom = DvfsDomain()  # steps 2.0/1.8/1.6/1.2 GHz, trips 80/85/90 °C, hysteresis 3 K
    seq, lv = [], 0
    for t in (70, 80, 79, 77.5, 76.9, 95, 88, 86.9, 60):
        lv = level_step(t, lv, dom)
        seq.append(lv)
    assert seq == [0, 1, 1, 1, 0, 3, 3, 2, 0]


def test_dvfs_per_core_and_frequencies(arch_small: ArchConfig) -> None:
    temps = np.full(16, 50.0)
    temps[5] = 86.0
    lv = step_levels(temps, np.zeros(16, dtype=int), arch_small)
    assert lv[5] == 2 and np.delete(lv, 5).sum() == 0
    f, v = freq_volt(lv, arch_small)
    assert f[5] == 1.6 and f[0] == 2.0 and v[5] == pytest.approx(0.8)


def test_vectorised_governor_is_level_step_core_by_core() -> None:
    """``step_levels`` (all cores at once) against ``level_step`` core by core: temperatures on, just off and between
    every trip and every trip minus hysteresis, NaN and infinities, levels below, inside and past the steps; three
    domains (the default, one with equal trips and no hysteresis, one of a single step)."""
    doms = [{"cores": "all"},
            {"cores": list(range(0, 64, 3)), "steps_ghz": [3.0, 2.0, 1.5, 1.0, 0.5], "trip_c": [70.0, 70.0, 75.5, 90.0],
             "hysteresis_c": 0.0, "volts": [1.1, 1.0, 0.9, 0.8, 0.7]},
            {"cores": [1, 4], "steps_ghz": [1.0], "trip_c": []}]
    arch = ArchConfig.model_validate({"dvfs": {"domains": doms}})
    marks = [t + d for dom in arch.dvfs.domains for trip in dom.trip_c
             for t in (trip, trip - dom.hysteresis_c, trip - dom.hysteresis_c / 2)
             for d in (0.0, 1e-9, -1e-9, 0.5, -0.5)]
    temps = np.array([*marks, 20.0, 200.0, np.nan, np.inf, -np.inf])
    rng = np.random.default_rng(3)
    dom_of = [next(d for d, spec in enumerate(arch.dvfs.domains) if spec.cores != "all" and c in spec.cores)
              if any(spec.cores != "all" and c in spec.cores for spec in arch.dvfs.domains) else 0 for c in range(64)]
    for _ in range(200):
        t = rng.choice(temps, 64)
        lv = rng.integers(-2, 7, 64)
        want = [level_step(float(t[c]), int(lv[c]), arch.dvfs.domains[dom_of[c]]) for c in range(64)]
        assert step_levels(t, lv, arch).tolist() == want
        f, v = freq_volt(lv, arch)
        spec = [arch.dvfs.domains[dom_of[c]] for c in range(64)]
        assert f.tolist() == [s.steps_ghz[min(max(int(x), 0), len(s.steps_ghz) - 1)] for s, x in zip(spec, lv,
                                                                                                     strict=True)]
        assert volts_for(f, arch).tolist() == v.tolist()


def test_bad_events_name_the_field(arch_small: ArchConfig) -> None:
    with pytest.raises(BadInput) as e:
        _power(arch_small, _compute([99], [1.0]), MemoryEvents.empty())
    assert e.value.field == "compute_events.core_id[0]"
    with pytest.raises(BadInput) as e:
        _power(arch_small, _compute([], []), _memory([0, 0], ["B(1,1,0)", "bank7"], [1.0, 1.0], [0, 0]))
    assert e.value.field == "memory_events.dst_bank[1]"
    with pytest.raises(BadInput) as e:
        _power(arch_small, _compute([], []), _memory([0], ["B(1,1,5)"], [1.0], [0]))
    assert e.value.field == "memory_events.dst_bank[0]"
    with pytest.raises(BadInput) as e:
        _power(arch_small, _compute([1], [-5.0]), MemoryEvents.empty())
    assert e.value.field == "compute_events.energy_j[0]"
    with pytest.raises(BadInput) as e:
        m = _memory([0], ["B(1,1,0)"], [1.0], [0])
        m.noc_qos = ["express"]
        _power(arch_small, _compute([], []), m)
    assert e.value.field == "memory_events.noc_qos[0]"
