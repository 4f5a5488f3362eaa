"""Science I acceptance: the schedule of the hardware as it is, and energy conserved in time and space.

The expected values are derived here from the cost model's formulas (``costmodel.cycles_from_macs``, vault and link
bandwidths) and the logical rows, not read back from the physicalizer.
"""

from __future__ import annotations

import numpy as np
import pytest

from services.lowering.costmodel import cycles_from_macs
from services.lowering.physical import physicalize_window
from services.lowering.synthetic import default_placement, synthetic_window
from shared.chip import Chip
from shared.configs.arch import ArchConfig
from shared.contracts.events import ComputeEvents, MemoryEvents, PhysicalState, WindowTiming
from shared.contracts.placement import OverlayMigrate, Overlays, Placement
from shared.contracts.workload import LogicalWindow
from shared.energy import EnergyModel, deposit_memory, noc_only_mask
from tests.lowering.replicas import after_migrations

Result = tuple[ComputeEvents, MemoryEvents, PhysicalState, WindowTiming]
F = 2.0


def _arch(**schedule: object) -> ArchConfig:
    return ArchConfig.model_validate({"schedule": schedule})


def _empty(t0: int, k: int, window_ms: float) -> LogicalWindow:
    return LogicalWindow(trace_id="t", window=k, t0_ns=t0, t1_ns=int(t0 + window_ms * 1e6),
                         compute=synthetic_window(0, n_layers=1).compute.empty(),
                         memory=synthetic_window(0, n_layers=1).memory.empty())


def _drained(st: PhysicalState) -> bool:
    q = st.queue
    return not (len(q.running_compute) or len(q.running_memory) or len(q.open_compute) or q.pending or q.open_mbs)


def _run_stream(windows: list[LogicalWindow], plc: Placement, arch: ArchConfig, window_ms: float, n_layers: int,
                overlays: list[Overlays] | None = None) -> list[Result]:
    """The windows, then empty windows until nothing is carried."""
    out: list[Result] = []
    st = PhysicalState()
    k = 0
    t0 = windows[0].t0_ns
    while k < len(windows) or not _drained(st):
        lw = windows[k] if k < len(windows) else _empty(t0, k, window_ms)
        ov = overlays[k] if overlays is not None and k < len(overlays) else None
        st = after_migrations(st, ov, plc)  # the replica state is the placement service's (TACS answers it)
        r = physicalize_window(k, lw, plc, ov, st, arch, [F] * arch.mesh.n_cores, window_ms, 1.0, n_layers=n_layers)
        out.append(r)
        st = r[2]
        t0 = r[3].t1_ns
        k += 1
        assert k < 5000
    return out


# ---- conservation -----------------------------------------------------------------------------------------------

def _conservation(windows: list[LogicalWindow], plc: Placement, overlays: list[Overlays] | None, window_ms: float,
                  n_layers: int) -> tuple[float, float]:
    """Σ over windows of deposited energy vs Σ of the events' energies, with the scratchpad and NoC energy set to 0
    so that the events' energies follow from the logical rows alone: compute = FLOPs/2 · mac energy, DRAM = (logical
    bytes + 2 × migrated bytes) · pJ/bit. Returns the relative errors (compute, memory)."""
    arch = ArchConfig.model_validate({"schedule": {"max_open_mb": 16}, "power": {"spm_pj_per_access": 0.0},
                                      "mesh": {"noc": {"pj_per_bit_hop": 0.0}}})
    res = _run_stream(windows, plc, arch, window_ms, n_layers, overlays)
    chip = Chip.from_arch(arch)
    em = EnergyModel.from_arch(arch)
    e_compute = sum(sum(r[0].energy_j) for r in res)
    e_memory = 0.0
    for _, m, _, _ in res:
        banks = np.array([chip.parse_bank(b, "x") for b in m.dst_bank], dtype=np.int64)
        dep = deposit_memory(chip, em, np.asarray(m.src_core, dtype=np.int64), banks, np.asarray(m.bytes),
                             noc_only_mask(m.noc_qos))
        e_memory += float(dep.core_j.sum() + dep.bank_j.sum())
    flops = sum(sum(w.compute.flops) for w in windows)
    mig = sum(sum(o.migrate.size_bytes) for o in overlays) if overlays else 0.0
    dram = (sum(sum(w.memory.bytes) for w in windows) + 2 * mig) * em.dram_j_per_byte
    return abs(e_compute / (flops / 2 * em.mac_j) - 1), abs(e_memory / dram - 1)


