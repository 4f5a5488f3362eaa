"""What TAPS needs from a workload config when the caller gives only configs (CLI, benchmarks): MoE layer indices,
per-expert loads, FLOPs per token per expert and expert weight bytes — taken from the workload service's functions.

Loads: by default the Zipf *expectation* over the workload's own seeded per-layer permutations
(``services.workload.routing``: expert ``perm_j[r]`` has share ``∝ (r+1)^-zipf_s``), which costs nothing; with
``exact=True`` the token shares of the actual trace (``services.workload.traces.expert_load``, seconds for big models).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.configs import WorkloadConfig
from shared.errors import ConfigError


@dataclass(frozen=True)
class WorkloadInputs:
    moe_layers: list[int]
    loads: list[list[float]]
    expert_flops_per_token: float
    expert_bytes: int
    load_source: str


def workload_inputs(wl: WorkloadConfig, *, exact: bool = False) -> WorkloadInputs:
    try:
        from services.workload.routing import RoutingStream, zipf_probabilities
        from services.workload.traces import FC, expert_load, make_plan
    except ImportError as exc:  # pragma: no cover - the workload service ships with the project
        raise ConfigError(f"the workload service's functions are not available: {exc}") from None
    plan = make_plan(wl)
    if not plan.E:
        raise ConfigError(f"workload.model: {wl.model_name} has no routed experts: nothing to place", field="model")
    if exact:
        layers, load = expert_load(wl)
        loads = load.tolist()
        source = "trace"
    else:
        stream = plan.routing_stream()
        layers = list(plan.moe_layers)
        if isinstance(stream, RoutingStream):
            loads = [zipf_probabilities(plan.E, wl.routing.zipf_s, perm).tolist() for perm in stream.perms]
            source = "zipf-expectation"
        else:  # a replayed trace: its empirical shares over the whole file
            loads = stream.probabilities().tolist()
            source = "recorded-trace"
    return WorkloadInputs(moe_layers=list(layers), loads=loads, expert_flops_per_token=float(plan.costs.flops[FC]),
                          expert_bytes=int(plan.costs.expert_bytes), load_source=source)


def zipf_loads(n_layers: int, n_experts: int, s: float = 1.2, seed: int = 42) -> list[list[float]]:
    """Synthetic loads (benchmarks, tests): per layer, the Zipf(s) expectation ``∝ (r+1)^-s`` over a permutation of
    the expert ids drawn from ``default_rng(seed)`` (shares summing to 1)."""
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n_experts + 1) ** s
    out = []
    for _ in range(n_layers):
        row = np.empty(n_experts)
        row[rng.permutation(n_experts)] = w / w.sum()
        out.append(row.tolist())
    return out
