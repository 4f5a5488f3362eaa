"""``tasmoe reduce``, ``tasmoe compare`` and ``tasmoe plot`` (the metrics service's subcommands)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from services.commands import command_help
from services.metrics.compare import collect_result_rows, compare_all, compare_markdown, write_compare
from services.metrics.plots import FORMATS, KINDS, render_plot
from services.metrics.reduce import reduce_window_metrics, write_result_csv
from services.metrics.series import load_plot_request, read_windows
from shared.contracts.metrics import SCENARIOS
from shared.errors import BadInput


def _scenarios(text: str | None) -> list[str] | None:
    if not text:
        return None
    names = [s.strip() for s in text.split(",") if s.strip()]
    for s in names:
        if s not in SCENARIOS:
            raise BadInput(f"--scenarios: unknown scenario {s!r}; known: {', '.join(SCENARIOS)}", field="scenarios")
    return names


def _compare(args: argparse.Namespace) -> int:
    rows = collect_result_rows(Path(args.results), workload=args.workload, scenarios=_scenarios(args.scenarios))
    tables = compare_all(rows)
    out = Path(args.out) if args.out else Path(args.results)
    csv_path, md_path = write_compare(tables, out)
    print(compare_markdown(tables), end="")
    print(f"\nwrote {csv_path} and {md_path}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    out = Path(args.out)
    fmt = args.format or out.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise BadInput(f"--out: cannot tell the format from {out.name!r}; use a .png or .svg name or --format",
                       field="format")
    req = load_plot_request(Path(args.results), args.workload, dram_layer=args.dram_layer, thot_c=args.thot)
    data = render_plot(args.kind, req, fmt)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    print(f"wrote {out} ({len(data)} bytes, {args.kind}, {req.workload})")
    return 0


def _reduce(args: argparse.Namespace) -> int:
    windows = read_windows(Path(args.windows))
    row = reduce_window_metrics(windows, scenario=args.scenario, workload=args.workload, thot_c=args.thot,
                                bw_raw_gbps=args.bw_raw_gbps)
    path = write_result_csv(row, Path(args.results))
    print(path.read_text(encoding="utf-8"), end="")
    print(f"wrote {path}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("compare", help=command_help("compare"))
    p.add_argument("results", help="results folder holding baseline/, taps/, tacs/, tas/")
    p.add_argument("--workload", default=None, help="only this workload (default: every workload found)")
    p.add_argument("--scenarios", default=None, help="comma-separated subset, baseline included (default: all four)")
    p.add_argument("--out", default=None, help="folder for comparison.csv and .md (default: the results folder)")
    p.set_defaults(func=_compare)

    p = sub.add_parser("plot", help=command_help("plot"))
    p.add_argument("kind", choices=KINDS, help="the figure to draw")
    p.add_argument("--results", required=True, help="folder holding <scenario>/<workload>.csv and .windows.jsonl.gz")
    p.add_argument("--out", required=True, help="output file (.png or .svg)")
    p.add_argument("--workload", default=None, help="needed when the folder holds several workloads")
    p.add_argument("--format", choices=FORMATS, default=None, help="default: from the --out suffix")
    p.add_argument("--dram-layer", type=int, default=None, help="heat map DRAM layer (default: the hottest)")
    p.add_argument("--thot", type=float, default=None, help="Thot line in °C (default: the CSV's thot_c)")
    p.set_defaults(func=_plot)

    p = sub.add_parser("reduce", help=command_help("reduce"))
    p.add_argument("windows", help="a .windows.jsonl.gz or .windows.jsonl file (one WindowMetrics JSON per line)")
    p.add_argument("--scenario", required=True, choices=SCENARIOS, help="the scenario the windows belong to")
    p.add_argument("--workload", required=True, help="workload label (the CSV's name)")
    p.add_argument("--thot", type=float, required=True, help="Thot in °C (for time_above_thot_ms)")
    p.add_argument("--bw-raw-gbps", type=float, default=None, help="raw DRAM bandwidth, for bw_util_raw")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.set_defaults(func=_reduce)
