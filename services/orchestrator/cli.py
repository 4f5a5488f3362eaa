"""``tasmoe run``: the four scenarios embedded, with a progress bar per scenario (same as scripts/run_all.py)."""

from __future__ import annotations

import argparse
from typing import Any

from services.orchestrator.local import check_ok, print_summary, progress_printer, run_local
from services.orchestrator.schemas import ALL_SCENARIOS


def _run(args: argparse.Namespace) -> int:
    res = run_local(arch=args.arch, workload=args.workload, tas=args.tas, out=args.out, scenarios=args.scenarios,
                    seed=args.seed, windows=args.windows, traces=not args.no_traces,
                    progress=None if args.quiet else progress_printer())
    print_summary(res)
    check_ok(res)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run an experiment embedded (four scenarios -> <out>/<scenario>/<workload>.csv)")
    p.add_argument("--arch", default="configs/arch_8x8_32x32x8.yaml")
    p.add_argument("--workload", default="configs/workload_mixtral_8x7b.yaml")
    p.add_argument("--tas", default="configs/tas_params.yaml")
    p.add_argument("--out", default="results/mixtral/")
    p.add_argument("--scenarios", nargs="+", default=list(ALL_SCENARIOS), choices=ALL_SCENARIOS)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--windows", type=int, default=None)
    p.add_argument("--no-traces", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_run)
