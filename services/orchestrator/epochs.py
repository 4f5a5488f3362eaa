"""Control epochs: the window loop advances many windows per call to the compute services (ARCHITECTURE §4).

A window (3 ms) is the unit of physics and of every result; an epoch is the unit of conversation. Between two control
decisions nothing feeds back from one window to the next but state the services carry themselves, so the services
are asked for a run of windows at once under the current mapping and clocks, and the first window after which a
decision changes the next window's inputs ends the epoch: an *event*, located as an ODE solver locates one
(``scipy.integrate.solve_ivp``'s ``events``). What was computed past it is discarded. An epoch from window k:

    L[k:k+N]       = workload windows (one GET per MAX_WINDOWS_PER_CALL)
    D_k            = placement.tacs/epoch([telemetry of k-1, L[k]])               TACS's decision for window k
    P[k:k+N]       = lowering.physicalize/epoch(L, D_k's overlays at k, clocks, refresh factor)
    S[k:k+M]       = thermal.step/epoch(P's deposits, until_event)  M <= N: stops after the first window whose next
                     window runs at other DVFS levels or another refresh factor ("dvfs", "refresh")
    D[k+1:k+M]     = placement.tacs/epoch([telemetry of j-1, L[j]] for j in k+1..k+M-1): stops at the first
                     decision that acts (a reroute or a migration: "tacs"); the windows from it on are discarded
    e              = the last window kept; the physicalizer's (and, after a TACS event, the thermal) state after e
                     is recomputed from the epoch's start when the epoch was cut before its end

Every window is computed exactly as the per-window loop computes it (an epoch of one window, ``epoch_windows: 1``):
each service steps its windows one after another from the state the one before left, and a TACS decision is made on
the same telemetry, so the results do not depend on the epoch sizes (tests compare them byte for byte). The epoch
size adapts: it doubles while no event cuts it, up to ``epoch_windows``, and after an event starts again from the
distance to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar

from services.orchestrator.pipeline_clients import (
    EMPTY_OVERLAYS,
    EpochTooLarge,
    Json,
    LogicalWindow,
    PhysicalEpoch,
    PhysicalWindow,
    Pipeline,
    RunData,
    ThermalEpoch,
    TraceInfo,
)
from shared.chip import vault_bw_raw_gbps
from shared.configs import ArchConfig, TasParams, WorkloadConfig
from shared.contracts.events import WindowTiming
from shared.contracts.metrics import WindowMetrics
from shared.contracts.placement import Placement, ReplicaEntry, ReplicaState, Telemetry
from shared.contracts.thermal import ThermalSnapshot
from shared.dvfs import top_freqs
from shared.errors import BadInput
from shared.limits import MAX_EPOCH_WINDOWS

log = logging.getLogger(__name__)

PHASES = ("workload", "tacs", "physicalize", "thermal")  # the calls of an epoch, timed per run
P = ParamSpec("P")
R = TypeVar("R")


def initial_freqs(arch: ArchConfig) -> list[float]:
    """Per core, the top step of its DVFS domain (``shared.dvfs.top_freqs``: the rule lowering and thermal use)."""
    return top_freqs(arch)


def ambient_telemetry(arch: ArchConfig) -> Telemetry:
    t = arch.geometry.cooling.ambient_c
    n = arch.mesh.n_cores
    return Telemetry(temps_core=[t] * n, temps_bank=[t] * n, util_core=[0.0] * n, noc_load=0.0, ts_ns=0,
                     freq_ghz=initial_freqs(arch))


def initial_replicas(placement: Placement) -> ReplicaState:
    return ReplicaState(experts={e: ReplicaEntry(cores=list(p.cores), ts_created_ns=0)
                                 for e, p in sorted(placement.experts.items())})


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def build_window_metrics(*, window: int, t0_ns: int, t1_ns: int, snap: ThermalSnapshot, timing: WindowTiming,
                         arch: ArchConfig) -> WindowMetrics:
    """One `WindowMetrics` from the thermal snapshot (temperatures °C, power W, DVFS, refresh) and the
    physicalizer's timing (tokens, latencies, bytes, NoC). BW_eff = vaults × vault_bw × (1 − t_RFC/t_REFI)."""
    # the layers by their kind in the arch config (``GeometryConfig.layer_names``), not by what they are called
    logic_names, dram_names = arch.geometry.layer_names("logic"), arch.geometry.layer_names("dram")
    logic_peaks = [snap.peak_c[n] for n in logic_names if n in snap.peak_c]
    dram_layers = [snap.peak_c[n] for n in dram_names if n in snap.peak_c]
    bank_flat = [t for vault in snap.temps_bank_c for t in vault]
    t_peak_logic = max(logic_peaks) if logic_peaks else max(snap.temps_core_max_c or snap.temps_core_c)
    t_peak_dram = max(dram_layers) if dram_layers else max(bank_flat or snap.temps_core_c)
    logic_means = [snap.mean_c[n] for n in logic_names if n in snap.mean_c]
    dram_means = [snap.mean_c[n] for n in dram_names if n in snap.mean_c]
    t_mean_logic = _mean(logic_means) if logic_means else _mean(snap.temps_core_c)
    t_mean_dram = _mean(dram_means) if dram_means else _mean(bank_flat or snap.temps_core_c)
    bw_eff = vault_bw_raw_gbps(arch) * max(snap.refresh.bw_eff_factor, 1e-9)
    return WindowMetrics(
        window=window, t_start_ms=t0_ns / 1e6, dt_ms=max(t1_ns - t0_ns, 1) / 1e6,
        temps_core_c=snap.temps_core_c, temps_bank_c=snap.temps_bank_c,
        T_peak_logic=t_peak_logic, T_peak_dram=t_peak_dram, T_mean_logic=t_mean_logic, T_mean_dram=t_mean_dram,
        power_w=max(snap.power_w.total, 0.0), freq_ghz=snap.freq_ghz, refresh_mhz=snap.refresh.refresh_mhz,
        bytes_moved=timing.bytes_moved, bw_eff_gbps=bw_eff, noc_link_util=timing.noc_link_util,
        tokens_completed=timing.tokens_completed, latencies_ms=timing.latencies_ms,
        queue_delay_ms=timing.queue_delay_ms, migrations=timing.migrations,
        oldest_inflight_ms=timing.oldest_inflight_ms, power=snap.power_w, power_layer_w=snap.power_layer_w,
        power_core_w=snap.power_core_w, requests_done=timing.requests_done, requests_arrived=timing.requests_arrived,
        requests_shed=timing.requests_shed, tokens_offered=timing.tokens_offered, tokens_shed=timing.tokens_shed,
        requests_waiting=timing.requests_waiting, requests_running=timing.requests_running,
        tokens_queued=timing.tokens_queued, cores_throttled=snap.cores_throttled, cores_emergency=snap.cores_emergency,
        limit_unheld=snap.limit_unheld)


