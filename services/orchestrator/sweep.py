"""``tasmoe sweep``: one sweep run to its end, its table written as ``sweep.csv`` and its figure (``pareto.svg`` /
``.png``) drawn by the metrics service.

A sweep is a `SweepRequest` (``POST /v1/sweeps``): a base experiment and a grid of dotted config keys, one
experiment per grid point (configs/sweep_cooling_limit.yaml is the documented one). Two ways to run it, one code path
each, the API's:

- on a running orchestrator (``--url``: a cluster's, or ``tasmoe serve``'s): the file is posted to
  ``POST /v1/sweeps``, ``GET /v1/sweeps/{id}`` is polled until the sweep finished, and its table is what that answer
  carries; ``--attach ID`` follows a sweep already submitted (a terminal that went away overnight);
- embedded (`run_sweep_local`): the sweep is created by `service.create_sweep`, the function behind
  ``POST /v1/sweeps``, in this process's database, its runs executed on the embedded pool (worker processes, as
  ``tasmoe run``'s) and its table read by `service.sweep_view`, the function behind ``GET /v1/sweeps/{id}``.

The figure is the metrics service's (``POST /v1/plots/sweep/pareto``), reached through the pipeline's clients as
every figure of a run is (finalize.py): the embedded sweep's in-process services, or for ``--url`` a metrics service
built in this process. Its slices are drawn at the base config's h and limit when those are swept values.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from services.orchestrator import repository as repo
from services.orchestrator.db import make_engine, session_factory, upgrade
from services.orchestrator.jobs import EmbeddedRunner, ProcessRunner
from services.orchestrator.local import run_experiments
from services.orchestrator.models import RunStatus
from services.orchestrator.pipeline_clients import Pipeline
from services.orchestrator.schemas import Scenario, SweepRequest, SweepView
from services.orchestrator.service import create_sweep, plan_sweep, sweep_view
from services.orchestrator.settings import orchestrator_settings
from shared.client import ServiceClient, ServiceClients
from shared.configs import ArchConfig, load_config
from shared.contracts.metrics import ALL_COLUMNS, COOLING_KEY, LIMIT_KEY
from shared.errors import BadInput, ServiceUnavailable, TasmoeError, UpstreamError, first_validation_error
from shared.logging import bind_run_id
from shared.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_SWEEP = "configs/sweep_cooling_limit.yaml"
DEFAULT_OUT = "results/sweep/"
DURATION_KEY = "workload.serving.duration_ms"
WARMUP_KEY = "arch.thermal.warmup_ms"
API_KEY_ENV = "TASMOE_API_KEY"  # a key of the orchestrator's (TASMOE_AUTH=keys), sent as a Bearer token with --url
FINISHED = frozenset({"succeeded", "failed", "cancelled"})
MAX_POLL_FAILURES = 60  # consecutive polls the orchestrator may miss (an outage) before the command gives up


# --- the request --------------------------------------------------------------------------------------------------

def load_sweep_request(path: str | Path, *, grid: dict[str, list[Any]] | None = None,
                       duration_ms: float | None = None, warmup_ms: float | None = None,
                       scenarios: Sequence[Scenario] | None = None) -> SweepRequest:
    """The sweep request of a YAML or JSON file, with the command's overrides: ``grid`` replaces (or adds) grid keys'
    values; ``duration_ms`` / ``warmup_ms`` are one-value grid keys (``workload.serving.duration_ms``,
    ``arch.thermal.warmup_ms``: they show in the table as every key does); ``scenarios`` replaces the base's."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"sweep file: {p}: file not found", field="file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"sweep file: {p}: cannot read it ({exc})", field="file") from None
    except yaml.YAMLError as exc:
        raise BadInput(f"sweep file: {p}: not YAML or JSON ({str(exc).splitlines()[0]})", field="file") from None
    if not isinstance(raw, dict):
        raise BadInput(f"sweep file: {p}: a mapping with base, grid and name is expected", field="file")
    extra: dict[str, list[Any]] = dict(grid or {})
    if duration_ms is not None:
        extra[DURATION_KEY] = [duration_ms]
    if warmup_ms is not None:
        extra[WARMUP_KEY] = [warmup_ms]
    raw = dict(raw)
    if extra:
        file_grid = raw.get("grid") or {}
        raw["grid"] = {**file_grid, **extra} if isinstance(file_grid, dict) else file_grid
    file_base = raw.get("base") or {}
    if scenarios is not None and isinstance(file_base, dict):
        raw["base"] = {**file_base, "scenarios": list(scenarios)}
    try:
        return SweepRequest.model_validate(raw)
    except ValidationError as exc:
        fld, msg = first_validation_error(exc)
        raise BadInput(f"{fld}: {msg} ({p})", field=fld) from None


