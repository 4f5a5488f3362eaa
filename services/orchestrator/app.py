"""HTTP layer of the orchestrator service: thin endpoints over `service.py`; runs go to the runtime's dispatcher
(in-process pool in embedded mode, Celery in cluster mode) only after the experiment's transaction committed."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, PlainTextResponse, StreamingResponse
from sqlalchemy.orm import Session
from starlette.background import BackgroundTask

from services.orchestrator import artefacts, service
from services.orchestrator import repository as repo
from services.orchestrator.jobs import Dispatcher
from services.orchestrator.models import TERMINAL, Experiment, RunStatus
from services.orchestrator.pipeline_clients import Pipeline
from services.orchestrator.runtime import Runtime, runtime
from services.orchestrator.schemas import (
    ExperimentAccepted,
    ExperimentPage,
    ExperimentRequest,
    ExperimentSpec,
    ExperimentView,
    Scenario,
    SweepRequest,
    SweepView,
)
from services.orchestrator.settings import orchestrator_settings
from shared.auth import redact_paths
from shared.client import ServiceClients
from shared.configs.workload import InlineModel
from shared.errors import BadInput, Conflict, NotFound, UpstreamError
from shared.service_app import create_service_app, principal_of
from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)

router = APIRouter(tags=["orchestrator"])

IdPath = Annotated[str, "experiment id"]


def _rt(request: Request) -> Runtime:
    rt: Runtime = request.app.state.rt
    return rt


def _visible(request: Request, s: Session, exp_id: str) -> Experiment:
    """The experiment if the caller may see it: its own, or any for an admin. Another principal's is a 404, as if it
    did not exist (its id says nothing)."""
    who = principal_of(request)
    exp = repo.get_experiment(session=s, exp_id=exp_id)
    if exp is None or not (who.admin or exp.owner == who.name):
        raise NotFound(f"no experiment {exp_id!r}", field="id")
    return exp


def _shown(request: Request, view: ExperimentView) -> ExperimentView:
    """What a non-admin sees of an experiment: no server paths."""
    if principal_of(request).admin:
        return view
    return view.model_copy(update={"out_dir": redact_paths(view.out_dir), "error": redact_paths(view.error)
                                   if view.error else view.error})


def _quota(request: Request) -> service.RunQuota:
    """The caller's run quota: TASMOE_QUOTA_ACTIVE_RUNS queued and running runs; a refusal asks to retry after a
    lease (30 s at least)."""
    osettings = orchestrator_settings(_rt(request).settings)
    return service.RunQuota(limit=osettings.quota_active_runs, retry_after_s=max(30, int(osettings.lease_s)))


def _check_clients(request: Request) -> ServiceClients:
    """The clients a submission's checks use: the runtime's in-process ones (embedded), else clients over the
    TASMOE_<SERVICE>_URLs without retries, built once (cluster: a service that is down skips the check)."""
    rt = _rt(request)
    if rt.clients is not None:
        return rt.clients
    clients: ServiceClients | None = getattr(request.app.state, "check_clients", None)
    if clients is None:
        clients = ServiceClients(rt.settings.model_copy(update={"http_retries": 0}))
        request.app.state.check_clients = clients
    return clients


def _check_model(request: Request, name: str | InlineModel) -> None:
    """Ask the workload service whether it knows the model (422 naming ``workload.model`` if not). Embedded: the
    runtime's in-process clients. Cluster (runs go to Celery workers): clients over ``TASMOE_WORKLOAD_URL`` built once,
    without retries; when the workload service cannot be reached the check is skipped with a warning (the run
    checks it again when it starts), so a submission never waits on or fails for a service that is down."""
    rt = _rt(request)
    if rt.clients is not None:
        Pipeline(rt.clients).check_model(name)
        return
    try:
        Pipeline(_check_clients(request)).check_model(name)
    except UpstreamError as exc:
        log.warning("workload.model %r not checked at submission: %s", name, exc)


FIRST_TOKEN_CHECK_S = 5.0  # wall time the submission may spend finding the first token's window (else unchecked)


def _check_windows(request: Request, spec: ExperimentSpec) -> None:
    """A run of ``windows`` windows that ends before any token can complete is refused (422 naming ``windows`` with
    the minimum): the first micro-batch alone on the idle chip (``capacity.first_token_window``, the cycle model)
    must finish inside it. Unchecked (accepted) when the services cannot be reached or the answer takes longer than
    FIRST_TOKEN_CHECK_S; the run itself then says why no token completed."""
    if spec.windows is None:
        return
    from services.orchestrator.capacity import first_token_window

    # its own idempotency keys: nothing of another submission's check is reused
    pipe = Pipeline(_check_clients(request), run_key=f"submit-check-{uuid.uuid4().hex[:12]}")
    try:
        first = first_token_window(pipe, spec, max_windows=spec.windows, deadline_s=FIRST_TOKEN_CHECK_S)
        if first is not None:
            return
        # too short: how long would do, for the message (a hundred times as long at most, within the time left)
        longer = first_token_window(pipe, spec, max_windows=100 * spec.windows,
                                    deadline_s=FIRST_TOKEN_CHECK_S) if spec.windows < 1000 else None
    except UpstreamError as exc:
        log.warning("windows not checked at submission: %s", exc)
        return
    ms = spec.tas.tacs.window_ms
    need = f"at least {longer}" if longer is not None else f"more than {spec.windows}"
    raise BadInput(f"windows: {spec.windows} windows of {ms:g} ms end before any token can complete (the first "
                   f"micro-batch alone on the chip needs {need} windows); ask for {need} windows, or leave windows "
                   "out for the whole trace", field="windows")


@router.post("/experiments", status_code=202, response_model=ExperimentAccepted)
def create_experiment(body: ExperimentRequest, request: Request, response: Response,
                      idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
                      ) -> ExperimentAccepted:
    """Start an experiment (one run per scenario). The same Idempotency-Key returns the same experiment."""
    rt = _rt(request)
    spec = service.resolve_spec(body, configs_dir=rt.settings.configs_dir)
    who = principal_of(request)
    quota = _quota(request)
    if idempotency_key is None:  # refused early, before the costly checks (a keyed request may be a free replay)
        with rt.sessions() as s:
            service.check_quota(session=s, owner=who.name, new_runs=len(spec.scenarios), quota=quota)
    _check_model(request, spec.workload.model)  # 422 now, not a failed run later
    _check_windows(request, spec)
    exp_id, created = service.create_experiment(sessions=rt.sessions, spec=spec, settings=rt.settings,
                                                idempotency_key=idempotency_key, owner=who.name, quota=quota)
    if created:
        rt.dispatcher.submit_experiment(exp_id)
    location = f"/v1/experiments/{exp_id}"
    response.headers["Location"] = location
    with rt.sessions() as s:
        exp = repo.get_experiment(session=s, exp_id=exp_id)
        status = exp.status.value if exp is not None else "queued"
    return ExperimentAccepted(id=exp_id, status=status, location=location, created=created)


@router.get("/experiments", response_model=ExperimentPage)
def list_experiments(request: Request, status: RunStatus | None = None,
                     limit: Annotated[int, Query(ge=1, le=200)] = 50,
                     offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> ExperimentPage:
    rt = _rt(request)
    with rt.sessions() as s:
        who = principal_of(request)
        exps, total = repo.list_experiments(session=s, status=status, limit=limit, offset=offset,
                                            owner=None if who.admin else who.name)
        items = [_shown(request, service.experiment_view(session=s, exp_id=e.id)) for e in exps]
    return ExperimentPage(items=items, total=total, limit=limit, offset=offset)


@router.get("/experiments/{exp_id}", response_model=ExperimentView)
def get_experiment(exp_id: IdPath, request: Request) -> ExperimentView:
    """Status and per-scenario progress ("window k of N"), timings and errors."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        return _shown(request, service.experiment_view(session=s, exp_id=exp_id))


