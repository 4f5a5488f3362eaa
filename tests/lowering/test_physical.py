"""physicalize_window: mapping, overlays, conservation across windows, timing, determinism, bad input.

Most tests admit up to 16 micro-batches at once (``schedule.max_open_mb``) so that every micro-batch of the
small windows runs; admission itself is tested in test_schedule_energy.py."""

from __future__ import annotations

import numpy as np
import pytest

from services.lowering.physical import physicalize_window
from services.lowering.synthetic import default_placement, synthetic_window
from shared.chip import Chip
from shared.configs.arch import ArchConfig
from shared.contracts.events import ComputeEvents, MemoryEvents, PhysicalState, WindowTiming
from shared.contracts.placement import (
    ExpertPlacement,
    OverlayMigrate,
    OverlayReroute,
    Overlays,
    Placement,
    ReplicaEntry,
    ReplicaState,
)
from shared.contracts.workload import LogicalWindow
from shared.errors import BadInput
from tests.lowering.replicas import after_migrations

# the first wave's 32 x 32 x 8 banks (vaults of 4 x 4 per die): the bank ids below are written for that grid
ARCH = ArchConfig.model_validate({"schedule": {"max_open_mb": 16}, "dram": {"banks": [32, 32, 8]}})
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
        if _drained(state):
            break
        empty = LogicalWindow(trace_id="t", window=lw.window + k, t0_ns=int(lw.t0_ns + k * window_ms * 1e6),
                              t1_ns=int(lw.t0_ns + (k + 1) * window_ms * 1e6),
                              compute=lw.compute.empty(), memory=lw.memory.empty())
        out.append(run(empty, placement, state=state, window_ms=window_ms))
        state = out[-1][2]
    return out, state


def _drained(st: PhysicalState) -> bool:
    q = st.queue
    return not (len(q.running_compute) or len(q.running_memory) or len(q.open_compute) or q.pending or q.open_mbs)


def _dram_bytes(res: list[Result]) -> float:
    """Bytes of DRAM accesses (dispatch/combine events are core-to-core NoC traffic)."""
    return sum(b for r in res for b, q in zip(r[1].bytes, r[1].noc_qos, strict=True) if q in ("normal", "migration"))


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
                                       "dvfs_domain", "power_hint", "energy_j"]
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
    dram = [q == "normal" for q in m.noc_qos]
    assert all(h == 0 for h, d in zip(m.hops, dram, strict=True) if d)
    banks = {b for b, core, d in zip(m.dst_bank, m.src_core, dram, strict=True) if core == 5 and d}
    assert {int(chip.bank_vault_core(np.array([chip.parse_bank(b, "x")]))[0]) for b in banks} == {5}


def test_conservation_of_flops_and_bytes_across_windows() -> None:
    """Work that does not fit spills into later windows; nothing is lost or duplicated."""
    lw = small_window()
    res, state = drain(lw, window_ms=0.05)
    assert len(res) > 3  # it did spill
    flops = sum(sum(r[0].flops) for r in res)
    assert flops == pytest.approx(sum(lw.compute.flops), rel=1e-9)
    # bytes: weights are read once per core that runs the expert; here no replicas, so all logical bytes
    assert _dram_bytes(res) == pytest.approx(sum(lw.memory.bytes), rel=1e-9)
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
    assert st.queue.open_mbs and max(st.queue.busy_until_ns) > lw.t0_ns + 0.05e6
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
    hops = [h for h, core, q in zip(m1.hops, m1.src_core, m1.noc_qos, strict=True)
            if core == 63 and h > 0 and q == "normal"]
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


