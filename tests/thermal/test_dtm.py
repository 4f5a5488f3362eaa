"""The hard limit of dynamic thermal management (``arch.dtm``, services/thermal/dtm.py): the next window's hottest
cell never exceeds ``dtm.limit_c`` under any deposit at or below the maximum power map; an arch without ``dtm`` runs
as before; the hot chip at full load settles under its limit with the emergency clock modulation on."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator

import numpy as np
import pytest
from pydantic import ValidationError
from threadpoolctl import threadpool_limits

from services.thermal import solvers
from services.thermal.dtm import MARGIN_K, HardLimit, hard_limit
from services.thermal.epoch import encode_field
from services.thermal.model import KELVIN, get_model
from services.thermal.service import thermal_step
from shared.chip import Chip
from shared.configs import ArchConfig
from shared.configs.arch import DtmConfig
from shared.configs.loader import load_arch
from shared.contracts.thermal import ThermalState
from shared.dvfs import Governor
from shared.energy import MemoryDeposit, WindowDeposit
from tests.conftest import CONFIGS
from tests.thermal.conftest import small_arch
from tests.thermal.test_epoch import _deposits, _sequential

WINDOW_MS = 3.0
FIXTURE = CONFIGS.parent / "tests" / "fixtures" / "thermal" / "default_chip_branch_point.json"
NEW_FIELDS = {"cores_throttled", "cores_emergency", "limit_unheld"}


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread() -> Iterator[None]:
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _with_limit(arch: ArchConfig, limit_c: float) -> ArchConfig:
    return arch.model_copy(update={"dtm": DtmConfig(limit_c=limit_c)})


@pytest.fixture(scope="module")
def hot_chip() -> ArchConfig:
    """The HBM-on-logic chip from a given field (no warm-up pass)."""
    arch = load_arch(CONFIGS / "arch_hbm_on_logic.yaml")
    return arch.model_copy(update={"thermal": arch.thermal.model_copy(update={"init": "ambient", "warmup_ms": 0.0})})


# --- config ---------------------------------------------------------------------------------------------------------

def test_config_sources_and_an_arch_without_dtm_is_unchanged() -> None:
    hot = load_arch(CONFIGS / "arch_hbm_on_logic.yaml")
    assert hot.dtm is not None and hot.dtm.limit_c == 89.0 and hot.dtm.duty == (0.5, 0.25, 0.125, 0.0625)
    for name in ("arch_8x8_32x32x8.yaml", "arch_seed.yaml", "arch_liquid.yaml"):
        arch = load_arch(CONFIGS / name)
        assert arch.dtm is None and "dtm" not in arch.canonical_json()  # the content hash of before
    assert "dtm" not in ArchConfig().canonical_json()
    for bad in ({"limit_c": 90.0, "duty": [0.25, 0.5]}, {"limit_c": 90.0, "duty": [1.0]}, {"limit_c": 90.0, "duty": []},
                {"duty": [0.5]}):
        with pytest.raises(ValidationError):
            DtmConfig.model_validate(bad)


def test_emergency_levels_run_the_last_steps_voltage_at_a_fraction_of_its_clock(hot_chip: ArchConfig) -> None:
    gov = Governor(hot_chip)
    f, v = gov.freq_volt(np.arange(64) % 9)
    steps = hot_chip.dvfs.domains[0].steps_ghz
    want = [*steps, *(steps[-1] * d for d in (0.5, 0.25, 0.125, 0.0625)), steps[-1] * 0.0625]  # past: the deepest
    assert f[:9].tolist() == want
    assert np.all(v[3:9] == v[3]) and np.array_equal(gov.volts_for(f), v)
    assert gov.deepest.tolist() == [7] * 64 and gov.n_dvfs.tolist() == [4] * 64
    plain = Governor(hot_chip.model_copy(update={"dtm": None}))  # without dtm: past the last step is the last step
    assert plain.freq_volt(np.full(64, 6))[0].tolist() == [steps[-1]] * 64


# --- an arch without dtm: bit for bit what the branch point answered -----------------------------------------------

def _close(got: object, want: object, path: str = "") -> None:
    """``got`` equals ``want`` key by key: floats within 1e-4 K (abs) or 1e-6 (rel), everything else exactly."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), path
        for k in want:
            _close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, f"{path}[{i}]")
    elif isinstance(want, float) or isinstance(got, float):
        assert isinstance(got, int | float) and isinstance(want, int | float), path
        assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-4), (path, got, want)
    else:
        assert got == want, (path, got, want)


