"""A striped expert (placement policy ``stripe``): its GEMMs split tensor-parallel over its cores, each core reading
``1/k`` of the weights from its own vault and seeing every token; MACs, bytes and energy conserved."""

from __future__ import annotations

import numpy as np
import pytest

from services.lowering.physical import physicalize_window
from services.lowering.synthetic import default_placement
from shared.chip import Chip
from shared.contracts.events import PhysicalState
from shared.contracts.placement import ExpertPlacement, Placement
from tests.lowering.test_physical import ARCH, F, N, _dram_bytes, _expert_flops, _fc_flops_on, drain, small_window

GROUP = [8, 9, 10, 11, 12, 13, 14, 15]


def _striped(keys: list[str]) -> Placement:
    plc = default_placement(ARCH, n_layers=2)
    for k in keys:
        plc.experts[k] = ExpertPlacement(cores=GROUP, policy="stripe")
    return plc


def test_a_striped_expert_runs_an_equal_share_on_every_core_of_its_group() -> None:
    lw = small_window()
    plc = _striped(["L0E0"])
    total = _expert_flops(lw, 0, 0)
    assert total > 0
    c, m, _, _ = physicalize_window(0, lw, plc, None, PhysicalState(), ARCH, F, 10_000.0, 1.0, n_layers=2)
    plain = physicalize_window(0, lw, default_placement(ARCH, n_layers=2), None, PhysicalState(), ARCH, F, 10_000.0,
                               1.0, n_layers=2)[0]
    # L0E0's FLOPs: on each group core an eighth, on top of what the core does in the plain placement
    for core in GROUP:
        extra = _fc_flops_on(c, core) - _fc_flops_on(plain, core)
        home = default_placement(ARCH, n_layers=2).experts["L0E0"].cores[0]
        extra += _fc_flops_on(plain, core) if core == home else 0.0
        assert extra == pytest.approx(total / len(GROUP), rel=1e-9), core
    assert sum(c.flops) == pytest.approx(sum(plain.flops), rel=1e-9)
    # each group core reads L0E0's weights from its own vault: local, 0 hops, an eighth of the bytes each
    chip = Chip.from_arch(ARCH)
    w = [(b, h, core, n) for b, h, core, n, q, rw in
         zip(m.dst_bank, m.hops, m.src_core, m.bytes, m.noc_qos, m.rw, strict=True)
         if q == "normal" and rw == "r" and core in GROUP]
    by_core: dict[int, float] = {}
    for b, h, core, n in w:
        vault = int(chip.bank_vault_core(np.array([chip.parse_bank(b, "x")]))[0])
        if vault == core:
            assert h == 0
        by_core[core] = by_core.get(core, 0.0) + n
    assert set(by_core) == set(GROUP)


def test_striping_conserves_flops_and_dram_bytes_and_completes_every_token() -> None:
    lw = small_window()
    plc = _striped([k for k in default_placement(ARCH, n_layers=2).experts])
    res, state = drain(lw, plc, window_ms=0.05)
    assert sum(sum(r[0].flops) for r in res) == pytest.approx(sum(lw.compute.flops), rel=1e-9)
    # every weight byte is read once in all (an eighth by each core); activations are read by each core in full
    weights = sum(b for t, b in zip(lw.memory.tensor_id, lw.memory.bytes, strict=True) if t.startswith("W_"))
    assert _dram_bytes(res) >= weights
    assert sum(r[3].tokens_completed for r in res) == lw.tokens_generated
    assert not state.queue.pending and not state.queue.open_mbs
    # the experts' work spread over the group: every group core ran fc work, no other core did
    fc_cores = {k for r in res for k, o in zip(r[0].core_id, r[0].op, strict=True) if o == "fc"}
    assert fc_cores == set(GROUP)


def test_a_striped_expert_is_faster_than_one_core_when_weights_bound() -> None:
    """Eight vaults stream an expert's weights in parallel: the window's expert work ends sooner."""
    lw = small_window()
    one = {k: ExpertPlacement(cores=[GROUP[0]]) for k in default_placement(ARCH, n_layers=2).experts}
    striped = _striped(list(one))
    ends = {}
    for name, plc in (("one", Placement(experts=one)), ("striped", striped)):
        res, _ = drain(lw, plc, window_ms=0.05)
        ends[name] = len(res)
    assert ends["striped"] < ends["one"]
    assert N == 64


def test_a_striped_row_does_not_depend_on_the_queues_and_a_replicated_one_does() -> None:
    """`assign` splits a replicated expert's row over its replicas by the queues at the window start, and gives a
    striped expert's row one piece per core of its stripe whatever the queues. The look-ahead's cache takes a row's
    lowering from an earlier window only when its pieces cannot have changed, so it must mark the replicated row as
    queue-dependent and the striped one not (a striped row marked so was lowered again every window)."""
    from services.lowering.physical.assign import Pieces, Rows, assign
    from services.lowering.physical.lookahead import _split_over_replicas
    from shared.contracts.placement import ReplicaState

    lw = small_window()
    rows = Rows.from_logical(lw.compute)
    plc = _striped(["L0E0"])
    plc.experts["L0E1"] = ExpertPlacement(cores=[1, 2], policy="replicate")
    chip, replicas = Chip.from_arch(ARCH), ReplicaState()
    idle, queued = np.zeros(N), np.zeros(N)
    queued[[1, GROUP[0]]] = 5e6  # core 1 and a core of the stripe busy for 5 ms: the replicated row's tokens go to 2
    quiet, busy = (assign(rows, plc, replicas, [], chip, ARCH, b, np.asarray(F)) for b in (idle, queued))

    def pieces_of(p: Pieces, expert: int) -> list[tuple[int, int, float]]:
        sel = np.flatnonzero((rows.layer[p.row] == 0) & (rows.expert[p.row] == expert))
        return sorted(zip(p.row[sel].tolist(), p.core[sel].tolist(), p.tok_frac[sel].tolist(), strict=True))

    striped_rows = np.flatnonzero((rows.layer == 0) & (rows.expert == 0)).tolist()
    assert striped_rows
    assert pieces_of(quiet, 0) == pieces_of(busy, 0) == [(r, c, 1.0) for r in striped_rows for c in GROUP]
    assert pieces_of(quiet, 1) != pieces_of(busy, 1)
    cores_of: dict[tuple[int, int], list[int]] = {}
    assign(rows, plc, replicas, [], chip, ARCH, idle, np.asarray(F), cores_of)
    multi = _split_over_replicas(rows, cores_of, plc)
    l0 = rows.layer == 0
    assert multi[l0 & (rows.expert == 1)].all() and not multi[l0 & (rows.expert == 0)].any()
    assert not multi[~rows.is_expert].any()