@router.get("/experiments/{exp_id}/results", response_model=None,
            responses={200: {"content": {"text/csv": {}, "application/json": {}}}})
def get_results(exp_id: IdPath, request: Request,
                format: Literal["csv", "json"] = "json") -> Any:
    """The unified rows (seed §3.6) of the finished scenarios, as CSV or JSON."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        if format == "csv":
            return PlainTextResponse(service.results_csv(session=s, exp_id=exp_id), media_type="text/csv")
        view = service.experiment_view(session=s, exp_id=exp_id)
        return {"id": exp_id, "status": view.status, "rows": service.result_rows(session=s, exp_id=exp_id)}


@router.get("/experiments/{exp_id}/power")
def get_power(exp_id: IdPath, request: Request) -> dict[str, Any]:
    """Each finished scenario's power report: energy (J), mean and peak power (W) by component (logic dynamic, SPM,
    NoC, logic leakage, DRAM access, refresh, DRAM leakage, total) and by die, over ``interval_ms``."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        return {"id": exp_id, "scenarios": service.power_view(session=s, exp_id=exp_id)}


@router.get("/experiments/{exp_id}/windows")
def get_windows(exp_id: IdPath, request: Request, scenario: Scenario | None = None,
                offset: Annotated[int, Query(ge=0, le=1 << 31, description="first window")] = 0,
                limit: Annotated[int, Query(ge=1, le=service.MAX_WINDOWS_PAGE,
                                            description="windows per scenario")] = service.MAX_WINDOWS_PAGE
                ) -> dict[str, Any]:
    """The per-window metrics series of each scenario (or of one), a page of at most ``limit`` windows from window
    ``offset``; ``next_offset`` is the window to ask for next (None when no scenario has more)."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        series = service.window_series(session=s, exp_id=exp_id, scenario=scenario, offset=offset, limit=limit)
    full = [ws for ws in series.values() if len(ws) == limit]
    nxt = max(int(ws[-1]["window"]) for ws in full) + 1 if full else None
    return {"id": exp_id, "scenarios": series, "offset": offset, "next_offset": nxt}


@router.get("/experiments/{exp_id}/log", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "the logs"}})
def get_log(exp_id: IdPath, request: Request, scenario: Scenario | None = None) -> Response:
    """The runs' run.log files (seed, config snapshot, versions, git revision, progress, errors). (The route's class
    is the generic Response so that its errors are documented as the JSON they are, not as text/plain.) A non-admin
    reads them without server paths."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        text = service.log_text(session=s, exp_id=exp_id, scenario=scenario)
    return PlainTextResponse(text if principal_of(request).admin else redact_paths(text))


