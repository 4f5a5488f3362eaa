"""physicalize_window: mapping, overlays, conservation across windows, timing, determinism, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from services.lowering.chip import Chip
from services.lowering.physicalize import physicalize_window
from services.lowering.synthetic import default_placement, synthetic_window
from shared.configs.arch import ArchConfig
from shared.contracts.events import ComputeEvents, MemoryEvents, PhysicalState, WindowTiming
from shared.contracts.placement import ExpertPlacement, OverlayMigrate, OverlayReroute, Overlays, Placement
from shared.contracts.workload import LogicalWindow
from shared.errors import BadInput

ARCH = ArchConfig()
N = ARCH.mesh.n_cores
F = [2.0] * N
Result = tuple[ComputeEvents, MemoryEvents, PhysicalState, WindowTiming]


def small_window(window: int = 0, n_layers: int = 2, window_ms: float = 3.0) -> LogicalWindow:
    return synthetic_window(window, n_layers=n_layers, window_ms=window_ms, micro_batch=8, context=256)


def run(lw: LogicalWindow, placement: Placement | None = None, overlays: Overlays | None = None,
        state: PhysicalState | None = None, window_ms: float = 3.0, freq: list[float] | None = None,
        bw: float = 1.0) -> Result:
    return physicalize_window(lw.window, lw, placement or default_placement(ARCH, n_layers=2), overlays,
                              state or PhysicalState(), ARCH, freq or F, window_ms, bw, n_layers=2)


def drain(lw: LogicalWindow, placement: Placement | None = None, overlays: Overlays | None = None,
          window_ms: float = 3.0, max_windows: int = 2000) -> tuple[list[Result], PhysicalState]:
    """Physicalize ``lw`` and then empty windows until no work is carried."""
    out = [run(lw, placement, overlays, window_ms=window_ms)]
    state = out[0][2]
    for k in range(1, max_windows):
        if not len(state.queue.carry_compute) and not state.queue.pending and not len(state.queue.carry_memory):
            break
        empty = LogicalWindow(trace_id="t", window=lw.window + k, t0_ns=int(lw.t0_ns + k * window_ms * 1e6),
                              t1_ns=int(lw.t0_ns + (k + 1) * window_ms * 1e6),
                              compute=lw.compute.empty(), memory=lw.memory.empty())
        out.append(run(empty, placement, state=state, window_ms=window_ms))
        state = out[-1][2]
    return out, state


def test_physicalizer_consistency() -> None:
    """Seed §9: no overlay and an empty overlay give identical events."""
    lw = small_window()
    a = run(lw, overlays=None)
    b = run(lw, overlays=Overlays())
    for x, y in zip(a, b, strict=True):
        assert x.model_dump() == y.model_dump()
    assert len(a[0]) > 0 and len(a[1]) > 0


def test_determinism() -> None:
    lw = small_window()
    assert run(lw)[0].model_dump() == run(lw)[0].model_dump()
    assert run(lw)[1].model_dump() == run(lw)[1].model_dump()


def test_columns_are_the_seed_ones() -> None:
    assert ComputeEvents.columns() == ["evt_id", "t_start_ns", "core_id", "duration_cycles", "flops", "op",
                                       "dvfs_domain", "power_hint"]
    assert MemoryEvents.columns() == ["evt_id", "t_start_ns", "src_core", "dst_bank", "bytes", "rw", "hops",
                                      "noc_qos"]


def test_expert_work_goes_to_its_core_and_the_rest_everywhere() -> None:
    lw = small_window()
    experts = {k: ExpertPlacement(cores=[5]) for k in default_placement(ARCH, n_layers=2).experts}
    c, m, _, _ = run(lw, placement=Placement(experts=experts), window_ms=10_000.0)
    cores = np.asarray(c.core_id)
    ops = np.asarray(c.op)
    assert set(cores[ops == "fc"].tolist()) == {5}
    assert set(cores[ops == "attn"].tolist()) == set(range(N))
    # weights of experts on core 5 are read from core 5's vault: local, 0 hops
    chip = Chip.from_arch(ARCH)
    assert all(h == 0 for h in m.hops)
    banks = {b for b, core in zip(m.dst_bank, m.src_core, strict=True) if core == 5}
    assert {int(chip.bank_vault_core(np.array([chip.parse_bank(b, "x")]))[0]) for b in banks} == {5}


def test_conservation_of_flops_and_bytes_across_windows() -> None:
    """Work that does not fit spills into later windows; nothing is lost or duplicated."""
    lw = small_window()
    res, state = drain(lw, window_ms=0.05)
    assert len(res) > 3  # it did spill
    flops = sum(sum(r[0].flops) for r in res)
    assert flops == pytest.approx(sum(lw.compute.flops), rel=1e-9)
    # bytes: weights are read once per core that runs the expert; here no replicas, so all logical bytes
    nbytes = sum(sum(r[1].bytes) for r in res)
    assert nbytes == pytest.approx(sum(lw.memory.bytes), rel=1e-9)
    assert sum(r[3].tokens_completed for r in res) == lw.tokens_generated == 24
    assert not state.queue.pending and not state.queue.open_mbs
    for r in res:
        assert all(0.0 <= u <= 1.0 for u in r[3].util_core)
        assert len(r[3].noc_link_util) == 2 * 7 * 8 * 2
    # event ids are unique and increasing across windows
    ids = [i for r in res for i in r[0].evt_id + r[1].evt_id]
    assert len(ids) == len(set(ids))


def test_latency_and_spill() -> None:
    lw = small_window()
    _, _, st, tm = run(lw, window_ms=0.05)
    assert tm.tokens_completed == 0
    assert st.queue.pending and max(st.queue.busy_until_ns) > lw.t0_ns + 0.05e6
    assert tm.backlog_ms > 0
    _, _, _, big = run(lw, window_ms=10_000.0)
    assert big.tokens_completed == 24
    assert len(big.latencies_ms) == 24 and min(big.latencies_ms) > 0
    assert big.backlog_ms == 0.0


def test_lower_frequency_and_refresh_slow_things_down() -> None:
    lw = small_window()
    base = run(lw, window_ms=10_000.0)[3]
    slow = run(lw, window_ms=10_000.0, freq=[1.0] * N)[3]
    refresh = run(lw, window_ms=10_000.0, bw=0.5)[3]
    assert np.mean(slow.latencies_ms) > np.mean(base.latencies_ms)
    assert np.mean(refresh.latencies_ms) > np.mean(base.latencies_ms)


def test_reroute_moves_work_and_reads_weights_over_the_noc() -> None:
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    c0, _, _, _ = run(lw, placement=plc, window_ms=10_000.0)
    src = plc.experts["L0E0"].cores[0]  # core 0
    ov = Overlays(reroute=OverlayReroute(t_apply_ns=[0], scope=["expert"], from_core=[src], to_core=[63],
                                        mb_ids_json=['["L0E0"]'], reason=["hot_core"], expected_gain=[0.1]))
    c1, m1, _, t1 = run(lw, placement=plc, overlays=ov, window_ms=10_000.0)
    fc0 = [c for c, o in zip(c0.core_id, c0.op, strict=True) if o == "fc"]
    fc1 = [c for c, o in zip(c1.core_id, c1.op, strict=True) if o == "fc"]
    assert src in fc0 and 63 not in fc0
    assert 63 in fc1 and src not in fc1
    hops = [h for h, core in zip(m1.hops, m1.src_core, strict=True) if core == 63 and h > 0]
    assert hops and set(hops) == {14}  # (0,0) -> (7,7)
    assert max(t1.noc_link_util) > 0


def test_reroute_mb_scope_only_touches_listed_micro_batches() -> None:
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    mbs = sorted(set(lw.compute.mb_id))
    ov = Overlays(reroute=OverlayReroute(t_apply_ns=[0], scope=["mb"], from_core=[0], to_core=[1],
                                        mb_ids_json=[f"[{mbs[0]}]"], reason=["x"], expected_gain=[0.0]))
    c, _, _, _ = run(lw, placement=plc, overlays=ov, window_ms=10_000.0)
    # attention of the listed micro-batch left core 0: core 0 runs fewer attention events than core 2
    att = [core for core, o in zip(c.core_id, c.op, strict=True) if o == "attn"]
    assert att.count(0) < att.count(2)
    assert att.count(1) > att.count(2)


def _expert_flops(lw: LogicalWindow, layer: int, expert: int) -> float:
    return sum(f for lv, e, f in zip(lw.compute.layer, lw.compute.expert, lw.compute.flops, strict=True)
               if lv == layer and e == expert)


def _fc_flops_on(c: ComputeEvents, core: int) -> float:
    return sum(f for k, o, f in zip(c.core_id, c.op, c.flops, strict=True) if o == "fc" and k == core)


def test_replicas_split_by_least_loaded() -> None:
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)  # cores 0..15 host one expert each, core 20 none
    plc.experts["L0E0"] = ExpertPlacement(cores=[0, 20], policy="replicate")
    l0e0 = _expert_flops(lw, 0, 0)
    assert l0e0 > 0
    c, _, _, _ = run(lw, placement=plc, window_ms=10_000.0)
    # both replicas idle: the tokens are shared (water-filling), and the FLOPs add up
    on0, on20 = _fc_flops_on(c, 0), _fc_flops_on(c, 20)
    assert 0 < on0 < l0e0 and 0 < on20 < l0e0
    assert on0 + on20 == pytest.approx(l0e0, rel=1e-9)
    assert abs(on0 - on20) <= l0e0 / 3
    # core 20 has 5 ms of queued work: the least-loaded rule sends every L0E0 token to core 0
    busy = PhysicalState()
    busy.queue.busy_until_ns = [0] * N
    busy.queue.busy_until_ns[20] = 5_000_000
    c2, _, _, _ = physicalize_window(0, lw, plc, None, busy, ARCH, F, 10_000.0, 1.0, n_layers=2)
    assert _fc_flops_on(c2, 0) == pytest.approx(l0e0, rel=1e-9)
    assert _fc_flops_on(c2, 20) == 0.0


def test_expert_migration_costs_memory_events_and_updates_state() -> None:
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    ov = Overlays(migrate=OverlayMigrate(t_apply_ns=[0], obj_type=["expert"], obj_id=["L0E0"], src=["0"],
                                         dst=["27"], size_bytes=[64 * 2**20], cost=[1.0]))
    c, m, st, tm = run(lw, placement=plc, overlays=ov, window_ms=10_000.0)
    assert tm.migrations == 1
    assert st.replicas.experts["L0E0"].cores == [27]
    assert st.replicas.experts["L0E0"].prev_cores == [0]
    mig = [(b, rw, h) for b, rw, h, q in zip(m.bytes, m.rw, m.hops, m.noc_qos, strict=True) if q == "migration"]
    assert sorted(rw for _, rw, _ in mig) == ["r", "w"]
    assert all(b == 64 * 2**20 for b, _, _ in mig)
    assert max(h for _, _, h in mig) == 3 + 3  # core 0 (0,0) -> core 27 (3,3)
    fc = {core for core, o in zip(c.core_id, c.op, strict=True) if o == "fc"}
    assert 27 in fc
    # the state carries the new mapping into the next window
    c2, _, _, _ = run(small_window(1), placement=plc, state=st, window_ms=10_000.0)
    assert 27 in {core for core, o in zip(c2.core_id, c2.op, strict=True) if o == "fc"}


def test_migration_leaves_the_callers_state_unchanged() -> None:
    """The replica state is copied per call (entries replaced, never mutated): the state passed in is the previous
    window's, which a caller (a replayed window, the orchestrator's frontier) may use again."""
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    ov = Overlays(migrate=OverlayMigrate(t_apply_ns=[0], obj_type=["expert"], obj_id=["L0E0"], src=["0"],
                                         dst=["27"], size_bytes=[64 * 2**20], cost=[1.0]))
    _, _, st, _ = run(lw, placement=plc, overlays=ov, window_ms=10_000.0)
    before = st.model_dump()
    ov2 = Overlays(migrate=OverlayMigrate(t_apply_ns=[0], obj_type=["expert"], obj_id=["L0E0"], src=["27"],
                                          dst=["5"], size_bytes=[64 * 2**20], cost=[1.0]))
    _, _, st2, _ = run(small_window(1), placement=plc, overlays=ov2, state=st, window_ms=10_000.0)
    assert st2.replicas.experts["L0E0"].cores == [5]
    assert st.model_dump() == before
    assert st.replicas.experts["L0E0"].cores == [27]


def test_weight_migration_moves_reads() -> None:
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    ov = Overlays(migrate=OverlayMigrate(t_apply_ns=[0], obj_type=["weight"], obj_id=["W_L0E0_0"],
                                         src=["B(0,0,0)"], dst=["B(31,31,7)"], size_bytes=[1000], cost=[0.0]))
    _, m, st, _ = run(lw, placement=plc, overlays=ov, window_ms=10_000.0)
    assert st.tensor_banks["W_L0E0_0"] == "B(31,31,7)"
    normal = [(b, h) for b, h, q in zip(m.dst_bank, m.hops, m.noc_qos, strict=True)
              if q == "normal" and b == "B(31,31,7)"]
    assert normal and all(h == 14 for _, h in normal)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"freq": [2.0] * 3}, "freq_ghz"),
    ({"freq": [0.0] * N}, "freq_ghz"),
    ({"bw": 1.5}, "bw_eff_factor"),
])
def test_bad_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    lw = small_window()
    with pytest.raises(BadInput) as ei:
        run(lw, freq=kwargs.get("freq"), bw=kwargs.get("bw", 1.0))  # type: ignore[arg-type]
    assert ei.value.field == field


def test_unplaced_expert_and_bad_overlay() -> None:
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    del plc.experts["L0E0"]
    with pytest.raises(BadInput) as ei:
        run(lw, placement=plc)
    assert ei.value.field == "placement.experts.L0E0"
    ov = Overlays(reroute=OverlayReroute(t_apply_ns=[0], scope=["mb"], from_core=[0], to_core=[99],
                                        mb_ids_json=["[]"], reason=[""], expected_gain=[0.0]))
    with pytest.raises(BadInput) as ei:
        run(lw, overlays=ov)
    assert ei.value.field == "overlays.reroute[0].to_core"


def test_real_workload_windows_conserve_work_and_complete_every_token() -> None:
    """The workload service's Mixtral trace (contract data, not the synthetic window) through the physicalizer."""
    from services.workload.traces import iter_windows
    from shared.configs.workload import SequenceConfig, WorkloadConfig

    wl = WorkloadConfig(sequence=SequenceConfig(tokens=256, micro_batch=4, steps=4, step_interval_ms=1.0))
    wins = list(iter_windows(wl, 2.0))
    plc = default_placement(ARCH)
    st = PhysicalState()
    flops = nbytes = 0.0
    done = 0
    k = 0
    t0 = 0
    while True:
        # the trace's 2 ms windows, then long empty windows until the queue drains
        w_ms = 2.0 if k < len(wins) else 200.0
        lw = wins[k] if k < len(wins) else LogicalWindow(
            trace_id="t", window=k, t0_ns=t0, t1_ns=int(t0 + w_ms * 1e6),
            compute=wins[0].compute.empty(), memory=wins[0].memory.empty())
        assert lw.t0_ns == t0
        c, m, st, tm = physicalize_window(k, lw, plc, None, st, ARCH, F, w_ms, 1.0)
        flops += sum(c.flops)
        nbytes += sum(m.bytes)
        done += tm.tokens_completed
        t0 = tm.t1_ns
        k += 1
        if k >= len(wins) and not len(st.queue.carry_compute) and not st.queue.pending:
            break
        assert k < 500
    assert flops == pytest.approx(sum(sum(w.compute.flops) for w in wins), rel=1e-9)
    assert nbytes == pytest.approx(sum(sum(w.memory.bytes) for w in wins), rel=1e-9)
    assert done == sum(w.tokens_generated for w in wins) == 16