def _mixtral(n: int) -> list[LogicalWindow]:
    from services.workload.traces import iter_windows
    from shared.configs.workload import SequenceConfig, WorkloadConfig

    wl = WorkloadConfig(sequence=SequenceConfig(tokens=512, micro_batch=8, steps=6, step_interval_ms=1.0))
    return list(iter_windows(wl, 3.0))[:n]


def test_energy_is_conserved_over_the_default_window_stream() -> None:
    wins = _mixtral(2)
    err_c, err_m = _conservation(wins, default_placement(ArchConfig()), None, 3.0, 32)
    assert err_c < 1e-9 and err_m < 1e-9


def test_energy_is_conserved_with_migrations_every_window() -> None:
    wins = [synthetic_window(k, n_layers=2, micro_batch=8, context=256) for k in range(4)]
    plc = default_placement(ArchConfig(), n_layers=2)
    ovs = []
    for k in range(4):  # move L0E{k} to core 40 + k, with its 64 MiB, at mid-window
        t = int(wins[k].t0_ns + 1.5e6)
        ovs.append(Overlays(migrate=OverlayMigrate(
            t_apply_ns=[t], obj_type=["expert"], obj_id=[f"L0E{k}"], src=[str(plc.experts[f"L0E{k}"].cores[0])],
            dst=[str(40 + k)], size_bytes=[64 * 2**20], cost=[1.0])))
    err_c, err_m = _conservation(wins, plc, ovs, 3.0, 2)
    assert err_c < 1e-9 and err_m < 1e-9


def test_deposit_memory_conserves_and_places_every_share() -> None:
    arch = ArchConfig()
    chip = Chip.from_arch(arch)
    em = EnergyModel.from_arch(arch)
    rng = np.random.default_rng(3)
    n = 500
    src = rng.integers(0, 64, n)
    bank = rng.integers(0, chip.BX * chip.BY * chip.L, n)
    nbytes = rng.uniform(0, 1e6, n)
    noc_only = rng.random(n) < 0.2
    dep = deposit_memory(chip, em, src, bank, nbytes, noc_only)
    expect = em.memory_j(nbytes, chip.hops(src, chip.bank_vault_core(bank)), noc_only)
    assert dep.core_j.sum() + dep.bank_j.sum() == pytest.approx(expect.sum(), rel=1e-12)
    assert dep.total_j == pytest.approx(expect.sum(), rel=1e-12)
    dram = float(np.sum(nbytes[~noc_only])) * em.dram_j_per_byte
    assert dep.array_j == pytest.approx(dram * arch.dram.energy_split.array, rel=1e-12)
    assert dep.bank_j.sum() == pytest.approx(dram * (1 - arch.dram.energy_split.controller), rel=1e-12)


# ---- the schedule -----------------------------------------------------------------------------------------------

def _critical_path_ns(lw: LogicalWindow, plc: Placement, arch: ArchConfig) -> float:
    """One micro-batch alone on an idle chip: Σ over layers of attention + router (split over all n cores: 1/n of
    the cycles and bytes each, local) + the slowest expert (its cycles at its token count vs its bytes from its own
    vault), each piece max(compute, DMA)."""
    chip = Chip.from_arch(arch)
    n = chip.n_cores
    R, C = arch.core.array
    bw = chip.vault_bw_bytes_per_ns
    c = lw.compute
    bytes_of: dict[int, float] = {}
    for ev, b in zip(lw.memory.event_id, lw.memory.bytes, strict=True):
        bytes_of[ev] = bytes_of.get(ev, 0.0) + b
    stage: dict[tuple[int, int], float] = {}
    phase = {"attn": 0, "router": 1, "fc": 2}
    for ev, lv, op, e, tok, fl in zip(c.event_id, c.layer, c.op_type, c.expert, c.tokens, c.flops, strict=True):
        cyc = float(cycles_from_macs(np.array([fl / 2]), np.array([float(tok)]), R, C, arch.core.dataflow)[0])
        k = n if e < 0 else 1  # split over all cores, or one expert core
        d = max(cyc / k / F, bytes_of.get(ev, 0.0) / k / bw)
        key = (lv, phase[op])
        stage[key] = max(stage.get(key, 0.0), d)
    return sum(stage.values())