def next_telemetry(snap: ThermalSnapshot, timing: WindowTiming, t1_ns: int, freq_ghz: list[float]) -> Telemetry:
    """What TACS sees before the next window: raw core temperatures, hottest DRAM layer per vault, utilisation and
    ``freq_ghz``, the clocks the next window runs at (the DVFS governor's after this one: the frontier's, which the
    physicalizer is given too)."""
    banks = [max(v) for v in snap.temps_bank_c] if snap.temps_bank_c else list(snap.temps_core_c)
    return Telemetry(temps_core=snap.temps_core_c, temps_bank=banks, util_core=timing.util_core,
                     noc_load=_mean(timing.noc_link_util), ts_ns=t1_ns, freq_ghz=freq_ghz)


@dataclass
class Frontier:
    """Everything the window at the frontier needs, as JSON-ready values, saved whole with each epoch's commit (the
    services keep nothing of a run between calls: any replica serves any epoch)."""

    thermal: Json | None  # `ThermalState` (None: the run's start state)
    physical: Json  # `PhysicalState`
    replicas: Json  # `ReplicaState`: the placement service's (TACS answers it), carried into the physical state
    smoothed: Any  # TACS's smoothed temperatures after the last decision (opaque here)
    telemetry: Telemetry  # after the last window: what TACS sees before the next
    freq_ghz: list[float]  # the clocks of the next window
    bw_eff_factor: float  # the refresh factor of the next window
    files: dict[str, int] = field(default_factory=dict)  # the run's appended files' sizes (`RunFiles.sizes`)

    def to_json(self) -> Json:
        return {"thermal": self.thermal, "physical": self.physical, "replicas": self.replicas,
                "smoothed": self.smoothed, "telemetry": self.telemetry.model_dump(mode="json"),
                "freq_ghz": self.freq_ghz, "bw_eff_factor": self.bw_eff_factor, "files": self.files}

    @classmethod
    def from_json(cls, d: Json) -> Frontier:
        return cls(thermal=d.get("thermal"), physical=dict(d["physical"]), replicas=dict(d["replicas"]),
                   smoothed=d.get("smoothed"), telemetry=Telemetry.model_validate(d["telemetry"]),
                   freq_ghz=list(d["freq_ghz"]), bw_eff_factor=float(d["bw_eff_factor"]),
                   files=dict(d.get("files") or {}))