@router.post("/experiments/{exp_id}/cancel", response_model=ExperimentView)
def cancel_experiment(exp_id: IdPath, request: Request) -> ExperimentView:
    """Cancel the unfinished runs; a running window loop stops at its next commit."""
    rt = _rt(request)
    with rt.sessions.begin() as s:
        _visible(request, s, exp_id)
        repo.cancel_experiment(session=s, exp_id=exp_id)
    with rt.sessions() as s:
        return _shown(request, service.experiment_view(session=s, exp_id=exp_id))


@router.get("/experiments/{exp_id}/files")
def list_files(exp_id: IdPath, request: Request) -> dict[str, Any]:
    """The experiment's files (CSV results, series, plots, traces, logs): paths relative to its folder, sizes."""
    with _rt(request).sessions() as s:
        exp = _visible(request, s, exp_id)
    return {"id": exp_id, "files": artefacts.list_files(Path(exp.out_dir))}


@router.get("/experiments/{exp_id}/files/{path:path}", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "the file"},
                       206: {"content": {"application/octet-stream": {}}, "description": "the requested range"}})
def get_file(exp_id: IdPath, path: str, request: Request) -> Response:
    """One file of the experiment (a path from ``.../files``), with HTTP range requests; confined to its folder."""
    with _rt(request).sessions() as s:
        exp = _visible(request, s, exp_id)
    p = artefacts.resolve_file(Path(exp.out_dir), path)
    return FileResponse(p, filename=p.name)


@router.get("/experiments/{exp_id}/archive", response_class=Response,
            responses={200: {"content": {"application/zip": {}}, "description": "the experiment's folder, zipped"}})
