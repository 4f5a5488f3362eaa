"""What TAPS needs from a workload config when the caller gives only configs (CLI, benchmarks): MoE layer indices,
per-expert loads, FLOPs per token per expert and expert weight bytes, asked of the workload service over HTTP
(``POST /v1/traces``, ``GET /v1/traces/{id}/expert-load``), never from its modules.

Loads: by default the routing law's *expectation* (``?expected=true``: the Zipf shares over the workload's own seeded
per-layer permutations, or a replayed file's shares), which costs nothing; with ``exact=True`` the token shares of
the actual trace (seconds for big models).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.client import ServiceClients
from shared.configs import WorkloadConfig
from shared.contracts.workload import ExpertLoad, TraceSummary
from shared.errors import ConfigError


@dataclass(frozen=True)
class WorkloadInputs:
    moe_layers: list[int]
    loads: list[list[float]]
    expert_flops_per_token: float
    expert_bytes: int
    load_source: str
    nonexpert_flops_per_step: float = 0.0
    nonexpert_bytes_per_step: float = 0.0


def workload_inputs(wl: WorkloadConfig, clients: ServiceClients, *, exact: bool = False) -> WorkloadInputs:
    summary = TraceSummary.model_validate(clients["workload"].post_json(
        "/v1/traces", {"workload": wl.model_dump(mode="json")}))
    if not summary.n_experts:
        raise ConfigError(f"workload.model: {wl.model_name} has no routed experts: nothing to place", field="model")
    load = ExpertLoad.model_validate(clients["workload"].get_json(
        f"/v1/traces/{summary.trace_id}/expert-load", params={"expected": str(not exact).lower()}))
    source = "trace" if exact else ("recorded-trace" if wl.routing.trace else "zipf-expectation")
    return WorkloadInputs(moe_layers=list(load.layers), loads=load.load,
                          expert_flops_per_token=summary.flops_per_token_expert,
                          expert_bytes=int(summary.expert_bytes), load_source=source,
                          nonexpert_flops_per_step=summary.nonexpert_flops_per_step,
                          nonexpert_bytes_per_step=summary.nonexpert_bytes_per_step)


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