def test_default_chip_windows_are_those_of_the_branch_point() -> None:
    """The default chip from a uniform 84 °C field under a load that trips DVFS down and lets it step back: every
    snapshot's fields of before and every state's time, window, DVFS levels and field summary are the pinned ones
    (the fixture: temperatures within 1e-4 K, levels exactly; the BLAS kernels a machine picks change the last bits,
    so a pin of the bytes holds on one machine only); the new fields count the throttled cores."""
    arch = load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")
    model = get_model(arch)
    state = ThermalState(field_b64=encode_field(np.full(model.net.n_nodes, 84.0 + KELVIN)), window=-1)
    seq = _sequential(arch, 0, state, _deposits(arch, [600.0] * 8 + [5.0] * 8, seed=11))
    want = json.loads(FIXTURE.read_text())
    assert len(seq) == len(want["snapshots"]) == len(want["states"])
    for i, (r, snap, st) in enumerate(zip(seq, want["snapshots"], want["states"], strict=True)):
        _close(json.loads(r.snapshot.model_dump_json(exclude=NEW_FIELDS)), snap, f"snapshot[{i}]")
        assert r.state.field_b64 is not None
        field = np.frombuffer(base64.b64decode(r.state.field_b64), dtype="<f4").astype(float)
        got = {"t_ns": r.state.t_ns, "window": r.state.window, "dvfs_level": r.state.dvfs_level,
               "field_k": {"min": float(field.min()), "max": float(field.max()), "mean": float(field.mean()),
                           "argmax": int(field.argmax())}}
        _close(got, st, f"state[{i}]")
    ran = [0] * 64
    for r in seq:
        assert r.snapshot.cores_throttled == sum(x > 0 for x in ran) and r.snapshot.cores_emergency == 0
        assert not r.snapshot.limit_unheld
        ran = r.state.dvfs_level
    assert {r.snapshot.cores_throttled for r in seq} == {0, 64}


# --- the guarantee ------------------------------------------------------------------------------------------------

def _max_deposit(lim: HardLimit, levels: np.ndarray, frac: tuple[np.ndarray, np.ndarray, np.ndarray]) -> WindowDeposit:
    """A window's deposit at ``frac`` (cell by cell, in [0, 1]) of the maximum power map at ``levels``: compute per
    core, memory per core (controllers, routers) and per tile."""
    dt = WINDOW_MS * 1e-3
    f, _ = lim.governor.freq_volt(levels)
    compute = frac[0] * (lim.w_per_ghz * f + lim.dma_w) * dt
    chip = Chip.from_arch(lim.model.arch)
    # the tiles' share as the array share of each bank (bank_j = array_bank_j + the TSV/IO shares, none here)
    mem = MemoryDeposit(core_j=frac[1] * lim.mem_core_w * dt, array_j=0.0, tsv_io_j=0.0, controller_j=0.0, noc_j=0.0,
                        array_bank_j=(frac[2] * lim.mem_bank_w * dt).reshape(-1),
                        tsv_io_vault_j=np.zeros((chip.L, chip.n_cores)), chip=chip)
    return WindowDeposit(core_compute_j=compute, core_mac_j=0.5 * compute, memory=mem)


def _hot_field(model_arch: ArchConfig, rng: np.random.Generator, peak_c: float) -> np.ndarray:
    """A field whose hottest node is ``peak_c``: the steady state of random core and tile powers, scaled about the
    ambient, with per-node noise of up to 2 K below it."""
    model = get_model(model_arch)
    core_w = rng.uniform(0.0, 1.0, model.n_cores) ** 3
    bank_w = rng.uniform(0.0, 0.05, (len(model.dram_layers), model.n_banks_per_layer))
    T = solvers.steady(model.solver, model.node_power(core_w, bank_w))
    amb = model.net.ambient
    T = amb + (T - amb) * (peak_c + KELVIN - amb) / (T.max() - amb)
    T = T - rng.uniform(0.0, 2.0, T.size) * (amb + 2.0 < T)
    return np.asarray(T, dtype="<f4").astype(np.float64)


@pytest.mark.parametrize("chip", ["small", "hot"])
def test_the_next_windows_peak_never_exceeds_the_limit(chip: str, hot_chip: ArchConfig) -> None:
    """From random hot fields (hottest node 25 K under the limit to 0.5 K over it) and random levels, the rule picks
    the next levels; then under random deposits up to the maximum power at those levels (all of it, and random
    fractions cell by cell), the window the service steps ends with no cell above the limit whenever the rule held."""
    arch = _with_limit(small_arch(), 75.0) if chip == "small" else hot_chip
    assert arch.dtm is not None
    limit = arch.dtm.limit_c
    model = get_model(arch)
    lim = hard_limit(model, WINDOW_MS * 1e-3)
    assert lim is not None
    gov = lim.governor
    rng = np.random.default_rng(5)
    chosen_levels, held_n, worst = set(), 0, -np.inf
    for k in range(14 if chip == "small" else 5):
        T = _hot_field(arch, rng, limit + rng.uniform(-25.0, 0.5))
        core_k, _, bank_k = model.block_temps(T)
        ran = rng.integers(0, gov.deepest + 1)
        decision = lim.decide(T, core_k - KELVIN, bank_k - KELVIN, ran, gov.step(core_k - KELVIN, ran))
        chosen_levels |= set(decision.levels.tolist())
        if not decision.held:
            assert np.all(decision.levels == gov.deepest)
            continue
        held_n += 1
        state = ThermalState(field_b64=encode_field(T), dvfs_level=decision.levels.tolist(), window=k)
        n_dies, n_tiles = len(model.dram_layers), model.n_banks_per_layer
        fracs = [(np.ones(model.n_cores), np.ones(model.n_cores), np.ones((n_dies, n_tiles)))]
        fracs += [(rng.uniform(0, 1, model.n_cores), rng.uniform(0, 1, model.n_cores),
                   rng.uniform(0, 1, (n_dies, n_tiles))) for _ in range(2)]
        for frac in fracs:
            out = thermal_step(arch, k + 1, WINDOW_MS, state, None, None,
                               deposit=_max_deposit(lim, decision.levels, frac))
            peak = max(out.snapshot.peak_c.values())
            worst = max(worst, peak - limit)
            assert peak <= limit, (k, peak)
    assert held_n >= (10 if chip == "small" else 3)
    # the bound is tight enough to be tested: some window ends within a level's step of the limit
    assert worst > (-1.0 if chip == "small" else -3.0)
    if chip == "small":
        assert max(chosen_levels) >= 4 and min(chosen_levels) == 0  # emergency levels chosen, and the top step