def test_one_micro_batch_alone_takes_its_critical_path() -> None:
    arch = _arch()
    lw = synthetic_window(0, n_layers=3, window_ms=1.0, step_ms=1.0, micro_batch=8, context=256)
    assert len(set(lw.compute.mb_id)) == 1
    plc = default_placement(arch, n_layers=3)
    res = _run_stream([lw], plc, arch, 1.0, 3)
    lat = [x for r in res for x in r[3].latencies_ms]
    assert len(lat) == 8
    assert lat[0] * 1e6 == pytest.approx(_critical_path_ns(lw, plc, arch), rel=1e-6, abs=2.0)
    assert sum(r[3].tokens_dropped for r in res) == 0


def _offered(step_ms: float, n_windows: int, arch: ArchConfig) -> tuple[float, list[Result], int]:
    """One micro-batch of 8 tokens per window of ``step_ms``: returns tokens/s completed over the run."""
    wins = [synthetic_window(k, n_layers=2, window_ms=step_ms, step_ms=step_ms, micro_batch=8, context=256)
            for k in range(n_windows)]
    plc = default_placement(arch, n_layers=2)
    st = PhysicalState()
    res = []
    for k, w in enumerate(wins):
        r = physicalize_window(k, w, plc, None, st, arch, [F] * 64, step_ms, 1.0, n_layers=2)
        res.append(r)
        st = r[2]
    done = sum(r[3].tokens_completed for r in res)
    return done / (n_windows * step_ms * 1e-3), res, sum(r[3].tokens_dropped for r in res)


def test_below_capacity_throughput_is_the_offered_rate_and_the_backlog_stays_bounded() -> None:
    arch = _arch()
    lone = synthetic_window(0, n_layers=2, window_ms=1.0, step_ms=1.0, micro_batch=8, context=256)
    lat_ms = _critical_path_ns(lone, default_placement(arch, n_layers=2), arch) / 1e6
    step = 2.0 * lat_ms  # half the capacity of one micro-batch in flight
    ips, res, dropped = _offered(step, 300, arch)
    offered = 8 / (step * 1e-3)
    assert dropped == 0
    # the last micro-batch may still be in flight at the end of the run: at most one short
    assert ips == pytest.approx(offered, rel=0.02)
    backlog = [r[3].backlog_ms for r in res]
    assert max(backlog[150:]) <= max(backlog[:150]) + 1e-9 and max(backlog) < 2 * lat_ms


def test_at_twice_capacity_throughput_is_the_capacity() -> None:
    arch = _arch()  # attention on all cores: one micro-batch in flight (schedule.open_limit)
    lone = synthetic_window(0, n_layers=2, window_ms=1.0, step_ms=1.0, micro_batch=8, context=256)
    lat_ms = _critical_path_ns(lone, default_placement(arch, n_layers=2), arch) / 1e6
    capacity = 8 / (lat_ms * 1e-3)  # tokens/s: one micro-batch at a time, each its critical path
    step = lat_ms / 2.0
    ips, res, dropped = _offered(step, 600, arch)
    assert dropped > 0
    assert ips == pytest.approx(capacity, rel=0.05)
    assert max(r[3].open_mbs for r in res) == 1


def test_group_mapping_overlaps_micro_batches_on_different_cores() -> None:
    """With attention on core groups, the attention of two micro-batches arriving together starts at once on
    their two groups; with attention on all cores the second one's pieces queue behind the first one's."""
    lw = synthetic_window(0, n_layers=2, window_ms=2.0, step_ms=1.0, micro_batch=8, context=256)
    lw.compute.t_gen_ns = [lw.t0_ns] * len(lw.compute)  # both arrive at once
    plc = default_placement(ArchConfig(), n_layers=2)
    for mapping in ("all", "group"):
        arch = _arch(attention=mapping, max_open_mb=2)
        res = _run_stream([lw], plc, arch, 2.0, 2)
        c = res[0][0]
        cores = {k for r in res for k, o in zip(r[0].core_id, r[0].op, strict=True) if o == "attn"}
        at_t0 = [k for k, o, t in zip(c.core_id, c.op, c.t_start_ns, strict=True) if o == "attn" and t == lw.t0_ns]
        if mapping == "group":  # micro-batches 0 and 1: groups 0 and 1, both at t0
            assert len(cores) == 16 and sorted(at_t0) == list(range(16))
        else:  # only the first micro-batch's pieces start at t0, the second's follow on the same cores
            assert len(cores) == 64 and sorted(at_t0) == list(range(64))
        assert sum(r[3].tokens_completed for r in res) == 16


