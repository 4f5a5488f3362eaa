"""``tasmoe ir`` and ``tasmoe trace``: the workload service's functions from the command line."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from services.commands import command_help
from services.workload.ir.hf_config import from_hf_config
from services.workload.service import ir_to_dict
from services.workload.sources import WorkloadSources
from services.workload.traces import (
    generate_logical_traces,
    make_plan,
    routing_summary,
    trace_id_of,
)
from services.workload.zoo import read_config_file
from shared.configs import load_workload
from shared.contracts.workload_api import DEFAULT_WINDOW_MS
from shared.errors import BadInput
from shared.settings import load_settings


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def _sources() -> WorkloadSources:
    """The models and routing files the environment's settings name (``TASMOE_MODELS_DIR``, ``TASMOE_TRACES_DIR``):
    what a workload service started here would find."""
    return WorkloadSources.from_settings(load_settings())


def _ir(args: argparse.Namespace) -> int:
    from services.workload.ir import build_ir

    if args.config:
        path = Path(args.config)
        mc = from_hf_config(read_config_file(path), name=args.model or path.stem, generic=args.generic)
    elif args.model:
        mc = _sources().zoo.get_model_config(args.model)
    else:
        raise BadInput("give --model (a zoo or registered model) or --config (a config.json)", field="model")
    report: dict[str, Any] = ir_to_dict(build_ir(mc, phase=args.phase, batch=args.batch, seq_len=args.seq_len))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    print(f"{report['model']} {report['phase']} batch={report['batch']} seq_len={report['seq_len']} "
          f"({report['attention']})")
    print(f"  params total  {report['params_total'] / 1e9:10.3f} B")
    print(f"  params active {report['params_active'] / 1e9:10.3f} B")
    matmul = report["matmul_flops_per_token"] / 1e9
    print(f"  FLOPs/token   {report['flops_per_token'] / 1e9:10.3f} G (matmul {matmul:.3f} G)")
    print(f"  bytes/token   {report['bytes_per_token'] / 1e9:10.3f} GB")
    return 0


def _trace(args: argparse.Namespace) -> int:
    cfg = load_workload(args.workload)
    if args.seed is not None:
        if args.seed < 0:
            raise BadInput("--seed must be >= 0", field="routing.seed")
        cfg = cfg.model_copy(update={"routing": cfg.routing.model_copy(update={"seed": args.seed})})
    sources = _sources()
    t0 = time.perf_counter()
    cpath, mpath = generate_logical_traces(cfg, args.out, window_ms=args.window_ms, sources=sources)
    dt = time.perf_counter() - t0
    plan = make_plan(cfg, sources)
    print(cpath)
    print(mpath)
    n_win = plan.window_count(args.window_ms)
    print(f"trace {trace_id_of(cfg, args.window_ms, sources)}: {cfg.model_name}, {plan.steps} micro-batches x "
          f"{plan.T} tokens, {n_win} windows of {args.window_ms} ms, written in {dt:.2f} s")
    stats = routing_summary(plan)
    if stats is not None:
        src = f"replayed from {cfg.routing.trace}" if cfg.routing.trace else f"Zipf s={cfg.routing.zipf_s:g}"
        print(f"routing ({src}; first {stats.tokens} tokens), per MoE layer min / mean / max: "
              f"skew (max/mean tokens per expert) {_mmm(stats.skew)}; expert reuse by the next token "
              f"{_mmm(stats.reuse_next)}, by the same sequence's next token {_mmm(stats.reuse_sequence)}")
    return 0


def _mmm(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {sum(xs) / len(xs):.2f} / {max(xs):.2f}"


def register(sub: Any) -> None:
    p = sub.add_parser("ir", help=command_help("ir"))
    p.add_argument("--model", default=None, help="zoo or registered model (mixtral-8x7b, deepseek-v3, ...); with "
                                                  "--config its name (default: the file's stem)")
    p.add_argument("--config", default=None, help="a checkpoint's HuggingFace config.json")
    p.add_argument("--generic", action="store_true", help="read an unsupported model_type with the generic mapping")
    p.add_argument("--phase", choices=["decode", "prefill"], default="decode", help="default: %(default)s")
    p.add_argument("--batch", type=_positive_int, default=1, help="sequences per forward pass (default: 1)")
    p.add_argument("--seq-len", type=_positive_int, default=2048, help="context (decode) or prompt (prefill) length")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.set_defaults(func=_ir)

    p = sub.add_parser("trace", help=command_help("trace"))
    p.add_argument("--workload", required=True, help="configs/workload_*.yaml")
    p.add_argument("--out", default="traces", help="output directory")
    p.add_argument("--window-ms", type=_positive_float, default=DEFAULT_WINDOW_MS, help="write chunk (window) size")
    p.add_argument("--seed", type=int, default=None, help="override routing.seed")
    p.set_defaults(func=_trace)
