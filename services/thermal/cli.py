"""``tasmoe hotspot ...``: HotSpot's own command line (``-name value`` pairs), same inputs, same output files."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from services.commands import command_help
from services.thermal import hotspot
from services.thermal.network import RCNetwork


def _hotspot(args: argparse.Namespace) -> int:
    cl = hotspot.split_command_line(list(args.hotspot_args))
    if not cl.is_batch:
        res = hotspot.main([*cl.options, *(x for t in cl.traces for x in ("-p", str(t)))])
        _note(res.case.net)
        if cl.compare is not None:
            from services.thermal import hotspot_compare

            print(hotspot_compare.format_report(hotspot_compare.compare(res, cl.compare)), end="")
        return 0
    traces = hotspot.batch_traces(cl.traces, cl.batch_dirs)
    opts = hotspot.parse_options([*cl.options, "-p", str(traces[0])])  # every option checked once
    results = hotspot.run_batch(opts, traces)
    _note(results[0][1].case.net)
    for trace, _ in results:
        print(f"{trace}: solved")
    return 0


def _note(net: RCNetwork) -> None:
    note = hotspot.solver_note(net)
    if note is not None:
        print(f"tasmoe hotspot: {note}", file=sys.stderr)


def register(sub: Any) -> None:
    # prefix_chars="+" so that HotSpot's "-c file -p file ..." reach us untouched as positional words
    p = sub.add_parser(
        "hotspot",
        prefix_chars="+",
        help=command_help("hotspot"),
        description="Runs HotSpot's grid model inputs (.flp/.lcf/.ptrace/config) through the thermal service's "
                    "network and writes HotSpot's output files (Kelvin). Options are HotSpot's '-name value' pairs. "
                    "Batch: repeat -p, or --batch DIR (every DIR/*.ptrace): one model build and factorisation for "
                    "all, and each output option names a folder (<folder>/<trace stem>.steady, .grid.steady, "
                    ".ttrace). --compare HOTSPOT_OUTPUT: our blocks against HotSpot's block steady file or "
                    "transient trace of the same inputs (worst block first).",
    )
    p.add_argument("hotspot_args", nargs="*", metavar="-name value", help="HotSpot's own options")
    p.set_defaults(func=_hotspot)
    register_bound(sub)


def _bound(args: argparse.Namespace) -> int:
    from services.thermal import spread_bound_files

    result = spread_bound_files.bound_of_results(Path(args.results), args.scenario, arch_path=Path(args.arch),
                                                 under_c=args.under)
    out = Path(args.out) if args.out else Path(args.results) / spread_bound_files.BOUND_FILE
    spread_bound_files.write_bound(out, result)
    print(spread_bound_files.bound_text(result), end="")
    print(f"written: {out}")
    return 0


def _celsius(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a temperature in degC: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite temperature: {text!r}")
    return value


def register_bound(sub: Any) -> None:
    p = sub.add_parser(
        "bound", help=command_help("bound"),
        description="Reads a scenario's power report in a results folder (<results>/<scenario>/*.power.json) and "
                    "spreads its movable power (logic dynamic, DRAM access) over the chip's cores and vaults in the "
                    "way that keeps the hottest core coolest (a linear programme over the thermal influence "
                    "matrices, leakage at its own temperatures): no placement policy does better in steady state. "
                    "Prints it beside the uniform spread and the share of the work that the best spread holds "
                    "under the first DVFS trip; writes <results>/spread_bound.json.")
    p.add_argument("--arch", required=True, help="the chip's architecture config (YAML or JSON) the run used")
    p.add_argument("--results", required=True, help="the experiment's results folder")
    p.add_argument("--scenario", default="unthrottled",
                   help="whose power (default: unthrottled, the work at the top clock)")
    p.add_argument("--under", type=_celsius, default=None, help="the temperature to hold (degC; default: the "
                   "first DVFS trip)")
    p.add_argument("--out", default=None, help="the JSON file to write (default: <results>/spread_bound.json)")
    p.set_defaults(func=_bound)
