"""MILP placement jobs.

``run_placement_job(payload) -> dict`` is a plain, JSON-in/JSON-out function: a Celery task can wrap it unchanged
(``celery_app.task(name="placement.milp")(run_placement_job)``). Inside the placement service the jobs run on a
two-thread pool and their state lives in memory (``MilpJobs``, made and shut down by the app's lifespan): an accepted
exception to "services are stateless" for this one long call only: a restarted service forgets its running jobs
(the caller resubmits; the result is deterministic for the same request except where HiGHS hits its time limit).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.placement.service import placement_for
from shared.contracts.placement_api import PlacementRequest
from shared.errors import NotFound, QuotaExceeded, TasmoeError

log = logging.getLogger(__name__)


def run_placement_job(payload: dict[str, Any]) -> dict[str, Any]:
    """Validate ``payload`` as a PlacementRequest, compute the placement, return it as JSON."""
    req = PlacementRequest.model_validate(payload)
    return placement_for(req).model_dump(mode="json")


@dataclass
class _Job:
    owner: str = "local"
    status: str = "queued"
    result: dict[str, Any] | None = None
    error: dict[str, str | None] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    future: Future[None] | None = None


MAX_JOBS = 256  # oldest finished jobs are forgotten beyond this


def job_id_of(req: PlacementRequest, owner: str = "local") -> str:
    """Content hash of the request and its principal: a replayed request (same Idempotency-Key or not) finds the
    same job; another principal's same request is another job (jobs are read by their owner only)."""
    canon = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return "milp-" + hashlib.sha256(f"{owner}\n{canon}".encode()).hexdigest()[:20]


class MilpJobs:
    """The service's MILP jobs: their state and the two-thread pool they run on (at most two MILPs at once; others
    queue). Made by the placement app's lifespan and shut down with it (``create_app``)."""

    def __init__(self, max_workers: int = 2) -> None:
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="milp")

    def close(self) -> None:
        """Stop taking jobs; queued ones are cancelled, running ones finish (HiGHS cannot be interrupted)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def submit(self, req: PlacementRequest, *, owner: str = "local", max_active: int | None = None,
               time_limit_max_s: float | None = None) -> str:
        """Start (or find) the MILP job of this request; returns its id. ``max_active``: the principal's queued and
        running jobs beyond which a new one is refused (429); ``time_limit_max_s`` caps the request's HiGHS time
        limit."""
        job_id = job_id_of(req, owner)
        if time_limit_max_s is not None and req.tas.taps.milp_time_limit_s > time_limit_max_s:
            taps = req.tas.taps.model_copy(update={"milp_time_limit_s": time_limit_max_s})
            req = req.model_copy(update={"tas": req.tas.model_copy(update={"taps": taps})})
        with self._lock:
            old = self._jobs.get(job_id)
            if old is not None and old.status not in ("failed", "cancelled"):
                return job_id
            active = sum(1 for j in self._jobs.values() if j.owner == owner and not j.done.is_set())
            if max_active is not None and active >= max_active:
                raise QuotaExceeded(f"{owner} has {active} MILP placement jobs queued or running; at most "
                                    f"{max_active} (TASMOE_QUOTA_MILP_JOBS): retry when one finished, or cancel one",
                                    field="method", retry_after_s=30)
            job = _Job(owner=owner)
            self._jobs[job_id] = job
            finished = [k for k, j in self._jobs.items() if j.done.is_set()]
            for k in finished[: max(0, len(self._jobs) - MAX_JOBS)]:
                del self._jobs[k]
        payload = req.model_dump(mode="json")

        def _run() -> None:
            if job.status == "cancelled":
                return
            job.status = "running"
            try:
                result = run_placement_job(payload)
                if job.status != "cancelled":  # cancelled while HiGHS ran: the answer is dropped
                    job.result, job.status = result, "done"
            except TasmoeError as exc:
                job.error = {"code": exc.code, "message": exc.message, "field": exc.field}
                job.status = "failed"
            except (ValueError, np.linalg.LinAlgError) as exc:
                job.error = {"code": "failed", "message": str(exc), "field": None}
                job.status = "failed"
            except Exception as exc:  # a bug must fail the job visibly, never leave it "running" forever
                log.exception("placement job %s crashed", job_id)
                job.error = {"code": "internal", "message": f"{type(exc).__name__}: {exc}", "field": None}
                job.status = "failed"
            finally:
                job.done.set()

        job.future = self._pool.submit(_run)
        return job_id

    def get(self, job_id: str, owner: str | None = None) -> _Job:
        """The job; ``owner``: only that principal's (another's is a 404, as if it did not exist)."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None or (owner is not None and job.owner != owner):
            raise NotFound(f"no placement job {job_id}", field="job_id")
        return job

    def cancel(self, job_id: str, owner: str | None = None) -> _Job:
        """Cancel a job: a queued one never starts; a running one's answer is dropped and its slot frees when HiGHS
        stops (at the latest at the capped time limit: scipy's HiGHS cannot be interrupted mid-solve)."""
        job = self.get(job_id, owner)
        with self._lock:
            if not job.done.is_set() and job.status in ("queued", "running"):
                if job.future is not None and job.future.cancel():
                    job.done.set()
                job.status = "cancelled"
                job.error = {"code": "cancelled", "message": "cancelled by its owner", "field": None}
        return job

    def wait(self, job_id: str, timeout_s: float) -> _Job:
        job = self.get(job_id)
        job.done.wait(timeout_s)
        return job
