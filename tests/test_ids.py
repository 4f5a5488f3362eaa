"""Identifier parsing shared by every service (shared/contracts/ids.py), and the placement's rule for an expert's
weight shards (``Placement.expert_shards``)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from shared.contracts.ids import bank_id, parse_bank_id, parse_bank_ids, parse_weight_tensor_id, weight_tensor_id
from shared.contracts.placement import ExpertPlacement, Placement, TensorPlacement


def test_parse_bank_ids_agrees_with_the_one_by_one_parser() -> None:
    rng = np.random.default_rng(0)
    xyz = rng.integers(0, 512, size=(1000, 3))
    ids = [bank_id(*map(int, r)) for r in xyz]
    np.testing.assert_array_equal(parse_bank_ids(ids), xyz)
    assert parse_bank_ids([]).shape == (0, 3)
    spaced = ["B(1, 2, 3)", "B(4,5,6)"]  # spaces: the slow path, same answer as parse_bank_id
    assert parse_bank_ids(spaced).tolist() == [list(parse_bank_id(s)) for s in spaced]


@pytest.mark.parametrize(("ids", "where"), [
    (["B(1,2,3)", "bank7"], "[1]"),
    (["B(1,2,3);B(4,5,6)", "x"], "[0]"),  # a ';' inside an id cannot make up for a bad one
    (["B(1,2,3)B(4,5,6)", "B(1,1,1)"], "[0]"),
    (["B(1,2)", "B(1,2,3)"], "[0]"),
])
def test_parse_bank_ids_names_the_first_bad_id(ids: list[str], where: str) -> None:
    with pytest.raises(ValueError) as ei:
        parse_bank_ids(ids)
    assert str(ei.value).startswith(where)


def test_weight_tensor_ids_round_trip_and_anything_else_is_refused() -> None:
    assert parse_weight_tensor_id(weight_tensor_id(31, 7, 5)) == (31, 7, 5)
    assert parse_weight_tensor_id("W_L0E0_0") == (0, 0, 0)
    for bad in ("W_L1E2", "W_L1E2_x", "L1E2_0", "W_L1E2_0_1", "W_LxE2_0", "KV_L1E2_0", "L1E2_*", "W_L01E2_0",
                "W_L1E02_0", "W_L1E2_00", "W_L1E2_gate"):
        with pytest.raises(ValueError):
            parse_weight_tensor_id(bad)


def test_expert_shards_are_the_contiguous_run_from_shard_zero() -> None:
    """`Placement.expert_shards`: the one rule for an expert's shards (lowering's overlays and TACS both use it)."""
    def tp(bank: str) -> TensorPlacement:
        return TensorPlacement(dram_bank=bank, size_bytes=64)

    experts = {"L1E2": ExpertPlacement(cores=[0]), "L1E3": ExpertPlacement(cores=[1])}
    plc = Placement(experts=experts,
                    tensors={"W_L1E2_1": tp("B(0,0,1)"), "W_L1E2_0": tp("B(0,0,0)"), "W_L1E2_2": tp("B(0,0,3)"),
                             "W_L1E3_0": tp("B(1,0,0)"), "W_L11E2_0": tp("B(2,0,0)"), "KV_0": tp("B(3,0,0)")})
    assert [tid for tid, _ in plc.expert_shards(1, 2)] == ["W_L1E2_0", "W_L1E2_1", "W_L1E2_2"]
    assert [t.dram_bank for _, t in plc.expert_shards(1, 2)] == ["B(0,0,0)", "B(0,0,1)", "B(0,0,3)"]
    assert [tid for tid, _ in plc.expert_shards(1, 3)] == ["W_L1E3_0"]
    assert plc.expert_shards(2, 0) == []


@pytest.mark.parametrize(("ids", "named"), [
    (["W_L1E2_0", "W_L1E2_2"], "W_L1E2_2 is listed without W_L1E2_1"),
    (["W_L1E2_1"], "W_L1E2_1 is listed without W_L1E2_0"),
    (["W_L0E0_0", "W_L1E2_0", "W_L1E2_1", "W_L1E2_5", "W_L1E2_3"], "W_L1E2_5 is listed without W_L1E2_2"),
])
def test_a_placement_with_a_gap_in_an_experts_shards_is_refused(ids: list[str], named: str) -> None:
    tensors = {tid: TensorPlacement(dram_bank="B(0,0,0)") for tid in ids}
    with pytest.raises(ValidationError, match=named) as err:
        Placement(experts={"L1E2": ExpertPlacement(cores=[0])}, tensors=tensors)
    assert err.value.errors()[0]["loc"] == ("tensors",)  # the error names the field