def test_expert_migration_costs_memory_events_and_runs_where_the_replica_state_says() -> None:
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    ov = Overlays(migrate=OverlayMigrate(t_apply_ns=[0], obj_type=["expert"], obj_id=["L0E0"], src=["0"],
                                         dst=["27"], size_bytes=[64 * 2**20], cost=[1.0]))
    state = after_migrations(PhysicalState(), ov, plc)
    c, m, st, tm = run(lw, placement=plc, overlays=ov, state=state, window_ms=10_000.0)
    assert tm.migrations == 1
    assert st.replicas == state.replicas  # carried as the placement service gave it
    mig = [(b, rw, h) for b, rw, h, q in zip(m.bytes, m.rw, m.hops, m.noc_qos, strict=True) if q == "migration"]
    assert sorted(rw for _, rw, _ in mig) == ["r", "w"]
    assert all(b == 64 * 2**20 for b, _, _ in mig)
    assert max(h for _, _, h in mig) == 3 + 3  # core 0 (0,0) -> core 27 (3,3)
    fc = {core for core, o in zip(c.core_id, c.op, strict=True) if o == "fc"}
    assert 27 in fc
    # the state carries the new mapping into the next window
    c2, _, _, _ = run(small_window(1), placement=plc, state=st, window_ms=10_000.0)
    assert 27 in {core for core, o in zip(c2.core_id, c2.op, strict=True) if o == "fc"}


def test_the_physicalizer_never_writes_the_replica_state() -> None:
    """ARCHITECTURE §3: the replica state has one owner, the placement service. The physicalizer reads it, carries it
    into its next state unchanged and refuses an expert migration the state it is given does not reflect (naming the
    row), instead of applying the move a second time by its own rule."""
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    ov = Overlays(migrate=OverlayMigrate(t_apply_ns=[0], obj_type=["expert"], obj_id=["L0E0"], src=["0"],
                                         dst=["27"], size_bytes=[64 * 2**20], cost=[1.0]))
    with pytest.raises(BadInput) as exc:  # the state still puts L0E0 on its placement core 0
        run(lw, placement=plc, overlays=ov, window_ms=10_000.0)
    assert exc.value.field == "overlays.migrate[0].dst"
    both = PhysicalState(replicas=ReplicaState(experts={"L0E0": ReplicaEntry(cores=[0, 27], ts_created_ns=0)}))
    with pytest.raises(BadInput) as exc:  # 27 added but 0 not left
        run(lw, placement=plc, overlays=ov, state=both, window_ms=10_000.0)
    assert exc.value.field == "overlays.migrate[0].src"
    moved = after_migrations(PhysicalState(), ov, plc)
    before = moved.model_dump()
    _, _, st, _ = run(lw, placement=plc, overlays=ov, state=moved, window_ms=10_000.0)
    assert st.replicas.model_dump() == before["replicas"]
    assert moved.model_dump() == before  # the caller's state is not changed either
    # a replica added (no src): its bytes come from the expert's other core
    add = Overlays(migrate=OverlayMigrate(t_apply_ns=[0], obj_type=["expert"], obj_id=["L0E0"], src=[""],
                                          dst=["27"], size_bytes=[1000], cost=[1.0]))
    _, m, st2, tm = run(lw, placement=plc, overlays=add, state=after_migrations(PhysicalState(), add, plc),
                        window_ms=10_000.0)
    assert st2.replicas.experts["L0E0"].cores == [0, 27] and tm.migrations == 1
    hops = {h for h, q in zip(m.hops, m.noc_qos, strict=True) if q == "migration"}
    assert max(hops) == 3 + 3  # core 0's vault -> core 27's


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
        nbytes += _dram_bytes([(c, m, st, tm)])
        done += tm.tokens_completed
        t0 = tm.t1_ns
        k += 1
        if k >= len(wins) and _drained(st):
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
    # the replica state is the shards' one record: the physical state keeps no second copy of their banks, and a
    # weight row that disagrees with it is refused (naming the row)
    assert st.tensor_banks == {}
    # an older physical state's copy of a shard's bank is dropped, and the reads follow the replica state even with
    # no overlay this window; a move no replica state records stays
    stale = PhysicalState(replicas=state.replicas, tensor_banks={"W_L0E0_0": "B(31,0,7)", "L0E0_*": "B(0,31,7)",
                                                                 "W_L1E0_0": "B(31,31,7)"})
    _, m2, st2, _ = run(lw, placement=plc, state=stale, window_ms=10_000.0)
    # (this placement lists no shards, so how many L0E0 has is not known: its "_*" stays, behind shard_banks)
    assert st2.tensor_banks == {"L0E0_*": "B(0,31,7)", "W_L1E0_0": "B(31,31,7)"}
    reads2 = {b for b, q, core in zip(m2.dst_bank, m2.noc_qos, m2.src_core, strict=True)
              if q == "normal" and core == 27}
    assert set(state.replicas.experts["L0E0"].shard_banks or []) <= reads2
    assert not {"B(31,0,7)", "B(0,31,7)"} & set(m2.dst_bank)
    wrong = ov.model_copy(update={"migrate": ov.migrate.model_copy(update={
        "dst": ["27", "B(13,13,0)", "B(15,13,1)"]})})
    with pytest.raises(BadInput) as exc:
        run(lw, placement=plc, overlays=wrong, state=state, window_ms=10_000.0)
    assert exc.value.field == "overlays.migrate[2].dst" and "replica state keeps it in B(14,13,1)" in str(exc.value)
    # an expert row that carries bytes would move shards the replica state records elsewhere: refused
    heavy = ov.model_copy(update={"migrate": ov.migrate.model_copy(update={"size_bytes": [1000, 1000, 2000]})})
    with pytest.raises(BadInput) as exc:
        run(lw, placement=plc, overlays=heavy, state=state, window_ms=10_000.0)
    assert exc.value.field == "overlays.migrate[0].size_bytes"
    # a shorter shard_banks list records only its shards: the expert's "_*" still serves the others, and stays
    short = PhysicalState(replicas=ReplicaState(experts={"L0E0": state.replicas.experts["L0E0"].model_copy(
        update={"shard_banks": ["B(13,13,0)", "B(14,13,1)"]})}), tensor_banks={"L0E0_*": "B(12,12,6)"})
    _, m3, st3, _ = run(lw, placement=plc, state=short, window_ms=10_000.0)
    assert st3.tensor_banks == {"L0E0_*": "B(12,12,6)"}
    reads3 = {b for b, q, core in zip(m3.dst_bank, m3.noc_qos, m3.src_core, strict=True)
              if q == "normal" and core == 27}
    assert {"B(13,13,0)", "B(14,13,1)", "B(12,12,6)"} <= reads3
    # with the placement listing L0E0's six shards, six recorded banks cover them all: the "_*" copy goes; two do not
    from shared.contracts.placement import TensorPlacement
    listed = plc.model_copy(update={"tensors": {f"W_L0E0_{k}": TensorPlacement(dram_bank=f"B(0,0,{k})",
                                                                                size_bytes=1000) for k in range(6)}})
    _, _, st4, _ = run(lw, placement=listed, state=stale, window_ms=10_000.0)
    assert st4.tensor_banks == {"W_L1E0_0": "B(31,31,7)"}
    _, _, st5, _ = run(lw, placement=listed, state=short, window_ms=10_000.0)
    assert st5.tensor_banks == {"L0E0_*": "B(12,12,6)"}


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


