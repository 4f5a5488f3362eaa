"""The window loop of one scenario run (ARCHITECTURE §4), resumable from its commit frontier.

    trace  = workload.POST /traces                 model/H = thermal.POST /models, GET /influence (TAPS, TACS)
    plc    = placement (default | TAPS, MILP as a polled job), saved once as a job row (reused on resume)
    run    = arch, plc (+ TACS params, H) registered once with lowering, thermal (POST /models) and placement
             (POST /registry/...): the windows name them by content hash (re-registered on a 404 unknown_<kind>)
    for k in next_window .. n-1:
        L  = workload.GET /traces/{id}/windows?start=k&count=16   (read once per 16 windows walked in order)
        ov, #reps = placement.POST /tacs/step(telemetry of k-1, #plc, #reps, pending=L)   (tacs, tas)
        D, #phys = lowering.POST /physicalize(k, L, #plc, ov, #phys [+ reps TACS answered], freq, BW_eff of k-1)
        #state, snap = thermal.POST /step(k, #model, #state, D)       (D: the events' energy deposit)
        append the window's files, then commit window k (snapshot + metrics + frontier) in ONE fenced transaction
    (#x: x named by the hash the service that keeps it answered; whole every CHECKPOINT_EVERY windows, see Frontier)
    metrics.POST /reduce(all committed windows, read back from the database) -> <out>/<scenario>/<workload>.csv

The frontier state (everything window k+1 needs: the names of the thermal field + DVFS levels and of the physical
state, the replica state, TACS smoothed temperatures, telemetry, next-window frequencies and BW_eff, file sizes; the
whole states at a checkpoint) is saved with window k, so a resumed run continues exactly where the committed one
stopped and produces the same bytes (replaying the windows since its checkpoint when a service lost the states).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator.models import RunStatus
from services.orchestrator.pipeline_clients import (
    EMPTY_OVERLAYS,
    PhysicalResult,
    Pipeline,
    RunData,
    StateMissing,
    ThermalResult,
    TraceInfo,
)
from services.orchestrator.run_files import RunFiles, power_json_path, result_csv_path
from services.orchestrator.run_log import RunLog, run_log
from services.orchestrator.schemas import ExperimentSpec
from services.orchestrator.settings import orchestrator_settings
from shared import json_codec
from shared.client import ServiceClients
from shared.configs import ArchConfig
from shared.content import field_order_json
from shared.contracts.events import PhysicalState, WindowTiming
from shared.contracts.metrics import WindowMetrics
from shared.contracts.placement import Placement, ReplicaEntry, ReplicaState, Telemetry
from shared.contracts.thermal import ThermalSnapshot, ThermalState
from shared.dvfs import top_freqs
from shared.errors import ServiceUnavailable
from shared.logging import bind_run_id

log = logging.getLogger(__name__)

TAPS_SCENARIOS = frozenset({"taps", "tas"})
REDUCE_CHUNK = 1000  # windows per metrics request (~15 kB of JSON each: ~15 MB, under TASMOE_MAX_BODY_MB)
TACS_SCENARIOS = frozenset({"tacs", "tas"})

# Called after each committed window with (run_id, k, n_windows); returning False stops the loop at once, as if the
# worker had died (the lease stays held until it expires). Tests use it to simulate crashes; dashboards for progress.
WindowHook = Callable[[str, int, int], bool | None]


class StopFlag(Protocol):
    """Set to stop the loop at the next window boundary (`threading.Event`, or `multiprocessing.Event` when the run
    executes in a pool's worker process)."""

    def is_set(self) -> bool: ...


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    status: str  # succeeded | failed | cancelled | lost_lease | stopped | leased | done | exhausted | missing
    windows_run: int = 0
    error: str | None = None


# ------------------------------------------------------------------------------------------------- pure helpers


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
    bw_eff = arch.mesh.n_cores * arch.dram.vault_bw_gbps * max(snap.refresh.bw_eff_factor, 1e-9)
    return WindowMetrics(
        window=window, t_start_ms=t0_ns / 1e6, dt_ms=max(t1_ns - t0_ns, 1) / 1e6,
        temps_core_c=snap.temps_core_c, temps_bank_c=snap.temps_bank_c,
        T_peak_logic=t_peak_logic, T_peak_dram=t_peak_dram, T_mean_logic=t_mean_logic, T_mean_dram=t_mean_dram,
        power_w=max(snap.power_w.total, 0.0), freq_ghz=snap.freq_ghz, refresh_mhz=snap.refresh.refresh_mhz,
        bytes_moved=timing.bytes_moved, bw_eff_gbps=bw_eff, noc_link_util=timing.noc_link_util,
        tokens_completed=timing.tokens_completed, latencies_ms=timing.latencies_ms,
        queue_delay_ms=timing.queue_delay_ms, migrations=timing.migrations,
        oldest_inflight_ms=timing.oldest_inflight_ms, power=snap.power_w, power_layer_w=snap.power_layer_w,
        power_core_w=snap.power_core_w)


def next_telemetry(snap: ThermalSnapshot, timing: WindowTiming, t1_ns: int, freq_ghz: list[float]) -> Telemetry:
    """What TACS sees before the next window: raw core temperatures, hottest DRAM layer per vault, utilisation and
    ``freq_ghz``, the clocks the next window runs at (the DVFS governor's after this one: the frontier's, which the
    physicalizer is given too)."""
    banks = [max(v) for v in snap.temps_bank_c] if snap.temps_bank_c else list(snap.temps_core_c)
    return Telemetry(temps_core=snap.temps_core_c, temps_bank=banks, util_core=timing.util_core,
                     noc_load=_mean(timing.noc_link_util), ts_ns=t1_ns, freq_ghz=freq_ghz)


# ----------------------------------------------------------------------------------------------------- frontier


@dataclass
class Frontier:
    """Everything window k+1 needs, as JSON-ready values.

    The thermal and physical states stay with the services that produce them (issue 21): a window names the
    previous one's by the hash the service answered (``thermal_ref``, ``physical_ref``). They come back whole only
    at a checkpoint (every `CHECKPOINT_EVERY` windows, the first and the last): that window's frontier row keeps
    them (``ckpt`` names it), and a service that lost a state (a restart, an eviction, another replica) gets it
    rebuilt by replaying the windows after the checkpoint (`_rebuild`; the replay must reproduce the names).
    ``thermal`` / ``physical`` are the whole states when this frontier has them (a checkpoint, the run's start)."""

    thermal: dict[str, Any] | None  # `ThermalState` (None: the run's start state, or named by thermal_ref)
    physical: dict[str, Any] | None  # `PhysicalState` (None: named by physical_ref)
    smoothed: Any
    telemetry: Telemetry
    freq_ghz: list[float]
    bw_eff_factor: float | list[float]
    files: dict[str, int]
    replicas: dict[str, Any] = dataclass_field(default_factory=dict)  # `ReplicaState` (= the physical state's)
    thermal_ref: str | None = None
    physical_ref: str | None = None
    replicas_ref: str | None = None  # the placement service's name of ``replicas`` (None: send them whole)
    ckpt: int = -1  # the window whose frontier row holds whole states (-1: the run's start)
    # the replicas the checkpoint's row holds (None: not known here); a frontier whose replicas are still those
    # saves the checkpoint's window in their place (~25 kB a window of the default experiment), `to_json`
    ckpt_replicas: dict[str, Any] | None = dataclass_field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The JSON saved at the commit. ``replicas``: the replica state, or (a frontier without whole states whose
        replicas are its checkpoint's) the checkpoint's window, whose row holds them (`replicas_at`; `from_json`
        takes that row). A number, not a null and another key: a worker of a version before it fails on it loudly
        (``dict(int)``) instead of resuming with no replicas."""
        by_ckpt = (self.physical is None and self.ckpt >= 0 and self.ckpt_replicas is not None
                   and self.replicas == self.ckpt_replicas)
        return {"thermal": self.thermal, "physical": self.physical, "smoothed": self.smoothed,
                "telemetry": self.telemetry.model_dump(mode="json"), "freq_ghz": self.freq_ghz,
                "bw_eff_factor": self.bw_eff_factor, "files": self.files,
                "replicas": self.ckpt if by_ckpt else self.replicas, "thermal_ref": self.thermal_ref,
                "physical_ref": self.physical_ref, "replicas_ref": self.replicas_ref, "ckpt": self.ckpt}

    @classmethod
    def from_json(cls, d: dict[str, Any], *, window: int, ckpt_row: dict[str, Any] | None = None) -> Frontier:
        """The frontier saved with ``window`` (one saved before checkpoints holds whole states: its own).
        ``ckpt_row``: the frontier saved with its checkpoint's window (``ckpt``), where ``d`` names its replicas by
        that window (`replicas_at`; a ValueError without it)."""
        ckpt = int(d.get("ckpt", window))
        physical = d.get("physical")
        replicas = d.get("replicas")
        at_ckpt: dict[str, Any] | None = None
        at = replicas_at(d)
        if at is not None:
            if ckpt_row is None or at != ckpt:
                raise ValueError(f"the frontier of window {window} keeps its replicas in the checkpoint's row "
                                 f"(window {at}): give that row")
            replicas = at_ckpt = _replicas_of(ckpt_row)
        elif replicas is None:
            replicas = dict((physical or {}).get("replicas") or {})
        if ckpt == window:  # a checkpoint's own row: its replicas are the checkpoint's
            at_ckpt = replicas
        return cls(thermal=d.get("thermal"), physical=dict(physical) if physical is not None else None,
                   smoothed=d.get("smoothed"), telemetry=Telemetry.model_validate(d["telemetry"]),
                   freq_ghz=list(d["freq_ghz"]), bw_eff_factor=d["bw_eff_factor"], files=dict(d.get("files") or {}),
                   replicas=dict(replicas), thermal_ref=d.get("thermal_ref"), physical_ref=d.get("physical_ref"),
                   replicas_ref=d.get("replicas_ref"), ckpt=ckpt,
                   ckpt_replicas=dict(at_ckpt) if at_ckpt is not None else None)


def replicas_at(row: dict[str, Any]) -> int | None:
    """The window whose frontier row holds this row's replicas (`Frontier.to_json`), None where it holds them."""
    replicas = row.get("replicas")
    return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None


def _replicas_of(row: dict[str, Any]) -> dict[str, Any]:
    """The replicas a frontier row holds whole (its own, or its physical state's)."""
    replicas = row.get("replicas")
    if replicas is None:
        replicas = (row.get("physical") or {}).get("replicas")
    if replicas is None:
        raise ValueError("the checkpoint's frontier row holds no replicas")
    return dict(replicas)


# ------------------------------------------------------------------------------------------------- the run


def load_spec(*, sessions: sessionmaker[Session], run_id: str) -> tuple[ExperimentSpec, str, Path]:
    with sessions() as s:
        run = repo.get_run(session=s, run_id=run_id)
        if run is None:
            raise KeyError(run_id)
        exp = run.experiment
        return ExperimentSpec.model_validate(exp.configs), run.scenario, Path(exp.out_dir)


def _placement(*, pipe: Pipeline, spec: ExperimentSpec, scenario: str, trace: TraceInfo, model_hash: str | None,
               H: list[list[float]] | None, sessions: sessionmaker[Session], run_id: str) -> Placement:
    """The run's placement: computed once and kept as a job row, so a resumed run reuses the very same one."""
    job_id = f"plc-{run_id}"
    with sessions() as s:
        job = repo.get_job(session=s, job_id=job_id)
        if job is not None and job.result is not None:
            return Placement.model_validate(job.result)
    if spec.placement is not None:  # a hand-made mapping (e.g. a hot spot) replaces default and TAPS
        return spec.placement
    load = pipe.expert_load(trace, workload=spec.workload, window_ms=spec.tas.tacs.window_ms)
    method = spec.tas.taps.method if scenario in TAPS_SCENARIOS else "default"
    plc = pipe.placement(arch=spec.arch, workload=spec.workload, tas=spec.tas, method=method, trace=trace,
                         expert_load=load, H=H if scenario in TAPS_SCENARIOS else None)
    with sessions.begin() as s:
        job = repo.get_job(session=s, job_id=job_id)
        if job is None:
            job = repo.add_job(session=s, job_id=job_id, kind="placement", payload={"run_id": run_id})
        job.result = plc.model_dump(mode="json")
        job.status = RunStatus.succeeded
    return plc


CHECKPOINT_EVERY = 64  # windows between whole states at the frontier (a lost state replays at most this many)


@dataclass(frozen=True)
class _Step:
    """What one window's calls returned (``advance`` in `_run`)."""

    L: Any  # pipeline_clients.LogicalWindow
    overlays: dict[str, Any]
    smoothed: Any
    P: PhysicalResult
    th: ThermalResult
    replicas: dict[str, Any]  # the replica state after the window
    replicas_ref: str | None  # its name at the placement service (its only owner: TACS answers it)
    times: tuple[float, float, float, float, float]

    @property
    def snap(self) -> ThermalSnapshot:
        return self.th.snapshot

    def frontier(self, before: Frontier, *, ckpt: int, files: dict[str, int]) -> Frontier:
        """The frontier after this window (``before``: the one it started from)."""
        freq = list(self.snap.freq_ghz) or before.freq_ghz  # the next window's clocks (a snapshot without: kept)
        return Frontier(thermal=self.th.state, physical=self.P.state, smoothed=self.smoothed,
                        telemetry=next_telemetry(self.snap, self.P.timing, self.L.t1_ns, freq),
                        freq_ghz=freq,
                        bw_eff_factor=self.snap.refresh.bw_eff_factor, files=files, replicas=self.replicas,
                        thermal_ref=self.th.state_ref, physical_ref=self.P.state_ref,
                        replicas_ref=self.replicas_ref, ckpt=ckpt,
                        ckpt_replicas=before.ckpt_replicas if ckpt == before.ckpt else self.replicas)


Advance = Callable[..., _Step]  # (k, frontier, tag="", *, whole=False, keep=False) -> _Step


def _warm_up(advance: Advance, fr: Frontier, *, n_warm: int, pipe: Pipeline, run: RunData, rlog: RunLog
             ) -> Frontier:
    """``thermal.init: steady`` with a warm-up: run windows 0 .. n_warm-1 from ``fr`` (nothing committed, no files),
    carrying frontier state as the run does, then return ``fr`` with the thermal state replaced by the steady state
    of the warm-up's mean power map (the thermal service accumulates the energy in the state it returns).
    Everything else of ``fr`` (queues, replicas, telemetry, DVFS) is the fresh run's: the results start at
    window 0 of the run proper, on a warm chip. The states come back whole every `CHECKPOINT_EVERY` windows and at
    the end (kept here, not committed): a service that loses one sends the pass back to the last of them."""
    ck, ck_k = fr, -1  # the last frontier with whole states, and its window
    cur, k, misses, resumed = fr, 0, 0, False
    while k < n_warm:
        keep = k % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1 or k == n_warm - 1
        try:
            nxt = advance(k, cur, "warm", whole=resumed, keep=keep).frontier(cur, ckpt=-1, files=cur.files)
        except StateMissing as exc:
            misses += 1
            if misses > 3:
                raise RuntimeError(f"warm-up: the services lost the run's states {misses} times ({exc}); "
                                   "TASMOE_STATE_CACHE_SIZE must exceed the runs a service replica serves at once"
                                   ) from exc
            rlog.info(f"warm-up window {k}: {exc}; going on from window {ck_k + 1} with the states kept then")
            cur, k, resumed = ck, ck_k + 1, True
            continue
        cur, resumed = nxt, False
        if keep:
            ck, ck_k = cur, k
        k += 1
    if cur.thermal is None:
        return fr
    warm = pipe.warm_start(run=run.thermal, state=cur.thermal, state_ref=None)
    rlog.info(f"warm start: the steady state of the mean power of a {n_warm}-window warm-up pass")
    return replace(fr, thermal=warm, thermal_ref=None)


def _rebuild(advance: Advance, fr: Frontier, ckpt: Frontier, *, k: int, rlog: RunLog) -> Frontier:
    """Put the states ``fr`` names back into the services that lost them: replay windows ``fr.ckpt`` + 1 .. k - 1
    from the checkpoint's whole states (nothing committed, no files; every replayed window sends and gets its
    states whole, so a replay never depends on a service's cache). Returns the frontier to go on from: ``fr`` with
    the replay's names. The replay should name the very states the run committed (content hashes: the simulation is
    deterministic); where it does not (services on another machine whose numerical kernels differ in the last bits)
    the run log says so and the run goes on from the replayed states."""
    rlog.info(f"window {k}: a service lost the run's state; replaying windows {fr.ckpt + 1}..{k - 1} from the "
              f"checkpoint after window {fr.ckpt}")
    cur = ckpt
    for j in range(fr.ckpt + 1, k):
        cur = advance(j, cur, f"replay{k}:", whole=True, keep=True).frontier(cur, ckpt=fr.ckpt, files=fr.files)
    if k > fr.ckpt + 1 and (cur.thermal_ref, cur.physical_ref) != (fr.thermal_ref, fr.physical_ref):
        rlog.info(f"warning: replaying windows {fr.ckpt + 1}..{k - 1} did not reproduce the committed states "
                  f"(thermal {cur.thermal_ref} vs {fr.thermal_ref}, physical {cur.physical_ref} vs "
                  f"{fr.physical_ref}); going on from the replayed states: the windows from {k} on may differ in "
                  "the last bits from an undisturbed run")
    return replace(fr, thermal=cur.thermal, physical=cur.physical, thermal_ref=cur.thermal_ref,
                   physical_ref=cur.physical_ref) if k > fr.ckpt + 1 else fr


def freeze_heap() -> None:
    """Move every object alive now (modules, schemas, caches, the trace and placement of this run) out of the
    garbage collector's generations (`gc.freeze`), after one collection so no garbage is pinned.

    The window loop allocates many short-lived containers per window (parsed bodies), which triggers full (gen 2)
    collections; each one walked the ~200 000 long-lived objects of the process (about 120 ms). Frozen objects are
    still freed by reference counting; only cycles among them wait for `gc.unfreeze`. No effect on any result."""
    gc.collect()
    gc.freeze()


def run_scenario(run_id: str, clients: ServiceClients, sessions: sessionmaker[Session], *,
                 owner: str | None = None, lease_s: float = 60.0, on_window: WindowHook | None = None,
                 stop: StopFlag | None = None) -> RunOutcome:
    """Claim ``run_id`` and run (or resume) its window loop to the end. Never raises for run failures: they are
    recorded on the run (status failed + error) and returned."""
    owner = owner or default_owner()
    claim = repo.claim_run(sessions=sessions, run_id=run_id, owner=owner, lease_s=lease_s)
    if not claim.ok:
        return RunOutcome(run_id, claim.outcome)
    spec, scenario, out_dir = load_spec(sessions=sessions, run_id=run_id)
    files = RunFiles(out_dir, scenario, traces=spec.traces, events=spec.events, logical=scenario == spec.scenarios[0])
    osettings = orchestrator_settings(clients.settings)
    outage: _Outage | None = None
    with bind_run_id(run_id), run_log(files.run_dir / "run.log", run_id=run_id) as rlog, \
            _heartbeat(sessions, run_id, owner, lease_s):
        while True:
            try:
                return _run(run_id=run_id, claim=claim, owner=owner, lease_s=lease_s, spec=spec, scenario=scenario,
                            out_dir=out_dir, files=files, clients=clients, sessions=sessions, on_window=on_window,
                            stop=stop, rlog=rlog)
            except ServiceUnavailable as exc:  # an outage: wait it out, then resume at the frontier
                frontier = _next_window(sessions, run_id)
                if outage is None or frontier > outage.at_window:  # progress since the last one: a new outage
                    outage = _Outage(time.monotonic(), frontier)
                waited = time.monotonic() - outage.t0
                if waited >= osettings.outage_budget_s:
                    return _fail(run_id, sessions, owner, f"{exc} (waited {waited:.0f} s for it, the outage budget "
                                 f"TASMOE_OUTAGE_BUDGET_S is {osettings.outage_budget_s:g} s; POST "
                                 ".../retry resumes the run at its frontier)")
                outage.tries += 1
                pause = min(osettings.outage_backoff_max_s, 0.5 * 2 ** (outage.tries - 1),
                            osettings.outage_budget_s - waited)
                rlog.info(f"waiting: {exc}; trying again in {pause:.1f} s (window {frontier}, outage "
                          f"{waited:.0f} s of {osettings.outage_budget_s:g} s)")
                end = _wait_out(run_id, sessions, owner, lease_s, str(exc), pause, stop)
                if end is not None:
                    return end
                claim = replace(claim, next_window=_next_window(sessions, run_id))
            except Exception as exc:  # any other failure ends the run cleanly, with its reason
                return _fail(run_id, sessions, owner, f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _heartbeat(sessions: sessionmaker[Session], run_id: str, owner: str, lease_s: float) -> Iterator[None]:
    """Renew the run's lease every ``lease_s / 3`` while this process works on it, not only at window commits: a
    phase longer than the lease (a placement MILP, a warm start, one slow window on a loaded machine) would otherwise
    let the reaper hand a live run to a second worker. A dead process stops beating, so its lease still expires;
    a lease given back or lost is never revived (`repo.extend_lease`); a late beat that finds the lease expired
    but still ours keeps beating (the next window commit renews the lease)."""
    done = threading.Event()

    def beat() -> None:
        with bind_run_id(run_id):
            while not done.wait(max(lease_s / 3, 0.05)):
                try:
                    if repo.extend_lease(sessions=sessions, run_id=run_id, owner=owner, lease_s=lease_s) == "lost":
                        return  # another owner (the window loop's fenced commit stops the run), or it ended
                except Exception:  # the database is away: the window loop meets that and waits it out
                    log.warning("lease heartbeat failed", exc_info=True)

    t = threading.Thread(target=beat, name=f"lease-{run_id}", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(timeout=5.0)  # a beat stuck on the database must not hold the run's end (a daemon thread)


@dataclass
class _Outage:
    t0: float  # time.monotonic() when it began
    at_window: int  # the run's frontier then
    tries: int = 0


def _next_window(sessions: sessionmaker[Session], run_id: str) -> int:
    with sessions() as s:
        run = repo.get_run(session=s, run_id=run_id)
        return run.next_window if run is not None else 0


def _fail(run_id: str, sessions: sessionmaker[Session], owner: str, msg: str) -> RunOutcome:
    log.exception("run %s failed: %s", run_id, msg)
    repo.finish_run(sessions=sessions, run_id=run_id, owner=owner, status=RunStatus.failed, error=msg[:4000])
    return RunOutcome(run_id, "failed", error=msg)


def _wait_out(run_id: str, sessions: sessionmaker[Session], owner: str, lease_s: float, reason: str,
              pause_s: float, stop: StopFlag | None) -> RunOutcome | None:
    """The run shows ``waiting`` (its reason) for ``pause_s``, its lease renewed; then it tries again (the waiting
    mark cleared). An outcome instead when it was cancelled (or lost its lease) or the worker stops meanwhile."""
    end = time.monotonic() + pause_s
    tick = max(0.05, min(1.0, lease_s / 4))
    while True:
        if not repo.set_waiting(sessions=sessions, run_id=run_id, owner=owner, reason=reason, lease_s=lease_s):
            with sessions() as s:
                run = repo.get_run(session=s, run_id=run_id)
                cancelled = run is not None and run.status == RunStatus.cancelled
            return RunOutcome(run_id, "cancelled" if cancelled else "lost_lease")
        if stop is not None and stop.is_set():
            repo.release_lease(sessions=sessions, run_id=run_id, owner=owner)
            return RunOutcome(run_id, "stopped")
        left = end - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(tick, left))
    repo.set_waiting(sessions=sessions, run_id=run_id, owner=owner, reason=None, lease_s=lease_s)
    return None


def _run(*, run_id: str, claim: repo.Claim, owner: str, lease_s: float, spec: ExperimentSpec, scenario: str,
         out_dir: Path, files: RunFiles, clients: ServiceClients, sessions: sessionmaker[Session],
         on_window: WindowHook | None, stop: StopFlag | None, rlog: RunLog) -> RunOutcome:
    t_start = time.perf_counter()
    arch, wl, tas = spec.arch, spec.workload, spec.tas
    window_ms = tas.tacs.window_ms
    pipe = Pipeline(clients, run_key=run_id)
    rlog.header(spec=spec, scenario=scenario, attempt=claim.attempts, next_window=claim.next_window)

    trace = pipe.create_trace(wl, window_ms)
    n = trace.n_windows if spec.windows is None else min(trace.n_windows, spec.windows)
    repo.set_n_windows(sessions=sessions, run_id=run_id, owner=owner, n_windows=n)
    needs_h = scenario in TAPS_SCENARIOS or scenario in TACS_SCENARIOS
    model_hash = pipe.thermal_model(arch) if needs_h else None
    H = pipe.influence(model_hash, arch) if model_hash is not None else None
    plc = _placement(pipe=pipe, spec=spec, scenario=scenario, trace=trace, model_hash=model_hash, H=H,
                     sessions=sessions, run_id=run_id)
    for note in plc.meta.notes:  # e.g. the default mapping over bank capacity: the run goes on, the log says so
        rlog.info(f"placement ({plc.meta.method}): {note}")

    k0 = claim.next_window
    saved = repo.load_frontier(sessions=sessions, run_id=run_id, next_window=k0)
    if saved is None:
        files.start_fresh()
        files.write_placement(plc)
        reps = initial_replicas(plc)
        start = spec.thermal_init.model_dump(mode="json") if spec.thermal_init is not None else None
        fr = Frontier(thermal=start, physical=PhysicalState(replicas=reps).model_dump(mode="json"), smoothed=None,
                      telemetry=ambient_telemetry(arch), freq_ghz=initial_freqs(arch), bw_eff_factor=1.0,
                      files=files.sizes(), replicas=reps.model_dump(mode="json"))
        files.write_replica_state(reps)
    else:
        at = replicas_at(saved)
        ckpt_row = repo.load_frontier_at(sessions=sessions, run_id=run_id, window=at) if at is not None else None
        fr = Frontier.from_json(saved, window=k0 - 1, ckpt_row=ckpt_row)
        files.truncate_to(fr.files)
        files.write_placement(plc)
        files.write_replica_state(fr.replicas)  # it may lag the frontier by one window
        rlog.info(f"resuming at window {k0} of {n} (attempt {claim.attempts})")

    tacs_on = scenario in TACS_SCENARIOS
    # registered once per run (attempt) with the services that use them; the windows name them by hash
    rundata = pipe.register_run(RunData.of(arch=arch, placement=plc, tacs=tas.tacs if tacs_on else None,
                                       H=H if tacs_on else None))
    freeze_heap()  # the setup's long-lived objects: keep full collections in the loop cheap
    n_warm = arch.thermal.warmup_windows(window_ms)
    done = 0
    phase = dict.fromkeys(("workload", "tacs", "physicalize", "thermal", "orchestrator"), 0.0)
    def advance(k: int, fr: Frontier, tag: str = "", *, whole: bool = False, keep: bool | None = None) -> _Step:
        """Window k from frontier ``fr``: logical window, TACS (tacs, tas), physicalize, thermal step. The
        previous states by name, or whole where ``fr`` has them and ``whole`` is set (or it has no name); the new
        states come back whole when ``keep`` (default: at a checkpoint of the run proper)."""
        t0 = time.perf_counter()
        L = pipe.logical_window(trace, k, workload=wl, window_ms=window_ms)
        t1 = time.perf_counter()
        replicas, replicas_ref = fr.replicas, fr.replicas_ref
        if tacs_on:
            tr = pipe.tacs_step(telemetry=fr.telemetry, run=rundata.tacs, state=fr.replicas,
                                state_ref=fr.replicas_ref, pending=L.raw, smoothed=fr.smoothed, now_ns=L.t0_ns,
                                bank_bw_gbps=tas.taps.capacity.bank_bw_gbps, window=k, tag=tag)
            overlays, smoothed, replicas_ref = tr.overlays, tr.smoothed, tr.state_ref
            if tr.state is not None:
                replicas = tr.state
        else:
            overlays, smoothed = EMPTY_OVERLAYS, fr.smoothed
        t2 = time.perf_counter()
        if keep is None:
            keep = not tag and (k % CHECKPOINT_EVERY == 0 or k == n - 1)  # whole states back: a checkpoint
        phys_whole = fr.physical is not None and (whole or fr.physical_ref is None)
        P = pipe.physicalize(window=k, logical=L.raw, run=rundata.lowering, overlays=overlays,
                             state={**fr.physical, "replicas": replicas} if phys_whole and fr.physical else None,
                             state_ref=None if phys_whole else fr.physical_ref,
                             replicas=None if phys_whole or replicas == fr.replicas else replicas,
                             freq_ghz=fr.freq_ghz, window_ms=window_ms, bw_eff_factor=fr.bw_eff_factor,
                             n_layers=trace.n_layers, return_state=keep, events=files.events and not tag, tag=tag)
        t3 = time.perf_counter()
        th_whole = fr.thermal is not None and (whole or fr.thermal_ref is None)
        th = pipe.thermal_step(run=rundata.thermal, window=k, window_ms=window_ms,
                               state=fr.thermal if th_whole else None, state_ref=None if th_whole else fr.thermal_ref,
                               deposit=P.deposit, return_state=keep, tag=tag)
        t4 = time.perf_counter()
        return _Step(L=L, overlays=overlays, smoothed=smoothed, P=P, th=th, replicas=dict(replicas),
                     replicas_ref=replicas_ref, times=(t0, t1, t2, t3, t4))

    def advance_or_rebuild(k: int, fr: Frontier) -> _Step:
        """`advance`; when a service lost a state ``fr`` names: rebuild the states from the last checkpoint
        (`_rebuild`: none to replay when window k - 1 is the checkpoint) and go on from them whole."""
        try:
            return advance(k, fr)
        except StateMissing as exc:
            rlog.info(f"window {k}: {exc}")
        if fr.ckpt == k - 1 and (fr.physical is not None or fr.physical_ref is None) \
                and (fr.thermal is not None or fr.thermal_ref is None):
            rebuilt = fr  # the checkpoint itself: its states are whole
        else:
            ckpt = Frontier.from_json(repo.load_frontier_at(sessions=sessions, run_id=run_id, window=fr.ckpt),
                                      window=fr.ckpt)
            rebuilt = _rebuild(advance, fr, ckpt, k=k, rlog=rlog)
        return advance(k, rebuilt, whole=True)

    if saved is None and n_warm:
        fr = _warm_up(advance, fr, n_warm=min(n_warm, n), pipe=pipe, run=rundata, rlog=rlog)
    for k in range(k0, n):
        if stop is not None and stop.is_set():
            repo.release_lease(sessions=sessions, run_id=run_id, owner=owner)
            return RunOutcome(run_id, "stopped", done)
        st = advance_or_rebuild(k, fr)
        L, overlays, P, snap = st.L, st.overlays, st.P, st.snap
        t0, t1, t2, t3, t4 = st.times
        wm = build_window_metrics(window=k, t0_ns=L.t0_ns, t1_ns=L.t1_ns, snap=snap, timing=P.timing, arch=arch)
        files.append_window(logical_compute=L.compute, logical_memory=L.memory, overlays=overlays,
                            compute=P.compute or {}, memory=P.memory or {})
        ckpt = k if P.state is not None and st.th.state is not None else fr.ckpt
        new = st.frontier(fr, ckpt=ckpt, files=files.sizes())
        drop = [k - 1] if k - 1 != ckpt else []
        if ckpt == k and fr.ckpt >= 0 and fr.ckpt != k - 1:
            drop.append(fr.ckpt)  # the previous checkpoint: no longer needed
        ok = repo.commit_window(sessions=sessions, run_id=run_id, owner=owner, window=k,
                                snapshot=json_codec.encoded(field_order_json(snap)),
                                metrics=json_codec.encoded(field_order_json(wm)),
                                frontier=new.to_json(), lease_s=lease_s, compute_s=time.perf_counter() - t0,
                                drop_frontiers=drop)
        if not ok:
            with sessions() as s:
                run = repo.get_run(session=s, run_id=run_id)
                cancelled = run is not None and run.status == RunStatus.cancelled
            rlog.info(f"window {k}: {'cancelled' if cancelled else 'lease lost'}, stopping")
            return RunOutcome(run_id, "cancelled" if cancelled else "lost_lease", done)
        if new.replicas != fr.replicas:  # the file holds the newest state; rewrite on change
            files.write_replica_state(new.replicas)
        fr = new
        done += 1
        t5 = time.perf_counter()
        for name, dt in (("workload", t1 - t0), ("tacs", t2 - t1), ("physicalize", t3 - t2), ("thermal", t4 - t3),
                         ("orchestrator", t5 - t4)):
            phase[name] += dt
        if k % 25 == 0 or k == n - 1:
            rlog.info(f"window {k + 1} of {n}: T_peak_logic {wm.T_peak_logic:.2f} C, "
                      f"T_peak_dram {wm.T_peak_dram:.2f} C, tokens {wm.tokens_completed}")
        if on_window is not None and on_window(run_id, k, n) is False:
            return RunOutcome(run_id, "stopped", done)

    if fr.thermal is not None:  # the last field, ready to start another run from (arch.thermal.init: <name>.json)
        final = ThermalState.model_validate({**fr.thermal, "window": -1, "t_ns": 0, "warm_energy_b64": None,
                                             "warm_s": 0.0}).model_dump(mode="json")
        (files.run_dir / "thermal_final.json").write_text(json.dumps(final) + "\n", encoding="utf-8")
    if done:
        rlog.info(f"{done} windows; wall time per window by call (ms): "
                  + ", ".join(f"{name} {1e3 * v / done:.1f}" for name, v in phase.items()))
    # reduce over the committed windows, read back from the database (identical whichever worker ran them), chunk by
    # chunk: the metrics service folds each chunk into a partial, and the last chunk finishes the row
    thot = tas.tacs.thresholds.Thot
    partial: dict[str, Any] | None = None
    last: list[dict[str, Any]] = []
    for i, chunk in enumerate(repo.iter_window_metrics(sessions=sessions, run_id=run_id, chunk=REDUCE_CHUNK)):
        if last:
            partial = pipe.reduce_fold(thot_c=thot, windows=last, partial=partial, chunk=i - 1)
        last = chunk
    wins = last
    red = pipe.reduce(scenario=scenario, workload=wl.label, thot_c=thot,
                      bw_raw_gbps=arch.mesh.n_cores * arch.dram.vault_bw_gbps, windows=wins, partial=partial)
    out_csv = result_csv_path(out_dir, scenario, wl.label)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_csv.with_suffix(".csv.tmp")
    tmp.write_text(red.csv, encoding="utf-8")
    os.replace(tmp, out_csv)
    if red.power is not None:
        pj = power_json_path(out_dir, scenario, wl.label)
        tmp = pj.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(red.power, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, pj)
    rlog.info(f"wrote {out_csv} ({red.row.get('windows')} windows, {time.perf_counter() - t_start:.2f} s this "
              "attempt)")
    if not repo.finish_run(sessions=sessions, run_id=run_id, owner=owner, status=RunStatus.succeeded,
                           result_row=red.row):
        return RunOutcome(run_id, "lost_lease", done)
    return RunOutcome(run_id, "succeeded", done)
