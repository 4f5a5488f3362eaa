"""Control epochs (``thermal_epoch``, ``POST /v1/step/epoch``): a run of windows in one call is bit for bit the
window step called window after window, whatever the epoch size, and stops at the window the sequential loop would
see its event at."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from threadpoolctl import threadpool_limits

from services.thermal.app import create_app
from services.thermal.dvfs import busy_fraction, refresh_mhz
from services.thermal.model import KELVIN, get_model
from services.thermal.power import WindowPower, compute_power
from services.thermal.service import StepOutcome, decode_state, thermal_epoch, thermal_step, warm_start
from shared.chip import Chip, core_domains
from shared.configs import ArchConfig
from shared.configs.loader import load_arch
from shared.contracts.thermal import (
    RefreshReport,
    StepEpochResult,
    StepResult,
    ThermalSnapshot,
    ThermalState,
)
from shared.dvfs import freq_volt, level_step
from shared.energy import EnergyModel, WindowDeposit, deposit_memory, refresh_multiplier, trefi_us
from shared.errors import BadInput
from shared.limits import MAX_EPOCH_WINDOWS
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.thermal.conftest import small_arch

WINDOW_MS = 3.0
SIZES = (1, 2, 7, 64)


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread() -> Iterator[None]:
    """One BLAS thread, as the services run (``Settings.blas_threads``): the default chip's window steps here take
    several times longer with OpenBLAS's threads waiting for each other on a loaded machine."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _deposits(arch: ArchConfig, watts: Sequence[float], *, seed: int) -> list[WindowDeposit]:
    """One deposit per entry of ``watts`` (the window's dynamic power, W): 80 % compute spread unevenly over the
    cores, 20 % DRAM traffic of 64 accesses from random cores to random banks (``shared.energy``'s deposit)."""
    chip, em = Chip.from_arch(arch), EnergyModel.from_arch(arch)
    rng = np.random.default_rng(seed)
    n_banks, n_ev = chip.L * chip.BX * chip.BY, 64
    out = []
    for w in watts:
        compute = 0.8 * w * WINDOW_MS * 1e-3 * rng.uniform(0.5, 1.5, chip.n_cores) / chip.n_cores
        nbytes = rng.uniform(0.5, 1.5, n_ev) * 0.2 * w * WINDOW_MS * 1e-3 / n_ev / em.dram_j_per_byte
        mem = deposit_memory(chip, em, rng.integers(0, chip.n_cores, n_ev), rng.integers(0, n_banks, n_ev), nbytes,
                             np.zeros(n_ev, dtype=bool))
        out.append(WindowDeposit(core_compute_j=compute, core_mac_j=0.6 * compute, memory=mem))
    return out


def _sequential(arch: ArchConfig, window: int, state: ThermalState | None,
                deposits: Sequence[WindowDeposit]) -> list[StepOutcome]:
    out = []
    for j, dep in enumerate(deposits):
        r = thermal_step(arch, window + j, WINDOW_MS, state, None, None, deposit=dep)
        out.append(r)
        state = r.state
    return out


def _freq_of(arch: ArchConfig, state: ThermalState | None) -> list[float]:
    levels = state.dvfs_level if state is not None and state.dvfs_level else [0] * arch.mesh.n_cores
    return [float(f) for f in freq_volt(np.asarray(levels), arch)[0]]


def _events(arch: ArchConfig, state: ThermalState | None, snapshots: Sequence[ThermalSnapshot],
            bw: float | None) -> list[str | None]:
    """The event after each window as the sequential loop sees it (from ``state``): "dvfs" when the clocks it
    answers for the next window differ from the ones it ran at, else "refresh" when its refresh factor differs from
    ``bw``."""
    ran_at = _freq_of(arch, state)
    out: list[str | None] = []
    for snap in snapshots:
        if snap.freq_ghz != ran_at:
            out.append("dvfs")
        elif bw is not None and snap.refresh.bw_eff_factor != bw:
            out.append("refresh")
        else:
            out.append(None)
        ran_at = snap.freq_ghz
    return out


