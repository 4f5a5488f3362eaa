"""``tasmoe place`` (TAPS / default mapping from config files) and ``tasmoe place balance`` (load balance)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from services.commands import command_help
from services.placement.balance import balance, read_loads_file
from services.placement.default import default_placement
from services.placement.inputs import workload_inputs
from services.placement.service import placement_for
from shared.configs import load_arch, load_tas, load_workload
from shared.contracts.placement import Placement
from shared.contracts.placement_api import PlacementRequest
from shared.errors import BadInput


def _place(args: argparse.Namespace) -> int:
    for opt in ("arch", "workload", "tas"):
        if getattr(args, opt) is None:
            raise BadInput(f"--{opt} is required (or use 'tasmoe place balance')", field=opt)
    arch = load_arch(args.arch)
    wl = load_workload(args.workload)
    tas = load_tas(args.tas)
    # the workload's facts and the chip's influence matrix come from the workload and thermal services (in process
    # here: `tasmoe` wires them), as they do for a run
    with args.local_services() as clients:
        inp = workload_inputs(wl, clients, exact=args.exact_load)
        plc: Placement
        if args.method == "default":
            plc = default_placement(arch, inp.moe_layers, len(inp.loads[0]), wl.tensors.weight_shard_mb,
                                    inp.expert_bytes)
        else:  # the service's own function: H, the vault matrix and the pulse responses from the thermal service
            plc = placement_for(PlacementRequest(
                arch=arch, workload=wl, tas=tas, method=args.method, expert_load=inp.loads,
                moe_layers=inp.moe_layers, expert_flops_per_token=inp.expert_flops_per_token,
                expert_bytes=inp.expert_bytes, nonexpert_flops_per_step=inp.nonexpert_flops_per_step,
                nonexpert_bytes_per_step=inp.nonexpert_bytes_per_step), clients)
    plc.meta.notes.append(f"expert loads: {inp.load_source}")
    body = plc.model_dump(mode="json", exclude_none=True)
    if args.out:
        Path(args.out).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps({**body, "predicted_peak_c": plc.meta.predicted_peak_c}, sort_keys=True))
    else:
        n_rep = sum(1 for e in plc.experts.values() if len(e.cores) > 1)
        peak = plc.meta.predicted_peak_c
        print(f"{wl.label}: {len(plc.experts)} expert instances ({n_rep} replicated), {len(plc.tensors)} weight "
              f"shards, method {plc.meta.method}, predicted peak {'n/a' if peak is None else f'{peak:.2f} °C'}")
        for note in plc.meta.notes:
            print(f"  note: {note}")
    return 0


def _balance(args: argparse.Namespace) -> int:
    loads = read_loads_file(args.loads)
    out: dict[str, Any] = balance(loads, args.cores, args.slots)
    if args.json:
        print(json.dumps(out))
        return 0
    for lay in out["layers"]:
        print(f"layer {lay['layer']}: max/mean {lay['max_over_mean']:.4f}, lower bound {lay['lower_bound']:.4g}, "
              f"gap {100 * lay['gap']:.2f} %, replicas per expert {lay['replica_counts']}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("place", help=command_help("place"))
    p.add_argument("--arch", help="arch config YAML")
    p.add_argument("--workload", help="workload config YAML")
    p.add_argument("--tas", help="TAS parameters YAML")
    p.add_argument("--method", choices=["default", "heuristic", "milp"], default="heuristic",
                   help="default mapping, TAPS heuristic or TAPS MILP (default: %(default)s)")
    p.add_argument("--exact-load", action="store_true",
                   help="use the trace's routed-token shares (slow for big models) instead of the Zipf expectation")
    p.add_argument("--out", help="also write placement.json here")
    p.add_argument("--json", action="store_true", help="print the placement (and predicted_peak_c) as JSON")
    p.set_defaults(func=_place)
    psub = p.add_subparsers(dest="place_command", metavar="SUBCOMMAND", parser_class=type(p))
    b = psub.add_parser("balance", help="replicate experts into N slots over the cores (max/mean, gap to a bound)")
    b.add_argument("--loads", required=True, help="CSV (expert_<i> columns, one row per layer) or JSON list of lists")
    b.add_argument("--cores", type=int, default=64, help="cores to balance over (default: %(default)s)")
    b.add_argument("--slots", type=int, required=True, help="total replica slots (>= number of experts)")
    b.add_argument("--json", action="store_true", help="print the balance as JSON")
    b.set_defaults(func=_balance)