def parse_set(text: str) -> tuple[str, list[Any]]:
    """``KEY=V1,V2,...`` (``--set``): a grid key and its values, each read as YAML (numbers stay numbers)."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise ValueError(f"expected KEY=V1,V2,... (e.g. {COOLING_KEY}=5000,10000), got {text!r}")
    out = [_value(v.strip(), key) for v in values.split(",")]
    if any(v is None for v in out):
        raise ValueError(f"{key}: an empty value in {values!r}")
    return key, out


def _value(text: str, key: str) -> Any:
    """A number when ``text`` reads as one (``1e4`` too, which YAML 1.1 leaves a string), else the YAML value."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise ValueError(f"{key}: {text!r} is not a value") from None


def reference_values(req: SweepRequest, configs_dir: Path) -> tuple[float | None, float | None]:
    """The base config's (h, limit) when each is one of the sweep's values of its key (the figure's slices are drawn
    there; None: the figure picks). The base arch is read from ``configs_dir`` when it is a file name."""
    arch: ArchConfig | None = req.base.arch if isinstance(req.base.arch, ArchConfig) else None
    if arch is None and isinstance(req.base.arch, str):
        name = req.base.arch
        for p in (configs_dir / name, configs_dir / f"{name}.yaml"):
            if p.is_file():
                try:
                    arch = load_config(p, ArchConfig)
                except TasmoeError:
                    arch = None
                break

    def swept(key: str, v: float | None) -> float | None:
        vals = req.grid.get(key, [])
        ok = v is not None and any(isinstance(x, int | float) and not isinstance(x, bool)
                                   and math.isclose(x, v, rel_tol=1e-9) for x in vals)
        return v if ok else None

    if arch is None:
        return None, None
    return (swept(COOLING_KEY, arch.geometry.cooling.h_wmk2k),
            swept(LIMIT_KEY, arch.dtm.limit_c if arch.dtm is not None else None))


# --- the outputs --------------------------------------------------------------------------------------------------

def _columns(table: list[dict[str, Any]]) -> list[str]:
    params = list(dict.fromkeys(k for row in table for k in row if k.startswith("param:")))
    known = ["experiment", *params, *ALL_COLUMNS]
    extra = sorted({k for row in table for k in row} - set(known))
    return known + extra


def table_csv(table: list[dict[str, Any]]) -> str:
    """The sweep's table (``GET /v1/sweeps/{id}``) as CSV: experiment, the ``param:<key>`` columns, the result
    columns in the unified CSV's order; an empty cell for a value the row does not have."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=_columns(table), lineterminator="\n", restval="")
    w.writeheader()
    for row in table:
        w.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def plot_rows(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table's rows as the metrics service's `SweepRow` bodies (point values by key, the result row)."""
    return [{"experiment": row.get("experiment", ""),
             "params": {k[len("param:"):]: v for k, v in row.items() if k.startswith("param:")},
             "row": {k: v for k, v in row.items() if k != "experiment" and not k.startswith("param:")}}
            for row in table]


@dataclass
class SweepOutcome:
    sweep_id: str
    status: str
    runs: int  # points x scenarios
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    table_rows: int = 0


