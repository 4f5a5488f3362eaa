"""``tasmoe run``: the four scenarios embedded, with a progress bar per scenario (same as scripts/run_all.py);
``tasmoe capacity``: a chip's serving capacity under an SLO; ``tasmoe sweep``: a sweep (``POST /v1/sweeps``) on a
running orchestrator or embedded, its table and Pareto figure; ``tasmoe experiments``: a database's experiments."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from services.commands import command_help
from services.orchestrator import repository as repo
from services.orchestrator.db import open_database
from services.orchestrator.default_experiment import DEFAULT, EXPERIMENTS, QUICK, REFERENCE
from services.orchestrator.local import check_ok, print_summary, run_local
from services.orchestrator.models import utcnow
from services.orchestrator.progress import progress_printer
from services.orchestrator.schemas import ALL_SCENARIOS
from services.orchestrator.settings import orchestrator_settings
from services.orchestrator.sweep import (
    API_KEY_ENV,
    DEFAULT_SWEEP,
    check_outcome,
    load_sweep_request,
    parse_set,
    run_sweep_local,
    run_sweep_remote,
    sweep_progress_printer,
)
from services.orchestrator.sweep import DEFAULT_OUT as SWEEP_OUT
from shared.errors import BadInput, NotFound

if TYPE_CHECKING:
    from services.orchestrator.slo_capacity import Probe



def epoch_windows(text: str) -> int:
    """``--epoch``: windows of one control epoch, 1 to 1024 (argparse's type: a bad one is a usage error, exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of windows, got {text!r}") from None
    if not 1 <= n <= 1024:
        raise argparse.ArgumentTypeError(f"an epoch is 1 to 1024 windows, got {n}")
    return n


MIGRATION_LOGGER = "alembic.runtime.migration"


def quiet_migrations() -> None:
    """Silence Alembic's INFO lines (one per migration, and two at every start even when there is none to run): a
    ``--quiet`` run prints its summary and warnings only."""
    logging.getLogger(MIGRATION_LOGGER).setLevel(logging.WARNING)


def start_line(name: str, *, arch: str, workload: str, tas: str, out: str, scenarios: int, workers: int) -> str:
    """The first line of a run: which experiment, its configs, where its files go and how many runs go at once."""
    runs = f"{scenarios} scenario{'s' if scenarios != 1 else ''}"
    return (f"experiment {name}: {arch}, {workload}, {tas} -> {out}; {runs}, {min(workers, scenarios)} at a time "
            "(TASMOE_POOL_WORKERS)")


def _run(args: argparse.Namespace) -> int:
    name = "quick" if args.quick else args.experiment
    if args.quick and args.experiment != "default":
        raise BadInput("--quick is --experiment quick; give one of them", field="experiment")
    exp = EXPERIMENTS[name]
    if name == "quick" and args.workload is not None:
        raise BadInput(f"--quick runs {exp.workload} for {exp.arrivals_ms:g} ms; leave out --workload",
                       field="workload")
    if exp.rate_rps is not None and args.workload is not None:  # its rate is the default chip's, not another load's
        raise BadInput(f"--experiment {name} offers {exp.workload} at {exp.rate_rps:g} requests/s; leave out "
                       "--workload (tasmoe capacity finds a workload's own rates)", field="workload")
    workload = exp.workload_config(args.workload)
    warmup = args.warmup_ms if args.warmup_ms is not None else exp.warmup_ms
    scenarios = args.scenarios or list(exp.scenarios)
    out = args.out or exp.out
    if args.quiet:
        quiet_migrations()
    else:
        print(start_line(name, arch=args.arch or exp.arch, workload=args.workload or exp.workload,
                         tas=args.tas or exp.tas, out=out, scenarios=len(scenarios),
                         workers=orchestrator_settings().pool_workers), file=sys.stderr, flush=True)
    res = run_local(arch=args.arch or exp.arch, workload=workload, tas=args.tas or exp.tas, out=out,
                    scenarios=scenarios, seed=args.seed, windows=args.windows,
                    traces=not args.no_traces, events=args.events,
                    progress=None if args.quiet else progress_printer(), warmup_ms=warmup, epoch=args.epoch)
    print_summary(res)
    check_ok(res)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("run", help=command_help("run"))
    p.add_argument("--experiment", default="default", choices=list(EXPERIMENTS),
                   help=f"which experiment's configs (default: %(default)s = {DEFAULT.arch}, {DEFAULT.workload}, "
                        f"{DEFAULT.tas}, five scenarios; reference = {REFERENCE.arch}, {REFERENCE.workload}); the "
                        "options below replace its parts")
    p.add_argument("--arch", default=None, help=f"arch config (default: the experiment's, {DEFAULT.arch})")
    p.add_argument("--workload", default=None, help=f"workload config (default: the experiment's, {DEFAULT.workload})")
    p.add_argument("--tas", default=None, help=f"TAS parameters (default: the experiment's, {DEFAULT.tas})")
    p.add_argument("--out", default=None,
                   help=f"output folder (default: the experiment's: {DEFAULT.out}, {QUICK.out} with --quick)")
    p.add_argument("--quick", action="store_true",
                   help=f"a quick look: the default experiment with {QUICK.arrivals_ms:g} ms of arrivals and a "
                        f"{QUICK.warmup_ms:g} ms warm-up; a check that everything runs, not a result")
    p.add_argument("--warmup-ms", type=float, default=None,
                   help="replace the arch config's thermal.warmup_ms (ms) for this run")
    p.add_argument("--scenarios", nargs="+", default=None, choices=ALL_SCENARIOS,
                   help="the scenarios to run (default: the experiment's: the four policies and, on the default and "
                        "quick, unthrottled, the reference without DVFS and DTM)")
    p.add_argument("--seed", type=int, default=None, help="routing seed (default: the workload config's)")
    p.add_argument("--windows", type=int, default=None, help="run only the first N windows")
    p.add_argument("--no-traces", action="store_true",
                   help="do not write the logical trace and the overlays (traces/*.csv.gz, runs/*/runtime/*.csv)")
    p.add_argument("--events", action="store_true",
                   help="also write the physical events (runs/<scenario>/traces/physical/*.csv.gz; ~100 MB per "
                        "scenario of the default experiment)")
    p.add_argument("--epoch", type=epoch_windows, default=None, metavar="N",
                   help="the most windows of one control epoch (default: TASMOE_EPOCH_WINDOWS, 256); 1 runs the "
                        "per-window reference loop; the results are the same bytes either way")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines and no database migration lines: the summary and warnings only")
    p.set_defaults(func=_run)
    register_capacity(sub)
    register_sweep(sub)
    register_experiments(sub)


# --- tasmoe capacity: the highest offered rate that meets the SLO, measured -----------------------------------------

def _finite(text: str, *, zero_ok: bool) -> float:
    """A finite number > 0 (``zero_ok``: >= 0), for argparse's type: a bad one is a usage error, exit 2."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not ((v >= 0 if zero_ok else v > 0) and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be {'>=' if zero_ok else '>'} 0, got {text}")
    return v


def _positive(text: str) -> float:
    return _finite(text, zero_ok=False)


def _non_negative(text: str) -> float:
    return _finite(text, zero_ok=True)


def _capacity(args: argparse.Namespace) -> int:
    from services.orchestrator.slo_capacity import measure_slo_capacity

    def said(p: Probe) -> None:
        if not args.quiet:
            verdict = "met" if p.met else f"missed: {p.why}"
            print(f"  {p.rate_rps:.4g} requests/s, {_s(p.drain_ms)} of drain: {p.tokens_served} of {p.tokens_offered} "
                  f"tokens served, p99 TTFT {_ms(p.ttft_p99_ms)}, p99 TPOT {_ms(p.tpot_p99_ms)}; {verdict}", flush=True)

    res = measure_slo_capacity(arch=args.arch, workload=args.workload, tas=args.tas, out=Path(args.out),
                               lo_rps=args.lo, hi_rps=args.hi, probes=args.probes, duration_ms=args.duration_ms,
                               drain_ms=args.drain_ms, scenario=args.scenario, on_probe=said,
                               sets=dict(args.set or []))
    print(res.line())
    print(f"probes: {Path(args.out) / 'slo_capacity.csv'}")
    return 0


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 1e3:g} s"


def register_capacity(sub: Any) -> None:
    p = sub.add_parser("capacity", help=command_help("capacity"))
    p.add_argument("--arch", default="configs/arch_hbm_on_logic.yaml", help="arch config (default: %(default)s)")
    p.add_argument("--workload", default="configs/workload_serving.yaml",
                   help="a serving workload config; its serving.slo is the SLO (default: %(default)s)")
    p.add_argument("--tas", default="configs/tas_params_hbm_on_logic.yaml",
                   help="TAS parameters (default: %(default)s)")
    p.add_argument("--out", default="results/capacity/",
                   help="output folder; a search run again into it reads the probes it finished there instead of "
                        "running them again (default: %(default)s)")
    p.add_argument("--scenario", default="baseline", choices=ALL_SCENARIOS,
                   help="the scenario the probes run (default: %(default)s)")
    p.add_argument("--lo", type=_positive, default=0.25, help="lowest offered rate, requests/s (default: %(default)s)")
    p.add_argument("--hi", type=_positive, default=20.0, help="highest offered rate, requests/s (default: %(default)s)")
    p.add_argument("--probes", type=int, default=8, help="runs at most (default: %(default)s)")
    p.add_argument("--duration-ms", type=_positive, default=20_000.0,
                   help="simulated time of arrivals per probe, ms (default: %(default)s)")
    p.add_argument("--drain-ms", type=_positive, default=None,
                   help="simulated time after the arrivals in which the queue must empty, ms (default: per probe, the "
                        "shortest after which every request's SLO deadline has passed, so that a request still "
                        "queued has missed it)")
    p.add_argument("--set", action="append", type=_one_value, metavar="KEY=VALUE",
                   help="replace one value of the arch, tas or workload config for every probe, e.g. --set "
                        "arch.geometry.cooling.h_wmk2k=2777.8; repeatable")
    p.add_argument("--quiet", action="store_true", help="print the verdict only")
    p.set_defaults(func=_capacity)


def _one_value(text: str) -> tuple[str, Any]:
    """``--set KEY=VALUE`` of `tasmoe capacity` (argparse's type: a bad one is a usage error, exit 2)."""
    key, values = _grid_values(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"{key}: one value per --set (a search runs one config), got {len(values)}")
    return key, values[0]


# --- tasmoe sweep: a sweep on a running orchestrator (--url) or embedded, its table and its Pareto figure ----------

def _grid_values(text: str) -> tuple[str, list[Any]]:
    """``--set KEY=V1,V2`` (argparse's type: a bad one is a usage error, exit 2)."""
    try:
        return parse_set(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sweep(args: argparse.Namespace) -> int:
    if args.attach is not None and args.url is None:
        raise BadInput("--attach: follows a sweep on a running orchestrator; give its --url", field="attach")
    overrides: dict[str, list[Any]] = {}
    for key, values in args.set or []:
        if key in overrides:
            raise BadInput(f"--set: {key} given twice; give its values once, comma-separated", field=f"grid.{key}")
        overrides[key] = values
    req = None if args.attach is not None else load_sweep_request(
        args.file, grid=overrides, duration_ms=args.duration_ms, warmup_ms=args.warmup_ms, scenarios=args.scenarios)
    progress = None if args.quiet else sweep_progress_printer()
    out = Path(args.out)
    settings = orchestrator_settings()
    if args.url is not None:
        res = run_sweep_remote(req, url=args.url, out=out, settings=settings, attach=args.attach, poll_s=args.poll_s,
                               progress=progress)
    else:
        assert req is not None
        res = run_sweep_local(req, out=out, settings=settings, progress=progress)
    print(f"sweep {res.sweep_id}: {res.status}, {res.table_rows} of {res.runs} runs with results; "
          + ", ".join(str(p) for p in res.files))
    check_outcome(res)
    return 0


def register_sweep(sub: Any) -> None:
    p = sub.add_parser("sweep", help=command_help("sweep"))
    p.add_argument("file", nargs="?", default=DEFAULT_SWEEP,
                   help="the sweep request (YAML or JSON: base, grid, name; the body of POST /v1/sweeps; default: "
                        "%(default)s)")
    p.add_argument("--url", default=None,
                   help="a running orchestrator's base URL (a cluster's, or tasmoe serve's); the sweep runs there "
                        f"(its key, with TASMOE_AUTH=keys: the {API_KEY_ENV} environment variable). Default: embedded, "
                        "in this process")
    p.add_argument("--attach", default=None, metavar="SWEEP_ID",
                   help="with --url: follow a sweep already submitted instead of posting the file")
    p.add_argument("--out", default=SWEEP_OUT,
                   help="output folder: sweep.csv, sweep.json, pareto.svg, pareto.png (embedded: also each point's "
                        "folder p000 ...) (default: %(default)s)")
    p.add_argument("--set", "--points", dest="set", action="append", type=_grid_values, metavar="KEY=V1,V2",
                   help="replace a grid key's values (or add a key), e.g. "
                        "--set arch.geometry.cooling.h_wmk2k=5000,10000; repeatable")
    p.add_argument("--scenarios", nargs="+", default=None, choices=ALL_SCENARIOS,
                   help="run only these scenarios at each point (default: the file's)")
    p.add_argument("--duration-ms", type=_positive, default=None,
                   help="the serving workload's arrivals span, ms (workload.serving.duration_ms), for a quick run")
    p.add_argument("--warmup-ms", type=_non_negative, default=None,
                   help="the arch config's thermal warm-up, ms (arch.thermal.warmup_ms), for a quick run")
    p.add_argument("--poll-s", type=_positive, default=10.0,
                   help="with --url: seconds between two polls of GET /v1/sweeps/{id} (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_sweep)


# --- tasmoe experiments list|cancel|clean|prune: the experiments of a database (default: the embedded one) ---------

def _sessions(args: argparse.Namespace) -> tuple[Engine, sessionmaker[Session]]:
    url = args.db or orchestrator_settings().effective_database_url
    try:
        engine, sessions = open_database(url)
    except sa_exc.ArgumentError:
        raise BadInput(f"--db {url!r}: not a database URL (sqlite:///path/to/file.sqlite3, "
                       "postgresql+psycopg://user@host/db)", field="db") from None
    return engine, sessions


def _experiments_list(args: argparse.Namespace) -> int:
    engine, sessions = _sessions(args)
    try:
        with sessions() as s:
            exps, total = repo.list_experiments(session=s, limit=args.limit)
            abandoned = set(repo.abandoned_experiments(session=s))
            rows = [("id", "status", "created (UTC)", "runs", "out")]
            for e in exps:
                runs = repo.runs_of(session=s, exp_id=e.id)
                progress = " ".join(f"{r.scenario}:{r.status.value}@{r.next_window}/{r.n_windows or '?'}"
                                    for r in runs)
                status = e.status.value + (" (abandoned)" if e.id in abandoned else "")
                rows.append((e.id, status, e.created_at.strftime("%Y-%m-%d %H:%M:%S"), progress, e.out_dir))
    finally:
        engine.dispose()
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    print(f"{len(exps)} of {total} experiments; abandoned = unfinished and no process holds a live lease "
          "(tasmoe experiments clean)")
    return 0


def _experiments_cancel(args: argparse.Namespace) -> int:
    engine, sessions = _sessions(args)
    try:
        with sessions.begin() as s:
            if repo.get_experiment(session=s, exp_id=args.id) is None:
                raise NotFound(f"no experiment {args.id!r} in {args.db or 'the embedded database'}", field="id")
            n = repo.cancel_experiment(session=s, exp_id=args.id)
    finally:
        engine.dispose()
    print(f"{args.id}: {n} unfinished run(s) cancelled")
    return 0


def _experiments_clean(args: argparse.Namespace) -> int:
    """Cancel every abandoned experiment (unfinished, no live lease); result files stay where they are."""
    engine, sessions = _sessions(args)
    try:
        with sessions.begin() as s:
            found = repo.abandoned_experiments(session=s)
            for exp_id in found:
                if not args.dry_run:
                    repo.cancel_experiment(session=s, exp_id=exp_id)
                print(f"{exp_id}: {'would cancel' if args.dry_run else 'cancelled'}")
    finally:
        engine.dispose()
    print(f"{len(found)} abandoned experiment(s){' (dry run: nothing changed)' if args.dry_run else ''}")
    return 0


def _experiments_prune(args: argparse.Namespace) -> int:
    """Delete the finished experiments older than ``--older-than`` days from the database (files are kept)."""
    engine, sessions = _sessions(args)
    cutoff = utcnow() - timedelta(days=args.older_than)
    try:
        with sessions.begin() as s:
            found = repo.prune_experiments(session=s, older_than=cutoff)
            if args.dry_run:
                s.rollback()
    finally:
        engine.dispose()
    for exp_id in found:
        print(f"{exp_id}: {'would delete' if args.dry_run else 'deleted'}")
    print(f"{len(found)} finished experiment(s) older than {args.older_than:g} days"
          f"{' (dry run: nothing changed)' if args.dry_run else ' deleted from the database'}; results folders kept")
    return 0


def days(text: str) -> float:
    """``--older-than``: a number of days >= 0 (argparse's type: a bad one is a usage error, exit 2)."""
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if not 0 <= n <= 36500:
        raise argparse.ArgumentTypeError(f"days are 0 to 36500, got {text}")
    return n


def register_experiments(sub: Any) -> None:
    p = sub.add_parser("experiments", help=command_help("experiments"))
    esub = p.add_subparsers(dest="experiments_command", metavar="ACTION", parser_class=type(p))
    esub.required = True
    db_help = "SQLAlchemy URL of the database (default: TASMOE_DATABASE_URL, else the embedded SQLite file)"
    lp = esub.add_parser("list", help="the newest experiments with their runs' progress")
    lp.add_argument("--db", default=None, help=db_help)
    lp.add_argument("--limit", type=int, default=50, help="at most this many (newest first; default: %(default)s)")
    lp.set_defaults(func=_experiments_list)
    cp = esub.add_parser("cancel", help="cancel an experiment's unfinished runs")
    cp.add_argument("id", help="experiment id (tasmoe experiments list)")
    cp.add_argument("--db", default=None, help=db_help)
    cp.set_defaults(func=_experiments_cancel)
    kp = esub.add_parser("clean", help="cancel every abandoned experiment (unfinished, no process running it); "
                                       "result files are kept")
    kp.add_argument("--dry-run", action="store_true", help="only list what would be cancelled")
    kp.add_argument("--db", default=None, help=db_help)
    kp.set_defaults(func=_experiments_clean)
    pp = esub.add_parser("prune", help="delete finished experiments older than N days from the database (their "
                                       "results folders are kept)")
    pp.add_argument("--older-than", type=days, required=True, metavar="DAYS",
                    help="finished (succeeded, failed, cancelled) and last updated more than DAYS days ago")
    pp.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    pp.add_argument("--db", default=None, help=db_help)
    pp.set_defaults(func=_experiments_prune)
