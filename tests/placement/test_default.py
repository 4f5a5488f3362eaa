"""Default mapping: round-robin instances, no replication, shards spread inside the owner's vault."""

from __future__ import annotations

from collections import Counter

import pytest

from services.placement.default import default_placement
from services.placement.geometry import ChipGeometry
from shared.configs import ArchConfig
from shared.contracts.ids import expert_id, parse_bank_id, weight_tensor_id
from shared.errors import BadInput

MIXTRAL_EXPERT_BYTES = 3 * 4096 * 14336 * 2  # w1, w2, w3 in bf16


def test_round_robin_row_major_no_replication(arch: ArchConfig) -> None:
    plc = default_placement(arch, 32, 8, 64, MIXTRAL_EXPERT_BYTES)
    assert list(plc.experts)[:3] == ["L0E0", "L0E1", "L0E2"]
    for i, (eid, ep) in enumerate(plc.experts.items()):
        assert ep.cores == [i % 64] and ep.policy == "single", eid
    # 256 instances on 64 cores: every core hosts exactly four
    assert Counter(c for ep in plc.experts.values() for c in ep.cores) == {c: 4 for c in range(64)}


def test_shards_spread_over_the_owner_vault(arch: ArchConfig) -> None:
    geom = ChipGeometry.of(arch)
    plc = default_placement(arch, [1, 3], 8, 64, MIXTRAL_EXPERT_BYTES)
    assert set(plc.experts) == {expert_id(layer, e) for layer in (1, 3) for e in range(8)}
    n_shards = -(-MIXTRAL_EXPERT_BYTES // (64 << 20))
    assert n_shards == 6
    by_core: dict[int, list[str]] = {}
    for eid, ep in plc.experts.items():
        layer, e = int(eid[1:eid.index("E")]), int(eid[eid.index("E") + 1:])
        for k in range(n_shards):
            tp = plc.tensors[weight_tensor_id(layer, e, k)]
            core, _ = geom.bank_core_slot(tp.dram_bank)
            assert core == ep.cores[0]
            by_core.setdefault(core, []).append(tp.dram_bank)
        # one expert's shards go to different DRAM layers (they cycle fastest)
        shard_layers = [parse_bank_id(plc.tensors[weight_tensor_id(layer, e, k)].dram_bank)[2] for k in range(6)]
        assert len(set(shard_layers)) == 6
    for banks in by_core.values():
        assert len(set(banks)) == len(banks)  # no bank reused while the vault has room
    last = plc.tensors[weight_tensor_id(1, 0, 5)]
    assert last.size_bytes == MIXTRAL_EXPERT_BYTES - 5 * (64 << 20)


def test_default_rejects_bad_input(arch: ArchConfig) -> None:
    with pytest.raises(BadInput) as ei:
        default_placement(arch, [0, 0], 8, 64, 1)
    assert ei.value.field == "moe_layers"
    with pytest.raises(BadInput) as ei:
        default_placement(arch, 2, 0, 64, 1)
    assert ei.value.field == "n_experts"