def test_tacs_style_migration_keeps_its_replica_state() -> None:
    """TACS updates ReplicaState itself and sends an expert row (0 bytes) plus one weight row per shard."""
    from shared.contracts.placement import ReplicaEntry, ReplicaState

    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    state = PhysicalState(replicas=ReplicaState(experts={"L0E0": ReplicaEntry(
        cores=[27], ts_created_ns=0, last_change_ns=5, prev_cores=[0],
        shard_banks=["B(13,13,0)", "B(14,13,1)", "B(13,14,2)", "B(14,14,3)", "B(12,12,4)", "B(15,15,5)"])}))
    ov = Overlays(migrate=OverlayMigrate(
        t_apply_ns=[0, 0, 0], obj_type=["expert", "weight", "weight"], obj_id=["L0E0", "W_L0E0_0", "W_L0E0_1"],
        src=["0", "B(0,0,0)", "B(1,0,0)"], dst=["27", "B(13,13,0)", "B(14,13,1)"], size_bytes=[0, 1000, 2000],
        cost=[1.0, 0.3, 0.7]))
    c, m, st, tm = run(lw, placement=plc, overlays=ov, state=state, window_ms=10_000.0)
    assert tm.migrations == 1
    ent = st.replicas.experts["L0E0"]
    assert ent.cores == [27] and ent.prev_cores == [0] and ent.last_change_ns == 5  # TACS's bookkeeping kept
    mig = sorted(b for b, q in zip(m.bytes, m.noc_qos, strict=True) if q == "migration")
    assert mig == [1000, 1000, 2000, 2000]
    # every shard read of L0E0 goes to the banks the state lists, locally (core 27's vault)
    reads = {b for b, q, core in zip(m.dst_bank, m.noc_qos, m.src_core, strict=True) if q == "normal" and core == 27}
    assert set(state.replicas.experts["L0E0"].shard_banks or []) <= reads
    assert 27 in {k for k, o in zip(c.core_id, c.op, strict=True) if o == "fc"}