def _drive(arch: ArchConfig, window: int, state: ThermalState | None, deposits: Sequence[WindowDeposit],
           seq: Sequence[StepOutcome], size: int, *, refresh: bool) -> list[tuple[int, str]]:
    """Epochs of up to ``size`` windows over ``deposits`` as an orchestrator would run them (each from the previous
    epoch's state, stopping at events; with ``refresh``, each given the refresh factor of the last window before
    it), every answer checked bit for bit against the sequential ``seq``. Returns the events met (window, kind)."""
    met: list[tuple[int, str]] = []
    j, st = 0, state
    bw: float | None = 1.0 if refresh else None
    while j < len(deposits):
        chunk = deposits[j:j + size]
        expected = _events(arch, st, [r.snapshot for r in seq[j:j + len(chunk)]], bw)
        stop = next((k for k, e in enumerate(expected) if e is not None), None)
        out = thermal_epoch(arch, window + j, WINDOW_MS, st, chunk, bw_eff_factor=bw, until_event=True)
        n = len(chunk) if stop is None else stop + 1
        assert len(out.snapshots) == n, (window + j, size)
        assert out.event == (None if stop is None else expected[stop])
        for k, snap in enumerate(out.snapshots):
            assert snap.model_dump_json() == seq[j + k].snapshot.model_dump_json(), (window + j + k, size)
        assert out.state.model_dump_json() == seq[j + n - 1].state.model_dump_json(), (window + j + n - 1, size)
        if out.event is not None:
            met.append((window + j + n - 1, out.event))
        st = out.state
        if refresh:
            bw = out.snapshots[-1].refresh.bw_eff_factor
        j += n
    return met


@pytest.fixture(scope="module")
def default_chip() -> ArchConfig:
    """The default chip from the run's start (thermal.init steady) with a 60 ms warm-up: the warm-up energy
    accumulates in the state over windows 0-19, then the pass is over."""
    arch = load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")
    assert arch.thermal.init == "steady"
    return arch.model_copy(update={"thermal": arch.thermal.model_copy(update={"warmup_ms": 60.0})})


def test_default_chip_epochs_are_the_sequential_windows_bit_for_bit(default_chip: ArchConfig) -> None:
    deps = _deposits(default_chip, [25.0] * 48, seed=1)
    seq = _sequential(default_chip, 0, None, deps)
    assert seq[10].state.warm_energy_b64 is not None and seq[19].state.warm_s > 0
    assert seq[20].state.warm_energy_b64 is None and seq[20].state.warm_s == 0.0
    for size in SIZES:
        assert _drive(default_chip, 0, None, deps, seq, size, refresh=False) == []  # ~50 °C: no trip
    for size in (7, 64):
        # the refresh factor of the JEDEC step curve below 85 °C differs from the run's start value (1.0) once
        assert _drive(default_chip, 0, None, deps, seq, size, refresh=True) == [(0, "refresh")]
    # from a mid-run state, inside the warm-up (it carries the pass's energy) and after it
    for start in (9, 29):
        for size in (7, 64):
            _drive(default_chip, start + 1, seq[start].state, deps[start + 1:], seq[start + 1:], size, refresh=True)


def test_a_whole_epoch_answers_the_last_state_and_every_snapshot(default_chip: ArchConfig) -> None:
    deps = _deposits(default_chip, [25.0] * 7, seed=2)
    seq = _sequential(default_chip, 0, None, deps)
    out = thermal_epoch(default_chip, 0, WINDOW_MS, None, deps, until_event=False)
    assert [s.window for s in out.snapshots] == list(range(7)) and out.state.window == 6
    assert out.state.t_ns == 7 * 3_000_000 and out.state.model_dump_json() == seq[-1].state.model_dump_json()