def test_admission_sheds_micro_batches_beyond_the_limit() -> None:
    lw = synthetic_window(0, n_layers=2, window_ms=3.0, step_ms=1.0, micro_batch=8, context=256)
    plc = default_placement(ArchConfig(), n_layers=2)
    _, _, st, tm = physicalize_window(0, lw, plc, None, PhysicalState(), _arch(max_open_mb=2), [F] * 64, 3.0, 1.0,
                                      n_layers=2)
    assert tm.tokens_dropped == 8 and len(st.queue.dropped_mbs) == 1
    assert {o.mb_id for o in st.queue.open_mbs} | {p.mb_id for p in st.queue.pending} <= {0, 1}
    assert 2 not in set(st.queue.open_compute.mb_id)


def test_migration_lasts_bytes_over_bandwidth_and_spreads_its_energy_over_those_windows() -> None:
    arch = _arch()
    chip = Chip.from_arch(arch)
    plc = default_placement(arch, n_layers=2)
    nbytes = 512 * 2**20
    src, dst = plc.experts["L0E0"].cores[0], 27  # core 0 -> core 27: 6 hops
    ov = Overlays(migrate=OverlayMigrate(t_apply_ns=[100_000], obj_type=["expert"], obj_id=["L0E0"], src=[str(src)],
                                         dst=[str(dst)], size_bytes=[nbytes], cost=[1.0]))
    wms = 1.0
    w0 = _empty(0, 0, wms)
    res = _run_stream([w0], plc, arch, wms, 2, [ov])
    hops = int(chip.hops(np.array([src]), np.array([dst]))[0])
    bw = min(chip.vault_bw_bytes_per_ns, chip.link_bw_bytes_per_ns)
    dur = nbytes / bw + hops * chip.link_latency_ns
    start, end = 100_000.0, 100_000.0 + dur
    for k, (_, m, _, tm) in enumerate(res):
        got = sum(b for b, q, rw in zip(m.bytes, m.noc_qos, m.rw, strict=True) if q == "migration" and rw == "r")
        t0, t1 = tm.t0_ns, tm.t1_ns
        share = max(0.0, min(end, t1) - max(start, t0)) / dur
        assert got == pytest.approx(nbytes * share, rel=1e-9, abs=1e-6), k
    assert sum(1 for r in res if any(q == "migration" for q in r[1].noc_qos)) == int(np.ceil(end / 1e6))


def test_no_bank_or_core_exceeds_its_physical_power_bound() -> None:
    """Default Mixtral windows: the window-average power of a DRAM bank cannot exceed a whole vault's bandwidth
    streamed through it (vault_bw · 8 · pJ/bit · (array + TSV/IO share)); a logic core cannot exceed its array's
    peak MAC rate · MAC energy plus its scratchpad and DMA traffic at full rate, its controller and 4 router ports."""
    arch = ArchConfig()
    chip = Chip.from_arch(arch)
    em = EnergyModel.from_arch(arch)
    wins = _mixtral(3)
    res = _run_stream(wins, default_placement(arch), arch, 3.0, 32)
    sp = arch.dram.energy_split
    vault_bw = chip.vault_bw_bytes_per_ns * 1e9
    bank_max_w = vault_bw * em.dram_j_per_byte * (sp.array + sp.tsv_io)
    R, C = arch.core.array
    link_bw = chip.link_bw_bytes_per_ns * 1e9
    core_max_w = (R * C * F * 1e9 * em.mac_j  # array at full rate
                  + (R * C * F * 1e9 * (2 / R + 2 / C + 4 / R) + 2 * vault_bw) / 8 * em.spm_j_per_access
                  + vault_bw * em.dram_j_per_byte * sp.controller + 4 * link_bw * em.noc_j_per_byte_hop)
    worst_bank = worst_core = 0.0
    for c, m, _, tm in res:
        dt = (tm.t1_ns - tm.t0_ns) * 1e-9
        banks = np.array([chip.parse_bank(b, "x") for b in m.dst_bank], dtype=np.int64)
        dep = deposit_memory(chip, em, np.asarray(m.src_core, dtype=np.int64), banks, np.asarray(m.bytes),
                             noc_only_mask(m.noc_qos))
        core_j = dep.core_j + np.bincount(np.asarray(c.core_id, dtype=np.int64), weights=np.asarray(c.energy_j),
                                          minlength=64)
        worst_bank = max(worst_bank, float(dep.bank_j.max()) / dt)
        worst_core = max(worst_core, float(core_j.max()) / dt)
    assert 0 < worst_bank <= bank_max_w
    assert 0 < worst_core <= core_max_w
