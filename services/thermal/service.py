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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from services.thermal import solvers
from services.thermal.epoch import (
    FIELD_INVALID,
    MODES_INVALID,
    WARM_INVALID,
    EpochOutcome,
    EpochStart,
    check_finite,
    encode_field,
    energy_ok,
    field_ok,
    run_windows,
)
from services.thermal.model import KELVIN, StackModel, get_model, lookup_model
from services.thermal.power import WindowPower, compute_power
from shared.chip import Chip
from shared.configs import ArchConfig
from shared.content import ContentStore, object_or_hash
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.thermal import (
    MAX_WINDOW,
    ModelInfo,
    PowerBreakdown,
    SolveResult,
    StepEpochRequest,
    StepEpochResult,
    StepRequest,
    StepResult,
    ThermalSnapshot,
    ThermalState,
    WarmStartRequest,
)
from shared.dvfs import freq_volt
from shared.energy import WindowDeposit, deposit_of_events
from shared.errors import BadInput, Conflict, NotFound
from shared.limits import MAX_EPOCH_WINDOWS


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
    if not field_ok(T):
        raise BadInput(FIELD_INVALID, field="state.field_b64")
    return T


def layer_stats(model: StackModel, T: np.ndarray) -> tuple[dict[str, float], dict[str, float]]:
    L, nrc = model.net.n_layers, model.net.rows * model.net.cols
    cells = T[:model.net.n_cells].reshape(L, nrc) - KELVIN
    peak = {name: float(cells[i].max()) for i, name in enumerate(model.layer_names)}
    mean = {name: float(cells[i].mean()) for i, name in enumerate(model.layer_names)}
    return peak, mean


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


def warm_start_request(req: WarmStartRequest, states: ContentStore[ThermalState]) -> ThermalState:
    """``POST /v1/warm_start``: the warm-up's last state inline or by its name."""
    return warm_state(arch_of(req.arch, req.model), object_or_hash(req.state, req.state_ref, states, field="state"))


def _check_step(window: int, window_ms: float) -> None:
    if window < 0:
        raise BadInput("window must be >= 0", field="window")
    if not (math.isfinite(window_ms) and window_ms > 0):
        raise BadInput("window_ms must be > 0", field="window_ms")


def decode_state(state: ThermalState | None, model: StackModel) -> np.ndarray:
    """The state vector a window starts from (``StackModel.state_of``): ``state.modes_b64`` when present (exactly
    what the previous window left), else the modes of ``state.field_b64``'s field (ambient when None)."""
    if state is None or state.modes_b64 is None:
        return model.state_of(decode_field(state.field_b64 if state else None, model))
    if not model.modal:
        raise BadInput(f"state.modes_b64: model {model.key} carries node temperatures (the sparse solver), not modes; "
                       "send field_b64 only", field="state.modes_b64")
    v = decode_array(state.modes_b64, field="state.modes_b64", dtype="<f4", n=model.net.n_nodes,
                     what=f"model {model.key} (nodes)")
    if not (np.isfinite(v).all() and field_ok(model.field_of(v))):
        raise BadInput(MODES_INVALID, field="state.modes_b64")
    return v


def _state_inputs(model: StackModel, window: int, state: ThermalState | None) -> tuple[np.ndarray, np.ndarray]:
    """The state vector (``decode_state``) and DVFS levels ``window`` starts from: ``state``'s (it must be the state
    after ``window - 1``), or ambient at the top step when None."""
    if state is not None and state.window != window - 1:
        raise Conflict(f"state is after window {state.window}; window {window} needs the state after window "
                       f"{window - 1}", field="state.window")
    v0 = decode_state(state, model)
    levels = np.zeros(model.n_cores, dtype=int)
    if state is not None and state.dvfs_level:
        if len(state.dvfs_level) != model.n_cores:
            raise BadInput(f"state.dvfs_level has {len(state.dvfs_level)} entries for {model.n_cores} cores",
                           field="state.dvfs_level")
        levels = np.asarray(state.dvfs_level, dtype=int)
    return v0, levels


def _epoch_start(model: StackModel, window: int, window_ms: float, state: ThermalState | None, v0: np.ndarray,
                 levels: np.ndarray, first: WindowDeposit) -> EpochStart:
    """What the first window starts from. No state: the run's start (``thermal.init``: ambient, or the steady state
    of the first window's power, ``warm_start``), and the warm-up pass starts with it; a state carries the pass's
    energy while the pass lasts (its first ``warmup_windows`` windows)."""
    arch = model.arch
    if state is None and arch.thermal.init == "steady":
        freq, _ = freq_volt(levels, arch)

        def power_at(T: np.ndarray) -> WindowPower:
            return compute_power(first, arch, core_temp_c=model.core_temps(T) - KELVIN,
                                 bank_temp_c=model.bank_temps(T) - KELVIN, freq_ghz=freq, window_s=window_ms * 1e-3)

        v0 = model.state_of(warm_start(model, power_at))
    elif state is None and arch.thermal.init != "ambient":
        raise BadInput(f"arch.thermal.init names a state file ({arch.thermal.init}): the orchestrator loads it; a "
                       "step of window 0 needs that state in `state`", field="arch.thermal.init")
    n = model.n_cores + len(model.dram_layers) * model.n_banks_per_layer
    warm: np.ndarray | None = None
    if window < arch.thermal.warmup_windows(window_ms):
        if state is None:
            warm = np.zeros(n)
        elif state.warm_energy_b64 is not None:  # else a run that started from a given state: no pass
            warm = _decode_energy(state.warm_energy_b64, n)
    return EpochStart(v=v0, levels=levels, t_ns=state.t_ns if state else 0, warm=warm,
                      warm_s=state.warm_s if state is not None and warm is not None else 0.0,
                      decided=state is not None and bool(state.dvfs_level))