def _next_empty(lw: LogicalWindow, k: int, window_ms: float) -> LogicalWindow:
    return LogicalWindow(trace_id="t", window=lw.window + k, t0_ns=int(lw.t0_ns + k * window_ms * 1e6),
                         t1_ns=int(lw.t0_ns + (k + 1) * window_ms * 1e6), compute=lw.compute.empty(),
                         memory=lw.memory.empty())


def _open_fc_flops(st: PhysicalState, layer: int, expert: int) -> float:
    oc = st.queue.open_compute
    return sum(f for lv, e, f in zip(oc.layer, oc.expert, oc.flops, strict=True) if lv == layer and e == expert)


@pytest.mark.parametrize("kind", ["reroute", "migrate"])
def test_rerouted_or_migrated_expert_takes_its_open_work_along(kind: str) -> None:
    """ARCHITECTURE §4: work not yet scheduled is still logical, so when TACS moves an expert away from an
    overloaded core, that expert's open work runs where the expert now is (FLOPs and bytes conserved)."""
    wms = 0.05
    lw = small_window()
    plc = _hot_spot(5)
    _, _, st0, tm0 = run(lw, placement=plc, window_ms=wms)
    assert _open_fc_flops(st0, 1, 0) > 0 and tm0.open_mbs > 0  # layer-1 work of L1E0 is still open
    t_next = int(lw.t0_ns + wms * 1e6)
    if kind == "reroute":
        ov = Overlays(reroute=OverlayReroute(t_apply_ns=[0], scope=["expert"], from_core=[5], to_core=[40],
                                            mb_ids_json=['["L1E0"]'], reason=["hot_core"], expected_gain=[1.0]))
    else:
        ov = Overlays(migrate=OverlayMigrate(t_apply_ns=[t_next], obj_type=["expert"], obj_id=["L1E0"], src=["5"],
                                             dst=["40"], size_bytes=[0], cost=[1.0]))
    res_plain, _ = drain_from(lw, plc, None, st0, wms)
    res_moved, _ = drain_from(lw, plc, ov, after_migrations(st0, ov, plc), wms)
    assert sum(_fc_flops_on(r[0], 40) for r in res_plain) == 0.0
    on40 = sum(_fc_flops_on(r[0], 40) for r in res_moved)
    assert on40 == pytest.approx(_expert_flops(lw, 1, 0), rel=1e-9)  # all of L1E0, nothing else
    for res in (res_plain, res_moved):
        first = run(lw, placement=plc, window_ms=wms)
        allr = [first, *res]
        assert sum(sum(r[0].flops) for r in allr) == pytest.approx(sum(lw.compute.flops), rel=1e-9)
        assert _dram_bytes(allr) == pytest.approx(sum(lw.memory.bytes), rel=1e-9)
        assert sum(r[3].tokens_completed for r in allr) == lw.tokens_generated
    if kind == "reroute":  # the weights stay in core 5's vault: core 40 reads them over the NoC
        hops = {h for r in res_moved for h, c, q in zip(r[1].hops, r[1].src_core, r[1].noc_qos, strict=True)
                if c == 40 and q == "normal"}
        assert int(Chip.from_arch(ARCH).hops(np.array([40]), np.array([5]))[0]) in hops


