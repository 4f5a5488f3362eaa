"""Where scenario runs execute.

- `EmbeddedRunner` (embedded mode): an in-process ``ThreadPoolExecutor`` (not Celery's eager mode) running
  `run_scenario` for each run, plus a reaper thread that re-submits runs whose lease expired (a previous process died)
  and runs still queued. The database stays the source of truth; the pool only holds work in flight.
- `CeleryDispatcher` (cluster mode): sends one ``run_scenario`` task per run to the Celery workers
  (see `services.orchestrator.celery_app`).

Both expose ``submit_experiment(exp_id)``; the API calls it after the experiment's transaction committed, so no job
ever sees uncommitted state.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator.finalize import finalize_experiment
from services.orchestrator.models import TERMINAL, Experiment, RunStatus, ScenarioRun, utcnow
from services.orchestrator.window_loop import RunOutcome, WindowHook, default_owner, run_scenario
from shared.client import ServiceClients

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    def submit_experiment(self, exp_id: str) -> None: ...

    def shutdown(self) -> None: ...


def run_ids_of(*, sessions: sessionmaker[Session], exp_id: str) -> list[str]:
    with sessions() as s:
        return [r.id for r in repo.runs_of(session=s, exp_id=exp_id) if r.status not in TERMINAL]


def after_run(*, sessions: sessionmaker[Session], clients: ServiceClients, run_id: str) -> None:
    """When the run's experiment has no unfinished run left, write its summary files (idempotent)."""
    with sessions() as s:
        run = repo.get_run(session=s, run_id=run_id)
        if run is None:
            return
        exp_id = run.experiment_id
        runs = repo.runs_of(session=s, exp_id=exp_id)
        if not all(r.status in TERMINAL for r in runs):
            return
    finalize_experiment(sessions=sessions, clients=clients, exp_id=exp_id)


class EmbeddedRunner:
    """Runs scenario runs on a thread pool in this process; `wait(exp_id)` blocks until an experiment finishes."""

    def __init__(self, *, sessions: sessionmaker[Session], clients: ServiceClients, max_workers: int = 4,
                 lease_s: float = 60.0, reap_interval_s: float | None = None,
                 on_window: WindowHook | None = None) -> None:
        self.sessions = sessions
        self.clients = clients
        self.lease_s = lease_s
        self.on_window = on_window
        self.owner_prefix = default_owner()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tasmoe-run")
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[RunOutcome]] = {}
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        if reap_interval_s is not None:
            self._reaper = threading.Thread(target=self._reap_loop, args=(reap_interval_s,), daemon=True,
                                            name="tasmoe-reaper")
            self._reaper.start()

    # -- submission
    def submit_run(self, run_id: str) -> Future[RunOutcome]:
        with self._lock:
            fut = self._inflight.get(run_id)
            if fut is not None and not fut.done():
                return fut
            fut = self._pool.submit(self._execute, run_id)
            self._inflight[run_id] = fut
            return fut

    def submit_experiment(self, exp_id: str) -> None:
        for run_id in run_ids_of(sessions=self.sessions, exp_id=exp_id):
            self.submit_run(run_id)

    def _execute(self, run_id: str) -> RunOutcome:
        out = run_scenario(run_id, self.clients, self.sessions, owner=f"{self.owner_prefix}:{run_id}",
                           lease_s=self.lease_s, on_window=self.on_window, stop=self._stop)
        if out.status in {"succeeded", "failed", "cancelled", "done", "exhausted"}:
            try:
                after_run(sessions=self.sessions, clients=self.clients, run_id=run_id)
            except Exception:
                log.exception("finalizing after run %s failed", run_id)
        return out

    # -- recovery
    def recover(self, *, queued_grace_s: float = 0.0) -> list[str]:
        """Submit every run whose lease expired (its worker died), and every queued run created more than
        ``queued_grace_s`` ago (a grace period, so that a periodic pass does not race another process's own pool
        for the runs it just created)."""
        cutoff = utcnow() - timedelta(seconds=queued_grace_s)
        with self.sessions() as s:
            stale = repo.stale_runs(session=s)
            young = set(s.scalars(sa.select(ScenarioRun.id).join(Experiment).where(
                ScenarioRun.status == RunStatus.queued, Experiment.created_at > cutoff))) if queued_grace_s else set()
        picked = [r for r in stale if r not in young]
        for run_id in picked:
            self.submit_run(run_id)
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
        return {r: f.result(timeout=timeout) for r, f in futs.items()}

    def wait(self, exp_id: str, timeout: float | None = None) -> dict[str, RunOutcome]:
        with self.sessions() as s:
            ids = [r.id for r in repo.runs_of(session=s, exp_id=exp_id)]
        return self.wait_runs(ids, timeout)

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking work; runs in flight give their lease back at the next window boundary."""
        self._stop.set()
        self._pool.shutdown(wait=wait, cancel_futures=True)