def write_sweep_files(out: Path, view: SweepView, *, clients: ServiceClients, label: str,
                      at: tuple[float | None, float | None]) -> list[Path]:
    """``sweep.csv`` (the table), ``sweep.json`` (id, status, points, experiments) and, when the table has rows, the
    figure as ``pareto.svg`` and ``pareto.png`` (the metrics service's)."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "sweep.csv", out / "sweep.json"]
    written[0].write_text(table_csv(view.table), encoding="utf-8")
    meta = {"id": view.id, "status": view.status, "points": view.points, "experiments": view.experiments}
    written[1].write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    if not view.table:
        return written
    pipe = Pipeline(clients, run_key=view.id)
    rows = plot_rows(view.table)
    for fmt in ("svg", "png"):
        data = pipe.sweep_plot("pareto", label=label, rows=rows, at_cooling=at[0], at_limit=at[1], fmt=fmt)
        path = out / f"pareto.{fmt}"
        path.write_bytes(data)
        written.append(path)
    return written


@contextmanager
def figure_clients(settings: Settings, apps: str | None = None) -> Iterator[ServiceClients]:
    """Clients whose metrics service runs in this process (the figure of a sweep run elsewhere)."""
    from services.orchestrator.worker import compute_clients

    with compute_clients(settings, apps, only=("metrics",)) as cc:
        yield cc


# --- progress -----------------------------------------------------------------------------------------------------

ProgressFn = Callable[[str], None]


def progress_line(view: SweepView, runs: int, elapsed_s: float, running: str = "") -> str:
    done = len(view.table)
    points_done = len({row.get("experiment") for row in view.table})
    return (f"sweep {view.id}: {view.status}; {done} of {runs} runs succeeded ({points_done} of {len(view.points)} "
            f"points with results){running}; {elapsed_s / 60:.1f} min")


def sweep_progress_printer(stream: TextIO | None = None, *, every_s: float = 60.0,
                           clock: Callable[[], float] = time.monotonic) -> ProgressFn:
    """Print a progress line (to ``stream``, default standard error) when a run finished or the sweep's status
    changed, and otherwise at most every ``every_s`` seconds (the running runs' windows move at every tick: an
    overnight log stays readable)."""
    last_key, last_t = [""], [-math.inf]

    def show(line: str) -> None:
        head = line.split("; running (", 1)[0]
        key = head if head != line else line.rsplit("; ", 1)[0]  # the elapsed time aside
        now = clock()
        if key != last_key[0] or now - last_t[0] >= every_s:
            print(line, file=sys.stderr if stream is None else stream, flush=True)
            last_key[0], last_t[0] = key, now

    return show


# --- embedded -----------------------------------------------------------------------------------------------------

def run_sweep_local(req: SweepRequest, *, out: Path, settings: Settings | None = None,
                    clients: ServiceClients | None = None, apps: str | None = None,
                    database_url: str | None = None, progress: ProgressFn | None = None) -> SweepOutcome:
    """Create the sweep (`service.create_sweep`, as ``POST /v1/sweeps``) in the embedded database, its points'
    folders ``<out>/p000`` ..., run every run on the embedded pool (`local.run_experiments`: worker processes, or
    threads over ``clients`` when given or ``TASMOE_POOL=thread``), then write the table and the figure into
    ``out``. ``apps``: ``module:factory`` building the compute services instead of the real ones."""
    from services.orchestrator.worker import compute_clients

    s = orchestrator_settings(settings)
    label = req.name or "sweep"
    points, specs = plan_sweep(req, configs_dir=s.configs_dir)  # every bad input before anything starts
    n_runs = sum(len(sp.scenarios) for sp in specs)
    at = reference_values(req, s.configs_dir)
    url = database_url or s.effective_database_url
    engine = make_engine(url)
    sessions = session_factory(engine)
    # the worker processes start before this process connects to the database or starts a thread (fork-safe)
    procs = ProcessRunner(sessions=sessions, database_url=url, settings=s, max_workers=s.pool_workers,
                          lease_s=s.lease_s, apps=apps) if clients is None and s.pool == "process" else None
    t0 = time.monotonic()
    try:
        upgrade(engine)

        def create(cc: ServiceClients) -> tuple[str, list[str]]:
            return create_sweep(sessions=sessions, req=req, settings=s, check_workload=Pipeline(cc).check_workload,
                                out_dir=out)

        def execute(cc: ServiceClients) -> SweepOutcome:
            sweep_id, exp_ids = create(cc)
            with bind_run_id(sweep_id):
                log.info("sweep %s: %d points x scenarios = %d runs under %s", sweep_id, len(points), n_runs, out)
                runner = procs if procs is not None else EmbeddedRunner(
                    sessions=sessions, clients=cc, max_workers=s.pool_workers, lease_s=s.lease_s)

                def tick() -> None:
                    if progress is not None:
                        with sessions() as ses:
                            view = sweep_view(session=ses, sweep_id=sweep_id)
                            running = _running(ses, exp_ids)
                        progress(progress_line(view, n_runs, time.monotonic() - t0, running))

                run_experiments(runner, sessions, exp_ids, tick, every_s=2.0)
                with sessions() as ses:
                    view = sweep_view(session=ses, sweep_id=sweep_id)
                files = write_sweep_files(out, view, clients=cc, label=label, at=at)
                log.info("sweep %s: %s; %d of %d runs with results", sweep_id, view.status, len(view.table), n_runs)
            return SweepOutcome(sweep_id, view.status, n_runs, out, files, len(view.table))

        if clients is not None:
            return execute(clients)
        with compute_clients(s, apps) as cc:
            return execute(cc)
    finally:
        if procs is not None:
            procs.shutdown()
        engine.dispose()


def _running(session: Any, exp_ids: Sequence[str]) -> str:
    """The running runs' progress, for the progress line: ``; running: p003 tas 120 of 10000 windows, ...``."""
    parts = []
    for i, exp_id in enumerate(exp_ids):
        for r in repo.runs_of(session=session, exp_id=exp_id):
            if r.status == RunStatus.running:
                parts.append(f"{i:03d} {r.scenario} {r.next_window}/{r.n_windows or '?'}")
    return f"; running (point scenario window): {', '.join(parts)}" if parts else ""


