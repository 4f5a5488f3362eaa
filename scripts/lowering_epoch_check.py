"""Record and time the lowering service's windows on the shipped experiments, to compare two checkouts byte for byte.

``record``: every window's answer of ``services.lowering.service.physicalize`` called window after window (each call
with the previous call's state, TACS-shaped overlays at the first window only), one JSON line per window (events,
deposit, timing, state), into ``--out``. Uses only what ``physicalize`` has always had, so any checkout can record
(``PYTHONPATH=<checkout> python scripts/lowering_epoch_check.py record ...``). ``epoch``: the same windows from one
``physicalize_epoch`` call (this checkout only), in the same format. ``time``: per-window CPU
(``time.process_time``) of the sequential calls (state sent and answered as JSON, deposit included) against the
epoch's, alternated A/B, medians.

Scenarios: ``default`` (configs/workload_mixtral_8x7b.yaml: one micro-batch of 32 every 300 ms) and ``saturated``
(configs/workload_mixtral_8x7b_saturated.yaml: one every 1 ms, admission sheds), on configs/arch_8x8_32x32x8.yaml with
the default placement, 3 ms windows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def scenario(name: str, n_windows: int, start: int = 0) -> dict[str, Any]:
    """Arch, placement, logical windows ``start .. start + n_windows - 1``, TACS-shaped overlays and replicas."""
    from services.placement.default import default_placement
    from services.workload.service import TraceCache, create_trace, get_window
    from services.workload.sources import WorkloadSources
    from shared.configs import load_arch, load_workload
    from shared.dvfs import top_freqs

    arch = load_arch(ROOT / "configs" / "arch_8x8_32x32x8.yaml")
    wl_file = {"default": "workload_mixtral_8x7b.yaml", "saturated": "workload_mixtral_8x7b_saturated.yaml"}[name]
    cfg = load_workload(ROOT / "configs" / wl_file)
    cache = TraceCache()
    summary = create_trace(cache, WorkloadSources.packaged(), cfg, 3.0)
    entry = cache.get(summary.trace_id)
    placement = default_placement(arch, summary.moe_layers, summary.n_experts, cfg.tensors.weight_shard_mb,
                                  summary.expert_bytes)
    windows = [get_window(entry, k) for k in range(start, start + n_windows)]
    overlays, replicas = tacs_overlays(placement, arch, windows[0].t0_ns)
    return {"arch": arch, "placement": placement, "windows": windows, "n_layers": summary.n_layers,
            "freq": top_freqs(arch), "overlays": overlays, "replicas": replicas}


def tacs_overlays(placement: Any, arch: Any, t_apply: int) -> tuple[Any, Any]:
    """A TACS step's answer as ``services.placement.tacs`` writes it: expert L0E0 migrated from its core to another
    (one ``expert`` row, one ``weight`` row per shard, the replica state with its ``shard_banks``), an ``expert``
    reroute row for it, and an ``mb`` reroute row moving micro-batches 0-1's work off core 3."""
    from shared.chip import Chip
    from shared.contracts.placement import OverlayMigrate, OverlayReroute, Overlays, ReplicaEntry, ReplicaState

    chip = Chip.from_arch(arch)
    eid = "L0E0"
    src = placement.experts[eid].cores[0]
    dst = (src + 9) % chip.n_cores
    shards = sorted(t for t in placement.tensors if t.startswith("W_L0E0_"))
    key_part, core_part = chip.vault_bank_parts(__import__("numpy").arange(len(shards)))
    dst_banks = [chip.bank_str(int(key_part[i] + core_part[dst])) for i in range(len(shards))]
    mg: dict[str, list[Any]] = {k: [] for k in OverlayMigrate.model_fields}
    for row in [("expert", eid, str(src), str(dst), 0)] + [
            ("weight", t, placement.tensors[t].dram_bank, b, placement.tensors[t].size_bytes)
            for t, b in zip(shards, dst_banks, strict=True)]:
        for k, v in zip(("obj_type", "obj_id", "src", "dst", "size_bytes"), row, strict=True):
            mg[k].append(v)
        mg["t_apply_ns"].append(t_apply)
        mg["cost"].append(1.0)
    rr = {"t_apply_ns": [t_apply, t_apply], "scope": ["expert", "mb"], "from_core": [src, 3], "to_core": [dst, 4],
          "mb_ids_json": [json.dumps([eid]), "[0, 1]"], "reason": ["migrate", "hot_core"],
          "expected_gain": [0.5, 0.25]}
    experts = {e: ReplicaEntry(cores=list(p.cores), ts_created_ns=0) for e, p in sorted(placement.experts.items())}
    experts[eid] = ReplicaEntry(cores=[dst], ts_created_ns=t_apply, last_change_ns=t_apply, prev_cores=[src],
                                shard_banks=dst_banks)
    return (Overlays(reroute=OverlayReroute.model_validate(rr), migrate=OverlayMigrate.model_validate(mg)),
            ReplicaState(experts=experts))


