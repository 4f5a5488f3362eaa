"""MILP placement jobs.

``run_placement_job(payload) -> dict`` is a plain, JSON-in/JSON-out function: a Celery task can wrap it unchanged
(``celery_app.task(name="placement.milp")(run_placement_job)``). Inside the placement service the jobs run on a
two-thread pool and their state lives in an in-process dict — an accepted exception to "services are stateless"
for this one long call only: a restarted service forgets its running jobs (the caller resubmits; the result is
deterministic for the same request except where HiGHS hits its time limit).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.placement.schemas import PlacementRequest
from services.placement.service import placement_for
from shared.errors import NotFound, TasmoeError

log = logging.getLogger(__name__)


def run_placement_job(payload: dict[str, Any]) -> dict[str, Any]:
    """Validate ``payload`` as a PlacementRequest, compute the placement, return it as JSON."""
    req = PlacementRequest.model_validate(payload)
    return placement_for(req).model_dump(mode="json")


@dataclass
class _Job:
    status: str = "queued"
    result: dict[str, Any] | None = None
    error: dict[str, str | None] | None = None
    done: threading.Event = field(default_factory=threading.Event)


_JOBS: dict[str, _Job] = {}
_LOCK = threading.Lock()
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="milp")  # at most two MILPs at once; others queue
MAX_JOBS = 256  # oldest finished jobs are forgotten beyond this


def job_id_of(req: PlacementRequest) -> str:
    """Content hash of the request: a replayed request (same Idempotency-Key or not) finds the same job."""
    canon = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return "milp-" + hashlib.sha256(canon.encode()).hexdigest()[:20]


def submit(req: PlacementRequest) -> str:
    """Start (or find) the MILP job of this request; returns its id."""
    job_id = job_id_of(req)
    with _LOCK:
        old = _JOBS.get(job_id)
        if old is not None and old.status != "failed":
            return job_id
        job = _Job()
        _JOBS[job_id] = job
        finished = [k for k, j in _JOBS.items() if j.done.is_set()]
        for k in finished[: max(0, len(_JOBS) - MAX_JOBS)]:
            del _JOBS[k]
    payload = req.model_dump(mode="json")

    def _run() -> None:
        job.status = "running"
        try:
            job.result = run_placement_job(payload)
            job.status = "done"
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

    _POOL.submit(_run)
    return job_id


def get(job_id: str) -> _Job:
    with _LOCK:
        job = _JOBS.get(job_id)
    if job is None:
        raise NotFound(f"no placement job {job_id}", field="job_id")
    return job


def wait(job_id: str, timeout_s: float) -> _Job:
    job = get(job_id)
    job.done.wait(timeout_s)
    return job