def test_replicas_read_their_own_copies() -> None:
    from shared.contracts.placement import TensorPlacement

    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    plc.experts["L0E0"] = ExpertPlacement(cores=[0, 20], policy="replicate")
    for k in range(6):
        plc.tensors[f"W_L0E0_{k}"] = TensorPlacement(dram_bank=f"B(0,{k % 4},{k})",
                                                     replica_banks=[f"B(16,{8 + k % 4},{k})"])
    _, m, _, _ = run(lw, placement=plc, window_ms=10_000.0)
    for core, bank in ((0, "B(0,0,0)"), (20, "B(16,8,0)")):
        rows = [(b, h) for b, h, c in zip(m.dst_bank, m.hops, m.src_core, strict=True) if c == core and b == bank]
        assert rows and all(h == 0 for _, h in rows)


def _hot_spot(core: int = 5) -> Placement:
    return Placement(experts={k: ExpertPlacement(cores=[core]) for k in default_placement(ARCH, n_layers=2).experts})


def _carried_fc_flops(st: PhysicalState, core: int, expert: str | None = None) -> float:
    cc, tags = st.queue.carry_compute, st.queue.carry_compute_expert or [""] * len(st.queue.carry_compute)
    return sum(f for k, p, o, f, t in zip(cc.core_id, cc.part, cc.op, cc.flops, tags, strict=True)
               if k == core and p == 1 and o == "fc" and (expert is None or t == expert))


