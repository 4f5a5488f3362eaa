"""The thermal service's plain functions (the endpoints are thin wrappers): build a model, step a window, solve a
power map. Stateless: the temperature field and DVFS levels travel in ``ThermalState`` (float32 little-endian, K,
model node order, base64), so replaying a window with the same input gives the same output. The endpoints keep the
states they answer in an LRU by content hash (``shared.content.state_store``), so a caller may name the previous
state (``state_ref``) instead of sending it back: a cache, never the only copy the caller can rely on.

Window step (ARCHITECTURE §5.4): power from the window's events at the previous window's temperatures and DVFS
levels, then ``window_ms`` of transient at constant power (``StackModel.step``: by default the exponential step, exact
in time up to a degree-6 rational approximation of exp, or TR-BDF2 sub-steps; services/thermal/solvers.py), then the
DVFS decision for the NEXT window and the refresh report at the new temperatures.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from services.thermal import solvers
from services.thermal.dvfs import busy_fraction, refresh_mhz
from services.thermal.model import KELVIN, StackModel, get_model, lookup_model
from services.thermal.power import WindowPower, compute_power
from shared.chip import Chip
from shared.configs import ArchConfig
from shared.content import ContentStore, object_or_hash
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.thermal import (
    ModelInfo,
    PowerBreakdown,
    RefreshReport,
    SolveResult,
    StepRequest,
    StepResult,
    ThermalSnapshot,
    ThermalState,
    WarmStartRequest,
)
from shared.dvfs import freq_volt, step_levels
from shared.energy import WindowDeposit, deposit_of_events, refresh_multiplier, trefi_us
from shared.errors import BadInput, Conflict, NotFound


def model_info(arch: ArchConfig) -> ModelInfo:
    return ModelInfo.model_validate(get_model(arch).summary())


def model_named(model_hash: str, *, field: str = "model") -> StackModel:
    """The cached model of ``POST /v1/models``; 404 ``unknown_model`` when this process does not have it (a restart,
    the LRU of TASMOE_THERMAL_CACHE_SIZE, another replica): the caller posts its arch again."""
    model = lookup_model(model_hash)
    if model is None:
        raise NotFound(f"unknown model {model_hash!r} (not in this replica's cache): POST /v1/models with its arch "
                       "config again", field=field, code="unknown_model")
    return model


def arch_of(arch: ArchConfig | None, model_hash: str | None) -> ArchConfig:
    """The request's arch: inline, or that of its ``model`` hash (exactly one; a 422 naming ``arch`` otherwise)."""
    if arch is not None and model_hash is not None:
        raise BadInput("arch: give arch or model (its hash from POST /v1/models), not both", field="arch")
    if model_hash is not None:
        return model_named(model_hash).arch
    if arch is None:
        raise BadInput("arch: required (the arch config, or model: its hash from POST /v1/models)", field="arch")
    return arch


def encode_field(T: np.ndarray) -> str:
    return base64.b64encode(np.asarray(T, dtype="<f4").tobytes()).decode("ascii")


