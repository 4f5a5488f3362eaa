"""Scenario builders for the TACS tests: hand-made placements, pending windows and a synthetic thermal loop.

The "thermal model" here is ``T = H·p + T_amb`` with a synthetic diffusion kernel, not the thermal service."""

from __future__ import annotations

import numpy as np

from services.placement.geometry import ChipGeometry
from shared.configs import ArchConfig
from shared.contracts.placement import ExpertPlacement, Placement, ReplicaState, TensorPlacement
from shared.contracts.workload import LogicalCompute, LogicalMemory, LogicalWindow

E_FLOP = 1.5 * 0.5e-12  # J/FLOP at the default mac_pj
SHARD = 32 << 20


def placement_from(arch: ArchConfig, cores: dict[str, list[int]]) -> Placement:
    """One 32 MiB shard per expert copy, in the vault of each of its cores (distinct banks)."""
    geom = ChipGeometry.of(arch)
    fill = [0] * geom.n_cores
    experts, tensors = {}, {}
    for eid, cs in cores.items():
        experts[eid] = ExpertPlacement(cores=cs, policy="replicate" if len(cs) > 1 else "single")
        banks = []
        for c in cs:
            banks.append(geom.slot_bank_id(c, fill[c]))
            fill[c] += 1
        tensors[f"W_{eid}_0"] = TensorPlacement(dram_bank=banks[0], size_bytes=SHARD, replica_banks=banks[1:] or None)
    return Placement(experts=experts, tensors=tensors)


def window(k: int, watts: dict[str, float], window_ms: float = 3.0) -> LogicalWindow:
    """Pending window k: one fc row per expert (two micro-batches) carrying ``watts`` of compute power."""
    t0 = int(k * window_ms * 1e6)
    t1 = int((k + 1) * window_ms * 1e6)
    rows: dict[str, list[object]] = {f: [] for f in LogicalCompute.model_fields}
    for i, (eid, w) in enumerate(sorted(watts.items())):
        layer, ex = (int(x) for x in eid[1:].split("E"))
        for mb in (0, 1):
            rows["event_id"].append(2 * i + mb)
            rows["t_gen_ns"].append(t0)
            rows["mb_id"].append(2 * k + mb)
            rows["layer"].append(layer)
            rows["op_type"].append("fc")
            rows["expert"].append(ex)
            rows["tokens"].append(8)
            rows["flops"].append(w * window_ms * 1e-3 / E_FLOP / 2)
    return LogicalWindow(trace_id="t", window=k, t0_ns=t0, t1_ns=t1, compute=LogicalCompute.model_validate(rows),
                         memory=LogicalMemory.empty())


def cores_now(placement: Placement, state: ReplicaState) -> dict[str, list[int]]:
    out = {eid: list(ep.cores) for eid, ep in placement.experts.items()}
    for eid, ent in state.experts.items():
        out[eid] = list(ent.cores)
    return out


def temps(H: np.ndarray, cores: dict[str, list[int]], watts: dict[str, float], t_amb: float = 45.0) -> np.ndarray:
    p = np.zeros(H.shape[0])
    for eid, cs in cores.items():
        for c in cs:
            p[c] += watts.get(eid, 0.0) / len(cs)
    return np.asarray(H @ p + t_amb)
