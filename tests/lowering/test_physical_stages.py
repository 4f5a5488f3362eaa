"""The physicalizer's stages called directly (services/lowering/physical/)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from services.lowering.physical import deposit
from services.lowering.physical.assign import Rows, assign, attention_cores
from services.lowering.physical.overlays import Transfer
from services.lowering.physical.schedule import Stages, list_schedule, schedule_transfers
from services.lowering.synthetic import default_placement, synthetic_window
from shared.chip import Chip
from shared.configs.arch import ArchConfig
from shared.contracts.placement import ReplicaState


def test_share_splits_an_interval_pro_rata_and_sums_to_one() -> None:
    start = np.array([0.0, 2.5, 5.0, 9.0, 3.0])
    end = np.array([10.0, 7.5, 5.0, 9.0, 3.0])  # the last two have no length
    edges = np.arange(0.0, 12.0, 1.5)
    total = sum(deposit.share(start, end, a, b) for a, b in itertools.pairwise(edges))
    np.testing.assert_allclose(total, 1.0, rtol=1e-12)
    np.testing.assert_allclose(deposit.share(start, end, 0.0, 3.0), [0.3, 0.1, 0.0, 0.0, 0.0])
    assert deposit.share(np.array([3.0]), np.array([3.0]), 3.0, 4.0)[0] == 1.0  # a point belongs to [t0, t1)
    assert list(deposit.remains(end, start, 7.5)) == [True, False, False, True, False]


def test_list_schedule_chains_stages_and_overlaps_independent_micro_batches() -> None:
    # two micro-batches, two stages each; stage 0 on cores {0, 1}, stage 1 on core 2
    mb = np.array([0, 0, 1, 1])
    st = Stages.of(mb, np.zeros(4, np.int64), np.array([0, 1, 0, 1]), np.zeros(4))
    piece_stage = np.array([0, 0, 1, 2, 2, 3])  # stages are sorted (mb, layer, phase)
    piece_core = np.array([0, 1, 2, 3, 4, 2])
    dur = np.array([10.0, 20.0, 5.0, 7.0, 7.0, 5.0])
    s = list_schedule(st, piece_stage, piece_core, dur, np.arange(6), {}, np.zeros(8), np.zeros(8), 1e9)
    # mb 0: stage 0 ends at 20 (the slower core), stage 1 runs 20..25 on core 2
    assert s.stage_end[0] == 20.0 and s.start[2] == 20.0 and s.stage_end[1] == 25.0
    # mb 1 runs its first stage at the same time on other cores; its second stage is ready first (at 7) and takes
    # core 2 before mb 0's (earliest ready stage first)
    assert s.start[3] == 0.0 and s.start[4] == 0.0 and s.start[5] == 7.0
    # a window ending at 15: mb 0's second stage (ready at 20) stays open, mb 1's (ready at 7) is scheduled
    s2 = list_schedule(st, piece_stage, piece_core, dur, np.arange(6), {}, np.zeros(8), np.zeros(8), 15.0)
    assert np.isnan(s2.start[2]) and s2.start[5] == 7.0


def test_transfers_hold_both_vaults_for_bytes_over_bandwidth() -> None:
    chip = Chip.from_arch(ArchConfig())
    vault_bw = np.full(64, chip.vault_bw_bytes_per_ns)
    vf = np.zeros(64)
    core_free = np.zeros(64)
    core_free[27] = 1000.0
    b0 = int(chip.vault_bank(np.array([0]), np.array([1]))[0])
    b27 = int(chip.vault_bank(np.array([27]), np.array([1]))[0])
    lf = np.zeros(chip.n_links)
    start, dur, sv, dv = schedule_transfers([Transfer(b0, b27, 1e6, 10.0), Transfer(b27, b0, 1e6, 0.0)], chip,
                                            vault_bw, vf, core_free, lf)
    bw = min(chip.vault_bw_bytes_per_ns, chip.link_bw_bytes_per_ns)
    assert dur[0] == pytest.approx(1e6 / bw + 6 * chip.link_latency_ns)
    assert start[0] == 1000.0  # core 27 streams from its vault until then
    assert start[1] == pytest.approx(start[0] + dur[0])  # the second one waits for both vaults
    assert vf[0] == vf[27] == pytest.approx(start[1] + dur[1])
    assert list(sv) == [0, 27] and list(dv) == [27, 0]
    assert lf[list(chip.route_links(0, 27))].tolist() == [start[0] + dur[0]] * 6  # it held its route


def test_attention_groups_and_assign_conserve_work() -> None:
    arch = ArchConfig.model_validate({"schedule": {"attention": "group", "group_cores": 16}})
    cores, k = attention_cores(np.array([0, 1, 5]), arch)
    assert k == 16 and cores[0, 0] == 0 and cores[1, 0] == 16 and cores[2, 0] == 16
    lw = synthetic_window(0, n_layers=2, micro_batch=8, context=256)
    rows = Rows.from_logical(lw.compute)
    chip = Chip.from_arch(arch)
    p = assign(rows, default_placement(arch, n_layers=2), ReplicaState(), [], chip, arch, np.zeros(64),
               np.full(64, 2.0))
    # every row's token/weight shares sum to 1 over its pieces
    np.testing.assert_allclose(np.bincount(p.row, weights=p.tok_frac, minlength=len(rows)), 1.0)
    np.testing.assert_allclose(np.bincount(p.row, weights=p.w_frac, minlength=len(rows))[~rows.is_expert], 1.0)
    assert set(p.core[p.split & (rows.mb[p.row] == 0)].tolist()) == set(range(16))


def test_pieces_crossing_the_same_link_take_turns() -> None:
    """Two single-piece stages of different micro-batches on different cores whose remote reads share a link run one
    after the other; without the shared link they overlap."""
    chip = Chip.from_arch(ArchConfig())
    st = Stages.of(np.array([0, 1]), np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(2))
    links_a = chip.route_links(0, 2)  # core 0's vault -> core 2 (links 0->1, 1->2)
    links_b = chip.route_links(1, 3)  # core 1's vault -> core 3 (links 1->2, 2->3): shares 1->2
    assert set(links_a) & set(links_b)
    def sched(links: dict[int, tuple[int, ...]]) -> Any:
        return list_schedule(st, np.array([0, 1]), np.array([2, 3]), np.array([10.0, 10.0]), np.arange(2), {},
                             np.zeros(64), np.zeros(64), 1e9, np.zeros(chip.n_links), links)

    s = sched({0: links_a, 1: links_b})
    assert sorted(s.start.tolist()) == [0.0, 10.0]
    assert s.link_free[list(set(links_a) & set(links_b))].tolist() == [20.0]
    s_free = sched({0: links_a, 1: chip.route_links(7, 5)})
    assert s_free.start.tolist() == [0.0, 0.0]