def drain_from(lw: LogicalWindow, plc: Placement, ov: Overlays | None, st: PhysicalState, wms: float,
               drain_ms: float = 1.0) -> tuple[list[Result], PhysicalState]:
    """From state ``st`` after window 0: window 1 (``wms`` long) with the overlay, then empty windows of ``drain_ms``
    until nothing is carried (a window's length is the physicalizer's argument: the work carried is in absolute time,
    so longer drain windows drain the same work in fewer calls)."""
    out: list[Result] = []
    k, t0 = 1, int(lw.t0_ns + wms * 1e6)
    while True:
        ms = wms if k == 1 else drain_ms
        w = LogicalWindow(trace_id="t", window=lw.window + k, t0_ns=t0, t1_ns=int(t0 + ms * 1e6),
                          compute=lw.compute.empty(), memory=lw.memory.empty())
        out.append(physicalize_window(k, w, plc, ov if k == 1 else None, st, ARCH, F, ms, 1.0, n_layers=2))
        st, t0 = out[-1][2], w.t1_ns
        if _drained(st):
            return out, st
        k += 1
        assert k < 20_000


def test_moe_dispatch_and_combine_load_the_noc() -> None:
    """A routed expert's input activations come from the micro-batch's attention cores (1/k from each) and its
    outputs go back the same way: NoC-only events, and the link bytes are Σ act bytes × mean hops to the expert."""
    lw = small_window()
    plc = default_placement(ARCH, n_layers=2)
    window_ms = 10_000.0  # long enough that no link saturates (no clipping)
    _, mem, _, timing = run(lw, placement=plc, window_ms=window_ms)
    chip = Chip.from_arch(ARCH)
    qos = np.asarray(mem.noc_qos)
    assert "dispatch" in set(qos.tolist())  # the synthetic window's experts only read activations
    # weights are local (default placement: the owner's vault): DRAM accesses cross no link
    assert {h for h, q in zip(mem.hops, qos, strict=True) if q == "normal"} == {0}
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
    disp = sum(b for b, q in zip(mem.bytes, qos, strict=True) if q in ("dispatch", "combine"))
    act = sum(b for ev, t, b in zip(lw.memory.event_id, lw.memory.tensor_id, lw.memory.bytes, strict=True)
              if ev in expert_of_event and not t.startswith("W_"))
    own = sum(b / N for ev, t, b in zip(lw.memory.event_id, lw.memory.tensor_id, lw.memory.bytes, strict=True)
              if ev in expert_of_event and not t.startswith("W_"))  # the expert core's own 1/n share stays home
    assert disp == pytest.approx(act - own, rel=1e-9)


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda q: q.running_compute.core_id.__setitem__(0, 99), "state.queue.running_compute.core_id[0]"),
    (lambda q: q.running_compute.end_ns.__setitem__(0, float("nan")), "state.queue.running_compute.end_ns[0]"),
    (lambda q: q.running_memory.noc_qos.__setitem__(0, "express"), "state.queue.running_memory.noc_qos[0]"),
    (lambda q: q.running_memory.bank.__setitem__(0, -3), "state.queue.running_memory.bank[0]"),
    (lambda q: q.open_compute.flops.__setitem__(0, -1.0), "state.queue.open_compute.flops[0]"),
])
def test_a_tampered_state_is_refused_naming_the_field(mutate: object, field: str) -> None:
    """The state comes back from the caller (HTTP): what it carries is checked like any other input."""
    lw = small_window()
    _, _, st, _ = run(lw, placement=_hot_spot(5), window_ms=0.05)
    assert len(st.queue.running_compute) and len(st.queue.running_memory) and len(st.queue.open_compute)
    bad = st.model_copy(deep=True)
    mutate(bad.queue)  # type: ignore[operator]
    with pytest.raises(BadInput) as ei:
        run(_next_empty(lw, 1, 0.05), placement=_hot_spot(5), state=bad, window_ms=0.05)
    assert ei.value.field == field


