"""Run the scenarios of an experiment embedded and write ``<out>/<scenario>/<workload>.csv`` (seed 001 §4.8, §9.4);
the defaults are the reference chip's experiment (``default_experiment.REFERENCE``, the seed's interface)::

    python scripts/run_all.py --arch configs/arch_8x8_32x32x8.yaml \\
        --workload configs/workload_mixtral_8x7b.yaml --tas configs/tas_params.yaml --out results/mixtral/
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in {None, ""}:  # `python scripts/run_all.py` as well as `python -m scripts.run_all`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.orchestrator.default_experiment import REFERENCE
from services.orchestrator.local import check_ok, print_summary, run_local
from services.orchestrator.progress import progress_printer
from services.orchestrator.schemas import ALL_SCENARIOS, POLICY_SCENARIOS
from shared.errors import TasmoeError
from shared.logging import setup_logging


def parser(prog: str = "run_all.py", *, single: bool = False) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--arch", default=REFERENCE.arch)
    ap.add_argument("--workload", default=REFERENCE.workload)
    ap.add_argument("--tas", default=REFERENCE.tas)
    ap.add_argument("--out", default=REFERENCE.out)
    if single:
        ap.add_argument("--scenario", required=True, choices=ALL_SCENARIOS)
    else:
        ap.add_argument("--scenarios", nargs="+", default=list(POLICY_SCENARIOS), choices=ALL_SCENARIOS)
    ap.add_argument("--seed", type=int, default=None, help="routing seed (default: the workload config's)")
    ap.add_argument("--windows", type=int, default=None, help="run only the first N windows")
    ap.add_argument("--no-traces", action="store_true", help="skip the logical trace and the overlays")
    ap.add_argument("--events", action="store_true", help="also write the physical events (~100 MB per scenario)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    return ap


def main(argv: Sequence[str] | None = None, *, single: bool = False, prog: str = "run_all.py") -> int:
    args = parser(prog, single=single).parse_args(argv)
    setup_logging("WARNING")
    scenarios = [args.scenario] if single else args.scenarios
    try:
        res = run_local(arch=args.arch, workload=args.workload, tas=args.tas, out=args.out, scenarios=scenarios,
                        seed=args.seed, windows=args.windows, traces=not args.no_traces, events=args.events,
                        progress=None if args.quiet else progress_printer())
        print_summary(res)
        check_ok(res)
    except TasmoeError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
