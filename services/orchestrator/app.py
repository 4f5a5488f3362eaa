"""HTTP layer of the orchestrator service: thin endpoints over `service.py`; runs go to the runtime's dispatcher
(in-process pool in embedded mode, Celery in cluster mode) only after the experiment's transaction committed."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, PlainTextResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.orm import Session
from starlette.background import BackgroundTask
from starlette.types import Scope

from services.orchestrator import artefacts, chrome_trace, series, service
from services.orchestrator import repository as repo
from services.orchestrator.jobs import Dispatcher
from services.orchestrator.models import TERMINAL, Experiment, RunStatus
from services.orchestrator.pipeline_clients import Pipeline
from services.orchestrator.runtime import Runtime, runtime
from services.orchestrator.schemas import (
    ALL_SCENARIOS,
    ExperimentAccepted,
    ExperimentPage,
    ExperimentRequest,
    ExperimentSpec,
    ExperimentView,
    LinkToken,
    Scenario,
    SweepRequest,
    SweepView,
)
from services.orchestrator.settings import orchestrator_settings
from shared import json_codec
from shared.auth import redact_paths
from shared.client import ServiceClients
from shared.configs.workload import WorkloadConfig
from shared.db import database_outage, outage_text
from shared.errors import BadInput, Conflict, DatabaseUnavailable, NotFound, TasmoeError, UpstreamError
from shared.link_tokens import LinkTokens
from shared.service_app import ErrorBody, JsonRoute, create_service_app, install_database_errors, principal_of
from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)

router = APIRouter(route_class=JsonRoute, tags=["orchestrator"], responses={
    503: {"model": ErrorBody, "description": "The run-state database cannot be reached for now; see Retry-After"}})

IdPath = Annotated[str, "experiment id"]


def _prefix(request: Request) -> str:
    """The path this app is mounted under (``/orchestrator`` under ``tasmoe serve all``; empty on its own port), so
    that every URL it hands out (``Location``, links) is one the client can follow."""
    return str(request.scope.get("root_path", "")).rstrip("/")


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


def _check_workload(request: Request, workload: WorkloadConfig, window_ms: float) -> bool:
    """Ask the workload service whether it knows the model and, for a workload that reads a trace (arrivals, recorded
    routing), whether it can make the run's trace of it (422 naming the field if not: ``workload.model``,
    ``workload.serving.start_s``, ...). Embedded: the runtime's in-process clients. Cluster (runs go to Celery
    workers): clients over ``TASMOE_WORKLOAD_URL`` built once, without retries; when the workload service cannot be
    reached the check is skipped with a warning (the run checks it again when it starts), so a submission never waits
    on or fails for a service that is down. False when skipped."""
    rt = _rt(request)
    if rt.clients is not None:
        Pipeline(rt.clients).check_workload(workload, window_ms)
        return True
    try:
        Pipeline(_check_clients(request)).check_workload(workload, window_ms)
    except UpstreamError as exc:
        log.warning("workload %r not checked at submission: %s", workload.model_name, exc)
        return False
    return True


FIRST_TOKEN_CHECK_S = 5.0  # wall time the submission may spend finding the first token's window (else unchecked)


def _check_windows(request: Request, spec: ExperimentSpec) -> None:
    """A run of ``windows`` windows that ends before any token can complete is refused (422 naming ``windows`` with
    the minimum): the first micro-batch alone on the idle chip (``capacity.first_token_window``, the cycle model)
    must finish inside it. Unchecked (accepted) when the services cannot be reached or the answer takes longer than
    FIRST_TOKEN_CHECK_S; the run itself then says why no token completed. A serving workload is not checked (its
    micro-batches are formed at run time: ``capacity.serving_note``)."""
    if spec.windows is None or spec.workload.serving is not None:
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
    _check_workload(request, spec.workload, spec.tas.tacs.window_ms)  # 422 now, not a failed run later
    _check_windows(request, spec)
    exp_id, created = service.create_experiment(sessions=rt.sessions, spec=spec, settings=rt.settings,
                                                idempotency_key=idempotency_key, owner=who.name, quota=quota)
    if created:
        rt.dispatcher.submit_experiment(exp_id)
    location = f"{_prefix(request)}/v1/experiments/{exp_id}"
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
                                            description="windows per scenario")] = service.MAX_WINDOWS_PAGE,
                fields: Annotated[str | None, Query(max_length=2000, description=(
                    "comma-separated WindowMetrics keys to return (window always), e.g. temps_core_c,temps_bank_c"
                    " for a heat map; default: all"))] = None,
                ) -> dict[str, Any]:
    """The per-window metrics series of each scenario (or of one), a page of at most ``limit`` windows from window
    ``offset``; ``next_offset`` is the window to ask for next (None when no scenario has more). For a timeline of a
    long run use ``.../series`` (decimated) instead."""
    keep = service.window_fields(fields)
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        series = service.window_series(session=s, exp_id=exp_id, scenario=scenario, offset=offset, limit=limit,
                                       fields=keep)
    full = [ws for ws in series.values() if len(ws) == limit]
    nxt = max(int(ws[-1]["window"]) for ws in full) + 1 if full else None
    return {"id": exp_id, "scenarios": series, "offset": offset, "next_offset": nxt}


@router.get("/experiments/{exp_id}/token", response_model=LinkToken)
def get_link_token(exp_id: IdPath, request: Request, response: Response) -> LinkToken:
    """A link token for this experiment (``shared.link_tokens``): what a browser passes as ``?token=`` where it
    cannot send the key (the dashboard's event stream, figures and downloads). It opens only this experiment's GET
    paths (not this one), for the caller, until it expires (``TASMOE_LINK_TOKEN_TTL_S``)."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
    tokens: LinkTokens = request.app.state.link_tokens
    issued = tokens.issue(principal_of(request), exp_id)
    response.headers["Cache-Control"] = "no-store"
    return LinkToken(token=issued.token, experiment=exp_id, expires_at=issued.expires_at, ttl_s=issued.ttl_s)


@router.get("/experiments/{exp_id}/series")
def get_series(exp_id: IdPath, request: Request, scenario: Scenario | None = None,
               points: Annotated[int, Query(ge=1, le=series.MAX_POINTS, description="buckets at most")] = 600,
               start: Annotated[int, Query(ge=0, le=1 << 31, description="first window")] = 0,
               stop: Annotated[int | None, Query(ge=1, le=1 << 31, description="window after the last")] = None,
               ) -> dict[str, Any]:
    """Each scenario's committed windows ``start .. stop-1`` as a timeline of at most ``points`` buckets of
    ``stride`` windows (decimated on the server: a 30 s run has 10^4 windows): per bucket the logic and DRAM peaks
    (the maximum, and ``*_w`` the window it was reached in), throughput, mean latency, power by component, clocks,
    refresh rate, migrations. Also the chip's facts (mesh, dies, Thot, the 85 °C refresh step) and the experiment's
    one colour scale for heat maps (°C; null before its first window)."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        _, spec, runs = service.dashboard_runs(session=s, exp_id=exp_id)
    chosen = [r for r in runs if scenario is None or r.scenario == scenario]
    if scenario is not None and not chosen:
        raise NotFound(f"experiment {exp_id} has no scenario {scenario!r}", field="scenario")
    summaries = {r.scenario: series.SUMMARIES.get(r.run_dir, r.committed) for r in runs}
    out: dict[str, Any] = {}
    for r in chosen:
        with summaries[r.scenario].lock:  # read while no other request extends it
            out[r.scenario] = {**series.decimate(summaries[r.scenario], start, stop, points), "status": r.status,
                               "n_windows": r.n_windows}
    return {"id": exp_id, "chip": service.chip_facts(spec), "scale": service.colour_scale(list(summaries.values())),
            "scenarios": out}


@router.get("/experiments/{exp_id}/map")
def get_map(exp_id: IdPath, request: Request, scenario: Scenario,
            window: Annotated[int | None, Query(ge=0, le=1 << 31, description="default: the newest")] = None,
            span: Annotated[int, Query(ge=1, le=10_000, description="moves of this many windows up to it")] = 20,
            ) -> dict[str, Any]:
    """The expert map of one scenario during ``window``: the experts on each core (the run's placement with TACS's
    migrations applied up to it) and the weight shards in each core's vault, with TACS's moves (migrations,
    reroutes) of the ``span`` windows up to it, each with the window from whose start it applies."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        _, spec, runs = service.dashboard_runs(session=s, exp_id=exp_id, scenario=scenario)
    run = runs[0]
    w = max(0, run.committed - 1) if window is None else min(window, max(0, run.committed - 1))
    return {"id": exp_id, "scenario": scenario, "committed": run.committed,
            **series.expert_map(run.run_dir, spec.arch, spec.tas.tacs.window_ms, w, span, run.committed)}


@router.get("/experiments/{exp_id}/trace", response_class=Response,
            responses={200: {"content": {"application/json": {}}, "description": "a Chrome trace (trace-event JSON)"},
                       409: {"model": ErrorBody, "description": "the run kept no physical events"}})
def get_trace(exp_id: IdPath, request: Request, scenario: Scenario,
              start: Annotated[int, Query(ge=0, le=1 << 31, description="first window")] = 0,
              count: Annotated[int, Query(ge=1, le=chrome_trace.MAX_TRACE_WINDOWS, description="windows")] = 10,
              ) -> Response:
    """Windows ``start .. start+count-1`` of one scenario's physical events as a Chrome trace (JSON trace-event
    format; open it in https://ui.perfetto.dev or chrome://tracing): a track per core (compute) and per DRAM vault
    channel (memory), and the peaks and power as counters. 409 when the run kept no events (run the experiment with
    ``"events": true``)."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        _, spec, runs = service.dashboard_runs(session=s, exp_id=exp_id, scenario=scenario)
    run = runs[0]
    if not chrome_trace.has_events(run.run_dir):
        raise Conflict(f"the {scenario} run of {exp_id} kept no physical events: submit the experiment again with "
                       '"events": true (POST /v1/experiments) to write them, then ask for its trace',
                       field="events", code="no_events")
    if start >= run.committed:
        raise NotFound(f"window {start}: the {scenario} run has committed {run.committed} windows", field="start")
    count = min(count, run.committed - start)
    trace = chrome_trace.chrome_trace(run.run_dir, spec.arch, spec.tas.tacs.window_ms, start, count,
                                      f"{exp_id}/{scenario}")
    name = f"{exp_id}-{scenario}-w{start}-{start + count - 1}.trace.json"
    return Response(json_codec.dumps(trace), media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


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
    p, st = artefacts.resolve_file(Path(exp.out_dir), path)
    return FileResponse(p, filename=p.name, stat_result=st)


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


SSE_RETRY_MS = 2000  # how long an EventSource waits before it reconnects (the stream's ``retry:`` field)
SSE_OUTAGE_POLL_MAX_S = 5.0  # the longest pause between two looks at the database while it is away
SSE_KEEPALIVE_S = 15.0  # a comment line at least this often while nothing else is sent (proxies close idle streams)


def _event(kind: str, data: str, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {data}\n\n"


def _event_id(data: str) -> str:
    """A progress event's id: a digest of the state it carries, so a client that reconnects with ``Last-Event-ID``
    is sent the state again only if it changed meanwhile."""
    return hashlib.sha256(data.encode()).hexdigest()[:16]

FRAME_MIN_POLL_S = 0.5  # with frames, the stream looks at the runs at most twice a second
MAX_FRAME_MOVES = 50  # TACS moves in one frame (the newest; the frame counts the rest)


def _since(text: str | None) -> dict[str, int]:
    """``since=baseline:120,tas:80`` -> the window each scenario's next frame summarises from."""
    out: dict[str, int] = {}
    for part in (text or "").split(","):
        name, _, num = part.partition(":")
        if not part.strip():
            continue
        if name.strip() not in ALL_SCENARIOS or not num.strip().isdigit():
            raise BadInput(f"since: {part!r} is not <scenario>:<window>", field="since")
        out[name.strip()] = int(num)
    return out


def _frames(request: Request, exp_id: str, cursor: dict[str, int]) -> list[dict[str, Any]]:
    """A frame for each run that committed windows since its cursor (advanced here): the newest window's maps, the
    windows since the cursor as one timeline bucket (`series.bucket`), TACS's moves applied in them. A run seen for
    the first time without a cursor gets its newest window's maps and no bucket."""
    with _rt(request).sessions() as s:
        _visible(request, s, exp_id)
        _, spec, runs = service.dashboard_runs(session=s, exp_id=exp_id)
    out: list[dict[str, Any]] = []
    for run in runs:
        prev = cursor.get(run.scenario)
        if run.committed == 0 or prev == run.committed:
            continue
        maps = series.frame(run.run_dir, run.committed - 1)
        if maps is None:
            continue
        item: dict[str, Any] = {"scenario": run.scenario, "committed": run.committed, "n_windows": run.n_windows,
                                **maps, "summary": None, "moves": [], "moves_dropped": 0}
        if prev is not None and prev < run.committed:
            summary = series.SUMMARIES.get(run.run_dir, run.committed)
            with summary.lock:
                if summary.n > prev:
                    item["summary"] = series.bucket(summary.cols, prev, min(summary.n, run.committed))
            moved = series.moves_between(series.moves(run.run_dir, spec.arch, spec.tas.tacs.window_ms,
                                                      run.committed), prev, run.committed)
            item["moves"] = moved[-MAX_FRAME_MOVES:]
            item["moves_dropped"] = max(0, len(moved) - MAX_FRAME_MOVES)
        cursor[run.scenario] = run.committed
        out.append(item)
    return out


@router.get("/experiments/{exp_id}/events", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}}})
async def experiment_events(exp_id: IdPath, request: Request,
                            poll_s: Annotated[float, Query(ge=0.05, le=10)] = 0.5,
                            frames: Annotated[bool, Query(description=(
                                "also send `frame` events: each run's newest committed window (heat maps), the "
                                "windows since the last frame as one timeline bucket, TACS's moves"))] = False,
                            since: Annotated[str | None, Query(max_length=200, description=(
                                "with frames: <scenario>:<window>,... where each run's first bucket starts"))] = None,
                            last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=64)] = None,
                            ) -> StreamingResponse:
    """Server-Sent Events: a ``progress`` event whenever the experiment changes, ``done`` when it finished. Every
    progress event has an id; a client that reconnects with ``Last-Event-ID`` (an EventSource does) is not sent the
    state it already has again. With ``frames``: also a ``frame`` event per run that advanced, at most one per run
    every max(``poll_s``, 0.5) s (the windows in between are summarised, not sent: ~5 kB a frame on the default
    chip). A stream opened with a link token ends with an ``expired`` event when the token does (ask for a new one
    and reconnect). While the run-state database is away the stream stays open: one ``unavailable`` event (the 503
    error body) when the outage begins, comments to keep the connection alive, and progress again when the database
    is back."""
    rt = _rt(request)
    cursor = _since(since)
    expires_at = request.scope.get("state", {}).get("link_expires_at")
    interval = max(poll_s, FRAME_MIN_POLL_S) if frames else poll_s

    def view() -> ExperimentView:
        with rt.sessions() as s:
            _visible(request, s, exp_id)
            return _shown(request, service.experiment_view(session=s, exp_id=exp_id))

    first = await run_in_threadpool(view)  # 404 (or 503) before the stream starts

    async def stream() -> AsyncIterator[str]:
        yield f"retry: {SSE_RETRY_MS}\n\n"
        last = last_event_id
        current: ExperimentView | None = first
        away = 0  # looks at the database that failed in a row
        quiet = 0.0  # seconds since the last line sent
        while True:
            if current is not None:
                data = current.model_dump_json()
                eid = _event_id(data)
                if eid != last:
                    yield _event("progress", data, eid)
                    last, quiet = eid, 0.0
                if frames:
                    for item in await run_in_threadpool(_frames, request, exp_id, cursor):
                        yield _event("frame", json_codec.dumps_str(item))
                        quiet = 0.0
                if RunStatus(current.status) in TERMINAL:
                    yield _event("done", json.dumps({"id": exp_id, "status": current.status}), eid)
                    return
            if expires_at is not None and time.time() >= expires_at:
                yield _event("expired", json.dumps({"id": exp_id}))
                return
            if await request.is_disconnected():
                return
            pause = interval if away == 0 else min(SSE_OUTAGE_POLL_MAX_S, interval * 2 ** away)
            await asyncio.sleep(pause)
            quiet += pause
            try:
                current = await run_in_threadpool(view)
                away = 0
            except TasmoeError as exc:  # deleted meanwhile (tasmoe experiments prune): say so and end
                yield _event("error", json.dumps(exc.body()))
                return
            except Exception as exc:
                if not database_outage(exc):
                    raise
                current = None
                away += 1
                if away == 1:
                    log.warning("events of %s: the database is unreachable (%s); the stream waits", exp_id,
                                outage_text(exc))
                    body = DatabaseUnavailable("the run-state database cannot be reached for now; this stream "
                                               "goes on when it is back").body()
                    yield _event("unavailable", json.dumps(body))
                    quiet = 0.0
            if quiet >= SSE_KEEPALIVE_S:
                yield ": keep-alive\n\n"
                quiet = 0.0

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/configs")
def list_configs(request: Request) -> dict[str, Any]:
    """The config files a request may name (``arch``, ``workload``, ``tas``), by kind, and the models the workload
    service knows (zoo and registered; empty, with ``models_error``, when it cannot be reached): the dashboard's
    presets."""
    rt = _rt(request)
    out: dict[str, Any] = {"configs": service.list_configs(rt.settings.configs_dir), "models": [],
                           "models_error": None}
    try:
        got = _check_clients(request)["workload"].get_json("/v1/models")
        out["models"] = [m.get("name") for m in got.get("models", []) if isinstance(m, dict)]
    except TasmoeError as exc:  # unreachable, or a workload service without the list: the presets still load
        out["models_error"] = str(exc)
    return out


