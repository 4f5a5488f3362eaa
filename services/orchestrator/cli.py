"""``tasmoe run``: the four scenarios embedded, with a progress bar per scenario (same as scripts/run_all.py)."""

from __future__ import annotations

import argparse
from typing import Any

from services.orchestrator.local import check_ok, print_summary, progress_printer, run_local
from services.orchestrator.schemas import ALL_SCENARIOS
from shared.errors import BadInput

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
                    seed=args.seed, windows=args.windows, traces=not args.no_traces,
                    progress=None if args.quiet else progress_printer(), warmup_ms=warmup)
    print_summary(res)
    check_ok(res)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run an experiment embedded (four scenarios -> <out>/<scenario>/<workload>.csv)")
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
    p.add_argument("--no-traces", action="store_true", help="do not write the per-window trace and event files")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_run)