def _next_empty(lw: LogicalWindow, k: int, window_ms: float) -> LogicalWindow:
    return LogicalWindow(trace_id="t", window=lw.window + k, t0_ns=int(lw.t0_ns + k * window_ms * 1e6),
                         t1_ns=int(lw.t0_ns + (k + 1) * window_ms * 1e6), compute=lw.compute.empty(),
                         memory=lw.memory.empty())


@pytest.mark.parametrize("kind", ["reroute", "migrate"])
def test_rerouted_or_migrated_expert_takes_its_backlog_along(kind: str) -> None:
    """ARCHITECTURE §4: carried work that has not started is not yet physicalized, so when TACS moves an expert away
    from an overloaded core, that expert's queued work leaves with it (FLOPs and bytes conserved)."""
    wms = 0.05
    lw = small_window()
    plc = _hot_spot(5)
    _, _, st0, tm0 = run(lw, placement=plc, window_ms=wms)
    backlog = _carried_fc_flops(st0, 5, "L0E0")
    assert backlog > 0 and tm0.backlog_ms > 0  # core 5 is overloaded and L0E0 work waits in its queue
    t_next = int(lw.t0_ns + wms * 1e6)
    if kind == "reroute":
        ov = Overlays(reroute=OverlayReroute(t_apply_ns=[t_next], scope=["expert"], from_core=[5], to_core=[40],
                                            mb_ids_json=['["L0E0"]'], reason=["hot_core"], expected_gain=[1.0]))
    else:
        ov = Overlays(migrate=OverlayMigrate(t_apply_ns=[t_next], obj_type=["expert"], obj_id=["L0E0"], src=["5"],
                                             dst=["40"], size_bytes=[0], cost=[1.0]))
    empty = _next_empty(lw, 1, wms)
    plain = physicalize_window(1, empty, plc, None, st0, ARCH, F, wms, 1.0, n_layers=2)
    moved = physicalize_window(1, empty, plc, ov, st0, ARCH, F, wms, 1.0, n_layers=2)
    # without the overlay core 40 does nothing; with it, it runs L0E0's backlog and core 5's queue got shorter
    assert _fc_flops_on(plain[0], 40) == 0.0
    assert _fc_flops_on(moved[0], 40) > 0.0
    assert moved[2].queue.busy_until_ns[5] < plain[2].queue.busy_until_ns[5]
    assert _carried_fc_flops(moved[2], 5, "L0E0") == 0.0
    assert _carried_fc_flops(moved[2], 5) < _carried_fc_flops(plain[2], 5)
    # the other experts' backlog stays on core 5
    assert _carried_fc_flops(moved[2], 5, "L0E1") == pytest.approx(_carried_fc_flops(plain[2], 5, "L0E1"))
    # conservation: drain both and compare the totals with the logical window
    for first in (moved,):
        res, state = [run(lw, placement=plc, window_ms=wms), first], first[2]
        big = 10.0  # drain in 10 ms windows
        for k in range(2, 200):
            if not len(state.queue.carry_compute) and not state.queue.pending and not len(state.queue.carry_memory):
                break
            t0 = int(lw.t0_ns + 2 * wms * 1e6 + (k - 2) * big * 1e6)
            w = LogicalWindow(trace_id="t", window=k, t0_ns=t0, t1_ns=int(t0 + big * 1e6),
                              compute=lw.compute.empty(), memory=lw.memory.empty())
            res.append(physicalize_window(k, w, plc, None, state, ARCH, F, big, 1.0, n_layers=2))
            state = res[-1][2]
        assert not len(state.queue.carry_compute)
        assert sum(sum(r[0].flops) for r in res) == pytest.approx(sum(lw.compute.flops), rel=1e-9)
        assert sum(sum(r[1].bytes) for r in res) == pytest.approx(sum(lw.memory.bytes), rel=1e-9)
        assert sum(r[3].tokens_completed for r in res) == lw.tokens_generated
        l0e0_on_40 = sum(_fc_flops_on(r[0], 40) for r in res)
        assert l0e0_on_40 == pytest.approx(backlog, rel=1e-9)  # exactly the backlog moved, nothing else


