"""Striped experts (``arch.schedule.expert_stripe`` = k > 1) in every policy: the default mapping and TAPS place each
expert on a group of k cores with a 1/k slice of every shard in each core's vault; TACS never migrates a striped
expert and reroutes a slice within its group with the slice's weight reads left in the source's vault. And a TAPS
base field that runs away (the hot chip under weak cooling) stays finite and says so."""

from __future__ import annotations

import numpy as np
import pytest

from services.placement.default import default_placement
from services.placement.geometry import MIB, ChipGeometry, synthetic_diffusion_kernel
from services.placement.placer import build_placement
from services.placement.tacs import tacs_step
from services.placement.taps import stripe_influence
from shared.chip import stripe_groups
from shared.configs import ArchConfig, TasParams, WorkloadConfig
from shared.contracts.ids import parse_weight_tensor_id
from shared.contracts.placement import ExpertPlacement, Placement, ReplicaState, Telemetry, TensorPlacement
from tests.placement.conftest import small_arch
from tests.placement.tacs_helpers import window

MIXTRAL_FLOPS = 2 * 3 * 4096 * 14336
MIXTRAL_BYTES = 3 * 4096 * 14336 * 2


def _striped(arch: ArchConfig, k: int) -> ArchConfig:
    return ArchConfig.model_validate({**arch.model_dump(mode="json"),
                                      "schedule": {**arch.schedule.model_dump(mode="json"), "expert_stripe": k}})


def _slices_per_vault(plc: Placement, arch: ArchConfig) -> dict[int, float]:
    """Bytes each core's vault holds of the placement's shards (a striped shard: 1/k in each of its banks)."""
    geom = ChipGeometry.of(arch)
    out: dict[int, float] = {}
    for tid, tp in plc.tensors.items():
        banks = [tp.dram_bank, *(tp.replica_banks or [])]
        lv, e, _ = parse_weight_tensor_id(tid)
        assert len(banks) == len(plc.experts[f"L{lv}E{e}"].cores)
        for b in banks:
            core = geom.bank_core_slot(b)[0]
            out[core] = out.get(core, 0.0) + (tp.size_bytes or 0) / len(banks)
    return out


def test_the_stripe_must_divide_the_cores() -> None:
    with pytest.raises(ValueError, match="expert_stripe = 3 must divide the 64 cores"):
        ArchConfig.model_validate({"schedule": {"expert_stripe": 3}})
    assert "expert_stripe" not in ArchConfig().model_dump(mode="json")["schedule"]  # the default's hash unchanged


def test_the_default_mapping_stripes_every_expert_over_a_group_with_a_slice_in_each_vault(arch: ArchConfig) -> None:
    a = _striped(arch, 8)
    plc = default_placement(a, 32, 8, 64, MIXTRAL_BYTES)
    groups = stripe_groups(a)
    for i, (eid, ep) in enumerate(plc.experts.items()):
        assert ep.policy == "stripe" and ep.cores == groups[i % groups.shape[0]].tolist(), eid
        for k in range(6):
            tp = plc.tensors[f"{eid.replace('L', 'W_L')}_{k}"]
            geom = ChipGeometry.of(a)
            assert [geom.bank_core_slot(b)[0] for b in [tp.dram_bank, *(tp.replica_banks or [])]] == ep.cores
    per_vault = _slices_per_vault(plc, a)
    assert sum(per_vault.values()) == pytest.approx(32 * 8 * MIXTRAL_BYTES)
    assert max(per_vault.values()) == pytest.approx(min(per_vault.values()))  # every vault holds the same bytes


def test_stripe_influence_is_the_groups_mean_column() -> None:
    a = _striped(small_arch(4, 4), 4)
    H = synthetic_diffusion_kernel(4, 4, self_kw=2.0, length=1.0, base_kw=0.05)
    Hs = stripe_influence(H, a)
    for g in stripe_groups(a):
        for j in g:
            np.testing.assert_allclose(Hs[:, j], H[:, g].mean(axis=1))
    assert stripe_influence(H, small_arch(4, 4)) is H