@router.get("/configs/{name}")
def get_config(name: str, request: Request) -> dict[str, Any]:
    """One config file (a name from ``GET /v1/configs``), validated, with every default filled in: what an
    experiment naming it runs with."""
    return service.read_config(name, configs_dir=_rt(request).settings.configs_dir)


@router.post("/sweeps", status_code=202, response_model=SweepView)
def create_sweep(body: SweepRequest, request: Request, response: Response) -> SweepView:
    """A grid over dotted config keys: one experiment per point, one task per experiment-scenario."""
    rt = _rt(request)
    reachable = True

    def check(wl: WorkloadConfig, ms: float) -> None:  # once the workload service is out of reach, no more waits
        nonlocal reachable
        reachable = reachable and _check_workload(request, wl, ms)

    sweep_id, exp_ids = service.create_sweep(sessions=rt.sessions, req=body, settings=rt.settings,
                                             check_workload=check,
                                             owner=principal_of(request).name, quota=_quota(request))
    for exp_id in exp_ids:
        rt.dispatcher.submit_experiment(exp_id)
    response.headers["Location"] = f"{_prefix(request)}/v1/sweeps/{sweep_id}"
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


UI_DIR = Path(__file__).resolve().parent / "ui"
# The dashboard's pages load nothing from elsewhere and run no inline script: what they may fetch, said to the browser
UI_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
          "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