def test_carry_tags_must_match_the_records() -> None:
    lw = small_window()
    _, _, st, _ = run(lw, placement=_hot_spot(5), window_ms=0.05)
    assert st.queue.carry_compute_expert and len(st.queue.carry_compute_expert) == len(st.queue.carry_compute)
    bad = st.model_copy(deep=True)
    bad.queue.carry_compute_expert = bad.queue.carry_compute_expert[:-1]
    with pytest.raises(BadInput) as ei:
        run(_next_empty(lw, 1, 0.05), placement=_hot_spot(5), state=bad, window_ms=0.05)
    assert ei.value.field == "state.queue.carry_compute_expert"


def test_migrated_backlog_reads_from_the_new_vault_rerouted_over_the_noc() -> None:
    wms = 0.05
    lw = small_window()
    plc = _hot_spot(5)
    _, _, st0, _ = run(lw, placement=plc, window_ms=wms)
    t_next = int(lw.t0_ns + wms * 1e6)
    chip = Chip.from_arch(ARCH)
    mig = Overlays(migrate=OverlayMigrate(t_apply_ns=[t_next], obj_type=["expert"], obj_id=["L0E0"], src=["5"],
                                          dst=["40"], size_bytes=[0], cost=[1.0]))
    rr = Overlays(reroute=OverlayReroute(t_apply_ns=[t_next], scope=["expert"], from_core=[5], to_core=[40],
                                        mb_ids_json=['["L0E0"]'], reason=["hot_core"], expected_gain=[1.0]))
    for ov, vault in ((mig, 40), (rr, 5)):
        _, _, st1, _ = physicalize_window(1, _next_empty(lw, 1, wms), plc, ov, st0, ARCH, F, wms, 1.0, n_layers=2)
        cm = st1.queue.carry_memory
        mine = [(b, h) for k, b, h, t in zip(cm.src_core, cm.dst_bank, cm.hops, st1.queue.carry_memory_expert,
                                             strict=True) if k == 40 and t == "L0E0"]
        assert mine
        vaults = {int(chip.bank_vault_core(np.array([chip.parse_bank(b, "x")]))[0]) for b, _ in mine}
        assert vaults == {vault}
        assert {h for _, h in mine} == {int(chip.hops(np.array([40]), np.array([vault]))[0])}