def test_taps_places_every_expert_striped_and_makes_no_replicas(arch: ArchConfig, tas: TasParams,
                                                                mixtral: WorkloadConfig) -> None:
    a = _striped(arch, 8)
    load = np.random.default_rng(0).zipf(1.5, size=(32, 8)).astype(float)
    plc = build_placement(a, mixtral, tas.taps, load.tolist(), MIXTRAL_FLOPS, None, expert_bytes=MIXTRAL_BYTES)
    groups = {tuple(g) for g in stripe_groups(a).tolist()}
    assert len(plc.experts) == 32 * 8
    assert all(ep.policy == "stripe" and tuple(ep.cores) in groups for ep in plc.experts.values())
    if tas.taps.replicate_hot_k > 0:
        assert any("not on a striped chip" in n for n in plc.meta.notes)
    per_vault = _slices_per_vault(plc, a)
    cap = a.dram.bank_capacity_mb * MIB * ChipGeometry.of(a).vault_banks
    assert max(per_vault.values()) <= cap
    # a group runs its experts one after another: a layer's eight experts on eight groups (its critical path)
    for layer in range(32):
        rows = {tuple(plc.experts[f"L{layer}E{e}"].cores) for e in range(8)}
        assert len(rows) == 8, layer


def test_tacs_reroutes_a_striped_slice_within_its_group_and_never_migrates_it(tas: TasParams) -> None:
    a = _striped(small_arch(4, 4), 4)
    H = synthetic_diffusion_kernel(4, 4, self_kw=2.0, length=1.0, base_kw=0.05)
    group = [4, 5, 6, 7]
    geom = ChipGeometry.of(a)
    tensors = {"W_L0E0_0": TensorPlacement(dram_bank=geom.slot_bank_id(4, 0), size_bytes=32 << 20,
                                           replica_banks=[geom.slot_bank_id(c, 0) for c in group[1:]])}
    plc = Placement(experts={"L0E0": ExpertPlacement(cores=group, policy="stripe")}, tensors=tensors)
    hot = [60.0] * 16
    hot[5] = 95.0
    tele = Telemetry(temps_core=hot, util_core=[0.5] * 16)
    pending = window(3, {"L0E0": 40.0})
    ov, state, _ = tacs_step(tele, plc, ReplicaState(), tas.tacs, a, H, pending, None, pending.t0_ns)
    assert not ov.migrate.obj_id  # nothing migrated
    assert state.experts == {} or all(ent.cores == group for ent in state.experts.values())
    assert len(ov.reroute) >= 1
    for rr in zip(ov.reroute.from_core, ov.reroute.to_core, strict=True):
        assert rr[0] == 5 and rr[1] in group and rr[1] != 5


def test_a_field_that_runs_away_is_capped_and_said_not_a_nan(tas: TasParams, mixtral: WorkloadConfig) -> None:
    """A cooling too weak for the chip's leakage at full load: TAPS's base field has no steady state. It stays finite
    (leakage priced at most at RUNAWAY_C), the note says why, and a placement comes out."""
    from services.placement.taps import RUNAWAY_C, build_problem

    a = small_arch(4, 4)
    d = a.model_dump(mode="json")
    d["geometry"]["cooling"]["h_wmk2k"] = 1.0  # ~no heat sink
    weak = ArchConfig.model_validate(d)
    pb = build_problem(weak, mixtral, tas.taps, np.ones((2, 8)).tolist(), MIXTRAL_FLOPS, None,
                       nonexpert_flops_per_step=1e12)
    assert np.all(np.isfinite(pb.t_base)) and pb.base_field is not None
    assert float(pb.base_field.temps_c.max()) == RUNAWAY_C
    assert any("runs away" in n for n in pb.notes)
