"""A run of windows stepped one after another in memory: ``POST /v1/step/epoch`` (a control epoch of up to
``MAX_EPOCH_WINDOWS`` windows) and ``POST /v1/step`` (a run of one) both step here, so that a window's answer does
not depend on how the windows were grouped into calls.

Each window is exactly the sequential window step (services/thermal/service.py ``thermal_step``): power from the
window's deposit at the previous window's block temperatures and DVFS clocks, ``window_ms`` of transient at constant
power (``StackModel.step_state``), the state vector rounded to float32 (what a ``ThermalState`` carries, so what the
next window starts from), then the DVFS levels of the next window and the snapshot at that state's field.

The state vector (``StackModel.state_of``) on the spectral solver is ``θ = T − T_amb`` in its modes: the exponential
step goes from modes to modes, so a window costs one inverse DCT (the snapshot's field) and no forward DCT; rounding
the modes of ``θ`` to float32 moves a cell by ~1e-6 K, where rounding the field itself (the state before) moved it by
up to 1.5e-5 K at 330 K. On the sparse solver the state is the field. Between windows the state stays a float64
array holding those float32 values and the warm-up energy a float64 array: no base64, no state objects, nothing
rounded that the sequential calls do not round. The snapshots' numbers come from compiled passes over the field
(``window_kernels``) and whole-array numpy operations that give the per-block definitions' numbers bit for bit (same
operands, same order of the sums; ``tests/thermal/test_epoch.py`` checks them against a plain definition of the
window), gathered one row per window and turned into ``ThermalSnapshot`` objects after the last window.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from services.thermal.dtm import HardLimit, hard_limit
from services.thermal.dvfs import busy_fraction, refresh_mhz_rows
from services.thermal.model import KELVIN, StackModel
from services.thermal.power import WindowPower, compute_power
from shared.contracts.thermal import PowerBreakdown, RefreshReport, ThermalSnapshot, ThermalState
from shared.dvfs import Governor
from shared.energy import WindowDeposit, refresh_multiplier, trefi_us
from shared.errors import BadInput

Event = Literal["dvfs", "refresh"]

FIELD_INVALID = "state.field_b64 holds non-finite or non-positive temperatures"
MODES_INVALID = "state.modes_b64 holds non-finite values or a field with non-positive temperatures"
WARM_INVALID = "state.warm_energy_b64 holds non-finite or negative energies"


def encode_field(T: np.ndarray) -> str:
    """The field as a state carries it: float32 little-endian, base64."""
    return base64.b64encode(np.asarray(T, dtype="<f4").tobytes()).decode("ascii")


def encode_energy(e: np.ndarray) -> str:
    """The warm-up energy as a state carries it: float64 little-endian, base64."""
    return base64.b64encode(np.asarray(e, dtype="<f8").tobytes()).decode("ascii")


def field_ok(T: np.ndarray) -> bool:
    """Every temperature finite and > 0 K (what a state's field must hold; a NaN fails both comparisons)."""
    return bool(T.size == 0 or (T.min() > 0 and T.max() < np.inf))


def energy_ok(e: np.ndarray) -> bool:
    """Every energy finite and >= 0 J (what a state's warm-up energy must hold; a NaN fails both comparisons)."""
    return bool(e.size == 0 or (e.min() >= 0 and e.max() < np.inf))


def check_finite(T: np.ndarray, field: str, what: str) -> None:
    """A 422 naming ``field`` when a solved field is not finite (inputs past what a float holds: a power of 1e308 W,
    a DVFS voltage of 1e3 V at 1e3 GHz), instead of answering NaN temperatures a later request refuses."""
    if not np.isfinite(T).all():
        raise BadInput(f"{what} gives temperatures that are not finite numbers", field=field)


@dataclass(frozen=True)
class EpochStart:
    """What the first window starts from: the state vector (``StackModel.state_of``: ``θ`` modes on the spectral
    solver, else the field; float64), the DVFS levels it runs at, the simulated time, and the warm-up pass's energy
    so far (J, per core then per bank; None: no pass) and its span. ``decided``: the levels are the ones a previous
    window chose (a state's); False at a run's start (no state, or a state without levels), where the hard limit
    (``arch.dtm``) checks them against the start field first."""

    v: np.ndarray
    levels: np.ndarray
    t_ns: int
    warm: np.ndarray | None
    warm_s: float
    decided: bool = True


@dataclass(frozen=True)
class EpochOutcome:
    """The windows stepped: one snapshot each, the state after the last, and the first event met (``"dvfs"``: the
    next window's clocks differ from the ones this window ran at; ``"refresh"``: its refresh factor differs from the
    one the windows' events were physicalized with), or None."""

    snapshots: list[ThermalSnapshot]
    state: ThermalState
    event: Event | None


class _Rows:
    """The snapshots' numbers, one row per window, turned into ``ThermalSnapshot`` objects after the last window.
    What no later window needs (the vault means, the refresh report) is computed then, for all the windows at once:
    the same functions on one more leading axis, every per-window sum over the same contiguous values in the same
    order, so the same numbers as one window at a time."""

    def __init__(self, n: int, model: StackModel) -> None:
        cores, dies, layers = model.n_cores, len(model.dram_layers), model.net.n_layers
        self.core = np.empty((n, cores))  # °C
        self.core_max = np.empty((n, cores))  # K
        self.bank = np.empty((n, dies, model.n_banks_per_layer))  # K
        self.peak = np.empty((n, layers))  # °C
        self.mean = np.empty((n, layers))  # °C
        self.power_core = np.empty((n, cores))
        self.power_layer = np.empty((n, 1 + dies))
        self.freq = np.empty((n, cores))
        self.throttled = np.zeros(n, dtype=np.int64)
        self.emergency = np.zeros(n, dtype=np.int64)
        self.unheld = np.zeros(n, dtype=bool)
        self.breakdown: list[PowerBreakdown] = []

    def record(self, j: int, core_c: np.ndarray, core_max_k: np.ndarray, bank_k: np.ndarray, cells_c: np.ndarray,
               power: WindowPower, next_freq: np.ndarray) -> None:
        """Window j's row: its block temperatures and layer means at the end of the window, the power it ran at, the
        clocks of the next window."""
        self.core[j] = core_c
        self.core_max[j] = core_max_k
        self.bank[j] = bank_k
        self.mean[j] = cells_c.mean(axis=1)
        self.power_core[j] = power.core_w
        self.power_layer[j, 0] = power.core_w.sum()
        self.power_layer[j, 1:] = power.bank_w.sum(axis=1)
        self.freq[j] = next_freq
        self.breakdown.append(power.breakdown)

    def snapshots(self, model: StackModel, window: int, n: int) -> list[ThermalSnapshot]:
        names = model.layer_names
        dram_names = [names[i] for i in model.dram_layers]
        vault_c = _vault_rows(model, self.bank[:n])
        core, core_max, vault = self.core[:n].tolist(), (self.core_max[:n] - KELVIN).tolist(), vault_c.tolist()
        peak, mean = self.peak[:n].tolist(), self.mean[:n].tolist()
        power_core, power_layer = self.power_core[:n].tolist(), self.power_layer[:n].tolist()
        freq = self.freq[:n].tolist()
        throttled, emergency = self.throttled[:n].tolist(), self.emergency[:n].tolist()
        unheld = self.unheld[:n].tolist()
        if dram_names:
            cfg = model.arch.refresh
            bank_c = self.bank[:n] - KELVIN
            layer_peak = bank_c.max(axis=2)
            mult, trefi = refresh_multiplier(layer_peak, cfg).tolist(), trefi_us(layer_peak, cfg).tolist()
            busy, mhz = busy_fraction(layer_peak, cfg).tolist(), refresh_mhz_rows(bank_c, cfg).tolist()
            bw = _bw_rows(model, vault_c).tolist()
        out = []
        # the numbers are this module's own (Python floats and ints, lists and dicts of them): built without
        # re-validating them, the same JSON as validated models of the same values
        for j in range(n):
            refresh = RefreshReport.model_construct(
                multiplier=mult[j], trefi_us=trefi[j], busy_fraction=busy[j], refresh_mhz=mhz[j],
                bw_eff_factor=bw[j]) if dram_names else RefreshReport()
            out.append(ThermalSnapshot.model_construct(
                window=window + j, temps_core_c=core[j], temps_core_max_c=core_max[j], temps_bank_c=vault[j],
                peak_c=dict(zip(names, peak[j], strict=True)), mean_c=dict(zip(names, mean[j], strict=True)),
                power_w=self.breakdown[j], power_core_w=power_core[j],
                power_layer_w={"logic": power_layer[j][0], **dict(zip(dram_names, power_layer[j][1:], strict=True))},
                freq_ghz=freq[j], refresh=refresh, cores_throttled=throttled[j], cores_emergency=emergency[j],
                limit_unheld=unheld[j]))
        return out


def _vault_rows(model: StackModel, bank_k: np.ndarray) -> np.ndarray:
    """(windows, cores, DRAM dies) °C: each vault's mean bank temperature per die, from the windows' bank
    temperatures (windows, DRAM dies, banks) K."""
    out: np.ndarray = model.vault_means(bank_k) - KELVIN
    return out


def _bw_rows(model: StackModel, vault_c: np.ndarray) -> np.ndarray:
    """(windows,) the refresh report's BW_eff / BW_raw: ``1 − tRFC/tREFI`` at each vault's mean temperature per die
    (``vault_c``: windows, cores, DRAM dies; °C), averaged over the dies, then over the vaults."""
    vault_busy = busy_fraction(vault_c, model.arch.refresh).mean(axis=2)
    out: np.ndarray = np.mean(1.0 - vault_busy, axis=1)
    return out


def run_windows(model: StackModel, window: int, window_ms: float, start: EpochStart,
                deposits: Sequence[WindowDeposit], *, field_of: Callable[[int], str],
                bw_eff_factor: float | None = None, until_event: bool = False) -> EpochOutcome:
    """Windows ``window .. window + len(deposits) - 1`` from ``start``, one deposit each, as consecutive calls of the
    window step would (each with the previous call's state): the same snapshots and final state, bit for bit. With
    ``until_event``, stops after the first window with an event (included). ``field_of(j)``: the request field a 422
    about deposit ``j`` names. ``bw_eff_factor``: the refresh factor the windows' events were physicalized with
    (None: no refresh events)."""
    # numba is imported on the first window step, not with the module (the CLI and the other services skip it)
    from services.thermal.window_kernels import layer_cells, round_state

    arch = model.arch
    dies, layers = len(model.dram_layers), model.net.n_layers
    window_s = dt = window_ms * 1e-3
    n_warm = arch.thermal.warmup_windows(window_ms)
    rows = _Rows(len(deposits), model)
    v = np.empty(model.net.n_nodes)  # the state after each window (the caller's start.v is never written)
    cells_c = np.empty((layers, model.net.rows * model.net.cols))

    T = model.field_of(start.v)
    governor = Governor(arch)
    limit = hard_limit(model, window_s)
    core_k, _, bank_k = model.block_temps(T)
    core_c, bank_c = core_k - KELVIN, bank_k - KELVIN
    levels, start_unheld = _start_levels(limit, start, T, core_c, bank_c)
    freq, _ = governor.freq_volt(levels)
    volts = governor.volts_for(freq)
    warm = start.warm
    warm_s = start.warm_s if warm is not None else 0.0
    event: Event | None = None
    field_valid = True
    stepped = 0
    for j, dep in enumerate(deposits):
        w = window + j
        _check_resumable(model, field_valid, warm if j and w < n_warm else None)
        power = compute_power(dep, arch, core_temp_c=core_c, bank_temp_c=bank_c, freq_ghz=freq, window_s=window_s,
                              volts=volts)
        if w >= n_warm or warm is None:  # the warm-up pass is over, or this run has none
            warm, warm_s = None, 0.0
        else:
            warm = warm + np.concatenate([power.core_w, power.bank_w.ravel()]) * dt
            warm_s = warm_s + dt
        v1 = model.step_state(v if j else start.v, power.core_w, power.bank_w, dt)
        # what the next window starts from is the float32 state vector (rounded into ``v``): decide on exactly that,
        # through its field (K, float64)
        if not round_state(v1, v):  # a 422 naming the deposit when the solve is not finite
            check_finite(v1, field_of(j), "the window's power (its events' energy with arch's leakage, DVFS and "
                         "refresh)")
        T = model.field_of(v)
        field_valid = layer_cells(T, KELVIN, cells_c, rows.peak[j])  # else refused at the next window
        core_k, core_max_k, bank_k = model.block_temps(T)
        core_c, bank_c = core_k - KELVIN, bank_k - KELVIN
        next_levels = _next_levels(governor, limit, rows, j, T, core_c, bank_c, levels, j == 0 and start_unheld)
        if not np.array_equal(next_levels, levels):
            next_freq, _ = governor.freq_volt(next_levels)
            volts = governor.volts_for(next_freq)
        else:
            next_freq = freq
        rows.record(j, core_c, core_max_k, bank_k, cells_c, power, next_freq)
        stepped = j + 1
        if event is None:
            if not np.array_equal(next_freq, freq):
                event = "dvfs"
            elif bw_eff_factor is not None and _bw_now(model, dies, rows.bank[j:j + 1]) != bw_eff_factor:
                event = "refresh"
            if event is not None and until_event:
                levels = next_levels
                break
        levels, freq = next_levels, next_freq

    state = ThermalState(
        t_ns=start.t_ns + stepped * round(window_ms * 1e6),
        field_b64=encode_field(T),
        modes_b64=encode_field(v) if model.modal else None,
        dvfs_level=levels.tolist(),
        window=window + stepped - 1,
        warm_energy_b64=encode_energy(warm) if warm is not None else None,
        warm_s=warm_s,
    )
    return EpochOutcome(snapshots=rows.snapshots(model, window, stepped), state=state, event=event)


def _start_levels(limit: HardLimit | None, start: EpochStart, T: np.ndarray, core_c: np.ndarray,
                  bank_c: np.ndarray) -> tuple[np.ndarray, bool]:
    """(window 0's levels, whether the hard limit could not hold them): at a run's start (levels not decided by a
    previous window) the hard limit checks them against the start field first."""
    levels = np.asarray(start.levels, dtype=int)
    if limit is not None and not start.decided:
        first = limit.decide(T, core_c, bank_c, levels, levels)
        return first.levels, not first.held
    return levels, False


def _check_resumable(model: StackModel, field_valid: bool, warm: np.ndarray | None) -> None:
    """What the next call's decode of the state would refuse: a field (or modes) the previous window left invalid,
    or an invalid warm-up energy (``warm``: the energy carried into a window of the warm-up pass, else None)."""
    if not field_valid:
        raise BadInput(MODES_INVALID, field="state.modes_b64") if model.modal else \
            BadInput(FIELD_INVALID, field="state.field_b64")
    if warm is not None and not energy_ok(warm):
        raise BadInput(WARM_INVALID, field="state.warm_energy_b64")


def _next_levels(governor: Governor, limit: HardLimit | None, rows: _Rows, j: int, T: np.ndarray,
                 core_c: np.ndarray, bank_c: np.ndarray, levels: np.ndarray, start_unheld: bool) -> np.ndarray:
    """The next window's DVFS levels: the governor's trips, then the hard limit's decision. Records in window j's
    row how many cores ran throttled or in emergency, and whether the limit could not hold."""
    next_levels = governor.step(core_c, levels)
    ran = np.minimum(levels, governor.deepest)  # the levels this window ran at (past the deepest: the deepest)
    rows.throttled[j] = np.count_nonzero(ran > 0)
    rows.emergency[j] = np.count_nonzero(ran >= governor.n_dvfs)
    if limit is not None:
        decision = limit.decide(T, core_c, bank_c, levels, next_levels)
        next_levels = decision.levels
        rows.unheld[j] = not decision.held or start_unheld
    return next_levels


def _bw_now(model: StackModel, dies: int, bank_k: np.ndarray) -> float:
    """This window's refresh factor (what its snapshot will report), for the refresh event."""
    return float(_bw_rows(model, _vault_rows(model, bank_k))[0]) if dies else 1.0


__all__ = ["MODES_INVALID", "EpochOutcome", "EpochStart", "check_finite", "encode_energy", "encode_field", "field_ok",
           "run_windows"]
