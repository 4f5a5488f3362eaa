"""Default mapping (baseline, ARCHITECTURE §5.2): expert instances in index order, round-robin over cores in row-major
order, no replication, every weight shard in its owner's vault."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.placement.geometry import MIB, ChipGeometry
from services.placement.shards import shard_sizes
from shared.configs import ArchConfig
from shared.contracts.ids import expert_id, weight_tensor_id
from shared.contracts.placement import ExpertPlacement, Placement, PlacementMeta, TensorPlacement
from shared.errors import BadInput


def default_placement(arch: ArchConfig, moe_layers: int | Sequence[int], n_experts: int, weight_shard_mb: float,
                      expert_bytes: int) -> Placement:
    """Round-robin mapping.

    ``moe_layers``: the MoE layer indices (or their count, meaning ``0..n-1``). Instance ``L{l}E{e}`` with running
    index ``i`` (layers in the given order, experts ascending) goes to core ``i mod n_cores``. Its shards go to the
    owner's vault in slot order (DRAM layers cycle fastest, then positions inside the vault), continuing where the
    previous expert on that core stopped, so the shards of one core spread over all of its vault's banks. When a vault
    has fewer bank slots than shards to hold, the cursor wraps (and ``meta.notes`` says the vault is over capacity).
    """
    layers = list(range(moe_layers)) if isinstance(moe_layers, int) else [int(x) for x in moe_layers]
    if n_experts < 1:
        raise BadInput("n_experts must be >= 1", field="n_experts")
    if any(layer < 0 for layer in layers):
        raise BadInput("moe_layers must be non-negative layer indices", field="moe_layers")
    if len(set(layers)) != len(layers):
        raise BadInput("moe_layers has duplicates", field="moe_layers")
    geom = ChipGeometry.of(arch)
    n = geom.n_cores
    sizes = shard_sizes(int(expert_bytes), weight_shard_mb)
    cap = arch.dram.bank_capacity_mb * MIB
    cursor = np.zeros(n, dtype=np.int64)
    used = np.zeros((n, geom.vault_banks))
    experts: dict[str, ExpertPlacement] = {}
    tensors: dict[str, TensorPlacement] = {}
    i = 0
    for layer in layers:
        for e in range(n_experts):
            core = i % n
            i += 1
            experts[expert_id(layer, e)] = ExpertPlacement(cores=[core], policy="single")
            for k, size in enumerate(sizes):
                slot = int(cursor[core] % geom.vault_banks)
                cursor[core] += 1
                used[core, slot] += size
                tensors[weight_tensor_id(layer, e, k)] = TensorPlacement(
                    dram_bank=geom.slot_bank_id(core, slot), size_bytes=size)
    notes = []
    over = int((used > cap + 1e-6).sum())
    if over:
        notes.append(f"{over} banks hold more than bank_capacity_mb ({arch.dram.bank_capacity_mb} MiB): the default "
                     "mapping keeps every shard in its owner's vault")
    return Placement(experts=experts, tensors=tensors, meta=PlacementMeta(method="default", notes=notes))
