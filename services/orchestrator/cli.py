"""``tasmoe run``: the four scenarios embedded, with a progress bar per scenario (same as scripts/run_all.py)."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from services.commands import command_help
from services.orchestrator import repository as repo
from services.orchestrator.db import open_database
from services.orchestrator.local import check_ok, print_summary, progress_printer, run_local
from services.orchestrator.schemas import ALL_SCENARIOS
from services.orchestrator.settings import orchestrator_settings
from shared.errors import BadInput, NotFound

# `--quick`: the default experiment cut to two micro-batches, warmed up for one arrival interval (the workload repeats
# every 300 ms, so the warm start's mean power is the default's); all four scenarios in ~17 s on two cores
QUICK_WORKLOAD = "configs/workload_quick.yaml"
QUICK_OUT = "results/quick/"
QUICK_WARMUP_MS = 300.0
DEFAULT_WORKLOAD = "configs/workload_mixtral_8x7b.yaml"
DEFAULT_OUT = "results/mixtral/"


def _run(args: argparse.Namespace) -> int:
    if args.quick and args.workload is not None:
        raise BadInput("--quick: runs configs/workload_quick.yaml; leave out --workload", field="workload")
    workload = QUICK_WORKLOAD if args.quick else args.workload or DEFAULT_WORKLOAD
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    warmup = args.warmup_ms if args.warmup_ms is not None else QUICK_WARMUP_MS if args.quick else None
    res = run_local(arch=args.arch, workload=workload, tas=args.tas, out=out, scenarios=args.scenarios,
                    seed=args.seed, windows=args.windows, traces=not args.no_traces, events=args.events,
                    progress=None if args.quiet else progress_printer(), warmup_ms=warmup)
    print_summary(res)
    check_ok(res)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("run", help=command_help("run"))
    p.add_argument("--arch", default="configs/arch_8x8_32x32x8.yaml", help="arch config (default: %(default)s)")
    p.add_argument("--workload", default=None, help=f"workload config (default: {DEFAULT_WORKLOAD})")
    p.add_argument("--tas", default="configs/tas_params.yaml", help="TAS parameters (default: %(default)s)")
    p.add_argument("--out", default=None, help=f"output folder (default: {DEFAULT_OUT}; with --quick {QUICK_OUT})")
    p.add_argument("--quick", action="store_true",
                   help=f"a quick look: {QUICK_WORKLOAD} (two micro-batches of the default experiment) with a "
                        f"{QUICK_WARMUP_MS:g} ms warm-up; a check that everything runs, not a result")
    p.add_argument("--warmup-ms", type=float, default=None,
                   help="replace the arch config's thermal.warmup_ms (ms) for this run")
    p.add_argument("--scenarios", nargs="+", default=list(ALL_SCENARIOS), choices=ALL_SCENARIOS,
                   help="the scenarios to run (default: all four)")
    p.add_argument("--seed", type=int, default=None, help="routing seed (default: the workload config's)")
    p.add_argument("--windows", type=int, default=None, help="run only the first N windows")
    p.add_argument("--no-traces", action="store_true",
                   help="do not write the logical trace and the overlays (traces/*.csv.gz, runs/*/runtime/*.csv)")
    p.add_argument("--events", action="store_true",
                   help="also write the physical events (runs/<scenario>/traces/physical/*.csv.gz; ~100 MB per "
                        "scenario of the default experiment)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run)
    register_experiments(sub)


# --- tasmoe experiments list|cancel|clean: the experiments of a database (default: the embedded one) ---------------

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
