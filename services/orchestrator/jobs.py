"""Where scenario runs execute.

- `EmbeddedRunner` (embedded mode): an in-process ``ThreadPoolExecutor`` (not Celery's eager mode) running
  `run_scenario` for each run, plus a reaper thread that re-submits runs whose lease expired (a previous process died)
  and runs still queued. The database stays the source of truth; the pool only holds work in flight. Runs share one
  interpreter, so under the GIL they share one core.
- `ProcessRunner` (embedded ``make run`` / ``tasmoe run`` / ``run_all``): the same on a ``ProcessPoolExecutor``.
  Every worker process builds its own in-process compute services (ASGI apps behind the shared client, as in the
  thread pool) and its own database engine on the same database; claims, fenced commits and leases are exactly those
  of the thread pool or of two Celery workers sharing a database, so the results are the same bytes.
- `CeleryDispatcher` (cluster mode): sends one ``run_scenario`` task per run to the Celery workers
  (see `services.orchestrator.celery_app`).

All expose ``submit_experiment(exp_id)``; the API calls it after the experiment's transaction committed, so no job
ever sees uncommitted state.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
import sys
import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator.apps import build_apps, enter_lifespans, preload
from services.orchestrator.finalize import finalize_experiment
from services.orchestrator.models import TERMINAL, Experiment, RunStatus, ScenarioRun, utcnow
from services.orchestrator.settings import OrchestratorSettings, orchestrator_settings
from services.orchestrator.window_loop import (
    DatabaseAway,
    RunOutcome,
    StopFlag,
    WindowHook,
    default_owner,
    run_scenario,
    through_database_outage,
)
from shared.client import ServiceClients
from shared.logging import setup_logging

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    def submit_experiment(self, exp_id: str) -> None: ...

    def shutdown(self) -> None: ...


class StopEvent(StopFlag, Protocol):
    """`threading.Event` or `multiprocessing.Event`: the loop's `StopFlag`, which the pool also sets and waits on."""

    def set(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def run_ids_of(*, sessions: sessionmaker[Session], exp_id: str) -> list[str]:
    """The experiment's unfinished runs, the most expensive scenario first (`repository.COST_RANK`)."""
    with sessions() as s:
        runs = [r for r in repo.runs_of(session=s, exp_id=exp_id) if r.status not in TERMINAL]
        runs.sort(key=lambda r: repo.cost_order(r.scenario, r.position))
        return [r.id for r in runs]


FINALIZE_LEASE_S = 600.0  # a finalisation not finished in this time is taken over (its process is presumed dead)


def after_run(*, sessions: sessionmaker[Session], clients: ServiceClients, run_id: str) -> bool:
    """When the run's experiment has no unfinished run left, write its summary files, once: the finalisation is
    claimed (compare-and-set) and recorded when done, so a duplicate task or a second run finishing at the same time
    finds nothing to do. True if this call finalised."""
    with sessions() as s:
        run = repo.get_run(session=s, run_id=run_id)
        if run is None:
            return False
        exp_id = run.experiment_id
    return finalize_once(sessions=sessions, clients=clients, exp_id=exp_id)


def finalize_once(*, sessions: sessionmaker[Session], clients: ServiceClients, exp_id: str) -> bool:
    if not repo.claim_finalize(sessions=sessions, exp_id=exp_id, lease_s=FINALIZE_LEASE_S):
        return False
    try:
        finalize_experiment(sessions=sessions, clients=clients, exp_id=exp_id)
    except Exception as exc:  # a finalisation that cannot succeed must not leave the experiment "running" forever
        log.exception("finalizing %s failed", exp_id)
        repo.finish_finalize(sessions=sessions, exp_id=exp_id,
                             error=f"finalisation failed (summary, comparison or plots may be missing): "
                                   f"{type(exc).__name__}: {exc}"[:4000])
        return True
    repo.finish_finalize(sessions=sessions, exp_id=exp_id)
    return True


def execute_run(run_id: str, *, clients: ServiceClients, sessions: sessionmaker[Session], owner: str, lease_s: float,
                on_window: WindowHook | None = None, stop: StopEvent | None = None) -> RunOutcome:
    """One pool task: run (or resume) the run, then finalize its experiment if it was the last one."""
    try:  # counted once the database answers (a delivery during an outage waits for it, as the run does)
        through_database_outage(lambda: repo.note_delivery(sessions=sessions, run_id=run_id),
                                budget_s=orchestrator_settings(clients.settings).outage_budget_s, what=run_id)
    except DatabaseAway as exc:
        return RunOutcome(run_id, "unavailable", error=str(exc))
    out = run_scenario(run_id, clients, sessions, owner=owner, lease_s=lease_s, on_window=on_window, stop=stop)
    if out.status in {"succeeded", "failed", "cancelled", "done", "exhausted"}:
        try:
            after_run(sessions=sessions, clients=clients, run_id=run_id)
        except Exception:
            log.exception("finalizing after run %s failed", run_id)
    return out


class _PoolRunner:
    """What both embedded pools share: one future per run in flight, recovery of expired leases, waiting."""

    def __init__(self, *, sessions: sessionmaker[Session], lease_s: float, stop: StopEvent, pool: Executor) -> None:
        self.sessions = sessions
        self.lease_s = lease_s
        self._stop = stop
        self._pool = pool
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[RunOutcome]] = {}

    # -- submission
    def submit_run(self, run_id: str) -> Future[RunOutcome]:
        with self._lock:
            fut = self._inflight.get(run_id)
            if fut is not None and not fut.done():
                return fut
            fut = self._submit(run_id)
            self._inflight[run_id] = fut
            return fut

    def _submit(self, run_id: str) -> Future[RunOutcome]:
        raise NotImplementedError

    def submit_finalize(self, exp_id: str) -> None:
        """Finalise an experiment whose finalising process died (on the pool, claimed as after a run)."""
        raise NotImplementedError

    def submit_experiment(self, exp_id: str) -> None:
        """Run the experiment's unfinished runs on the pool; their hand-offs (`models.Handoff`) are done."""
        run_ids = run_ids_of(sessions=self.sessions, exp_id=exp_id)
        for run_id in run_ids:
            self.submit_run(run_id)
        repo.drop_handoffs_of(sessions=self.sessions, run_ids=run_ids)

    # -- recovery
    ignored_runs: frozenset[str] = frozenset()  # runs recover() leaves alone (abandoned by another process)

    def ignore_experiments(self, exp_ids: list[str]) -> None:
        """Never pick up the runs of these experiments (the API server's rule for runs it did not start)."""
        ids = {r for e in exp_ids for r in run_ids_of(sessions=self.sessions, exp_id=e)}
        self.ignored_runs = frozenset(self.ignored_runs | ids)

    def recover(self, *, queued_grace_s: float = 0.0) -> list[str]:
        """Submit every run whose lease expired (its worker died), and every queued run created more than
        ``queued_grace_s`` ago (a grace period, so that a periodic pass does not race another process's own pool
        for the runs it just created)."""
        cutoff = utcnow() - timedelta(seconds=queued_grace_s)
        with self.sessions() as s:
            stale = repo.stale_runs(session=s)
            young = set(s.scalars(sa.select(ScenarioRun.id).join(Experiment).where(
                ScenarioRun.status == RunStatus.queued, Experiment.created_at > cutoff))) if queued_grace_s else set()
            unfinalized = repo.unfinalized_experiments(session=s)
        picked = [r for r in stale if r not in young and r not in self.ignored_runs]
        for run_id in picked:
            self.submit_run(run_id)  # one future per run in flight: a run already in this pool is not resubmitted
        repo.drop_handoffs_of(sessions=self.sessions, run_ids=picked)
        for exp_id in unfinalized:  # the process that was writing its files died
            if not set(run_ids_of(sessions=self.sessions, exp_id=exp_id)) & self.ignored_runs:
                self.submit_finalize(exp_id)
        return picked

    def _reap_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.recover(queued_grace_s=4 * self.lease_s)
            except Exception:
                log.exception("reaper pass failed")

    # -- waiting / shutdown
    def wait_runs(self, run_ids: list[str], timeout: float | None = None) -> dict[str, RunOutcome]:
        with self._lock:
            futs = {r: self._inflight[r] for r in run_ids if r in self._inflight}
        return {r: self._result(r, f, timeout) for r, f in futs.items()}

    def _result(self, run_id: str, fut: Future[RunOutcome], timeout: float | None) -> RunOutcome:
        return fut.result(timeout=timeout)

    def wait(self, exp_id: str, timeout: float | None = None) -> dict[str, RunOutcome]:
        with self.sessions() as s:
            ids = [r.id for r in repo.runs_of(session=s, exp_id=exp_id)]
        return self.wait_runs(ids, timeout)

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking work; runs in flight give their lease back at the next window boundary."""
        self._stop.set()
        self._pool.shutdown(wait=wait, cancel_futures=True)


class EmbeddedRunner(_PoolRunner):
    """Runs scenario runs on a thread pool in this process; `wait(exp_id)` blocks until an experiment finishes."""

    def __init__(self, *, sessions: sessionmaker[Session], clients: ServiceClients, max_workers: int = 4,
                 lease_s: float = 60.0, reap_interval_s: float | None = None,
                 on_window: WindowHook | None = None) -> None:
        super().__init__(sessions=sessions, lease_s=lease_s, stop=threading.Event(),
                         pool=ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tasmoe-run"))
        self.clients = clients
        self.on_window = on_window
        self.owner_prefix = default_owner()
        self._reaper: threading.Thread | None = None
        if reap_interval_s is not None:
            self._reaper = threading.Thread(target=self._reap_loop, args=(reap_interval_s,), daemon=True,
                                            name="tasmoe-reaper")
            self._reaper.start()

    def _submit(self, run_id: str) -> Future[RunOutcome]:
        return self._pool.submit(self._execute, run_id)

    def submit_finalize(self, exp_id: str) -> None:
        self._pool.submit(finalize_once, sessions=self.sessions, clients=self.clients, exp_id=exp_id)

    def _execute(self, run_id: str) -> RunOutcome:
        return execute_run(run_id, clients=self.clients, sessions=self.sessions,
                           owner=f"{self.owner_prefix}:{run_id}", lease_s=self.lease_s, on_window=self.on_window,
                           stop=self._stop)


# ------------------------------------------------------------------------------------------- process pool


@dataclass
class _WorkerProcess:
    sessions: sessionmaker[Session]
    clients: ServiceClients
    stop: StopEvent


_worker: _WorkerProcess | None = None


def _init_worker(database_url: str, schema: str | None, settings: OrchestratorSettings, apps: str | None,
                 stop: StopEvent, log_level: int) -> None:
    """Initializer of a `ProcessRunner` worker: its own engine on the shared database (no migrations: the parent runs
    them) and its own compute services, in-process, with their lifespans entered for the life of the process."""
    global _worker
    from services.orchestrator.db import make_engine, session_factory

    # Ctrl-C reaches the whole process group: the parent answers it by setting ``stop``, and the runs in flight give
    # their lease back at the next window boundary, as on the thread pool (instead of dying mid-window)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(logging.getLevelName(log_level))
    engine = make_engine(database_url, schema=schema)
    built = build_apps(settings, apps)
    enter_lifespans(built)
    _worker = _WorkerProcess(sessions=session_factory(engine), clients=ServiceClients(settings, asgi_apps=built),
                             stop=stop)


def _noop() -> None:
    return None


def _finalize_in_worker(exp_id: str) -> bool:
    w = _worker
    if w is None:  # pragma: no cover - the pool's initializer runs first
        raise RuntimeError("ProcessRunner worker not initialised")
    return finalize_once(sessions=w.sessions, clients=w.clients, exp_id=exp_id)


def _run_in_worker(run_id: str, lease_s: float) -> RunOutcome:
    w = _worker
    if w is None:  # pragma: no cover - the pool's initializer runs first
        raise RuntimeError("ProcessRunner worker not initialised")
    return execute_run(run_id, clients=w.clients, sessions=w.sessions, owner=f"{default_owner()}:{run_id}",
                       lease_s=lease_s, stop=w.stop)


def start_method() -> str:
    """``fork`` on Linux while this process runs a single thread (the workers inherit the imported modules, no
    second interpreter start-up), otherwise ``spawn`` (forking a process that runs threads can deadlock the child)."""
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods() \
            and threading.active_count() == 1:
        return "fork"
    return "spawn"


class ProcessRunner(_PoolRunner):
    """Runs scenario runs on ``max_workers`` worker processes, one run at a time each.

    Each worker process opens its own engine on ``database_url`` and builds the compute services in-process
    (``apps``: ``module:factory`` as for the standalone worker; default the real services). Create it before this
    process connects to the database or starts a thread: the workers start at once, by ``fork`` when that is safe
    (`start_method`). A worker that dies (killed, out of memory) breaks the pool: its run keeps its lease until it
    expires, as a dead Celery worker's does, and the next submission starts a new pool.
    """

    MAX_POOL_RESTARTS = 3

    def __init__(self, *, sessions: sessionmaker[Session], database_url: str, settings: OrchestratorSettings,
                 max_workers: int = 2, lease_s: float = 60.0, schema: str | None = None,
                 apps: str | None = None) -> None:
        self.database_url = database_url
        self.schema = schema
        self.settings = settings
        self.apps = apps
        self.max_workers = max_workers
        self.restarts = 0
        self.start_method = start_method()
        if self.start_method == "fork":
            preload(apps)
        self._stops: list[StopEvent] = []
        pool = self._new_pool()
        super().__init__(sessions=sessions, lease_s=lease_s, stop=self._stops[0], pool=pool)

    def _new_pool(self) -> ProcessPoolExecutor:
        ctx = multiprocessing.get_context(self.start_method)
        stop = ctx.Event()  # one per pool: an event of one start method cannot be handed to another's processes
        self._stops.append(stop)
        pool = ProcessPoolExecutor(max_workers=self.max_workers, mp_context=ctx, initializer=_init_worker,
                                   initargs=(self.database_url, self.schema, self.settings, self.apps, stop,
                                             logging.getLogger().getEffectiveLevel()))
        pool.submit(_noop)  # start the workers now (all of them at once when forking)
        return pool

    def submit_finalize(self, exp_id: str) -> None:
        # a broken pool: the next submission of a run starts a new one, and the next reaper pass finalises then
        with contextlib.suppress(BrokenProcessPool):
            self._pool.submit(_finalize_in_worker, exp_id)

    def _submit(self, run_id: str) -> Future[RunOutcome]:
        try:
            return self._pool.submit(_run_in_worker, run_id, self.lease_s)
        except BrokenProcessPool:
            self.restarts += 1
            if self.restarts > self.MAX_POOL_RESTARTS:
                raise RuntimeError(f"embedded worker processes died {self.restarts} times; giving up") from None
            log.warning("an embedded worker process died; starting a new pool")
            self._pool.shutdown(wait=False, cancel_futures=True)
            self.start_method = start_method()  # this process runs threads by now: usually spawn
            self._pool = self._new_pool()
            return self._pool.submit(_run_in_worker, run_id, self.lease_s)

    def _result(self, run_id: str, fut: Future[RunOutcome], timeout: float | None) -> RunOutcome:
        try:
            return fut.result(timeout=timeout)
        except BrokenProcessPool as exc:
            log.warning("run %s: its worker process died (%s); it resumes once its lease expires", run_id, exc)
            return RunOutcome(run_id, "worker_died", error=str(exc))

    def shutdown(self, wait: bool = True) -> None:
        for stop in self._stops:
            stop.set()
        super().shutdown(wait=wait)