def thermal_step(arch: ArchConfig, window: int, window_ms: float, state: ThermalState | None,
                 compute: ComputeEvents | None, memory: MemoryEvents | None, *,
                 deposit: WindowDeposit | None = None) -> StepOutcome:
    """One window: events (or their ``deposit``) -> power -> temperatures, DVFS levels for the next window, refresh
    report (``epoch.run_windows`` with one window)."""
    _check_step(window, window_ms)
    model = get_model(arch)
    v0, levels = _state_inputs(model, window, state)
    from_events = deposit is None
    if deposit is None:
        if compute is None or memory is None:
            missing = "compute_events" if compute is None else "memory_events"
            raise BadInput(f"{missing}: required (the window's events, or their deposit)", field=missing)
        deposit = deposit_of_events(compute, memory, arch)
    start = _epoch_start(model, window, window_ms, state, v0, levels, deposit)
    field = "compute_events" if from_events else "deposit"
    out = run_windows(model, window, window_ms, start, [deposit], field_of=lambda _: field)
    return StepOutcome(state=out.state, snapshot=out.snapshots[0])


def thermal_epoch(arch: ArchConfig, window: int, window_ms: float, state: ThermalState | None,
                  deposits: Sequence[WindowDeposit], *, bw_eff_factor: float | None = None,
                  until_event: bool = True) -> EpochOutcome:
    """Windows ``window .. window + len(deposits) - 1`` in one call, deposit ``j`` the energy of window
    ``window + j``: the snapshots and the final state are bit for bit those of ``thermal_step`` called window after
    window, each with the previous call's state. Events (after window j): ``"dvfs"`` when the next window's clocks
    differ from the ones window j ran at, else ``"refresh"`` when ``bw_eff_factor`` is given and window j's refresh
    factor differs from it: the deposits after j were physicalized with inputs that no longer hold. ``until_event``:
    stop after the first window with an event; without, step every deposit. The outcome names the first event."""
    _check_step(window, window_ms)
    if not 1 <= len(deposits) <= MAX_EPOCH_WINDOWS:
        raise BadInput(f"deposits: 1 to {MAX_EPOCH_WINDOWS} windows a call, got {len(deposits)}", field="deposits")
    if window + len(deposits) - 1 > MAX_WINDOW:
        raise BadInput(f"deposits: the last window would be {window + len(deposits) - 1}, past {MAX_WINDOW}",
                       field="deposits")
    model = get_model(arch)
    v0, levels = _state_inputs(model, window, state)
    start = _epoch_start(model, window, window_ms, state, v0, levels, deposits[0])
    return run_windows(model, window, window_ms, start, deposits, field_of=lambda j: f"deposits[{j}]",
                       bw_eff_factor=bw_eff_factor, until_event=until_event)


def step_epoch_request(req: StepEpochRequest) -> StepEpochResult:
    """``POST /v1/step/epoch``: the deposits checked against the chip (a 422 names ``deposits[j]``), then
    ``thermal_epoch``."""
    arch = arch_of(req.arch, req.model)
    chip = Chip.from_arch(arch)
    deposits = [WindowDeposit.from_contract(d, chip, field=f"deposits[{j}]") for j, d in enumerate(req.deposits)]
    out = thermal_epoch(arch, req.window, req.window_ms, req.state, deposits, bw_eff_factor=req.bw_eff_factor,
                        until_event=req.until_event)
    return StepEpochResult(snapshots=out.snapshots, state=out.state if req.return_state else None, event=out.event)


def _decode_energy(b64: str | None, n: int) -> np.ndarray:
    if b64 is None:
        raise BadInput("state.warm_energy_b64 is missing: the state is not from a warm-up pass",
                       field="state.warm_energy_b64")
    e = decode_array(b64, field="state.warm_energy_b64", dtype="<f8", n=n, what="this model (cores + banks)")
    if not energy_ok(e):
        raise BadInput(WARM_INVALID, field="state.warm_energy_b64")
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
        T0 = model.field_of(decode_state(state, model))
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


__all__ = ["PowerBreakdown", "check_finite", "encode_field", "model_info", "solve_power_map", "thermal_epoch",
           "thermal_step"]
