"""``tasmoe hotspot ...``: HotSpot's own command line (``-name value`` pairs), same inputs, same output files."""

from __future__ import annotations

import argparse
from typing import Any

from services.thermal import hotspot


def _hotspot(args: argparse.Namespace) -> int:
    hotspot.main(list(args.hotspot_args))
    return 0


def register(sub: Any) -> None:
    # prefix_chars="+" so that HotSpot's "-c file -p file ..." reach us untouched as positional words
    p = sub.add_parser(
        "hotspot",
        prefix_chars="+",
        help="HotSpot drop-in (grid model): tasmoe hotspot -c hotspot.config -p trace.ptrace "
             "-grid_layer_file stack.lcf -model_type grid -steady_file out.steady [-o out.ttrace] ...",
        description="Runs HotSpot's grid model inputs (.flp/.lcf/.ptrace/config) through the thermal service's "
                    "network and writes HotSpot's output files (Kelvin). Options are HotSpot's '-name value' pairs.",
    )
    p.add_argument("hotspot_args", nargs="*", metavar="-name value", help="HotSpot's own options")
    p.set_defaults(func=_hotspot)
