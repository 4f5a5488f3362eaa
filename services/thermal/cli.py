"""``tasmoe hotspot ...``: HotSpot's own command line (``-name value`` pairs), same inputs, same output files."""

from __future__ import annotations

import argparse
import sys
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
