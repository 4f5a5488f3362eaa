"""The TAPS entry point: the heuristic (``taps``) or the MILP (``milp``) on one problem, with and without the
replicas of the hottest experts, keeping the replicas only where the predicted objective says they help. It sits
above both solvers so that neither imports the other (``milp`` builds on ``taps``'s problem and assembly)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.placement.milp import solve_milp
from services.placement.taps import CRITICAL_PATH_TOL, Problem, assemble, build_problem, heuristic_assign
from shared.configs import ArchConfig, WorkloadConfig
from shared.configs.tas import TapsParams
from shared.contracts.placement import Placement
from shared.errors import BadInput


def build_placement(arch: ArchConfig, workload: WorkloadConfig, taps: TapsParams,
                    expert_load: Sequence[Sequence[float]], expert_flops_per_token: float,
                    H: np.ndarray | None = None, *, moe_layers: Sequence[int] | None = None, expert_bytes: int = 0,
                    method: str | None = None) -> Placement:
    """TAPS placement (``method``: ``heuristic`` (default from ``taps.method``) or ``milp``).

    ``expert_load[l][e]``: load profile of MoE layer ``moe_layers[l]`` (default ``0..L-1``), any non-negative scale;
    ``expert_flops_per_token``: FLOPs one token costs in one expert; ``expert_bytes``: weight bytes of one expert
    (split into ``workload.tensors.weight_shard_mb`` shards); H: cores × cores K/W (the thermal service's; None:
    the analytic single-layer kernel, noted in ``meta.notes``: the placement service always passes thermal's H).
    """
    method = method or taps.method
    if method not in ("heuristic", "milp"):
        raise BadInput(f"unknown method {method!r} (heuristic | milp)", field="method")

    def solve(k_hot: int) -> tuple[Problem, Placement]:
        pb = build_problem(arch, workload, taps, expert_load, expert_flops_per_token, H, moe_layers=moe_layers,
                           expert_bytes=float(expert_bytes), critical_path_tol=CRITICAL_PATH_TOL,
                           replicate_hot_k=k_hot)
        if method == "heuristic":
            assign, notes = heuristic_assign(pb, taps.local_search_iters, workload.routing.seed)
            return pb, assemble(pb, assign, arch=arch, expert_bytes=expert_bytes,
                                weight_shard_mb=workload.tensors.weight_shard_mb,
                                bank_bw_gbps=taps.capacity.bank_bw_gbps, method="heuristic", extra_notes=notes)
        return pb, solve_milp(pb, taps, arch=arch, expert_bytes=expert_bytes,
                              weight_shard_mb=workload.tensors.weight_shard_mb, seed=workload.routing.seed)

    pb, plc = solve(taps.replicate_hot_k)
    if pb.m == pb.expert_layer.shape[0]:  # nothing replicated (k = 0, or a one-core chip)
        return plc
    # replication where it helps (Science III): a replica halves its expert's compute per core but streams a second
    # copy of the weights (decode reads every weight of an expert it routes to), so it is kept only when the
    # placement with it has the lower predicted objective than the placement without it
    _, plain = solve(0)
    a, b = plc.meta.objective["objective"], plain.meta.objective["objective"]
    keep = a < b
    note = (f"replication of the {taps.replicate_hot_k} most loaded expert(s) per layer: predicted objective "
            f"{a:.6g} with, {b:.6g} without: {'kept' if keep else 'dropped'}")
    chosen = plc if keep else plain
    return chosen.model_copy(update={"meta": chosen.meta.model_copy(update={"notes": [*chosen.meta.notes, note]})})
