"""The window loop of one scenario run (ARCHITECTURE §4), in control epochs, resumable from its commit frontier.

    trace  = workload.POST /traces                 model/H = thermal.POST /models, GET /influence (TAPS, TACS)
    plc    = placement (default | TAPS, MILP as a polled job), saved once as a job row (reused on resume)
    run    = arch, plc (+ TACS params, H) registered once with lowering, thermal (POST /models) and placement
             (POST /registry/...): the epochs name them by content hash (re-registered on a 404 unknown_<kind>)
    [warm-up: the same epochs over the first windows, nothing kept; thermal POST /warm_start]
    from next_window, epoch after epoch (`services.orchestrator.epochs`):
        windows k .. e of one epoch: a call each to workload, placement (TACS), lowering and thermal
        append the windows' files (trace files, the window store), then commit the epoch: the frontier moves to
        e + 1 with its whole state in ONE fenced update
    metrics.POST /reduce(every committed window, read back from the window store) -> <out>/<scenario>/<workload>.csv

The frontier state (everything window e + 1 needs: the thermal field and DVFS levels, the physical state, the
replica state, TACS's smoothed temperatures and telemetry, the next window's clocks and refresh factor, the files'
sizes) is saved with each commit, so a resumed run continues exactly where the committed one stopped and produces
the same bytes.
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
from pathlib import Path
from typing import Protocol, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator import window_store
from services.orchestrator.epochs import (
    Epoch,
    EpochStepper,
    Frontier,
    ambient_telemetry,
    build_window_metrics,
    initial_freqs,
    initial_replicas,
    next_epoch_size,
    warm_up,
)
from services.orchestrator.models import TERMINAL, RunStatus
from services.orchestrator.pipeline_clients import Pipeline, RunData, TraceInfo
from services.orchestrator.run_files import RunFiles, WindowRows, power_json_path, result_csv_path
from services.orchestrator.run_log import RunLog, run_log
from services.orchestrator.schemas import ExperimentSpec
from services.orchestrator.settings import orchestrator_settings
from shared.chip import vault_bw_raw_gbps
from shared.client import ServiceClients
from shared.contracts.events import PhysicalState
from shared.contracts.placement import Placement
from shared.contracts.thermal import ThermalState
from shared.db import database_outage, outage_text
from shared.errors import ServiceUnavailable, TasmoeError
from shared.logging import bind_run_id

log = logging.getLogger(__name__)

TAPS_SCENARIOS = frozenset({"taps", "tas"})
TACS_SCENARIOS = frozenset({"tacs", "tas"})
REDUCE_CHUNK = 1000  # most windows per metrics request (~17 kB of JSON each on the default chip: ~17 MB); fewer
# when a window's JSON is larger (a bigger mesh): within half the services' body bounds (`windows_per_request`)
EVENTS_EPOCH_WINDOWS = 64  # the longest epoch of a run that keeps its physical events (~85 kB of them a window)

# Called after each committed window with (run_id, k, n_windows); returning False stops the loop at once, as if the
# worker had died (the lease stays held until it expires). Tests use it to simulate crashes; dashboards for progress.
WindowHook = Callable[[str, int, int], bool | None]


class StopFlag(Protocol):
    """Set to stop the loop at the next epoch boundary (`threading.Event`, or `multiprocessing.Event` when the run
    executes in a pool's worker process)."""

    def is_set(self) -> bool: ...


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    # succeeded | failed | cancelled | lost_lease | stopped | leased | done | exhausted | missing | unavailable (the
    # run-state database stayed away past the outage budget: nothing recorded, the lease expires)
    status: str
    windows_run: int = 0
    error: str | None = None


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
    # a serving trace's tokens are formed at run time: placement plans on the routing law's expected load
    load = pipe.expert_load(trace, workload=spec.workload, window_ms=spec.tas.tacs.window_ms,
                            expected=spec.workload.serving is not None)
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


def freeze_heap() -> None:
    """Move every object alive now (modules, schemas, caches, the trace and placement of this run) out of the
    garbage collector's generations (`gc.freeze`), after one collection so no garbage is pinned.

    The window loop allocates many short-lived containers per window (parsed bodies), which triggers full (gen 2)
    collections; each one walked the ~200 000 long-lived objects of the process (about 120 ms). Frozen objects are
    still freed by reference counting; only cycles among them wait for `gc.unfreeze`. No effect on any result."""
    gc.collect()
    gc.freeze()


T = TypeVar("T")


class DatabaseAway(Exception):
    """The run-state database stayed unreachable for the whole outage budget."""


def through_database_outage(fn: Callable[[], T], *, budget_s: float, what: str) -> T:
    """``fn()``, called again with capped backoff while it meets the database away (`shared.db.database_outage`),
    up to ``budget_s``; then `DatabaseAway`. Any other error is raised at once. For the steps before a run holds its
    lease (taking the delivery, the claim), where there is no waiting mark to show yet."""
    t0, tries = time.monotonic(), 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not database_outage(exc):
                raise
            waited = time.monotonic() - t0
            if waited >= budget_s:
                raise DatabaseAway(f"{what}: the run-state database stayed unreachable for {waited:.0f} s "
                                   f"({outage_text(exc)})") from exc
            if tries == 0:
                log.warning("%s: the run-state database is unreachable (%s); waiting for it", what, outage_text(exc))
            tries += 1
            time.sleep(min(OUTAGE_POLL_MAX_S, 0.25 * 2 ** (tries - 1), max(0.05, budget_s - waited)))


OUTAGE_POLL_MAX_S = 5.0  # the longest pause between two looks at a database that is away


def _outage_reason(exc: BaseException) -> str | None:
    """What the run waits for when ``exc`` is an outage (a compute service or the run-state database away), else
    None (a failure: the run fails with its reason)."""
    if isinstance(exc, ServiceUnavailable):
        return str(exc)
    if database_outage(exc):
        return f"the run-state database is unreachable ({outage_text(exc)})"
    return None


def run_scenario(run_id: str, clients: ServiceClients, sessions: sessionmaker[Session], *,
                 owner: str | None = None, lease_s: float = 60.0, on_window: WindowHook | None = None,
                 stop: StopFlag | None = None) -> RunOutcome:
    """Claim ``run_id`` and run (or resume) its window loop to the end. Never raises for run failures: they are
    recorded on the run (status failed + error) and returned.

    An outage is waited out, not failed: a compute service that cannot be reached (`ServiceUnavailable`) or the
    run-state database away (a commit, a heartbeat or any other query meeting `shared.db.database_outage`). The run
    keeps its claim (no attempt is spent), shows ``waiting`` with the reason while the database lets it say so,
    renews its lease whenever it reaches the database, and resumes at its frontier (the windows appended but not
    committed are cut back, so the files are those of an undisturbed run). When another worker took the run
    meanwhile it stops cleanly (``lost_lease``); past ``TASMOE_OUTAGE_BUDGET_S`` it fails (or, the database still
    away, gives up with ``unavailable``: nothing can be recorded, the lease expires and a reaper hands the run on)."""
    owner = owner or default_owner()
    osettings = orchestrator_settings(clients.settings)
    budget = osettings.outage_budget_s
    try:
        claim = through_database_outage(lambda: repo.claim_run(sessions=sessions, run_id=run_id, owner=owner,
                                                               lease_s=lease_s), budget_s=budget, what=run_id)
        if not claim.ok:
            return RunOutcome(run_id, claim.outcome)
        spec, scenario, out_dir = through_database_outage(lambda: load_spec(sessions=sessions, run_id=run_id),
                                                          budget_s=budget, what=run_id)
    except DatabaseAway as exc:
        return RunOutcome(run_id, "unavailable", error=str(exc))
    spec = spec.for_scenario(scenario)  # the unthrottled reference: baseline on the chip without DVFS trips and limit
    files = RunFiles(out_dir, scenario, traces=spec.traces, events=spec.events, logical=scenario == spec.scenarios[0])
    outage: _Outage | None = None
    with bind_run_id(run_id), run_log(files.run_dir / "run.log", run_id=run_id) as rlog, \
            _heartbeat(sessions, run_id, owner, lease_s):
        while True:
            try:
                if outage is not None:  # resume where the last commit left the run
                    claim = replace(claim, next_window=_next_window(sessions, run_id))
                return _run(run_id=run_id, claim=claim, owner=owner, lease_s=lease_s, spec=spec, scenario=scenario,
                            out_dir=out_dir, files=files, clients=clients, sessions=sessions, on_window=on_window,
                            stop=stop, rlog=rlog)
            except Exception as exc:
                reason = _outage_reason(exc)
                if reason is None:  # any other failure ends the run cleanly, with its reason
                    return _fail(run_id, sessions, owner, f"{type(exc).__name__}: {exc}", exc)
                frontier = _frontier_if_reachable(sessions, run_id)  # None: the database is away
                if outage is None or (frontier is not None and frontier > outage.at_window):
                    # progress since the last one (or the first): a new outage
                    outage = _Outage(time.monotonic(), frontier if frontier is not None else claim.next_window)
                waited = time.monotonic() - outage.t0
                if waited >= budget:
                    return _fail(run_id, sessions, owner, f"{reason} (waited {waited:.0f} s for it, the outage "
                                 f"budget TASMOE_OUTAGE_BUDGET_S is {budget:g} s; POST .../retry resumes the run at "
                                 "its frontier)")
                outage.tries += 1
                pause = min(osettings.outage_backoff_max_s, 0.5 * 2 ** (outage.tries - 1), budget - waited)
                at = f"window {frontier}" if frontier is not None else "its last committed window"
                rlog.info(f"waiting: {reason}; trying again in {pause:.1f} s (from {at}, outage {waited:.0f} s of "
                          f"{budget:g} s)")
                end = _wait_out(run_id, sessions, owner, lease_s, reason, pause, stop,
                                give_up_at=outage.t0 + budget)
                if end is not None:
                    if end.status != "unavailable":
                        rlog.info(f"stopping while waiting: {end.status}")
                    return end


@contextlib.contextmanager
def _heartbeat(sessions: sessionmaker[Session], run_id: str, owner: str, lease_s: float) -> Iterator[None]:
    """Renew the run's lease every ``lease_s / 3`` while this process works on it, not only at window commits: a
    phase longer than the lease (a placement MILP, a warm start, one slow window on a loaded machine) would otherwise
    let the reaper hand a live run to a second worker. A dead process stops beating, so its lease still expires;
    a lease given back or lost is never revived (`repo.extend_lease`); a late beat that finds the lease expired
    but still ours keeps beating (the next window commit renews the lease). A beat that meets the database away is
    skipped (logged once per outage): the window loop meets the outage too and waits it out."""
    done = threading.Event()

    def beat() -> None:
        away = False
        with bind_run_id(run_id):
            while not done.wait(max(lease_s / 3, 0.05)):
                try:
                    if repo.extend_lease(sessions=sessions, run_id=run_id, owner=owner, lease_s=lease_s) == "lost":
                        return  # another owner (the window loop's fenced commit stops the run), or it ended
                    if away:
                        log.info("lease heartbeat: the database answers again")
                    away = False
                except Exception as exc:
                    if not away:
                        log.warning("lease heartbeat failed (%s); the run waits the outage out",
                                    outage_text(exc) if database_outage(exc) else repr(exc))
                    away = True

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
    at_window: int  # the run's frontier then (the attempt's first window when the database could not tell)
    tries: int = 0


def _next_window(sessions: sessionmaker[Session], run_id: str) -> int:
    with sessions() as s:
        run = repo.get_run(session=s, run_id=run_id)
        return run.next_window if run is not None else 0


def _frontier_if_reachable(sessions: sessionmaker[Session], run_id: str) -> int | None:
    """The run's frontier, or None while the database is away."""
    try:
        return _next_window(sessions, run_id)
    except Exception as exc:
        if database_outage(exc):
            return None
        raise


def _fail(run_id: str, sessions: sessionmaker[Session], owner: str, msg: str,
          exc: BaseException | None = None) -> RunOutcome:
    """Record the run as failed with ``msg``. The log gets the message; the traceback only for an unexpected
    ``exc``: a user error (a `TasmoeError` of status < 500, e.g. a service's 422 on the run's configs) and an
    outage past its budget (``exc`` None) are the run's outcome, said in full by the message, not a fault of the
    code."""
    expected = exc is None or (isinstance(exc, TasmoeError) and exc.status < 500)
    log.error("run %s failed: %s", run_id, msg, exc_info=None if expected else exc)
    try:
        repo.finish_run(sessions=sessions, run_id=run_id, owner=owner, status=RunStatus.failed, error=msg[:4000])
    except Exception as exc:
        if not database_outage(exc):
            raise
        # nothing can be recorded: the lease expires and a reaper hands the run on, as after a dead worker
        log.error("run %s: its failure could not be recorded, the database is away (%s)", run_id, outage_text(exc))
        return RunOutcome(run_id, "unavailable", error=msg)
    return RunOutcome(run_id, "failed", error=msg)


def _not_ours(run_id: str, sessions: sessionmaker[Session]) -> RunOutcome:
    """Why a fenced write found the run no longer ours: cancelled, finished, or claimed by another worker."""
    with sessions() as s:
        run = repo.get_run(session=s, run_id=run_id)
    if run is not None and run.status == RunStatus.cancelled:
        return RunOutcome(run_id, "cancelled")
    if run is None or run.status in TERMINAL:
        return RunOutcome(run_id, "done")
    return RunOutcome(run_id, "lost_lease")


def _wait_out(run_id: str, sessions: sessionmaker[Session], owner: str, lease_s: float, reason: str,
              pause_s: float, stop: StopFlag | None, *, give_up_at: float) -> RunOutcome | None:
    """Wait ``pause_s`` before the run tries again, showing ``waiting`` (its reason) and renewing its lease at every
    tick. The mark is not cleared when it tries again (the next committed epoch clears it), so a client sees
    ``waiting`` throughout an outage, not a flip to ``running`` at every try. While the database is away nothing can
    be written: the wait goes on past ``pause_s`` until a tick reaches the database again (the run then holds its
    lease again, or learns that it lost it), up to ``give_up_at`` (``unavailable``). An outcome instead of None when
    the run was cancelled, finished or taken by another worker, or the worker stops meanwhile."""
    end = time.monotonic() + pause_s
    tick = max(0.05, min(1.0, lease_s / 4))
    while True:
        try:
            ours = repo.set_waiting(sessions=sessions, run_id=run_id, owner=owner, reason=reason, lease_s=lease_s)
            if not ours:
                return _not_ours(run_id, sessions)
            reached = True
        except Exception as exc:
            if not database_outage(exc):
                raise
            reached = False
        if stop is not None and stop.is_set():
            with contextlib.suppress(Exception):  # the database may be away: the lease then simply expires
                repo.release_lease(sessions=sessions, run_id=run_id, owner=owner)
            return RunOutcome(run_id, "stopped")
        now = time.monotonic()
        if reached and now >= end:
            return None
        if not reached and now >= give_up_at:
            return RunOutcome(run_id, "unavailable", error=f"{reason}: past the outage budget")
        time.sleep(min(tick, end - now) if now < end else min(tick * 2, OUTAGE_POLL_MAX_S))


@dataclass
class _Run:
    """One attempt at a run: what its loop needs besides the frontier."""

    run_id: str
    owner: str
    lease_s: float
    spec: ExperimentSpec
    scenario: str
    out_dir: Path
    files: RunFiles
    sessions: sessionmaker[Session]
    rlog: RunLog
    stepper: EpochStepper
    n: int  # the run's windows
    epoch_limit: int


def _setup(*, run_id: str, spec: ExperimentSpec, scenario: str, clients: ServiceClients,
           sessions: sessionmaker[Session], owner: str, rlog: RunLog) -> tuple[Pipeline, TraceInfo, int, Placement,
                                                                              RunData]:
    """The run's trace, its window count, its placement and its run data registered with the services."""
    arch, wl, tas = spec.arch, spec.workload, spec.tas
    pipe = Pipeline(clients, run_key=run_id)
    trace = pipe.create_trace(wl, tas.tacs.window_ms)
    n = trace.n_windows if spec.windows is None else min(trace.n_windows, spec.windows)
    repo.set_n_windows(sessions=sessions, run_id=run_id, owner=owner, n_windows=n)
    needs_h = scenario in TAPS_SCENARIOS or scenario in TACS_SCENARIOS
    model_hash = pipe.thermal_model(arch) if needs_h else None
    H = pipe.influence(model_hash, arch) if model_hash is not None else None
    plc = _placement(pipe=pipe, spec=spec, scenario=scenario, trace=trace, model_hash=model_hash, H=H,
                     sessions=sessions, run_id=run_id)
    for note in plc.meta.notes:  # e.g. the default mapping over bank capacity: the run goes on, the log says so
        rlog.info(f"placement ({plc.meta.method}): {note}")
    tacs_on = scenario in TACS_SCENARIOS
    # registered once per run (attempt) with the services that use them; the epochs name them by hash
    rundata = pipe.register_run(RunData.of(arch=arch, placement=plc, tacs=tas.tacs if tacs_on else None,
                                           H=H if tacs_on else None))
    return pipe, trace, n, plc, rundata


def _starting_frontier(r: _Run, plc: Placement, k0: int) -> Frontier:
    """The frontier the attempt starts from: the run's start (files created afresh, the warm-up run), or the one
    saved at ``k0`` (the files cut back to their sizes then)."""
    saved = repo.load_frontier(sessions=r.sessions, run_id=r.run_id, next_window=k0)
    if saved is not None:
        frontier = Frontier.from_json(saved)
        r.files.truncate_to(frontier.files)
        r.files.write_placement(plc)
        r.files.write_replica_state(frontier.replicas)
        r.rlog.info(f"resuming at window {k0} of {r.n}")
        return frontier
    r.files.start_fresh()
    r.files.write_placement(plc)
    reps = initial_replicas(plc)
    arch = r.spec.arch
    start = r.spec.thermal_init.model_dump(mode="json") if r.spec.thermal_init is not None else None
    frontier = Frontier(thermal=start, physical=PhysicalState(replicas=reps).model_dump(mode="json"),
                        replicas=reps.model_dump(mode="json"), smoothed=None, telemetry=ambient_telemetry(arch),
                        freq_ghz=initial_freqs(arch), bw_eff_factor=1.0, files=r.files.sizes())
    r.files.write_replica_state(reps)
    n_warm = min(arch.thermal.warmup_windows(r.spec.tas.tacs.window_ms), r.n)
    if n_warm:
        t0 = time.perf_counter()
        frontier = warm_up(r.stepper, frontier, n_warm=n_warm, limit=r.epoch_limit)
        r.rlog.info(f"warm start: the steady state of the mean power of a {n_warm}-window warm-up pass "
                    f"({time.perf_counter() - t0:.1f} s)")
    return frontier


def _commit(r: _Run, ep: Epoch, first: int, compute_s: float) -> bool:
    """Append the epoch's windows to the run's files, then commit it (False: the lease is lost or the run was
    cancelled; nothing of the epoch counts)."""
    arch = r.spec.arch
    rows = []
    for w in ep.windows:
        wm = build_window_metrics(window=w.window, t0_ns=w.logical.t0_ns, t1_ns=w.logical.t1_ns, snap=w.snapshot,
                                  timing=w.physical.timing, arch=arch)
        rows.append(WindowRows(logical_compute=w.logical.compute, logical_memory=w.logical.memory,
                               overlays=w.overlays, compute=w.physical.compute, memory=w.physical.memory,
                               metrics_line=wm.model_dump_json().encode() + b"\n"))
    r.files.append_windows(rows)
    ep.frontier.files = r.files.sizes()
    return repo.commit_epoch(sessions=r.sessions, run_id=r.run_id, owner=r.owner, first=first,
                             next_window=first + len(ep.windows), frontier=ep.frontier.to_json(), lease_s=r.lease_s,
                             compute_s=compute_s)


def _stopped_by_db(r: _Run, k: int) -> RunOutcome:
    with r.sessions() as s:
        run = repo.get_run(session=s, run_id=r.run_id)
        cancelled = run is not None and run.status == RunStatus.cancelled
    r.rlog.info(f"window {k}: {'cancelled' if cancelled else 'lease lost'}, stopping")
    return RunOutcome(r.run_id, "cancelled" if cancelled else "lost_lease")


def _advance(r: _Run, frontier: Frontier, k0: int, on_window: WindowHook | None, stop: StopFlag | None
             ) -> tuple[Frontier, RunOutcome | None, int, int]:
    """Epochs from window ``k0`` to the run's end: (the last frontier, an outcome when the loop stopped early, the
    windows committed, the epochs)."""
    k, done, epochs, size = k0, 0, 0, min(r.epoch_limit, 8)
    logged = k0
    while k < r.n:
        if stop is not None and stop.is_set():
            repo.release_lease(sessions=r.sessions, run_id=r.run_id, owner=r.owner)
            return frontier, RunOutcome(r.run_id, "stopped", done), done, epochs
        t0 = time.perf_counter()
        ep = r.stepper.epoch(k, frontier, min(size, r.n - k))
        if not _commit(r, ep, k, time.perf_counter() - t0):
            return frontier, replace(_stopped_by_db(r, k), windows_run=done), done, epochs
        if ep.frontier.replicas != frontier.replicas:  # the file holds the newest state; rewrite on change
            r.files.write_replica_state(ep.frontier.replicas)
        frontier, epochs = ep.frontier, epochs + 1
        last = ep.windows[-1]
        for w in ep.windows:
            done += 1
            if on_window is not None and on_window(r.run_id, w.window, r.n) is False:
                return frontier, RunOutcome(r.run_id, "stopped", done), done, epochs
        k += len(ep.windows)
        if k - logged >= 250 or k == r.n:
            logged = k
            peak = max(last.snapshot.peak_c.values(), default=float("nan"))
            r.rlog.info(f"window {k} of {r.n}: T_peak {peak:.2f} C ({epochs} epochs"
                        f"{f', the last cut by {ep.event}' if ep.event else ''})")
        size = next_epoch_size(ep, r.epoch_limit)
    return frontier, None, done, epochs


def _finish(r: _Run, frontier: Frontier, pipe: Pipeline, t_start: float) -> RunOutcome | None:
    """The last thermal field, the run's result row (reduced from its window store) and its files; None when the
    lease was lost meanwhile."""
    if frontier.thermal is not None:  # the last field, ready to start another run from (arch.thermal.init: <name>.json)
        final = ThermalState.model_validate({**frontier.thermal, "window": -1, "t_ns": 0, "warm_energy_b64": None,
                                             "warm_s": 0.0}).model_dump(mode="json")
        (r.files.run_dir / "thermal_final.json").write_text(json.dumps(final) + "\n", encoding="utf-8")
    # reduce over the committed windows, read back from the window store (identical whichever worker ran them),
    # chunk by chunk: the metrics service folds each chunk into a partial, and the last chunk finishes the row
    spec, wl = r.spec, r.spec.workload
    thot = spec.tas.tacs.thresholds.Thot
    partial = None
    last: list[dict[str, object]] = []
    first = window_store.read(r.files.run_dir, 0, 1)
    per_request = pipe.windows_per_request(first[0], REDUCE_CHUNK) if first else REDUCE_CHUNK
    for i, chunk in enumerate(window_store.iter_chunks(r.files.run_dir, per_request)):
        if last:
            partial = pipe.reduce_fold(thot_c=thot, windows=last, partial=partial, chunk=i - 1)
        last = chunk
    red = pipe.reduce(scenario=r.scenario, workload=wl.label, thot_c=thot,
                      bw_raw_gbps=vault_bw_raw_gbps(spec.arch), windows=last,
                      partial=partial, slo=wl.serving.slo if wl.serving is not None else None)
    out_csv = result_csv_path(r.out_dir, r.scenario, wl.label)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_csv.with_suffix(".csv.tmp")
    tmp.write_text(red.csv, encoding="utf-8")
    os.replace(tmp, out_csv)
    if red.power is not None:
        pj = power_json_path(r.out_dir, r.scenario, wl.label)
        tmp = pj.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(red.power, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, pj)
    r.rlog.info(f"wrote {out_csv} ({red.row.get('windows')} windows, {time.perf_counter() - t_start:.2f} s this "
                "attempt)")
    if not repo.finish_run(sessions=r.sessions, run_id=r.run_id, owner=r.owner, status=RunStatus.succeeded,
                           result_row=red.row):
        return None
    return RunOutcome(r.run_id, "succeeded")


def _run(*, run_id: str, claim: repo.Claim, owner: str, lease_s: float, spec: ExperimentSpec, scenario: str,
         out_dir: Path, files: RunFiles, clients: ServiceClients, sessions: sessionmaker[Session],
         on_window: WindowHook | None, stop: StopFlag | None, rlog: RunLog) -> RunOutcome:
    t_start = time.perf_counter()
    rlog.header(spec=spec, scenario=scenario, attempt=claim.attempts, next_window=claim.next_window)
    pipe, trace, n, plc, rundata = _setup(run_id=run_id, spec=spec, scenario=scenario, clients=clients,
                                          sessions=sessions, owner=owner, rlog=rlog)
    limit = orchestrator_settings(clients.settings).epoch_windows
    stepper = EpochStepper(pipe=pipe, trace=trace, run=rundata, arch=spec.arch, workload=spec.workload, tas=spec.tas,
                           tacs_on=scenario in TACS_SCENARIOS, events=files.events, note=rlog.info)
    r = _Run(run_id=run_id, owner=owner, lease_s=lease_s, spec=spec, scenario=scenario, out_dir=out_dir,
             files=files, sessions=sessions, rlog=rlog, stepper=stepper, n=n,
             epoch_limit=min(limit, EVENTS_EPOCH_WINDOWS) if files.events else limit)
    frontier = _starting_frontier(r, plc, claim.next_window)
    freeze_heap()  # the setup's long-lived objects: keep full collections in the loop cheap
    stepper.times = dict.fromkeys(stepper.times, 0.0)  # the run's own windows, not the warm-up's
    t_loop = time.perf_counter()
    frontier, early, done, epochs = _advance(r, frontier, claim.next_window, on_window, stop)
    if done:
        wall = time.perf_counter() - t_loop
        rlog.info(f"{done} windows in {epochs} epochs, {wall:.1f} s; wall time per window by call (ms): "
                  + ", ".join(f"{name} {1e3 * v / done:.2f}" for name, v in stepper.times.items())
                  + f", orchestrator {1e3 * (wall - sum(stepper.times.values())) / done:.2f}")
    if early is not None:
        return early
    outcome = _finish(r, frontier, pipe, t_start)
    return replace(outcome, windows_run=done) if outcome is not None else RunOutcome(run_id, "lost_lease", done)