@dataclass(frozen=True)
class EpochWindow:
    """One window an epoch kept: its logical window, the overlays applied at it, its physical window and snapshot."""

    window: int
    logical: LogicalWindow
    overlays: Json
    physical: PhysicalWindow
    snapshot: ThermalSnapshot


@dataclass(frozen=True)
class Epoch:
    """An epoch's kept windows and the frontier after the last of them; ``event``: what ended it at its last window
    ("dvfs", "refresh", "tacs") or None (it ran its length, or to the end of the run); ``asked``: its length."""

    windows: list[EpochWindow]
    frontier: Frontier
    event: str | None
    asked: int

    @property
    def cut(self) -> bool:
        """An event ended it before the length it was asked for."""
        return len(self.windows) < self.asked


def next_epoch_size(epoch: Epoch, limit: int) -> int:
    """Double the length while no event ends an epoch, up to ``limit``; after an event, the distance to it."""
    if epoch.event is None:
        return min(limit, 2 * epoch.asked)
    return max(1, min(limit, len(epoch.windows)))


@dataclass
class EpochStepper:
    """Advances a run by epochs (see the module docstring): the run's pipeline, trace and registered run data."""

    pipe: Pipeline
    trace: TraceInfo
    run: RunData
    arch: ArchConfig
    workload: WorkloadConfig
    tas: TasParams
    tacs_on: bool
    events: bool  # the physical events themselves (the run's event files), not only their energy
    times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    max_windows: int = MAX_EPOCH_WINDOWS  # lowered when an epoch's requests were past the services' body bounds
    note: Callable[[str], None] = log.info  # where the loop says so (the run's log)

    @property
    def window_ms(self) -> float:
        return self.tas.tacs.window_ms

    def epoch(self, k: int, frontier: Frontier, n: int, *, tag: str = "") -> Epoch:
        """Windows k .. k+n-1 from ``frontier``, up to the first event (see the module docstring). An epoch whose
        requests would be past the services' body bounds (`EpochTooLarge`: many or busy windows) is asked again with
        half the windows, and later epochs keep to that (the results do not depend on the epoch's length); a single
        window past them is a `BadInput`."""
        n = min(n, self.max_windows)
        try:
            return self._epoch(k, frontier, n, tag)
        except EpochTooLarge as exc:
            if n == 1:
                raise BadInput(f"one window's requests are past the services' body bounds ({exc}); raise "
                               "TASMOE_MAX_BODY_MB / TASMOE_MAX_JSON_VALUES or shorten tas.tacs.window_ms",
                               field="tas.tacs.window_ms") from exc
            self.max_windows = n // 2
            self.note(f"{exc}; epochs of at most {self.max_windows} windows from now on")
            return self.epoch(k, frontier, self.max_windows, tag=tag)

    def _epoch(self, k: int, frontier: Frontier, n: int, tag: str) -> Epoch:
        logical = self._timed("workload", self.pipe.logical_windows, self.trace, k, n, workload=self.workload,
                              window_ms=self.window_ms)
        overlays, replicas, smoothed = self._decide(k, frontier, logical[0], tag)
        phys = self._physicalize(k, frontier, logical, overlays, replicas, events=self.events and not tag, tag=tag)
        thermal = self._step(k, frontier, [w.deposit for w in phys.windows], until_event=True, tag=tag)
        kept, event = len(thermal.snapshots), thermal.event  # a thermal event is at the last window stepped
        smooth_after = [smoothed]  # [i]: TACS's smoothed temperatures after its decision for window k + i
        if self.tacs_on and kept > 1:
            steps = [self._tacs_step(next_telemetry(snap, w.timing, lw.t1_ns, list(snap.freq_ghz) or frontier.freq_ghz),
                                     nxt) for snap, w, lw, nxt in zip(thermal.snapshots, phys.windows, logical,
                                                                       logical[1:kept], strict=False)]
            checked = self._timed("tacs", self.pipe.tacs_epoch, run=self.run.tacs, steps=steps, state=replicas,
                                  smoothed=smoothed, bank_bw_gbps=self.tas.taps.capacity.bank_bw_gbps,
                                  window=k + 1, tag=tag)
            smooth_after += checked.smoothed
            if checked.acted is not None:  # the decision for window k + 1 + acted acts: keep the windows before it
                kept, event = checked.acted + 1, "tacs"
        physical_state = phys.state if kept == n else self._physicalize(
            k, frontier, logical[:kept], overlays, replicas, events=False, tag=tag + "cut").state
        thermal_state = thermal.state if kept == len(thermal.snapshots) else self._step(
            k, frontier, [w.deposit for w in phys.windows[:kept]], until_event=False, tag=tag + "cut").state
        assert physical_state is not None and thermal_state is not None
        last, last_lw, last_w = thermal.snapshots[kept - 1], logical[kept - 1], phys.windows[kept - 1]
        freq = list(last.freq_ghz) or frontier.freq_ghz  # the next window's clocks (a snapshot without: kept)
        after = Frontier(thermal=thermal_state, physical=physical_state, replicas=replicas,
                         smoothed=smooth_after[kept - 1] if self.tacs_on else frontier.smoothed,
                         telemetry=next_telemetry(last, last_w.timing, last_lw.t1_ns, freq), freq_ghz=freq,
                         bw_eff_factor=last.refresh.bw_eff_factor, files=frontier.files)
        windows = [EpochWindow(window=k + i, logical=logical[i], overlays=overlays if i == 0 else EMPTY_OVERLAYS,
                               physical=phys.windows[i], snapshot=thermal.snapshots[i]) for i in range(kept)]
        return Epoch(windows=windows, frontier=after, event=event, asked=n)

    def _timed(self, phase: str, fn: Callable[P, R], *args: P.args, **kw: P.kwargs) -> R:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            self.times[phase] += time.perf_counter() - t0

    @staticmethod
    def _tacs_step(telemetry: Telemetry, pending: LogicalWindow) -> Json:
        return {"telemetry": telemetry.model_dump(mode="json"), "pending": pending.data, "now_ns": pending.t0_ns}

    def _decide(self, k: int, frontier: Frontier, first: LogicalWindow, tag: str) -> tuple[Json, Json, Any]:
        """TACS's decision for window k: (overlays, replica state after them, smoothed temperatures); none without
        TACS."""
        if not self.tacs_on:
            return EMPTY_OVERLAYS, frontier.replicas, frontier.smoothed
        decision = self._timed("tacs", self.pipe.tacs_epoch, run=self.run.tacs,
                               steps=[self._tacs_step(frontier.telemetry, first)], state=frontier.replicas,
                               smoothed=frontier.smoothed, bank_bw_gbps=self.tas.taps.capacity.bank_bw_gbps,
                               window=k, tag=tag)
        overlays = decision.overlays.model_dump(mode="json") if decision.acted is not None else EMPTY_OVERLAYS
        replicas = decision.state.model_dump(mode="json") if decision.state is not None else frontier.replicas
        return overlays, replicas, decision.smoothed[0]

    def _physicalize(self, k: int, frontier: Frontier, logical: Sequence[LogicalWindow], overlays: Json, replicas: Json,
                     *, events: bool, tag: str) -> PhysicalEpoch:
        return self._timed("physicalize", self.pipe.physicalize_epoch, window=k, logical=logical,
                           run=self.run.lowering, overlays=overlays, state=frontier.physical, replicas=replicas,
                           freq_ghz=frontier.freq_ghz, window_ms=self.window_ms, bw_eff_factor=frontier.bw_eff_factor,
                           n_layers=self.trace.n_layers, return_state=True, events=events, tag=tag,
                           serving=self.workload.serving, retrace=self._retrace)

    def _retrace(self) -> None:
        """The run's trace created again (deterministic: the same id) for a workload service that forgot it."""
        self.pipe.create_trace(self.workload, self.window_ms)

    def _step(self, k: int, frontier: Frontier, deposits: list[Json], *, until_event: bool, tag: str) -> ThermalEpoch:
        return self._timed("thermal", self.pipe.thermal_epoch, run=self.run.thermal, window=k,
                           window_ms=self.window_ms, state=frontier.thermal, deposits=deposits,
                           bw_eff_factor=frontier.bw_eff_factor, until_event=until_event, tag=tag)


def warm_up(stepper: EpochStepper, frontier: Frontier, *, n_warm: int, limit: int) -> Frontier:
    """``thermal.init: steady`` with a warm-up: windows 0 .. n_warm-1 from ``frontier`` in epochs (nothing committed, no
    files), then ``frontier`` with the thermal state replaced by the steady state of the warm-up's mean power map (the
    thermal service accumulates the energy in the state it returns). Everything else of ``frontier`` (queues, replicas,
    telemetry, DVFS) is the fresh run's: the results start at window 0 of the run proper, on a warm chip."""
    cur, k, n = frontier, 0, 1
    while k < n_warm:
        ep = stepper.epoch(k, cur, min(n, n_warm - k), tag="warm")
        cur, k = ep.frontier, k + len(ep.windows)
        n = next_epoch_size(ep, limit)
    if cur.thermal is None:
        return frontier
    return replace(frontier, thermal=stepper.pipe.warm_start(run=stepper.run.thermal, state=cur.thermal))
