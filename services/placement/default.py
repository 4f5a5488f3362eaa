"""Default mapping (baseline, ARCHITECTURE §5.2): expert instances in index order, round-robin over cores in row-major
order (over stripe groups when ``arch.schedule.expert_stripe`` > 1), no replication, every weight shard in its
owner's vault (a striped expert: a 1/k slice of every shard in each of its cores' vaults)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.placement.geometry import MIB, ChipGeometry
from services.placement.shards import shard_sizes
from shared.chip import stripe_groups
from shared.configs import ArchConfig
from shared.contracts.ids import expert_id, weight_tensor_id
from shared.contracts.placement import ExpertPlacement, Placement, PlacementMeta, TensorPlacement
from shared.errors import BadInput


def default_placement(arch: ArchConfig, moe_layers: int | Sequence[int], n_experts: int, weight_shard_mb: float,
                      expert_bytes: int) -> Placement:
    """Round-robin mapping.

    ``moe_layers``: the MoE layer indices (or their count, meaning ``0..n-1``). Instance ``L{l}E{e}`` with running
    index ``i`` (layers in the given order, experts ascending) goes to core ``i mod n_cores``. Its shards go to the
    owner's vault in slot order (DRAM layers cycle fastest, then positions inside the vault), packed by bytes: a
    shard goes to the bank at the vault's cursor when it has room, else the cursor moves on to the next bank in slot
    order with room (wrapping round the vault, so a later small shard fills what earlier banks left), continuing
    where the previous expert on that core stopped. Shards the size of a bank take a bank each, in slot order, as
    before packing; smaller ones fill a bank before the next (a bank holds as many shards as fit). When no bank of
    the vault has room the shard goes over capacity to the bank after the cursor (the baseline keeps every shard in
    its owner's vault, so a model larger than the chip still runs; ``meta.notes`` says how many banks are over).

    Striped (``arch.schedule.expert_stripe`` = k > 1): instance ``i`` goes to stripe group ``i mod (n_cores / k)``
    (policy ``stripe``, the group's k cores) and each of its shards to every core of the group as a slice of 1/k of
    its bytes, each slice packed into that core's vault as above (``dram_bank``: the first core's slice,
    ``replica_banks``: the others', in the cores' order).
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
    banks = geom.vault_banks
    cursor = np.zeros(n, dtype=np.int64)
    used = np.zeros((n, banks))
    experts: dict[str, ExpertPlacement] = {}
    tensors: dict[str, TensorPlacement] = {}
    groups = stripe_groups(arch)
    striped = groups.shape[1] > 1
    i = 0
    for layer in layers:
        for e in range(n_experts):
            cores = [int(c) for c in groups[i % groups.shape[0]]]
            i += 1
            experts[expert_id(layer, e)] = ExpertPlacement(cores=cores, policy="stripe" if striped else "single")
            for k, size in enumerate(sizes):
                part = size / len(cores)
                banks_k = []
                for core in cores:
                    slot = _next_bank(used[core], int(cursor[core]), part, cap)
                    cursor[core] = slot
                    used[core, slot] += part
                    banks_k.append(geom.slot_bank_id(core, slot))
                tensors[weight_tensor_id(layer, e, k)] = TensorPlacement(
                    dram_bank=banks_k[0], size_bytes=size, replica_banks=banks_k[1:] or None)
    notes = []
    over = int((used > cap + 1e-6).sum())
    if over:
        notes.append(f"{over} banks hold more than bank_capacity_mb ({arch.dram.bank_capacity_mb} MiB): the default "
                     "mapping keeps every shard in its owner's vault")
    return Placement(experts=experts, tensors=tensors, meta=PlacementMeta(method="default", notes=notes))


def _next_bank(used: np.ndarray, cursor: int, size: float, cap: float) -> int:
    """The slot for the next shard of a vault (``used``: bytes per slot): the first slot from ``cursor`` on, in slot
    order round the vault, with room for ``size`` bytes; none has room: the slot after the cursor (over capacity,
    the cursor keeps cycling the vault's banks)."""
    banks = used.shape[0]
    order = (cursor + np.arange(banks)) % banks
    room = np.flatnonzero(used[order] + size <= cap + 1e-6)
    return int(order[room[0]]) if room.size else (cursor + 1) % banks