def decode_array(b64: str, *, field: str, dtype: str, n: int, what: str) -> np.ndarray:
    """``n`` little-endian values (``dtype`` "<f4" or "<f8") from base64, float64; errors name ``field``."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except ValueError:
        raise BadInput(f"{field} is not valid base64", field=field) from None
    size = np.dtype(dtype).itemsize
    if len(raw) != size * n:
        raise BadInput(f"{field} holds {len(raw) // size} values but {what} has {n}", field=field)
    return np.frombuffer(raw, dtype=dtype).astype(np.float64)


def decode_field(b64: str | None, model: StackModel) -> np.ndarray:
    n = model.net.n_nodes
    if b64 is None:
        return np.full(n, model.net.ambient)
    T = decode_array(b64, field="state.field_b64", dtype="<f4", n=n, what=f"model {model.key} (nodes)")
    if not np.all(np.isfinite(T)) or np.any(T <= 0):
        raise BadInput("state.field_b64 holds non-finite or non-positive temperatures", field="state.field_b64")
    return T


def layer_stats(model: StackModel, T: np.ndarray) -> tuple[dict[str, float], dict[str, float]]:
    L, nrc = model.net.n_layers, model.net.rows * model.net.cols
    cells = T[:model.net.n_cells].reshape(L, nrc) - KELVIN
    peak = {name: float(cells[i].max()) for i, name in enumerate(model.layer_names)}
    mean = {name: float(cells[i].mean()) for i, name in enumerate(model.layer_names)}
    return peak, mean


def _refresh_report(model: StackModel, T: np.ndarray) -> RefreshReport:
    arch = model.arch
    if not model.dram_layers:
        return RefreshReport()
    bank_c = model.bank_temps(T) - KELVIN  # (dies, banks)
    layer_peak = bank_c.max(axis=1)
    vault_c = model.vault_temps(T) - KELVIN  # (cores, dies)
    vault_busy = busy_fraction(vault_c, arch.refresh).mean(axis=1)
    return RefreshReport(
        multiplier=[float(x) for x in refresh_multiplier(layer_peak, arch.refresh)],
        trefi_us=[float(x) for x in trefi_us(layer_peak, arch.refresh)],
        busy_fraction=[float(x) for x in busy_fraction(layer_peak, arch.refresh)],
        refresh_mhz=refresh_mhz(bank_c, arch.refresh),
        bw_eff_factor=float(np.mean(1.0 - vault_busy)),
    )


def warm_start(model: StackModel, power_at: Callable[[np.ndarray], WindowPower], refinements: int = 1) -> np.ndarray:
    """``thermal.init: steady``: the steady state of the first window's power, spread evenly over each layer (the
    logic die's power over its cores, each DRAM die's over its banks).

    Why spread: the stack's slow modes (sink, spreader, the bulk of the dies: seconds) see only the total power; the
    local pattern of one 3 ms window (which experts happened to stream) relaxes in milliseconds and moves from window
    to window, so holding it for ever would make a steady hot spot that no run has (window 0 became the run's peak).
    Leakage and refresh depend on the temperature: the power is evaluated at ambient, solved, and re-evaluated at that
    steady state ``refinements`` times (one step of the fixed point ``T = steady(P(T))``; the leakage slope is
    < 1 %/K)."""
    T = decode_field(None, model)
    for _ in range(1 + refinements):
        p = power_at(T)
        core_w = np.full_like(p.core_w, p.core_w.mean())
        bank_w = np.repeat(p.bank_w.mean(axis=1, keepdims=True), p.bank_w.shape[1], axis=1)
        T = solvers.steady(model.solver, model.node_power(core_w, bank_w))
    return np.asarray(T, dtype="<f4").astype(np.float64)


@dataclass(frozen=True)
class StepOutcome:
    """One window's new state and snapshot (`thermal_step`; ``POST /v1/step`` answers them as a `StepResult`)."""

    state: ThermalState
    snapshot: ThermalSnapshot


def step_request(req: StepRequest, states: ContentStore[ThermalState]) -> StepResult:
    """``POST /v1/step``: the state inline or by its name in ``states`` (the process's LRU of the states it answered);
    the events or their deposit; the new state kept in ``states`` and named in the answer (whole unless
    ``return_state`` is false)."""
    arch = arch_of(req.arch, req.model)
    # no state at all: the run's start (ambient, or thermal.init)
    state = None if req.state is None and req.state_ref is None else \
        object_or_hash(req.state, req.state_ref, states, field="state")
    if req.deposit is not None and (req.compute_events is not None or req.memory_events is not None):
        raise BadInput("deposit: give the events (compute_events, memory_events) or their deposit, not both",
                       field="deposit")
    dep = WindowDeposit.from_contract(req.deposit, Chip.from_arch(arch)) if req.deposit is not None else None
    out = thermal_step(arch, req.window, req.window_ms, state, req.compute_events, req.memory_events, deposit=dep)
    ref, _ = states.put(out.state)
    return StepResult(state=out.state if req.return_state else None, state_ref=ref, snapshot=out.snapshot)


def check_finite(T: np.ndarray, field: str, what: str) -> None:
    """A 422 naming ``field`` when a solved field is not finite (inputs past what a float holds: a power of 1e308 W,
    a DVFS voltage of 1e3 V at 1e3 GHz), instead of answering NaN temperatures a later request refuses."""
    if not np.isfinite(T).all():
        raise BadInput(f"{what} gives temperatures that are not finite numbers", field=field)


def warm_start_request(req: WarmStartRequest, states: ContentStore[ThermalState]) -> ThermalState:
    """``POST /v1/warm_start``: the warm-up's last state inline or by its name."""
    return warm_state(arch_of(req.arch, req.model), object_or_hash(req.state, req.state_ref, states, field="state"))


def thermal_step(arch: ArchConfig, window: int, window_ms: float, state: ThermalState | None,
                 compute: ComputeEvents | None, memory: MemoryEvents | None, *,
                 deposit: WindowDeposit | None = None) -> StepOutcome:
    """One window: events (or their ``deposit``) -> power -> temperatures, DVFS levels for the next window, refresh
    report."""
    if window < 0:
        raise BadInput("window must be >= 0", field="window")
    if not (math.isfinite(window_ms) and window_ms > 0):
        raise BadInput("window_ms must be > 0", field="window_ms")
    model = get_model(arch)
    n_cores = model.n_cores
    if state is not None and state.window != window - 1:
        raise Conflict(f"state is after window {state.window}; window {window} needs the state after window "
                       f"{window - 1}", field="state.window")
    T0 = decode_field(state.field_b64 if state else None, model)
    levels = np.zeros(n_cores, dtype=int)
    if state is not None and state.dvfs_level:
        if len(state.dvfs_level) != n_cores:
            raise BadInput(f"state.dvfs_level has {len(state.dvfs_level)} entries for {n_cores} cores",
                           field="state.dvfs_level")
        levels = np.asarray(state.dvfs_level, dtype=int)
    freq, _ = freq_volt(levels, arch)

    from_events = deposit is None
    if deposit is None:
        if compute is None or memory is None:
            missing = "compute_events" if compute is None else "memory_events"
            raise BadInput(f"{missing}: required (the window's events, or their deposit)", field=missing)
        deposit = deposit_of_events(compute, memory, arch)
    dep = deposit

    def power_at(T: np.ndarray) -> WindowPower:
        return compute_power(dep, arch, core_temp_c=model.core_temps(T) - KELVIN,
                             bank_temp_c=model.bank_temps(T) - KELVIN, freq_ghz=freq, window_s=window_ms * 1e-3)

    if state is None and arch.thermal.init == "steady":
        T0 = warm_start(model, power_at)
    elif state is None and arch.thermal.init != "ambient":
        raise BadInput(f"arch.thermal.init names a state file ({arch.thermal.init}): the orchestrator loads it; a "
                       "step of window 0 needs that state in `state`", field="arch.thermal.init")
    power = power_at(T0)
    warm_b64, warm_s = _accumulate_warmup(arch, model, window, window_ms, state, power)
    T1 = model.step(T0, power.core_w, power.bank_w, window_ms * 1e-3)
    check_finite(T1, "compute_events" if from_events else "deposit",
                 "the window's power (its events' energy with arch's leakage, DVFS and refresh)")
    # what the next window starts from is the float32 state: decide on exactly that
    T1 = np.asarray(T1, dtype="<f4").astype(np.float64)
    core_c = model.core_temps(T1) - KELVIN
    next_levels = step_levels(core_c, levels, arch)
    next_freq, _ = freq_volt(next_levels, arch)
    peak, mean = layer_stats(model, T1)
    snap = ThermalSnapshot(
        window=window,
        temps_core_c=[float(x) for x in core_c],
        temps_core_max_c=[float(x) for x in model.core_max_temps(T1) - KELVIN],
        temps_bank_c=(model.vault_temps(T1) - KELVIN).tolist(),
        peak_c=peak,
        mean_c=mean,
        power_w=power.breakdown,
        power_core_w=[float(x) for x in power.core_w],
        power_layer_w={"logic": float(power.core_w.sum()),
                       **{name: float(power.bank_w[d].sum())
                          for d, name in enumerate(model.layer_names[i] for i in model.dram_layers)}},
        freq_ghz=[float(x) for x in next_freq],
        refresh=_refresh_report(model, T1),
    )
    new_state = ThermalState(
        t_ns=(state.t_ns if state else 0) + round(window_ms * 1e6),
        field_b64=encode_field(T1),
        dvfs_level=[int(x) for x in next_levels],
        window=window,
        warm_energy_b64=warm_b64,
        warm_s=warm_s,
    )
    return StepOutcome(state=new_state, snapshot=snap)


def _accumulate_warmup(arch: ArchConfig, model: StackModel, window: int, window_ms: float,
                       state: ThermalState | None, power: WindowPower) -> tuple[str | None, float]:
    """The warm-up pass's energy after this window: ``E += P · Δt`` per core and per bank (J), while the pass is on:
    it starts with the run (``state`` None) and is carried in the state for its first ``warmup_windows`` windows."""
    if window >= arch.thermal.warmup_windows(window_ms):
        return None, 0.0
    if state is not None and state.warm_energy_b64 is None:
        return None, 0.0  # a run that started from a given state (e.g. after the warm-up): no pass
    n = model.n_cores + power.bank_w.size
    prev = _decode_energy(state.warm_energy_b64, n) if state is not None else np.zeros(n)
    dt = window_ms * 1e-3
    e = prev + np.concatenate([power.core_w, power.bank_w.ravel()]) * dt
    return base64.b64encode(e.astype("<f8").tobytes()).decode("ascii"), (state.warm_s if state else 0.0) + dt


def _decode_energy(b64: str | None, n: int) -> np.ndarray:
    if b64 is None:
        raise BadInput("state.warm_energy_b64 is missing: the state is not from a warm-up pass",
                       field="state.warm_energy_b64")
    e = decode_array(b64, field="state.warm_energy_b64", dtype="<f8", n=n, what="this model (cores + banks)")
    if not np.all(np.isfinite(e)) or np.any(e < 0):
        raise BadInput("state.warm_energy_b64 holds non-finite or negative energies", field="state.warm_energy_b64")
    return e


def mean_power_map(model: StackModel, state: ThermalState) -> tuple[np.ndarray, np.ndarray]:
    """A warm-up pass's mean power map from its last state: ``P̄ = E / t_warm`` (W) per core, (cores,), and per
    bank, (DRAM dies, banks per die)."""
    n_dies = len(model.dram_layers)
    e = _decode_energy(state.warm_energy_b64, model.n_cores + n_dies * model.n_banks_per_layer)
    if not state.warm_s > 0:
        raise BadInput("state.warm_s must be > 0 (the warm-up's length in s)", field="state.warm_s")
    p = e / state.warm_s
    return p[:model.n_cores], p[model.n_cores:].reshape(n_dies, model.n_banks_per_layer)


def warm_state(arch: ArchConfig, state: ThermalState) -> ThermalState:
    """The state window 0 starts from after a warm-up pass: the steady state of the pass's mean power map,
    ``T = G⁻¹ · P̄`` with ``P̄ = E / t_warm`` per core and per bank (W). Leakage and refresh are in ``P̄`` at the
    warm-up's own temperatures. DVFS starts at the top step, as every run does."""
    model = get_model(arch)
    core_w, bank_w = mean_power_map(model, state)
    T = solvers.steady(model.solver, model.node_power(core_w, bank_w))
    check_finite(T, "state.warm_energy_b64", "the warm-up's mean power (its energy over warm_s)")
    return ThermalState(t_ns=0, field_b64=encode_field(np.asarray(T, dtype=np.float64)), dvfs_level=[], window=-1)


def solve_power_map(arch: ArchConfig, core_w: list[float], bank_w: list[list[float]] | None = None, *,
                    mode: str = "steady", duration_ms: float = 0.0, state: ThermalState | None = None) -> SolveResult:
    """One-off solve of a power map: ``core_w`` (cores,) W in the logic layer, ``bank_w`` (DRAM dies, banks per
    die) W. ``steady``: the steady state. ``transient``: ``duration_ms`` from ``state`` (ambient when None)."""
    model = get_model(arch)
    cw = np.asarray(core_w, dtype=float)
    if cw.shape != (model.n_cores,):
        raise BadInput(f"core_w needs {model.n_cores} values, got {cw.size}", field="core_w")
    nd, nb = len(model.dram_layers), model.n_banks_per_layer
    bw = np.zeros((nd, nb)) if bank_w is None else np.asarray(bank_w, dtype=float)
    if bw.shape != (nd, nb):
        raise BadInput(f"bank_w must be {nd} x {nb} (DRAM dies x banks per die)", field="bank_w")
    for name, arr in (("core_w", cw), ("bank_w", bw)):
        bad = np.flatnonzero(~np.isfinite(arr.ravel()) | (arr.ravel() < 0))
        if bad.size:
            raise BadInput(f"{name}[{bad[0]}] must be a finite power >= 0 W", field=f"{name}[{bad[0]}]")
    if mode == "steady":
        T = solvers.steady(model.solver, model.node_power(cw, bw))
        out_state = None
    elif mode == "transient":
        if not (math.isfinite(duration_ms) and duration_ms > 0):
            raise BadInput("duration_ms must be > 0 for a transient solve", field="duration_ms")
        T0 = decode_field(state.field_b64 if state else None, model)
        T = model.step(T0, cw, bw, duration_ms * 1e-3, field="duration_ms")
        out_state = ThermalState(t_ns=(state.t_ns if state else 0) + round(duration_ms * 1e6),
                                 field_b64=encode_field(T), dvfs_level=list(state.dvfs_level) if state else [],
                                 window=state.window if state else -1)
    else:
        raise BadInput(f"mode must be 'steady' or 'transient', got {mode!r}", field="mode")
    check_finite(T, "core_w", "the power map")
    peak, mean = layer_stats(model, T)
    return SolveResult(model=model.key, mode=mode, temps_core_c=[float(x) for x in model.core_temps(T) - KELVIN],
                       temps_bank_c=(model.vault_temps(T) - KELVIN).tolist(), peak_c=peak, mean_c=mean,
                       state=out_state)


__all__ = ["PowerBreakdown", "model_info", "solve_power_map", "thermal_step"]
