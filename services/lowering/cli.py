"""``tasmoe lower ...``: cost and lower one GEMM or one op from the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any, cast

from pydantic import TypeAdapter, ValidationError

from services.commands import command_help
from services.lowering.costmodel import gemm_cost
from services.lowering.isa import Builder, DeviceProfile
from services.lowering.lower import lower_matmul
from services.lowering.ops import OpSpec, lower_op, validator_for
from services.lowering.streamcost import stream_cost
from shared.configs import ArchConfig, load_arch
from shared.errors import BadInput, first_validation_error

# the alias as a value: mypy reads the Annotated union as a UnionType object in some orders of a whole-tree check
_OP_ADAPTER: TypeAdapter[OpSpec] = TypeAdapter(cast(Any, OpSpec))


def _array(s: str) -> tuple[int, int]:
    try:
        r, c = (int(x) for x in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"array must look like 32x32, got {s!r}") from None
    if r < 1 or c < 1:
        raise argparse.ArgumentTypeError("array sides must be >= 1")
    return r, c


def _arch(path: str | None) -> ArchConfig:
    return load_arch(path) if path else ArchConfig()


def _gemm(args: argparse.Namespace) -> int:
    arch = _arch(args.arch)
    array = args.array or arch.core.array
    dataflow = args.dataflow or arch.core.dataflow
    spm = (args.spm_kb or arch.core.spm_kb) * 1024
    bpc = args.dma_bytes_per_cycle or arch.core.dma_bytes_per_cycle
    dtype = args.dtype or arch.core.dtype
    g = gemm_cost(args.m, args.k, args.n, array=array, dataflow=dataflow, spm_bytes=spm, dma_bytes_per_cycle=bpc,
                  dtype=dtype, arch=arch, burst_bytes=arch.core.dma_burst_bytes)
    prof = DeviceProfile(spm_bytes=spm, array=array, burst_bytes=arch.core.dma_burst_bytes, dtype=dtype,
                         vector_width=arch.core.vector_width, dma_bytes_per_cycle=bpc, dataflow=dataflow)
    b = Builder(prof)
    lower_matmul(b, args.m, args.k, args.n)
    violations = validator_for(b).validate(b.instrs)
    sc = stream_cost(b.instrs, prof, arch)
    out: dict[str, Any] = {
        "M": args.m, "K": args.k, "N": args.n, "array": f"{array[0]}x{array[1]}", "dataflow": dataflow,
        "dtype": dtype, "compute_cycles": g.compute_cycles, "total_cycles": g.total_cycles,
        "dram_bytes": g.dram_bytes, "compulsory_bytes": g.compulsory_bytes, "energy_j": g.energy_j,
        "energy_breakdown_j": g.energy_breakdown_j, "tiling": g.tiling.as_dict, "instructions": len(b.instrs),
        "stream_cycles": sc.cycles, "violations": len(violations),
    }
    if args.emit:
        out["stream"] = b.tuples()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k in ("compute_cycles", "total_cycles", "dram_bytes", "energy_j", "instructions"):
            print(f"{k:16s} {out[k]}")
        t = g.tiling
        print(f"{'tiling':16s} Mt={t.Mt} Kt={t.Kt} Nt={t.Nt} {'double' if t.double_buffered else 'single'}-buffered")
    return 0


def _parse_kv(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in pairs:
        if "=" not in p:
            raise BadInput(f"expected key=value, got {p!r}", field=p)
        k, v = p.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _op(args: argparse.Namespace) -> int:
    arch = _arch(args.arch)
    body = {"kind": args.kind, **_parse_kv(args.params)}
    try:
        spec: Any = _OP_ADAPTER.validate_python(body)
    except ValidationError as exc:
        field, msg = first_validation_error(exc, skip_loc_prefix=1)
        raise BadInput(f"{field}: {msg}", field=field) from None
    r = lower_op(spec, arch, dtype=args.dtype, include_instructions=args.emit)
    out = r.model_dump()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        c = r.cost
        print(f"{'op':16s} {r.kind}")
        for k in ("cycles", "te_cycles", "ve_cycles", "dram_bytes", "macs", "energy_j"):
            print(f"{k:16s} {c[k]}")
        print(f"{'instructions':16s} {r.n_instructions}")
        print(f"{'spm_peak_bytes':16s} {r.spm_peak_bytes}")
        print(f"{'violations':16s} {len(r.violations)}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("lower", help=command_help("lower"))
    lsub = p.add_subparsers(dest="lower_command", metavar="WHAT", parser_class=type(p))
    lsub.required = True
    g = lsub.add_parser("gemm", help="cost one GEMM (M x K) . (K x N) and lower it to a tile ISA stream")
    g.add_argument("--m", type=int, required=True, help="rows of the left operand (M)")
    g.add_argument("--k", type=int, required=True, help="inner dimension (K)")
    g.add_argument("--n", type=int, required=True, help="columns of the right operand (N)")
    g.add_argument("--array", type=_array, default=None, help="systolic array RxC (default: arch.core.array)")
    g.add_argument("--dataflow", choices=["os", "ws"], default=None,
                   help="output- or weight-stationary (default: arch.core.dataflow)")
    g.add_argument("--spm-kb", type=int, default=None, help="scratchpad size in KiB (default: the arch's)")
    g.add_argument("--dma-bytes-per-cycle", type=float, default=None,
                   help="DMA bandwidth in bytes per core cycle (default: the arch's)")
    g.add_argument("--dtype", default=None, help="fp16, bf16, fp32, int8")
    g.add_argument("--arch", default=None, help="arch YAML (default: built-in defaults)")
    g.add_argument("--json", action="store_true", help="print the cost as JSON")
    g.add_argument("--emit", action="store_true", help="include the instruction stream (with --json)")
    g.set_defaults(func=_gemm)
    o = lsub.add_parser("op", help="lower one op: KIND key=value ... (kinds: matmul conv2d ffn swiglu_ffn rmsnorm "
                                   "layernorm softmax gelu bias_add qkv attention moe_experts)")
    o.add_argument("kind", help="the op kind (listed above)")
    o.add_argument("params", nargs="*", help="op parameters, e.g. M=32 N=4096")
    o.add_argument("--dtype", default=None, help="fp16, bf16, fp32, int8")
    o.add_argument("--arch", default=None, help="arch YAML (default: built-in defaults)")
    o.add_argument("--json", action="store_true", help="print the lowering as JSON")
    o.add_argument("--emit", action="store_true", help="include the instruction stream (with --json)")
    o.set_defaults(func=_op)