def get_archive(exp_id: IdPath, request: Request) -> Response:
    """The experiment's whole folder as a zip (entries under ``<id>/``)."""
    with _rt(request).sessions() as s:
        exp = _visible(request, s, exp_id)
    tmp = artefacts.zip_folder(Path(exp.out_dir), exp_id)
    return FileResponse(tmp, media_type="application/zip", filename=f"{exp_id}.zip",
                        background=BackgroundTask(tmp.unlink, missing_ok=True))


@router.post("/experiments/{exp_id}/retry", status_code=202, response_model=ExperimentView)
def retry_experiment(exp_id: IdPath, request: Request) -> ExperimentView:
    """Resume the experiment's failed runs at their frontier (the windows they committed stay); 409 when none
    failed. For a run that failed because a service stayed unreachable past the outage budget, or any other reason
    that has since been fixed."""
    rt = _rt(request)
    with rt.sessions.begin() as s:
        _visible(request, s, exp_id)
        ids = repo.retry_experiment(session=s, exp_id=exp_id)
    if not ids:
        raise Conflict(f"experiment {exp_id} has no failed run to retry", field="id", code="nothing_to_retry")
    rt.dispatcher.submit_experiment(exp_id)
    with rt.sessions() as s:
        return _shown(request, service.experiment_view(session=s, exp_id=exp_id))


@router.get("/experiments/{exp_id}/events", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}}})
async def experiment_events(exp_id: IdPath, request: Request,
                            poll_s: Annotated[float, Query(ge=0.05, le=10)] = 0.5) -> StreamingResponse:
    """Server-Sent Events: a ``progress`` event whenever the experiment changes, ``done`` when it finished."""
    rt = _rt(request)

    def view() -> ExperimentView:
        with rt.sessions() as s:
            _visible(request, s, exp_id)
            return _shown(request, service.experiment_view(session=s, exp_id=exp_id))

    first = await run_in_threadpool(view)  # 404 before the stream starts

    async def stream() -> AsyncIterator[str]:
        last = ""
        current = first
        while True:
            data = current.model_dump_json()
            if data != last:
                yield f"event: progress\ndata: {data}\n\n"
                last = data
            if RunStatus(current.status) in TERMINAL:
                yield f"event: done\ndata: {json.dumps({'id': exp_id, 'status': current.status})}\n\n"
                return
            if await request.is_disconnected():
                return
            await asyncio.sleep(poll_s)
            current = await run_in_threadpool(view)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/sweeps", status_code=202, response_model=SweepView)
def create_sweep(body: SweepRequest, request: Request, response: Response) -> SweepView:
    """A grid over dotted config keys: one experiment per point, one task per experiment-scenario."""
    rt = _rt(request)
    sweep_id, exp_ids = service.create_sweep(sessions=rt.sessions, req=body, settings=rt.settings,
                                             check_model=lambda name: _check_model(request, name),
                                             owner=principal_of(request).name, quota=_quota(request))
    for exp_id in exp_ids:
        rt.dispatcher.submit_experiment(exp_id)
    response.headers["Location"] = f"/v1/sweeps/{sweep_id}"
    with rt.sessions() as s:
        return service.sweep_view(session=s, sweep_id=sweep_id)


@router.get("/sweeps/{sweep_id}", response_model=SweepView)
def get_sweep(sweep_id: str, request: Request) -> SweepView:
    """The sweep's status and its results collected into one table (one row per point × scenario)."""
    with _rt(request).sessions() as s:
        job = repo.get_job(session=s, job_id=sweep_id)
        who = principal_of(request)
        if job is None or not (who.admin or job.owner == who.name):
            raise NotFound(f"no sweep {sweep_id!r}", field="id")
        return service.sweep_view(session=s, sweep_id=sweep_id)


def create_app(settings: Settings | None = None, *, clients: ServiceClients | None = None,
               dispatcher: Dispatcher | None = None, lease_s: float | None = None) -> FastAPI:
    """The orchestrator app. ``clients``: compute services to use in embedded mode (default: in-process apps);
    ``dispatcher``: override where runs go (tests)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with runtime(settings, clients=clients, dispatcher=dispatcher, lease_s=lease_s) as rt:
            app.state.rt = rt
            yield

    return create_service_app("orchestrator", settings, [router], lifespan=lifespan,
                              description="Experiments end to end: scenario runs, window loop, sweeps, results.")