def _full_load(arch: ArchConfig, state: ThermalState, n: int) -> list[tuple[float, int, int, bool, list[int]]]:
    """``n`` windows at full load: every window's deposit the maximum power map at the clocks it runs at (every
    array at its peak rate, every vault at its full bandwidth). Per window: hottest cell (°C), cores throttled,
    cores in emergency, the unheld flag, the next levels."""
    model = get_model(arch)
    lim = hard_limit(model, WINDOW_MS * 1e-3)
    assert lim is not None
    ones = (np.ones(model.n_cores), np.ones(model.n_cores), np.ones((len(model.dram_layers),
                                                                      model.n_banks_per_layer)))
    out = []
    window = state.window + 1
    for w in range(window, window + n):
        levels = np.asarray(state.dvfs_level or [0] * model.n_cores)
        r = thermal_step(arch, w, WINDOW_MS, state, None, None, deposit=_max_deposit(lim, levels, ones))
        s = r.snapshot
        out.append((max(s.peak_c.values()), s.cores_throttled, s.cores_emergency, s.limit_unheld,
                    list(r.state.dvfs_level)))
        state = r.state
    return out


def test_hot_chip_at_full_load_settles_under_its_limit_in_emergency_throttle(hot_chip: ArchConfig) -> None:
    """The hot chip at full load (176 °C steady unmitigated; DVFS's last step alone settles above 89 °C) from a field
    2 K under its limit, shaped as the last DVFS step's steady state: the emergency clock modulation engages, the
    peak settles just under the limit, and no window ends above it."""
    model = get_model(hot_chip)
    lim = hard_limit(model, WINDOW_MS * 1e-3)
    assert lim is not None and hot_chip.dtm is not None
    limit = hot_chip.dtm.limit_c
    at_limit = (np.full(model.n_cores, limit), np.full((len(model.dram_layers), model.n_banks_per_layer), limit))
    core_w, bank_w = lim.power(np.full(model.n_cores, 3), *at_limit)
    T = solvers.steady(model.solver, model.node_power(core_w, bank_w))
    amb = model.net.ambient
    assert T.max() - KELVIN > limit  # the last DVFS step cannot hold the limit at full load
    T = amb + (T - amb) * (limit - 2.0 + KELVIN - amb) / (T.max() - amb)
    run = _full_load(hot_chip, ThermalState(field_b64=encode_field(T), window=-1), 100)
    assert max(p for p, *_ in run) <= limit
    assert not any(u for *_, u, _ in run)
    assert all(t == model.n_cores for _, t, *_ in run)  # every core below its top step all along
    # the emergency clock modulation carries the load most of the time: a cycle in which the cores it throttled
    # recover a level a window until the bound steps them down again, the peak held within 3 K under the limit
    assert sum(e > 0 for _, _, e, *_ in run[5:]) > 0.6 * len(run[5:])
    assert min(p for p, *_ in run[20:]) > limit - 3.0


def test_shipped_configs_never_lose_the_guarantee_at_full_load(hot_chip: ArchConfig) -> None:
    """Every shipped config with a hard limit (the hot chip), at full load from the ambient: its deepest levels are
    never needed in vain (no ``limit_unheld``) and no window ends above the limit. Full load is the most any of its
    experiments deposits; the configs without ``dtm`` have no limit to lose."""
    limited = [name for name in sorted(p.name for p in CONFIGS.glob("arch_*.yaml"))
               if load_arch(CONFIGS / name).dtm is not None]
    assert limited == ["arch_hbm_on_logic.yaml"]
    assert hot_chip.dtm is not None
    run = _full_load(hot_chip, ThermalState(), 150)
    assert not any(u for *_, u, _ in run) and max(p for p, *_ in run) <= hot_chip.dtm.limit_c
    assert max(p for p, *_ in run) > hot_chip.dtm.limit_c - 3.0  # it does run up against the limit


def test_the_margin_is_small_against_the_limit() -> None:
    assert 0 < MARGIN_K <= 0.01