def sequential(sc: dict[str, Any], state_json: str | None = None, *, with_overlays: bool = True,
               ) -> tuple[list[str], str]:
    """One JSON line per window from ``physicalize`` window after window, and the last state's JSON."""
    from services.lowering import service
    from shared.contracts.events import PhysicalizeRequest, PhysicalState
    from shared.contracts.placement import Overlays

    lines: list[str] = []
    for i, lw in enumerate(sc["windows"]):
        first = i == 0 and with_overlays
        req = PhysicalizeRequest(
            window=lw.window, logical=lw, placement=sc["placement"], arch=sc["arch"],
            overlays=sc["overlays"] if first else Overlays(), replicas=sc["replicas"] if first else None,
            state=PhysicalState.model_validate_json(state_json) if state_json is not None else None,
            freq_ghz=sc["freq"], window_ms=3.0, bw_eff_factor=1.0, n_layers=sc["n_layers"])
        r = service.physicalize(req)
        assert r.state is not None and r.deposit is not None
        state_json = r.state.model_dump_json()
        lines.append(_line(r.compute, r.memory, r.deposit, r.timing))
    assert state_json is not None
    return lines, state_json


def _line(compute: Any, memory: Any, deposit: Any, timing: Any) -> str:
    return "{" + ",".join(f'"{k}":{v.model_dump_json() if v is not None else "null"}' for k, v in
                          (("compute", compute), ("memory", memory), ("deposit", deposit), ("timing", timing))) + "}"


def epoch(sc: dict[str, Any], state_json: str | None = None, *, with_overlays: bool = True,
          ) -> tuple[list[str], str]:
    from services.lowering.epoch import physicalize_epoch
    from shared.contracts.events import PhysicalizeEpochRequest, PhysicalState
    from shared.contracts.placement import Overlays

    req = PhysicalizeEpochRequest(
        window=sc["windows"][0].window, logical=sc["windows"], placement=sc["placement"], arch=sc["arch"],
        overlays=sc["overlays"] if with_overlays else Overlays(),
        replicas=sc["replicas"] if with_overlays else None,
        state=PhysicalState.model_validate_json(state_json) if state_json is not None else None,
        freq_ghz=sc["freq"], window_ms=3.0, bw_eff_factor=1.0, n_layers=sc["n_layers"])
    r = physicalize_epoch(req)
    assert r.state is not None
    return [_line(w.compute, w.memory, w.deposit, w.timing) for w in r.windows], r.state.model_dump_json()


def record(args: argparse.Namespace) -> None:
    sc = scenario(args.scenario, args.windows)
    run = epoch if args.cmd == "epoch" else sequential
    lines, st = run(sc)
    if args.mid:  # then a second run of windows from the state the first one left
        sc2 = scenario(args.scenario, args.mid, start=args.windows)
        more, st = run(sc2, st, with_overlays=False)
        lines += more
    Path(args.out).write_text("\n".join([*lines, st]) + "\n")
    print(f"{len(lines)} windows -> {args.out}", file=sys.stderr)


def timing(args: argparse.Namespace) -> None:
    """Per-window CPU (``time.process_time``) of ``--repeat`` runs over ``--windows`` windows (after ``--skip``
    windows physicalized first: a mid-run state), median printed. ``seq``: ``physicalize`` window after window, the
    state parsed from the previous answer's JSON and the answer's state written as JSON (what crosses HTTP), the
    deposit included; ``epoch``: one ``physicalize_epoch`` call (request objects built beforehand). ``--no-events``:
    the deposit only. Run it once per checkout and mode, alternating, to compare."""
    from services.lowering import service
    from shared.contracts.events import PhysicalizeRequest, PhysicalState
    from shared.contracts.placement import Overlays

    sc = scenario(args.scenario, args.windows + args.skip)
    warm, ws = sc["windows"][:args.skip], sc["windows"][args.skip:]
    st0 = sequential({**sc, "windows": warm})[1] if warm else None
    common = {"placement": sc["placement"], "arch": sc["arch"], "freq_ghz": sc["freq"], "window_ms": 3.0,
              "bw_eff_factor": 1.0, "n_layers": sc["n_layers"], "events": not args.no_events}

    def seq() -> float:
        state_json = st0
        t = time.process_time()
        for lw in ws:
            req = PhysicalizeRequest(window=lw.window, logical=lw, overlays=Overlays(), **common,
                                     state=PhysicalState.model_validate_json(state_json) if state_json else None)
            r = service.physicalize(req)
            assert r.state is not None
            state_json = r.state.model_dump_json()
        return (time.process_time() - t) / len(ws)

    def epo() -> float:
        from services.lowering.epoch import physicalize_epoch
        from shared.contracts.events import PhysicalizeEpochRequest

        state0 = PhysicalState.model_validate_json(st0) if st0 is not None else None
        req = PhysicalizeEpochRequest(window=ws[0].window, logical=ws, state=state0, **common)
        t = time.process_time()
        physicalize_epoch(req)
        return (time.process_time() - t) / len(ws)

    run = epo if args.mode == "epoch" else seq
    runs = [run() for _ in range(args.repeat)]
    print(f"{args.scenario} {args.mode}: {statistics.median(runs) * 1e3:.3f} ms/window, median of {len(runs)} "
          f"(runs {[round(x * 1e3, 3) for x in runs]})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cmd", choices=["record", "epoch", "time"])
    p.add_argument("--scenario", choices=["default", "saturated"], default="default")
    p.add_argument("--windows", type=int, default=300)
    p.add_argument("--mid", type=int, default=0, help="record: this many more windows from the first run's state")
    p.add_argument("--skip", type=int, default=0, help="time: windows physicalized first (a mid-run state)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--mode", choices=["seq", "epoch"], default="epoch", help="time: what is timed")
    p.add_argument("--no-events", action="store_true", help="time: answer the deposit only")
    p.add_argument("--out", default="/tmp/windows.jsonl")
    args = p.parse_args()
    if args.cmd == "time":
        timing(args)
    else:
        record(args)


if __name__ == "__main__":
    main()