# --- on a running orchestrator ------------------------------------------------------------------------------------

def _orchestrator(url: str, settings: Settings, app: Any) -> ServiceClient:
    if app is None:
        return ServiceClient("orchestrator", url, settings)
    return ServiceClients(settings, asgi_apps={"orchestrator": app})["orchestrator"]


def run_sweep_remote(req: SweepRequest | None, *, url: str, out: Path, settings: Settings,
                     attach: str | None = None, poll_s: float = 10.0, progress: ProgressFn | None = None,
                     apps: str | None = None, app: Any = None) -> SweepOutcome:
    """Post ``req`` to the orchestrator at ``url`` (or follow sweep ``attach``), poll ``GET /v1/sweeps/{id}`` every
    ``poll_s`` seconds until it finished, then write the table and the figure into ``out``. The post is sent once
    (no retry: a sweep has no idempotency key, and a retried post could start it twice); a poll that fails is tried
    again at the next interval, MAX_POLL_FAILURES times in a row at most. ``app``: the orchestrator as an ASGI app
    in this process instead of at ``url`` (tests); ``apps``: the compute services' factory for the figure's metrics
    service."""
    key = os.environ.get(API_KEY_ENV, "")
    headers = {"Authorization": f"Bearer {key}"} if key else None
    once = _orchestrator(url, settings.model_copy(update={"http_retries": 0}), app)
    client = _orchestrator(url, settings, app)
    t0 = time.monotonic()
    try:
        if attach is not None:
            view = client.get_model(f"/v1/sweeps/{attach}", SweepView, headers=headers)
            label = f"sweep {attach}"
        else:
            assert req is not None
            view = once.post_model("/v1/sweeps", req.model_dump(mode="json"), SweepView, headers=headers)
            label = req.name or "sweep"
        n_runs = _runs_of(client, view, headers, req)
        with bind_run_id(view.id):
            log.info("sweep %s at %s: %d points, %d runs", view.id, url, len(view.points), n_runs)
            failures = 0
            while view.status not in FINISHED:
                if progress is not None:
                    progress(progress_line(view, n_runs, time.monotonic() - t0))
                time.sleep(poll_s)
                try:
                    view = client.get_model(f"/v1/sweeps/{view.id}", SweepView, headers=headers)
                    failures = 0
                except (ServiceUnavailable, UpstreamError) as exc:
                    failures += 1
                    if failures >= MAX_POLL_FAILURES:
                        raise
                    log.warning("sweep %s: poll %d failed (%s); trying again in %g s", view.id, failures, exc, poll_s)
            if progress is not None:
                progress(progress_line(view, n_runs, time.monotonic() - t0))
    finally:
        once.close()
        client.close()
    at = reference_values(req, settings.configs_dir) if req is not None else (None, None)
    with figure_clients(settings, apps) as cc:
        files = write_sweep_files(out, view, clients=cc, label=label, at=at)
    return SweepOutcome(view.id, view.status, n_runs, out, files, len(view.table))


def _runs_of(client: ServiceClient, view: SweepView, headers: dict[str, str] | None,
             req: SweepRequest | None) -> int:
    """Points x scenarios: from the request, or (attached) from each experiment's runs."""
    if req is not None:
        return len(view.points) * len(dict.fromkeys(req.base.scenarios))
    return sum(len(client.get_json(f"/v1/experiments/{e}", headers=headers)["runs"]) for e in view.experiments)


def check_outcome(res: SweepOutcome) -> None:
    """A sweep that did not succeed whole is an error (after its files were written): what it has is in them."""
    if res.status != "succeeded":
        raise TasmoeError(f"sweep {res.sweep_id} {res.status}: {res.table_rows} of {res.runs} runs have results "
                          f"(written to {res.out_dir}); each point's runs: GET /v1/experiments/<id> or tasmoe "
                          "experiments list", code="run_failed", status=500)