def test_the_layer_look_ahead_gives_the_result_of_lowering_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """physical.lookahead lowers only the first layers of each micro-batch and grows the look-ahead when needed; the
    events, state and timing equal those of lowering every open row in every window."""
    import services.lowering.physical.lookahead as phys

    # 20 ms windows of two 6-layer micro-batches: a micro-batch runs past the first look-ahead within a window (the
    # look-ahead grows: `assign` is called twice in windows 0 and 3) and other work stays open across windows
    wins = [synthetic_window(k, n_layers=6, window_ms=20.0, step_ms=10.0, micro_batch=8, context=256)
            for k in range(4)]
    plc = default_placement(ARCH, n_layers=6)
    calls: list[int] = []
    real_assign = phys.assign  # type: ignore[attr-defined]

    def counting_assign(*args: object, **kw: object) -> object:
        calls.append(1)
        return real_assign(*args, **kw)  # type: ignore[arg-type]

    def stream() -> list[str]:
        st = PhysicalState()
        out = []
        for k, w in enumerate(wins):
            c, m, st, tm = physicalize_window(k, w, plc, None, st, ARCH, F, 20.0, 1.0, n_layers=6)
            out.append(c.model_dump_json() + m.model_dump_json() + st.model_dump_json() + tm.model_dump_json())
        return out

    monkeypatch.setattr(phys, "assign", counting_assign)
    lazy = stream()
    assert len(calls) > len(wins)  # the look-ahead grew at least once
    monkeypatch.setattr(phys, "LOOKAHEAD_LAYERS", 10_000)
    eager = stream()
    assert lazy == eager
    assert sum(1 for s in lazy if '"open_compute":{"event_id":[]' not in s) >= 2  # work stayed open


