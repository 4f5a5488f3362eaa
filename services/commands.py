"""The services' ``tasmoe`` subcommands: which service's ``cli.register`` adds each one, and its one-line help.

This table is the only owner of both, so that ``tasmoe <command>`` imports that one service's CLI (``tasmoe hotspot``
never imports the orchestrator, SQLAlchemy or matplotlib) and ``tasmoe --help`` lists every command without importing
any service. ``tests/platform/test_cli_imports.py`` checks it against what each service's ``register`` adds.
This module imports nothing: it is read at every start of the command.
"""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    service: str  # the package under services/ whose cli.register adds the command
    help: str  # the line `tasmoe --help` prints for it
    # False: the command reads no TASMOE_* setting, so its start loads none (pydantic-settings is ~0.15 s of a
    # HotSpot user's one-process-per-case run); it logs warnings and errors, or what --log-level asks for
    settings: bool = True


COMMANDS: dict[str, Command] = {
    "hotspot": Command("thermal", "HotSpot drop-in (grid model): tasmoe hotspot -c hotspot.config -p trace.ptrace "
                                  "-grid_layer_file stack.lcf -model_type grid -steady_file out.steady "
                                  "[-o out.ttrace] ...", settings=False),
    "bound": Command("thermal", "the best spread: the lowest steady peak any placement of a run's power reaches, "
                                "and how much of that work it holds under the first DVFS trip", settings=False),
    "lower": Command("lowering", "lowering: GEMM cost, tile ISA streams"),
    "compare": Command("metrics", "compare scenarios: reads DIR/<scenario>/<workload>.csv, writes comparison.csv and "
                                  "comparison.md, prints the Markdown table"),
    "plot": Command("metrics", "render a figure from a results folder (PNG or SVG)"),
    "reduce": Command("metrics", "reduce a .windows.jsonl[.gz] series to results/<scenario>/<workload>.csv"),
    "run": Command("orchestrator", "run an experiment embedded (make run: the default one; --quick: a short check): "
                                   "each scenario's result row, the comparison and the figures in its results folder"),
    "capacity": Command("orchestrator", "measure a chip's serving capacity under the workload's SLO (bisection over "
                                        "served runs of one scenario)"),
    "sweep": Command("orchestrator", "run a sweep (POST /v1/sweeps) on a running orchestrator (--url) or embedded: "
                                     "<out>/sweep.csv and the Pareto figure pareto.svg/png"),
    "experiments": Command("orchestrator", "list, cancel, clean up or prune the experiments of a database (default: "
                                           "the embedded results/tasmoe.sqlite3)"),
    "place": Command("placement", "expert placement: TAPS / default mapping; 'place balance' for load balancing"),
    "ir": Command("workload", "WorkloadIR of a model: parameters, FLOPs and bytes per token, per-layer rows"),
    "trace": Command("workload", "write logical_compute.csv and logical_memory.csv for a workload config"),
}


def command_help(name: str) -> str:
    """The help line of a service's subcommand (for its ``cli.register``)."""
    return COMMANDS[name].help