class UiFiles(StaticFiles):
    """The dashboard's static files (``services/orchestrator/ui``: HTML, CSS, ES modules; no build step), served with
    a content security policy and revalidated on each load (a new version of the page is seen at once)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        resp = await super().get_response(path, scope)
        resp.headers["Content-Security-Policy"] = UI_CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"  # link tokens in URLs are not passed on
        resp.headers["Cache-Control"] = "no-cache"
        return resp


def mount_ui(app: FastAPI) -> None:
    """The dashboard at ``/ui/`` (public: the page holds no data and no secret; what it shows comes from the API with
    the user's key), ``/ui`` redirecting there under whatever prefix the app is mounted."""

    @app.get("/ui", include_in_schema=False)
    async def ui_redirect(request: Request) -> Response:
        return RedirectResponse(f"{_prefix(request)}/ui/", status_code=307)

    app.mount("/ui", UiFiles(directory=str(UI_DIR), html=True), name="ui")


DESCRIPTION = ("Experiments end to end: scenario runs, window loop, sweeps, results. The dashboard (experiments, "
               "live heat maps, replay, traces) is the page [/ui/](../ui/) of this service; `tasmoe serve all` links "
               "it from its root.")


def create_app(settings: Settings | None = None, *, clients: ServiceClients | None = None,
               dispatcher: Dispatcher | None = None, lease_s: float | None = None) -> FastAPI:
    """The orchestrator app. ``clients``: compute services to use in embedded mode (default: in-process apps);
    ``dispatcher``: override where runs go (tests)."""
    settings = settings or get_settings()
    osettings = orchestrator_settings(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with runtime(settings, clients=clients, dispatcher=dispatcher, lease_s=lease_s) as rt:
            app.state.rt = rt
            yield

    tokens = LinkTokens.from_settings(osettings.link_secret, osettings.service_key, osettings.link_token_ttl_s)
    app = create_service_app("orchestrator", settings, [router], lifespan=lifespan, description=DESCRIPTION,
                             link_tokens=tokens)
    install_database_errors(app)
    mount_ui(app)
    return app
