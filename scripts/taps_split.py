"""Split TAPS's gain over baseline into its two parts: the core mapping and the banks of the weight shards.

TAPS changes two things against baseline's default placement (services/placement/default.py): which core each expert
runs on (``Placement.experts[eid].cores``) and which DRAM bank holds each weight shard
(``Placement.tensors[tid].dram_bank`` / ``replica_banks``: the default mapping fills each owner core's vault in slot
order, TAPS's ``assemble`` uses the bank book, services/placement/shards.py). This script builds two hybrids and runs
them as baseline runs with a hand-made placement (``ExperimentRequest.placement``):

- ``mix_a``: baseline's cores, the bank book's banks for them: ``taps.build_problem`` with the very inputs the
  placement service gives TAPS (the trace's loads, FLOPs and bytes, the thermal service's H and H_vault; no replicas,
  as the default mapping has none) and ``taps.assemble`` on the default mapping's assignment;
- ``mix_b``: TAPS's cores (replicas as TAPS has them), each expert's shards in its owner core's vault in the default
  mapping's slot order (experts in the default mapping's order, a per-core cursor; replica copies likewise in their
  core's vault).

It checks both builders first (``assemble`` on TAPS's own assignment gives TAPS's banks; the slot-order builder on the
default cores gives the default placement's banks) and each hybrid (same experts and tensors, no bank over
``arch.dram.bank_capacity_mb``), then runs four runs with the embedded worker pool (``TASMOE_POOL_WORKERS``, default
2 at a time): one experiment with ``baseline`` and ``taps`` (as ``scripts/run_all.py``), and one ``baseline``
experiment per hybrid. It prints T_peak_logic, T_peak_dram, ips (tok/s) and energy (J) of each, with deltas against
baseline, and writes them to ``<out>/taps_split.csv`` (hybrid placements in ``<out>/placements/``)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m scripts.taps_split --out results/taps_split   # ~13 min
    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m scripts.taps_split --out /tmp/ts_quick \\
        --workload configs/workload_quick.yaml --warmup-ms 300                                   # a quick check
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in {None, ""}:  # `python scripts/taps_split.py` as well as `python -m scripts.taps_split`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from services.orchestrator import repository as repo
from services.orchestrator.db import make_engine, session_factory, upgrade
from services.orchestrator.jobs import ProcessRunner
from services.orchestrator.local import with_warmup
from services.orchestrator.pipeline_clients import Pipeline, TraceInfo
from services.orchestrator.run_files import placement_path, result_csv_path
from services.orchestrator.schemas import ExperimentRequest, Scenario
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.settings import orchestrator_settings
from services.orchestrator.worker import compute_clients
from services.placement.geometry import MIB, ChipGeometry
from services.placement.shards import shard_sizes
from services.placement.taps import CRITICAL_PATH_TOL, Problem, assemble, build_problem
from shared.configs import ArchConfig, TasParams, WorkloadConfig, load_arch, load_tas, load_workload
from shared.contracts.ids import expert_id, weight_tensor_id
from shared.contracts.placement import Placement, PlacementMeta, TensorPlacement
from shared.logging import setup_logging
from shared.peers import thermal_influence

ROWS = ("baseline", "taps", "mix_a", "mix_b")
COLUMNS = ("T_peak_logic", "T_peak_dram", "ips", "energy_j")


@dataclass(frozen=True)
class Inputs:
    """What the placement service gives TAPS for this experiment (services/placement/service.py `placement_for`)."""

    arch: ArchConfig
    workload: WorkloadConfig
    tas: TasParams
    trace: TraceInfo
    expert_load: list[list[float]]
    H: np.ndarray
    H_vault: np.ndarray | None


def problem(inp: Inputs, replicate_hot_k: int) -> Problem:
    """TAPS's problem as `placer.build_placement` builds it (``replicate_hot_k`` 0: no replicas), but without the
    thermal service's die shares (``vault_influence``): its temperatures differ from the service's, its banks do
    not (the bank book reads the instances' read demand only), and banks are all this script takes from it (checked
    against TAPS's own)."""
    return build_problem(inp.arch, inp.workload, inp.tas.taps, inp.expert_load, inp.trace.flops_per_token_expert,
                         inp.H, moe_layers=inp.trace.moe_layers, expert_bytes=float(int(inp.trace.expert_bytes)),
                         critical_path_tol=CRITICAL_PATH_TOL, replicate_hot_k=replicate_hot_k,
                         nonexpert_flops_per_step=inp.trace.nonexpert_flops_per_step,
                         nonexpert_bytes_per_step=inp.trace.nonexpert_bytes_per_step, H_vault=inp.H_vault)


def assignment(pb: Problem, plc: Placement) -> np.ndarray:
    """The instance → core assignment of ``plc`` in the problem's instance order (replica r of an expert: its r-th
    instance). Fails when the placement's replica counts differ from the problem's."""
    assign = np.full(pb.m, -1, dtype=np.int64)
    seen: dict[int, int] = {}
    for i in range(pb.m):
        k = int(pb.inst_expert[i])
        r = seen.get(k, 0)
        seen[k] = r + 1
        cores = plc.experts[expert_id(int(pb.expert_layer[k]), int(pb.expert_e[k]))].cores
        assign[i] = cores[r]
    for k, r in seen.items():
        eid = expert_id(int(pb.expert_layer[k]), int(pb.expert_e[k]))
        if len(plc.experts[eid].cores) != r:
            raise SystemExit(f"{eid}: {len(plc.experts[eid].cores)} cores in the placement, {r} instances")
    return assign


def bank_book_banks(inp: Inputs, pb: Problem, cores_of: Placement, method: str) -> Placement:
    """``cores_of``'s cores with the shards laid out by TAPS's bank book (`taps.assemble`)."""
    plc = assemble(pb, assignment(pb, cores_of), arch=inp.arch, expert_bytes=int(inp.trace.expert_bytes),
                   weight_shard_mb=inp.workload.tensors.weight_shard_mb,
                   bank_bw_gbps=inp.tas.taps.capacity.bank_bw_gbps, method=method)
    return plc


def slot_order_banks(inp: Inputs, cores_of: Placement, method: str) -> Placement:
    """``cores_of``'s cores (replicas kept) with the shards in slot order as `default.default_placement` lays them:
    experts in its order (layers as listed, experts ascending), each copy's shards in its core's vault, a per-core
    cursor over the vault's slots (DRAM dies fastest), continuing where the core's previous copy stopped."""
    geom = ChipGeometry.of(inp.arch)
    sizes = shard_sizes(int(inp.trace.expert_bytes), inp.workload.tensors.weight_shard_mb)
    cursor = np.zeros(geom.n_cores, dtype=np.int64)
    tensors: dict[str, TensorPlacement] = {}
    for layer in inp.trace.moe_layers:
        for e in range(inp.trace.n_experts):
            cores = cores_of.experts[expert_id(layer, e)].cores
            banks: list[list[str]] = []
            for core in cores:
                row = []
                for _ in sizes:
                    row.append(geom.slot_bank_id(core, int(cursor[core] % geom.vault_banks)))
                    cursor[core] += 1
                banks.append(row)
            for k, size in enumerate(sizes):
                tensors[weight_tensor_id(layer, e, k)] = TensorPlacement(
                    dram_bank=banks[0][k], size_bytes=size,
                    replica_banks=[b[k] for b in banks[1:]] if len(cores) > 1 else None)
    return Placement(experts=dict(cores_of.experts), tensors=tensors, meta=PlacementMeta(method=method))


def same_layout(a: Placement, b: Placement) -> bool:
    return a.experts == b.experts and a.tensors == b.tensors


def check_valid(name: str, plc: Placement, ref: Placement, arch: ArchConfig) -> str:
    """Same experts and tensors as ``ref``, no bank over capacity; a one-line summary."""
    if set(plc.experts) != set(ref.experts):
        raise SystemExit(f"{name}: experts differ from the default placement's")
    if set(plc.tensors) != set(ref.tensors):
        raise SystemExit(f"{name}: tensors differ from the default placement's")
    used: dict[str, int] = {}
    for tp in plc.tensors.values():
        for bank in [tp.dram_bank, *(tp.replica_banks or [])]:
            used[bank] = used.get(bank, 0) + int(tp.size_bytes or 0)
    cap = arch.dram.bank_capacity_mb * MIB
    over = [b for b, u in used.items() if u > cap + 1e-6]
    if over:
        raise SystemExit(f"{name}: {len(over)} banks over {arch.dram.bank_capacity_mb} MiB, e.g. {over[0]}")
    n_rep = sum(len(x.cores) > 1 for x in plc.experts.values())
    return (f"{name}: {len(plc.experts)} experts ({n_rep} replicated), {len(plc.tensors)} tensors in {len(used)} "
            f"banks, fullest {max(used.values()) / MIB:.0f} of {arch.dram.bank_capacity_mb:g} MiB")


def build_hybrids(inp: Inputs, default: Placement, taps: Placement) -> tuple[Placement, Placement, list[str]]:
    """(mix_a, mix_b, notes), after checking the two bank builders against the placements they must reproduce."""
    notes = []
    k_taps = inp.tas.taps.replicate_hot_k if any(len(x.cores) > 1 for x in taps.experts.values()) else 0
    again = bank_book_banks(inp, problem(inp, k_taps), taps, "heuristic")
    if not same_layout(again, taps):
        raise SystemExit("assemble on TAPS's own assignment does not give TAPS's banks: the inputs differ")
    notes.append(f"check: assemble(TAPS's problem (replicate_hot_k={k_taps}), TAPS's cores) == TAPS's banks")
    if not same_layout(slot_order_banks(inp, default, "default"), default):
        raise SystemExit("the slot-order builder on the default cores does not give the default placement's banks")
    notes.append("check: slot order on the default cores == the default placement's banks")
    if k_taps:
        notes.append(f"caveat: TAPS kept its replicas (replicate_hot_k={k_taps}); mix_a has the default mapping's "
                     "instances (no replicas), mix_b TAPS's")
    else:
        notes.append("TAPS dropped its replicas: mix_a uses its instance set (replicate_hot_k=0)")
    mix_a = bank_book_banks(inp, problem(inp, 0), default, "mix_a: default cores + bank book")
    mix_b = slot_order_banks(inp, taps, "mix_b: TAPS cores + default slot order")
    moved = sum(default.experts[e].cores != taps.experts[e].cores for e in default.experts)
    notes.append(f"TAPS moves {moved} of {len(default.experts)} experts off their default core")
    for name, plc in (("default", default), ("taps", taps), ("mix_a", mix_a), ("mix_b", mix_b)):
        notes.append(check_valid(name, plc, default, inp.arch))
    return mix_a, mix_b, notes


@dataclass(frozen=True)
class Planned:
    row: str
    scenario: Scenario
    out_dir: Path
    exp_id: str


def run(*, arch_path: str, workload_path: str, tas_path: str, out: Path, warmup_ms: float | None,
        windows: int | None, traces: bool) -> tuple[dict[str, dict[str, float]], list[str], float]:
    s = orchestrator_settings()
    arch = load_arch(arch_path)
    if warmup_ms is not None:
        arch = with_warmup(arch, warmup_ms)
    wl, tas = load_workload(workload_path), load_tas(tas_path)
    url = s.effective_database_url
    engine = make_engine(url)
    sessions = session_factory(engine)
    # the worker processes start before this process connects to the database or starts a thread (as run_local)
    procs = ProcessRunner(sessions=sessions, database_url=url, settings=s, max_workers=s.pool_workers,
                          lease_s=s.lease_s)
    t0 = time.perf_counter()
    try:
        upgrade(engine)

        def experiment(scenarios: list[Scenario], placement: Placement | None, sub: str) -> str:
            req = ExperimentRequest(arch=arch, workload=wl, tas=tas, scenarios=scenarios, windows=windows,
                                    traces=traces, placement=placement, name=f"taps_split {sub}")
            spec = resolve_spec(req, configs_dir=s.configs_dir)
            exp_id, _ = create_experiment(sessions=sessions, spec=spec, settings=s, out_dir=out / sub,
                                          max_attempts=s.max_attempts)
            return exp_id

        with compute_clients(s) as cc:  # the placement service's inputs and answers, as a run asks for them
            pipe = Pipeline(cc, run_key="taps-split")
            pipe.check_model(wl.model)
            spec = resolve_spec(ExperimentRequest(arch=arch, workload=wl, tas=tas), configs_dir=s.configs_dir)
            seeded = spec.workload  # the seed written in, as the runs see it
            trace = pipe.create_trace(seeded, tas.tacs.window_ms)
            load = pipe.expert_load(trace, workload=seeded, window_ms=tas.tacs.window_ms)
            H = pipe.influence(pipe.thermal_model(arch), arch)
            default = pipe.placement(arch=arch, workload=seeded, tas=tas, method="default", trace=trace,
                                     expert_load=load, H=None)
            taps = pipe.placement(arch=arch, workload=seeded, tas=tas, method=tas.taps.method, trace=trace,
                                  expert_load=load, H=H)
            infl = thermal_influence(cc, arch)
            inp = Inputs(arch=arch, workload=seeded, tas=tas, trace=trace, expert_load=load,
                         H=np.asarray(infl.H, dtype=float),
                         H_vault=np.asarray(infl.H_vault, dtype=float) if infl.H_vault else None)
            mix_a, mix_b, notes = build_hybrids(inp, default, taps)
        (out / "placements").mkdir(parents=True, exist_ok=True)
        for name, plc in (("default", default), ("taps", taps), ("mix_a", mix_a), ("mix_b", mix_b)):
            (out / "placements" / f"{name}.json").write_text(plc.model_dump_json(indent=1) + "\n", encoding="utf-8")
        ref = experiment(["baseline", "taps"], None, "ref")
        plan = [Planned("baseline", "baseline", out / "ref", ref), Planned("taps", "taps", out / "ref", ref),
                Planned("mix_a", "baseline", out / "mix_a", experiment(["baseline"], mix_a, "mix_a")),
                Planned("mix_b", "baseline", out / "mix_b", experiment(["baseline"], mix_b, "mix_b"))]
        for exp_id in dict.fromkeys(p.exp_id for p in plan):  # all four runs queued at once on the pool
            procs.submit_experiment(exp_id)
        for exp_id in dict.fromkeys(p.exp_id for p in plan):
            procs.wait(exp_id)
    finally:
        procs.shutdown()
    try:
        with sessions() as ses:
            status = {(r.experiment_id, r.scenario): (r.status.value, r.error or "")
                      for p in dict.fromkeys(x.exp_id for x in plan) for r in repo.runs_of(session=ses, exp_id=p)}
    finally:
        engine.dispose()
    bad = {k: v for k, v in status.items() if v[0] != "succeeded"}
    if bad:
        raise SystemExit(f"runs did not succeed: {bad}")
    # the real runs used the very placements computed here
    expect = {"baseline": default, "taps": taps, "mix_a": mix_a, "mix_b": mix_b}
    for p in plan:
        written = Placement.model_validate(json.loads(
            placement_path(p.out_dir, p.scenario).read_text(encoding="utf-8")))
        if not same_layout(written, expect[p.row]):
            raise SystemExit(f"{p.row}: the run's placement differs from the one computed here")
    notes.append("check: each run's mapping/placement.json is the placement computed here")
    rows: dict[str, dict[str, float]] = {}
    for p in plan:
        with result_csv_path(p.out_dir, p.scenario, wl.label).open(encoding="utf-8", newline="") as f:
            (r,) = list(csv.DictReader(f))
        rows[p.row] = {c: float(r[c]) for c in COLUMNS}
    return rows, notes, time.perf_counter() - t0


def table(rows: dict[str, dict[str, float]]) -> str:
    base = rows["baseline"]
    head = ["run", "T_peak_logic °C", "ΔT_logic K", "T_peak_dram °C", "ΔT_dram K", "ips tok/s", "Δips", "energy J",
            "Δenergy J"]
    out = [head]
    for name in ROWS:
        r = rows[name]
        out.append([name, f"{r['T_peak_logic']:.3f}", f"{r['T_peak_logic'] - base['T_peak_logic']:+.3f}",
                    f"{r['T_peak_dram']:.3f}", f"{r['T_peak_dram'] - base['T_peak_dram']:+.3f}",
                    f"{r['ips']:.2f}", f"{r['ips'] - base['ips']:+.2f}", f"{r['energy_j']:.2f}",
                    f"{r['energy_j'] - base['energy_j']:+.2f}"])
    d = {c: {n: rows[n][c] - base[c] for n in ROWS} for c in COLUMNS}
    out.append(["mix_a+mix_b"] + [x for c in COLUMNS for x in ("", f"{d[c]['mix_a'] + d[c]['mix_b']:+.3f}")])
    widths = [max(len(t[i]) for t in out) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(t, widths,
                                                                                                   strict=True)))
                     for t in out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="taps_split.py", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--arch", default="configs/arch_8x8_32x32x8.yaml")
    ap.add_argument("--workload", default="configs/workload_mixtral_8x7b.yaml")
    ap.add_argument("--tas", default="configs/tas_params.yaml")
    ap.add_argument("--out", default="results/taps_split/")
    ap.add_argument("--warmup-ms", type=float, default=None, help="replace the arch config's thermal.warmup_ms")
    ap.add_argument("--windows", type=int, default=None, help="run only the first N windows")
    ap.add_argument("--no-traces", action="store_true", help="skip the logical trace and the overlays")
    args = ap.parse_args(argv)
    setup_logging("WARNING")
    out = Path(args.out)
    rows, notes, wall = run(arch_path=args.arch, workload_path=args.workload, tas_path=args.tas, out=out,
                            warmup_ms=args.warmup_ms, windows=args.windows, traces=not args.no_traces)
    for line in notes:
        print(line)
    text = table(rows)
    print(text, end="")
    print(f"wall {wall:.0f} s -> {out}")
    with (out / "taps_split.csv").open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", *COLUMNS, *(f"d_{c}" for c in COLUMNS)])
        for name in ROWS:
            w.writerow([name, *(rows[name][c] for c in COLUMNS),
                        *(rows[name][c] - rows["baseline"][c] for c in COLUMNS)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