def test_emergency_throttle_clocks_stretch_compute_in_time() -> None:
    """The hard limit's emergency levels (arch.dtm) hand the physicalizer effective clocks down to 1/16 of the last
    DVFS step (1.2 GHz x 0.0625 = 75 MHz here): the same work takes as many cycles and as much energy at V0 (thermal
    charges the last step's voltage), over proportionally more time."""
    lw = small_window()
    fast = run(lw, window_ms=100_000.0, freq=[1.2] * N)
    slow = run(lw, window_ms=100_000.0, freq=[1.2 * 0.0625] * N)
    for r in (fast, slow):
        assert all(d > 0 for d in r[0].duration_cycles)
    assert sum(fast[0].flops) == pytest.approx(sum(slow[0].flops), rel=1e-12)
    assert sum(fast[0].energy_j) == pytest.approx(sum(slow[0].energy_j), rel=1e-9)
    assert np.mean(slow[3].latencies_ms) > np.mean(fast[3].latencies_ms)
    # cycles are counted at each run's own clock: in time, compute-bound pieces take 16 x longer (DMA-bound ones keep
    # their DMA time, so the whole stretches by less)
    t_fast = sum(fast[0].duration_cycles) / 1.2
    t_slow = sum(slow[0].duration_cycles) / (1.2 * 0.0625)
    assert t_slow > 4 * t_fast


def test_shards_sharing_a_bank_cost_nothing_in_the_schedule() -> None:
    """Several shards in one bank (bank packing) against each in a bank of its own, in the same vault: the schedule,
    the events and their bytes are the same but for the banks, and the DRAM array energy of the shared bank is the
    sum of the banks it replaces. The physicalizer times a piece's weight stream against its vault's channel
    (``vault_bw_gbps``) and runs a core's pieces one after another: no bank is a resource of the schedule, so bank
    conflicts and a bank's own bandwidth (TAPS's and TACS's ``bank_bw_gbps``) cost no time here; sharing a bank
    concentrates the reads' heat in it. (It takes the placement's banks as they are: every expert's six shards in one
    bank here is over a bank's capacity, on purpose, so that every read of an expert hits the one bank.)"""
    from shared.contracts.ids import bank_id
    from shared.contracts.placement import TensorPlacement
    from shared.energy import deposit_of_events

    lw = small_window()
    chip = Chip.from_arch(ARCH)
    bx, by = chip.BX // chip.X, chip.BY // chip.Y  # a vault's banks per die, in x and y

    def placed(shared: bool) -> Placement:
        plc = default_placement(ARCH, n_layers=2)
        for eid, ep in plc.experts.items():
            c = ep.cores[0]
            x0, y0 = (c % chip.X) * bx, (c // chip.X) * by
            for k in range(6):
                bank = bank_id(x0, y0, 0) if shared else bank_id(x0 + k % bx, y0 + k // bx, k % chip.L)
                plc.tensors[f"W_{eid}_{k}"] = TensorPlacement(dram_bank=bank, size_bytes=64 << 20)
        return plc

    own = run(lw, placement=placed(False), window_ms=10_000.0)
    one = run(lw, placement=placed(True), window_ms=10_000.0)
    assert own[0].model_dump() == one[0].model_dump() and own[3].model_dump() == one[3].model_dump()
    m_own, m_one = own[1].model_dump(), one[1].model_dump()
    assert {k: v for k, v in m_own.items() if k != "dst_bank"} == {k: v for k, v in m_one.items() if k != "dst_bank"}
    moved = [i for i, (a, b) in enumerate(zip(m_own["dst_bank"], m_one["dst_bank"], strict=True)) if a != b]
    assert moved and all(m_own["src_core"][i] < 16 for i in moved)
    d_own = deposit_of_events(own[0], own[1], ARCH).memory
    d_one = deposit_of_events(one[0], one[1], ARCH).memory
    np.testing.assert_allclose(d_own.core_j, d_one.core_j)
    np.testing.assert_allclose(d_own.array_j, d_one.array_j)
    np.testing.assert_allclose(d_own.tsv_io_vault_j.sum(axis=0), d_one.tsv_io_vault_j.sum(axis=0))
    for c in range(16):  # the shared bank of each expert's vault gains the array energy its other five banks lose
        x0, y0 = (c % chip.X) * bx, (c // chip.X) * by
        shared, *rest = [chip.parse_bank(bank_id(x0 + k % bx, y0 + k // bx, k % chip.L), "b") for k in range(6)]
        gain = d_one.array_bank_j[shared] - d_own.array_bank_j[shared]
        assert gain > 0 and gain == pytest.approx((d_own.array_bank_j[rest] - d_one.array_bank_j[rest]).sum(),
                                                  rel=1e-9)