@pytest.fixture(scope="module")
def seed_run() -> tuple[ArchConfig, list[WindowDeposit], list[StepOutcome]]:
    """The seed's chip (DRAM dies at k = 2, linearly interpolated refresh curve) under 1 W then 10 W phases of 12
    windows: DVFS trips and steps back within the run, and the refresh factor changes every window."""
    arch = load_arch(CONFIGS / "arch_seed.yaml")
    deps = _deposits(arch, [1.0 if (j // 12) % 2 == 0 else 10.0 for j in range(48)], seed=0)
    return arch, deps, _sequential(arch, 0, None, deps)


def test_seed_chip_epochs_stop_at_the_sequential_loops_events(
        seed_run: tuple[ArchConfig, list[WindowDeposit], list[StepOutcome]]) -> None:
    arch, deps, seq = seed_run
    dvfs = [j for j, e in enumerate(_events(arch, None, [r.snapshot for r in seq], None)) if e == "dvfs"]
    assert len([j for j in dvfs if j > 0]) >= 3  # trips inside the run, not only at its start
    assert seq[0].state.dvfs_level != seq[-1].state.dvfs_level
    for size in SIZES:
        # an epoch that would cross an event stops there, the next one starts after it: every event is met
        assert _drive(arch, 0, None, deps, seq, size, refresh=False) == [(j, "dvfs") for j in dvfs]
    for size in (7, 64):
        met = _drive(arch, 0, None, deps, seq, size, refresh=True)
        assert {e for _, e in met} == {"dvfs", "refresh"}


def test_without_until_event_every_window_is_stepped_and_the_first_event_named(
        seed_run: tuple[ArchConfig, list[WindowDeposit], list[StepOutcome]]) -> None:
    arch, deps, seq = seed_run
    first = _events(arch, None, [r.snapshot for r in seq], None).index("dvfs")
    out = thermal_epoch(arch, 0, WINDOW_MS, None, deps, until_event=False)
    assert len(out.snapshots) == len(deps) and out.event == "dvfs"
    assert [s.model_dump_json() for s in out.snapshots] == [r.snapshot.model_dump_json() for r in seq]
    assert out.state.model_dump_json() == seq[-1].state.model_dump_json()
    stopped = thermal_epoch(arch, 0, WINDOW_MS, None, deps)
    assert len(stopped.snapshots) == first + 1 and stopped.state.window == first and stopped.event == "dvfs"
    # the refresh factor: no event while a window's equals the one given (exact comparison), one when it differs
    j = next(j for j in range(31, 47) if seq[j].snapshot.freq_ghz == seq[j - 1].snapshot.freq_ghz)
    bw = seq[j].snapshot.refresh.bw_eff_factor
    assert seq[j + 1].snapshot.refresh.bw_eff_factor != bw
    one = thermal_epoch(arch, j, WINDOW_MS, seq[j - 1].state, deps[j:j + 1], bw_eff_factor=bw)
    assert one.event is None and len(one.snapshots) == 1
    two = thermal_epoch(arch, j, WINDOW_MS, seq[j - 1].state, deps[j:j + 2], bw_eff_factor=bw, until_event=False)
    assert two.event == _events(arch, seq[j].state, [seq[j + 1].snapshot], bw)[0] is not None
    nudged = thermal_epoch(arch, j, WINDOW_MS, seq[j - 1].state, deps[j:j + 2],
                           bw_eff_factor=float(np.nextafter(bw, 0.0)))
    assert nudged.event == "refresh" and len(nudged.snapshots) == 1


def test_epoch_bounds(arch_small: ArchConfig) -> None:
    deps = _deposits(arch_small, [2.0] * 3, seed=3)
    with pytest.raises(BadInput) as e:
        thermal_epoch(arch_small, 0, WINDOW_MS, None, [])
    assert e.value.field == "deposits"
    with pytest.raises(BadInput) as e:
        thermal_epoch(arch_small, 0, WINDOW_MS, None, deps[:1] * (MAX_EPOCH_WINDOWS + 1))
    assert e.value.field == "deposits"
    with pytest.raises(BadInput) as e:
        thermal_epoch(arch_small, 0, 0.0, None, deps)
    assert e.value.field == "window_ms"
    # a power past what a float holds in the second window: a 422 naming that deposit, not NaN temperatures
    huge = WindowDeposit(core_compute_j=np.full(16, 1e308), core_mac_j=np.zeros(16), memory=deps[1].memory)
    with pytest.raises(BadInput) as e:
        thermal_epoch(arch_small, 0, WINDOW_MS, None, [deps[0], huge, deps[2]])
    assert e.value.field == "deposits[1]"


# --- the window step against its plain definition ---------------------------------------------------------------

def _plain_step(arch: ArchConfig, window: int, state: ThermalState | None, dep: WindowDeposit) -> StepOutcome:
    """One window written with the plain per-block definitions (a CellMap product per block map and die, level_step
    core by core, a bincount per die for the vaults, one layer at a time, the state through base64: float32 modes,
    and their field for readers): what the vectorised window step must equal bit for bit."""
    model = get_model(arch)
    v0 = decode_state(state, model)  # the state's modes (or its field's, or ambient's)
    T0 = model.field_of(v0)
    levels = list(state.dvfs_level) if state is not None and state.dvfs_level else [0] * model.n_cores
    doms = [arch.dvfs.domains[d] for d in core_domains(arch)]

    def clocks(lv: Sequence[int]) -> np.ndarray:
        return np.array([d.steps_ghz[min(max(x, 0), len(d.steps_ghz) - 1)] for d, x in zip(doms, lv, strict=True)])

    freq = clocks(levels)

    def power_at(T: np.ndarray) -> WindowPower:
        return compute_power(dep, arch, core_temp_c=model.core_temps(T) - KELVIN,
                             bank_temp_c=model.bank_temps(T) - KELVIN, freq_ghz=freq, window_s=WINDOW_MS * 1e-3)

    if state is None:
        v0 = model.state_of(warm_start(model, power_at))
        T0 = model.field_of(v0)
    power = power_at(T0)
    dt = WINDOW_MS * 1e-3
    warm_b64, warm_s = None, 0.0
    if window < arch.thermal.warmup_windows(WINDOW_MS) and (state is None or state.warm_energy_b64 is not None):
        n = model.n_cores + power.bank_w.size
        prev = np.zeros(n) if state is None or state.warm_energy_b64 is None else \
            np.frombuffer(base64.b64decode(state.warm_energy_b64), "<f8")
        e = prev + np.concatenate([power.core_w, power.bank_w.ravel()]) * dt
        warm_b64 = base64.b64encode(e.astype("<f8").tobytes()).decode("ascii")
        warm_s = (state.warm_s if state else 0.0) + dt
    v1 = model.step_state(v0, power.core_w, power.bank_w, dt)
    # the state step is the node step in modes: the same field to round-off
    assert np.abs(model.field_of(v1) - model.step(T0, power.core_w, power.bank_w, dt)).max() < 1e-9
    v1 = np.asarray(v1, dtype="<f4").astype(np.float64)  # the state carries float32 modes
    T1 = model.field_of(v1)
    core_c = model.core_temps(T1) - KELVIN
    next_levels = [level_step(float(t), lv, d) for t, lv, d in zip(core_c, levels, doms, strict=True)]
    cells = model.layer_cells
    bank_k = np.stack([model.bank_map.avg @ cells(T1, layer) for layer in model.dram_layers])
    counts = np.bincount(model.vault_of_bank, minlength=model.n_cores)
    vault_c = np.stack([np.bincount(model.vault_of_bank, row, model.n_cores) / counts for row in bank_k],
                       axis=1) - KELVIN
    bank_c = bank_k - KELVIN
    peak = bank_c.max(axis=1)
    refresh = RefreshReport(
        multiplier=[float(x) for x in refresh_multiplier(peak, arch.refresh)],
        trefi_us=[float(x) for x in trefi_us(peak, arch.refresh)],
        busy_fraction=[float(x) for x in busy_fraction(peak, arch.refresh)],
        refresh_mhz=refresh_mhz(bank_c, arch.refresh),
        bw_eff_factor=float(np.mean(1.0 - busy_fraction(vault_c, arch.refresh).mean(axis=1))))
    names = model.layer_names
    snap = ThermalSnapshot(
        window=window, temps_core_c=[float(x) for x in core_c],
        temps_core_max_c=[float(cells(T1, model.logic_layer)[idx].max() - KELVIN) for idx in model._core_cells],
        temps_bank_c=vault_c.tolist(),
        peak_c={n: float((cells(T1, i) - KELVIN).max()) for i, n in enumerate(names)},
        mean_c={n: float((cells(T1, i) - KELVIN).mean()) for i, n in enumerate(names)},
        power_w=power.breakdown, power_core_w=[float(x) for x in power.core_w],
        power_layer_w={"logic": float(power.core_w.sum()),
                       **{names[i]: float(power.bank_w[d].sum()) for d, i in enumerate(model.dram_layers)}},
        freq_ghz=[float(x) for x in clocks(next_levels)], refresh=refresh,
        # no arch.dtm here: a core is throttled at any level past its top step, none in emergency throttle
        cores_throttled=sum(min(x, len(d.steps_ghz) - 1) > 0 for d, x in zip(doms, levels, strict=True)))
    new_state = ThermalState(t_ns=(state.t_ns if state else 0) + round(WINDOW_MS * 1e6),
                             field_b64=base64.b64encode(T1.astype("<f4").tobytes()).decode("ascii"),
                             modes_b64=base64.b64encode(v1.astype("<f4").tobytes()).decode("ascii"),
                             dvfs_level=next_levels, window=window, warm_energy_b64=warm_b64, warm_s=warm_s)
    return StepOutcome(state=new_state, snapshot=snap)


@pytest.mark.parametrize("chip", ["seed", "small"])
def test_window_step_is_its_plain_definition_bit_for_bit(chip: str) -> None:
    """The seed's chip under a DVFS-tripping load (its refresh curve interpolated), and a small chip from a warm-up
    start whose hot phase trips DVFS and whose cool phase steps back."""
    if chip == "seed":
        arch = load_arch(CONFIGS / "arch_seed.yaml")
        watts = [1.0] * 4 + [10.0] * 8
    else:
        arch = small_arch(init="steady", warmup_ms=15.0)
        watts = [2.0] * 3 + [60.0] * 6 + [0.5] * 12
    state: ThermalState | None = None
    met = set()
    for j, dep in enumerate(_deposits(arch, watts, seed=6)):
        want = _plain_step(arch, j, state, dep)
        got = thermal_step(arch, j, WINDOW_MS, state, None, None, deposit=dep)
        assert got.snapshot.model_dump_json() == want.snapshot.model_dump_json(), j
        assert got.state.model_dump_json() == want.state.model_dump_json(), j
        met |= {(a > b) - (a < b) for a, b in zip(got.state.dvfs_level, state.dvfs_level if state else [0] * 64,
                                                    strict=False)}
        state = got.state
    assert 1 in met and (chip == "seed" or -1 in met)  # levels stepped down (throttled), and back up


# --- HTTP wiring -------------------------------------------------------------------------------------------------

def _body(arch: ArchConfig, window: int, state: ThermalState | None, deposits: Sequence[WindowDeposit],
          **kw: Any) -> dict[str, Any]:
    return {"arch": arch.model_dump(mode="json"), "window": window, "window_ms": WINDOW_MS,
            "state": state.model_dump(mode="json") if state else None,
            "deposits": [d.to_contract().model_dump(mode="json") for d in deposits], **kw}


def test_http_epoch_answers_what_the_step_endpoint_answers_window_by_window(settings: Settings) -> None:
    arch = small_arch(init="steady", warmup_ms=9.0)
    deps = _deposits(arch, [3.0, 3.0, 40.0, 40.0, 40.0, 5.0], seed=4)
    client = TestClient(create_app(settings))
    steps, state = [], None
    for j, d in enumerate(deps):
        r = client.post("/v1/step", json={"arch": arch.model_dump(mode="json"), "window": j, "window_ms": WINDOW_MS,
                                          "state": state, "deposit": d.to_contract().model_dump(mode="json")})
        assert r.status_code == 200, r.text
        steps.append(StepResult.model_validate(r.json()))
        state = r.json()["state"]
    r = client.post("/v1/step/epoch", json=_body(arch, 0, None, deps, until_event=False))
    assert r.status_code == 200, r.text
    epoch = StepEpochResult.model_validate(r.json())
    assert [s.model_dump_json() for s in epoch.snapshots] == [s.snapshot.model_dump_json() for s in steps]
    assert epoch.state is not None and steps[-1].state is not None
    assert epoch.state.model_dump_json() == steps[-1].state.model_dump_json()
    first = _events(arch, None, [s.snapshot for s in steps], None)
    assert epoch.event == next((e for e in first if e is not None), None)
    # by the model's hash, from a mid-run state, without the state in the answer
    key = client.post("/v1/models", json={"arch": arch.model_dump(mode="json")}).json()["model"]
    body = {**_body(arch, 2, steps[1].state, deps[2:], until_event=False, return_state=False), "model": key}
    del body["arch"]
    r = client.post("/v1/step/epoch", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["state"] is None
    assert r.json()["snapshots"] == [s.model_dump(mode="json") for s in epoch.snapshots[2:]]


def test_http_epoch_refuses_what_a_step_refuses(settings: Settings, arch_small: ArchConfig) -> None:
    client = TestClient(create_app(settings))
    deps = _deposits(arch_small, [2.0] * 2, seed=5)
    r = client.post("/v1/step/epoch", json=_body(arch_small, 0, None, []))
    assert r.status_code == 422 and "deposits" in r.text
    r = client.post("/v1/step/epoch", json=_body(arch_small, 0, None, deps[:1] * (MAX_EPOCH_WINDOWS + 1)))
    assert r.status_code == 422 and "deposits" in r.text
    r = client.post("/v1/step/epoch", json=_body(arch_small, 4, ThermalState(window=0), deps))
    assert r.status_code == 409 and r.json()["error"]["field"] == "state.window"
    bad = _body(arch_small, 0, None, deps)
    bad["deposits"][1]["core_compute_j"] = [1e-3] * 3
    r = client.post("/v1/step/epoch", json=bad)
    assert r.status_code == 422 and r.json()["error"]["field"] == "deposits[1].core_compute_j"
    r = client.post("/v1/step/epoch", json=_body(arch_small, 0, None, deps, bw_eff_factor=1.5))
    assert r.status_code == 422 and "bw_eff_factor" in r.text


# --- the hard limit (arch.dtm): its throttle changes are DVFS events -------------------------------------------------

def test_epochs_with_the_hard_limits_throttle_are_the_sequential_windows_bit_for_bit() -> None:
    """A small chip with a 70 °C hard limit from ambient: a hot phase that drives every core into the emergency clock
    modulation, then a cool one that releases it a level a window. Every epoch size gives the sequential windows bit
    for bit, and stops at every throttle change (a "dvfs" event) the sequential loop sees."""
    from shared.configs.arch import DtmConfig

    arch = small_arch().model_copy(update={"dtm": DtmConfig(limit_c=70.0)})
    deps = _deposits(arch, [2.0] * 3 + [120.0] * 12 + [0.5] * 12, seed=8)
    seq = _sequential(arch, 0, None, deps)
    emergency = [r.snapshot.cores_emergency for r in seq]
    assert max(emergency) == arch.mesh.n_cores and emergency[-1] == 0  # engaged, then released
    # these deposits are no maximum-power map (120 W over 16 cores is several times it): the limit cannot be
    # held even at the deepest levels, and the snapshots say so
    assert any(r.snapshot.limit_unheld for r in seq)
    dvfs = [j for j, e in enumerate(_events(arch, None, [r.snapshot for r in seq], None)) if e == "dvfs"]
    assert len(dvfs) >= 4
    for size in SIZES:
        assert _drive(arch, 0, None, deps, seq, size, refresh=False) == [(j, "dvfs") for j in dvfs]
    for size in (7, 64):
        _drive(arch, 0, None, deps, seq, size, refresh=True)
    # from a mid-run state in emergency throttle
    j = next(j for j, e in enumerate(emergency) if e > 0)
    for size in (2, 64):
        _drive(arch, j + 1, seq[j].state, deps[j + 1:], seq[j + 1:], size, refresh=True)