def test_moe_dispatch_and_combine_load_the_noc() -> None:
    """Expert activations are gathered from / scattered to all cores: link bytes = Σ act bytes × mean hops."""
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    window_ms = 10_000.0  # long enough that no link saturates (no clipping)
    _, mem, _, timing = run(lw, placement=plc, window_ms=window_ms)
    chip = Chip.from_arch(ARCH)
    # weights are local (default placement: the owner's vault), so every link byte is dispatch/combine traffic
    assert set(mem.hops) == {0}
    link_bytes = np.asarray(timing.noc_link_util) * chip.link_bw_bytes_per_ns * window_ms * 1e6
    cores = np.arange(N, dtype=np.int64)
    mean_hops = np.array([chip.hops(cores, np.full(N, c, dtype=np.int64)).mean() for c in range(N)])
    expert_of_event = {ev: (layer, ex) for ev, layer, ex in zip(lw.compute.event_id, lw.compute.layer,
                                                               lw.compute.expert, strict=True) if ex >= 0}
    expected = 0.0
    for ev, tensor, nbytes in zip(lw.memory.event_id, lw.memory.tensor_id, lw.memory.bytes, strict=True):
        if ev in expert_of_event and not tensor.startswith("W_"):
            layer, ex = expert_of_event[ev]
            expected += nbytes * mean_hops[plc.experts[f"L{layer}E{ex}"].cores[0]]
    assert expected > 0
    np.testing.assert_allclose(link_bytes.sum(), expected, rtol=1e-9)
