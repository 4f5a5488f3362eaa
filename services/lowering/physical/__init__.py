"""``physicalize_window`` (seed 001 §4.4): logical window + placement + TACS overlays → physical events and timing.

A pipeline of pure stages, each in its own module with its own tests:

1. ``overlays``: migrations become transfers (weight moves update the tensor banks; the replica state, the
   placement service's, is read, never written); reroutes become rules.
2. admission (here): a micro-batch arriving when ``arch.schedule.max_open_mb`` are in flight is shed
   (``tokens_dropped``); the others' rows join the open rows carried from earlier windows.
3. ``assign``: rows → pieces on cores (attention mapping, replicas, reroutes).
4. ``memory``: the pieces' traffic (banks, bytes, hops).
5. ``cost``: duration (max of compute and DMA) and energy of each piece.
6. ``schedule``: list schedule of ready stages on cores and vaults; stages not ready by the window end stay open.
7. ``deposit``: every scheduled piece, its traffic, the MoE dispatch/combine it causes and every migration is an
   interval; each window emits the share of it that falls inside the window, the rest is carried as running work.

Units: ns (absolute simulated time) inside, ms in ``WindowTiming``, GHz (= cycles/ns), bytes, J.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from services.lowering.costmodel import mac_pj_for
from services.lowering.physical import deposit
from services.lowering.physical.assign import Pieces, Rows, assign, attention_cores
from services.lowering.physical.cost import cost
from services.lowering.physical.memory import Traffic, prepare, row_bytes, traffic
from services.lowering.physical.overlays import Reroute, apply_migrations, drop_recorded, parse_reroutes
from services.lowering.physical.schedule import Stages, list_schedule, schedule_transfers
from shared.chip import Chip
from shared.configs.arch import ArchConfig
from shared.contracts.events import (
    NOC_QOS,
    ActiveReroute,
    ComputeEvents,
    CoreQueueState,
    MemoryEvents,
    OpenMicroBatch,
    PendingTokens,
    PhysicalState,
    RunningCompute,
    RunningMemory,
    WindowTiming,
)
from shared.contracts.placement import Overlays, Placement
from shared.contracts.workload import LogicalCompute, LogicalMemory, LogicalWindow
from shared.energy import EnergyModel
from shared.errors import BadInput

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
QOS = NOC_QOS  # coded by index: 2 and 3 are NoC-only (shared.contracts.events)
QOS_CODE = {q: i for i, q in enumerate(QOS)}
LOOKAHEAD_LAYERS = 2  # first look-ahead (layers per micro-batch); an optimisation only, results do not depend on it


@dataclass
class _Intervals:
    """Compute or memory work with real intervals, as arrays (running from earlier windows + new)."""

    core: I64
    start: F64
    end: F64
    # compute
    op: I64 | None = None
    cycles: F64 | None = None
    flops: F64 | None = None
    energy: F64 | None = None
    # memory
    bank: I64 | None = None
    nbytes: F64 | None = None
    write: NDArray[np.bool_] | None = None
    hops: I64 | None = None
    qos: I64 | None = None


def _mb_tokens(rows: Rows, sel: NDArray[np.bool_]) -> int:
    ne = sel & ~rows.is_expert
    return int(rows.tokens[ne].max()) if ne.any() else int(rows.tokens[sel].max()) if sel.any() else 0


def _validate_rows(lc: LogicalCompute, where: str = "logical.compute") -> None:
    if not len(lc):
        return
    tok = np.asarray(lc.tokens, dtype=np.float64)
    fl = np.asarray(lc.flops, dtype=np.float64)
    if np.any(tok < 0):
        raise BadInput("tokens must be >= 0", field=f"{where}.tokens[{int(np.flatnonzero(tok < 0)[0])}]")
    bad = ~np.isfinite(fl) | (fl < 0)
    if np.any(bad):
        raise BadInput("flops must be finite and >= 0", field=f"{where}.flops[{int(np.flatnonzero(bad)[0])}]")


def _validate_running(q: CoreQueueState, n: int) -> None:
    """The carried running work must name cores of this mesh, known QoS classes and finite, ordered intervals."""
    for name, cols, core_col in (("running_compute", q.running_compute, "core_id"),
                                 ("running_memory", q.running_memory, "src_core")):
        core = np.asarray(getattr(cols, core_col), dtype=np.int64)
        start = np.asarray(cols.start_ns, dtype=np.float64)
        end = np.asarray(cols.end_ns, dtype=np.float64)
        bad = np.flatnonzero((core < 0) | (core >= n))
        if bad.size:
            raise BadInput(f"core {int(core[bad[0]])} outside the mesh (0..{n - 1})",
                           field=f"state.queue.{name}.{core_col}[{bad[0]}]")
        bad = np.flatnonzero(~np.isfinite(start) | ~np.isfinite(end) | (end < start))
        if bad.size:
            raise BadInput("intervals must be finite with end_ns >= start_ns",
                           field=f"state.queue.{name}.end_ns[{bad[0]}]")
    bad_q = [i for i, x in enumerate(q.running_memory.noc_qos) if x not in QOS_CODE]
    if bad_q:
        raise BadInput(f"noc_qos must be one of {', '.join(QOS)}",
                       field=f"state.queue.running_memory.noc_qos[{bad_q[0]}]")


def _admit(logical: LogicalWindow, state: CoreQueueState, max_open: int,
           ) -> tuple[LogicalCompute, LogicalMemory, int, list[int]]:
    """This window's rows of admitted micro-batches, the tokens shed, and the shed micro-batches to remember."""
    lc, lm = logical.compute, logical.memory
    if not len(lc):
        return lc, lm, 0, []
    mb = np.asarray(lc.mb_id, dtype=np.int64)
    tgen = np.asarray(lc.t_gen_ns, dtype=np.float64)
    open_ids = {o.mb_id for o in state.open_mbs}
    dropped_prev = set(state.dropped_mbs)
    here = np.unique(mb)
    new = [int(m) for m in here.tolist() if m not in open_ids and m not in dropped_prev]
    arrival = {m: float(tgen[mb == m].min()) for m in new}
    new.sort(key=lambda m: (arrival[m], m))
    room = max(0, max_open - len(open_ids))
    admitted, shed = new[:room], new[room:]
    keep_ids = np.asarray(sorted(open_ids | set(admitted)), dtype=np.int64)
    keep = np.isin(mb, keep_ids)
    tokens_dropped = 0
    if shed:
        rows = Rows.from_logical(lc)
        tokens_dropped = sum(_mb_tokens(rows, mb == m) for m in shed)
    remember = sorted((dropped_prev & set(here.tolist())) | set(shed))
    if keep.all():
        return lc, lm, tokens_dropped, remember
    ki = np.flatnonzero(keep)
    kc = _take(lc, ki)
    return kc, _subset_memory(lm, np.asarray(kc.event_id, dtype=np.int64)), tokens_dropped, remember


C_ = TypeVar("C_", LogicalCompute, LogicalMemory)


def _concat(a: C_, b: C_) -> C_:
    """Rows of ``a`` then rows of ``b`` (both logical compute, or both logical memory)."""
    if not len(a):
        return b
    if not len(b):
        return a
    return type(a).model_construct(**{k: getattr(a, k) + getattr(b, k) for k in type(a).model_fields})


def _take(cols: C_, idx: I64) -> C_:
    """Rows ``idx`` of ``cols`` (itself when that is every row, in order)."""
    if idx.size == len(cols):
        return cols
    il = idx.tolist()
    out: dict[str, Any] = {}
    for k in type(cols).model_fields:
        col = getattr(cols, k)  # once per column, not per row
        out[k] = [col[i] for i in il]
    return type(cols).model_construct(**out)


def _subset_memory(lm: LogicalMemory, events: I64, lm_ev: I64 | None = None) -> LogicalMemory:
    """The memory rows of compute events ``events`` (``lm_ev``: ``lm.event_id`` as an array, when at hand)."""
    if lm_ev is None:
        lm_ev = np.asarray(lm.event_id, dtype=np.int64)
    keep = np.flatnonzero(np.isin(lm_ev, events)) if len(lm) else np.zeros(0, np.int64)
    return _take(lm, keep)


def physicalize_window(win_idx: int, logical: LogicalWindow, placement: Placement, overlays: Overlays | None,
                       state: PhysicalState, arch: ArchConfig, freq_ghz: Sequence[float], window_ms: float,
                       bw_eff_factor: float | Sequence[float] = 1.0, *, n_layers: int | None = None,
                       ) -> tuple[ComputeEvents, MemoryEvents, PhysicalState, WindowTiming]:
    """Lower one logical window to physical events (see the module docstring).

    ``bw_eff_factor``: DRAM bandwidth left after refresh, one value or one per vault (core). ``n_layers``: the
    model's layer count (a micro-batch completes when its stages of layer ``n_layers − 1`` or later are done);
    default: the highest layer among the rows. ``overlays`` None and an empty ``Overlays`` give identical results.
    """
    chip = Chip.from_arch(arch)
    n = chip.n_cores
    if win_idx < 0:
        raise BadInput("window must be >= 0", field="window")
    if len(freq_ghz) != n:
        raise BadInput(f"freq_ghz has {len(freq_ghz)} values but the mesh has {n} cores", field="freq_ghz")
    freq = np.asarray(freq_ghz, dtype=np.float64)
    if not np.all(np.isfinite(freq) & (freq > 0)):
        raise BadInput("freq_ghz must be > 0 for every core", field="freq_ghz")
    if not window_ms > 0:
        raise BadInput("window_ms must be > 0", field="window_ms")
    eff = np.broadcast_to(np.asarray(bw_eff_factor, dtype=np.float64), (n,)) if np.ndim(bw_eff_factor) == 0 \
        else np.asarray(bw_eff_factor, dtype=np.float64)
    if eff.shape != (n,) or not np.all((eff > 0) & (eff <= 1)):
        raise BadInput(f"bw_eff_factor must be in (0, 1], one value or {n}", field="bw_eff_factor")
    overlays = overlays or Overlays()
    em = EnergyModel.from_arch(arch, mac_pj=mac_pj_for(arch.core.dtype, arch))
    t0 = float(logical.t0_ns)
    t1 = t0 + window_ms * 1e6
    window_ns = t1 - t0
    q = state.queue
    core_free = np.asarray(q.busy_until_ns, dtype=np.float64) if q.busy_until_ns else np.zeros(n)
    vault_free = np.asarray(q.vault_free_ns, dtype=np.float64) if q.vault_free_ns else np.zeros(n)
    if core_free.shape != (n,):
        raise BadInput(f"state.queue.busy_until_ns has {core_free.size} values, the mesh {n}",
                       field="state.queue.busy_until_ns")
    if vault_free.shape != (n,):
        raise BadInput(f"state.queue.vault_free_ns has {vault_free.size} values, the mesh {n}",
                       field="state.queue.vault_free_ns")
    link_free = np.asarray(q.link_free_ns, dtype=np.float64) if q.link_free_ns else np.zeros(chip.n_links)
    if link_free.shape != (chip.n_links,):
        raise BadInput(f"state.queue.link_free_ns has {link_free.size} values, the mesh {chip.n_links} links",
                       field="state.queue.link_free_ns")
    _validate_rows(logical.compute)
    _validate_rows(q.open_compute, "state.queue.open_compute")
    _validate_running(q, n)
    replicas = state.replicas  # the placement service's (read only here; carried into the next state as given)
    tensor_banks = dict(state.tensor_banks)
    drop_recorded(tensor_banks, replicas, placement)  # the replica state is the one record of the shards it lists
    vault_bw = chip.vault_bw_bytes_per_ns * eff  # bytes/ns per vault

    # ---- 1. overlays ------------------------------------------------------------------------------------------
    transfers, n_moved = apply_migrations(overlays, placement, replicas, tensor_banks, chip, t0)
    carried_rr = [Reroute(r.t_apply_ns, r.scope, r.from_core, r.to_core, tuple(r.mbs), tuple(r.experts),
                          tuple(r.open_mbs)) for r in q.reroutes]
    new_rr = [r for r in parse_reroutes(overlays, chip) if r.t_apply_ns < t1]
    vault_free = vault_free.copy()
    tr_start, tr_dur, tr_sv, tr_dv = schedule_transfers(transfers, chip, vault_bw, vault_free, core_free,
                                                          link_free)

    # ---- 2. admission -----------------------------------------------------------------------------------------
    new_c, new_m, tokens_dropped, dropped = _admit(logical, q, arch.schedule.open_limit(n))
    lc = _concat(q.open_compute, new_c)
    lm = _concat(q.open_memory, new_m)
    all_rows = Rows.from_logical(lc)
    # reroutes: the rules of earlier windows on the rows that were open then, and this window's rules
    reroutes = carried_rr + new_rr
    if len(all_rows) and np.unique(all_rows.event_id).size != len(all_rows):
        raise BadInput("event_id values must be unique (also against the open rows of earlier windows)",
                       field="logical.compute.event_id")
    open_prev = {o.mb_id: o for o in q.open_mbs}
    mb_ready0 = {m: float(o.ready_ns) for m, o in open_prev.items()}
    backlog = np.maximum(core_free - t0, 0.0)

    # ---- 3-6. assign, memory, cost, schedule: on a look-ahead of layers per micro-batch ----------------------
    # Only the rows of the first `ahead` not-yet-scheduled layers of each micro-batch are lowered; when some
    # micro-batch has scheduled all its lowered stages and its next stage is ready before t1, the look-ahead grows
    # and the window is lowered again. Rows are mapped independently of each other and the scheduler only takes
    # stages ready before t1, so the result is the one of lowering every row (tests/lowering/test_physical.py).
    if len(all_rows):
        mb_u, mb_inv = np.unique(all_rows.mb, return_inverse=True)
        first_layer = np.full(mb_u.size, np.iinfo(np.int64).max)
        np.minimum.at(first_layer, mb_inv, all_rows.layer)
        rel_layer = all_rows.layer - first_layer[mb_inv]
    else:
        mb_inv = rel_layer = np.zeros(0, np.int64)
    ahead = LOOKAHEAD_LAYERS
    lm_ev = np.asarray(lm.event_id, dtype=np.int64)
    while True:
        sub = np.flatnonzero(rel_layer < ahead)
        rows = all_rows.take(sub)
        lm_sub = _subset_memory(lm, rows.event_id, lm_ev)
        pieces = assign(rows, placement, replicas, reroutes, chip, arch, backlog, freq)
        mr = prepare(lm_sub, rows, placement, replicas, tensor_banks, chip)
        exp_idx = np.flatnonzero(~pieces.split)
        exp_tr = traffic(mr, pieces, exp_idx, chip)
        split_bytes = row_bytes(mr, len(rows))[pieces.row] / pieces.k
        pc = cost(rows, pieces, exp_tr, exp_idx, split_bytes, chip, arch, em, freq, vault_bw)
        stages = Stages.of(rows.mb, rows.layer, rows.phase, rows.tgen)
        p_stage = stages.of_row[pieces.row] if len(pieces) else np.zeros(0, np.int64)
        sch = list_schedule(stages, p_stage, pieces.core, pc.dur_ns, rows.event_id[pieces.row], mb_ready0,
                            core_free, vault_free, t1, link_free, _piece_links(exp_tr, exp_idx, pieces, chip))
        sub_done = ~np.isnan(sch.stage_ready[stages.of_row]) if len(rows) else np.zeros(0, dtype=bool)
        if sub.size == len(all_rows):
            break
        # micro-batches that ran out of lowered stages while still ready before t1
        lowered_open = np.zeros(mb_u.size, dtype=bool)
        lowered_open[mb_inv[sub[~sub_done]]] = True
        rest = np.setdiff1d(np.arange(len(all_rows)), sub, assume_unique=True)
        next_gen = np.full(mb_u.size, np.inf)
        np.minimum.at(next_gen, mb_inv[rest], all_rows.tgen[rest])
        mb_rd = np.array([sch.mb_ready.get(int(m), -np.inf) for m in mb_u.tolist()])
        if not np.any(~lowered_open & np.isfinite(next_gen) & (np.maximum(mb_rd, next_gen) < t1)):
            break
        ahead *= 4
    row_done = np.zeros(len(all_rows), dtype=bool)
    row_done[sub] = sub_done

    # ---- completion -------------------------------------------------------------------------------------------
    last_layer = (n_layers - 1) if n_layers is not None else (int(all_rows.layer.max()) if len(all_rows) else -1)
    pending = list(q.pending)
    open_mbs: dict[int, OpenMicroBatch] = dict(open_prev)
    for m in (np.unique(all_rows.mb).tolist() if len(all_rows) else []):
        sel = all_rows.mb == m
        prev = open_mbs.pop(m, None)
        arrival = prev.arrival_ns if prev is not None else int(all_rows.tgen[sel].min())
        tok = prev.tokens if prev is not None else _mb_tokens(all_rows, sel)
        ready = float(sch.mb_ready.get(m, float(prev.ready_ns) if prev is not None else float(arrival)))
        if row_done[sel].all() and int(all_rows.layer[sel].max()) >= last_layer:
            pending.append(PendingTokens(mb_id=m, arrival_ns=arrival, finish_ns=int(np.ceil(ready)), tokens=tok))
        else:
            open_mbs[m] = OpenMicroBatch(mb_id=m, arrival_ns=arrival, ready_ns=int(np.ceil(ready)), tokens=tok)
    done = sorted((p for p in pending if p.finish_ns < t1), key=lambda p: (p.finish_ns, p.mb_id))
    still = sorted((p for p in pending if p.finish_ns >= t1), key=lambda p: (p.finish_ns, p.mb_id))
    latencies: list[float] = []
    for p in done:
        latencies.extend([(p.finish_ns - p.arrival_ns) / 1e6] * p.tokens)

    # ---- 7. new intervals: scheduled pieces, their traffic, dispatch/combine, transfers -------------------------
    vocab = sorted(set(all_rows.op) | set(q.running_compute.op))
    op_code = {o: i for i, o in enumerate(vocab)}
    sp = np.flatnonzero(~np.isnan(sch.start))
    sp = sp[np.lexsort((rows.event_id[pieces.row[sp]], pieces.core[sp], sch.start[sp]))] if sp.size else sp
    p_start = sch.start[sp]
    p_end = p_start + pc.dur_ns[sp]
    row_op = np.array([op_code[o] for o in rows.op], dtype=np.int64) if len(rows) else np.zeros(0, np.int64)
    new_c_iv = _Intervals(core=pieces.core[sp], start=p_start, end=p_end, op=row_op[pieces.row[sp]],
                          cycles=pc.cycles[sp], flops=2.0 * pc.macs[sp], energy=pc.energy_j[sp])
    tr = traffic(mr, pieces, sp, chip)
    e_piece = sp[tr.piece] if tr.piece.size else np.zeros(0, np.int64)
    e_core = pieces.core[e_piece]
    mem_parts = [_Intervals(core=e_core, start=p_start[tr.piece], end=p_end[tr.piece], bank=tr.bank,
                            nbytes=tr.nbytes, write=tr.write, hops=tr.hops, qos=np.zeros(tr.piece.size, np.int64))]
    mem_parts.append(_dispatch_combine(tr, e_piece, e_core, p_start, p_end, pieces, rows, chip, arch))
    if transfers:
        tb_src = np.array([t.src_bank for t in transfers], dtype=np.int64)
        tb_dst = np.array([t.dst_bank for t in transfers], dtype=np.int64)
        tb_bytes = np.array([t.nbytes for t in transfers])
        two = np.concatenate
        mem_parts.append(_Intervals(
            core=two([tr_dv, tr_dv]), start=two([tr_start, tr_start]), end=two([tr_start + tr_dur] * 2),
            bank=two([tb_src, tb_dst]), nbytes=two([tb_bytes, tb_bytes]),
            write=two([np.zeros(len(transfers), bool), np.ones(len(transfers), bool)]),
            hops=two([chip.hops(tr_dv, tr_sv), np.zeros(len(transfers), np.int64)]),
            qos=np.ones(2 * len(transfers), np.int64)))

    # ---- 8. deposit: emit the window's share of running + new work; carry the rest ---------------------------
    rc = q.running_compute
    run_c = _Intervals(core=np.asarray(rc.core_id, dtype=np.int64), start=np.asarray(rc.start_ns, dtype=np.float64),
                       end=np.asarray(rc.end_ns, dtype=np.float64),
                       op=np.array([op_code[o] for o in rc.op], dtype=np.int64),
                       cycles=np.asarray(rc.cycles, dtype=np.float64), flops=np.asarray(rc.flops, dtype=np.float64),
                       energy=np.asarray(rc.energy_j, dtype=np.float64))
    rm = q.running_memory
    run_m = _Intervals(core=np.asarray(rm.src_core, dtype=np.int64), start=np.asarray(rm.start_ns, dtype=np.float64),
                       end=np.asarray(rm.end_ns, dtype=np.float64),
                       bank=_checked_banks(rm.bank, chip),
                       nbytes=np.asarray(rm.bytes, dtype=np.float64),
                       write=np.array([r == "w" for r in rm.rw], dtype=bool),
                       hops=np.asarray(rm.hops, dtype=np.int64),
                       qos=np.array([QOS_CODE[x] for x in rm.noc_qos], dtype=np.int64))
    C = _cat([run_c, new_c_iv])
    M = _cat([run_m, *mem_parts])
    fc = deposit.share(C.start, C.end, t0, t1)
    fm = deposit.share(M.start, M.end, t0, t1)
    compute = _emit_compute(C, fc, vocab, chip, state.next_evt_id, t0)
    memory = _emit_memory(M, fm, chip, state.next_evt_id + len(compute), t0)
    keep_c = deposit.remains(C.end, C.start, t1)
    keep_m = deposit.remains(M.end, M.start, t1)
    vocab_arr = np.array(vocab, dtype=object)
    assert C.op is not None and C.cycles is not None and C.flops is not None and C.energy is not None
    assert M.bank is not None and M.nbytes is not None and M.write is not None and M.hops is not None
    assert M.qos is not None
    running_compute = RunningCompute.model_construct(
        core_id=C.core[keep_c].tolist(), op=vocab_arr[C.op[keep_c]].tolist() if vocab else [],
        start_ns=C.start[keep_c].tolist(), end_ns=C.end[keep_c].tolist(), cycles=C.cycles[keep_c].tolist(),
        flops=C.flops[keep_c].tolist(), energy_j=C.energy[keep_c].tolist())
    running_memory = RunningMemory.model_construct(
        src_core=M.core[keep_m].tolist(), bank=M.bank[keep_m].tolist(),
        bytes=M.nbytes[keep_m].tolist(), rw=np.array(["r", "w"], dtype=object)[M.write[keep_m].astype(int)].tolist(),
        hops=M.hops[keep_m].tolist(), noc_qos=np.array(QOS, dtype=object)[M.qos[keep_m]].tolist(),
        start_ns=M.start[keep_m].tolist(), end_ns=M.end[keep_m].tolist())
    open_rows = np.flatnonzero(~row_done)
    open_compute = _take(lc, open_rows)
    open_memory = _subset_memory(lm, all_rows.event_id[open_rows], lm_ev)

    # ---- 9. timing --------------------------------------------------------------------------------------------
    ov = np.clip(np.minimum(C.end, t1) - np.maximum(C.start, t0), 0.0, None)
    util = np.clip(np.bincount(C.core, weights=ov, minlength=n) / window_ns, 0.0, 1.0)
    m_bytes = M.nbytes * fm
    vault_of = chip.bank_vault_core(M.bank)
    rd = ~M.write
    link_b = chip.link_bytes(np.where(rd, vault_of, M.core), np.where(rd, M.core, vault_of), m_bytes)
    link_util = np.clip(link_b / (chip.link_bw_bytes_per_ns * window_ns), 0.0, 1.0)
    noc_only = M.qos >= 2
    mem_j = em.memory_j(m_bytes, chip.hops(M.core, vault_of), noc_only)
    wait = sch.start[sp] - sch.stage_ready[p_stage[sp]] if sp.size else np.zeros(0)
    busy_until = np.maximum(sch.core_free, t0)
    timing = WindowTiming(
        tokens_completed=sum(p.tokens for p in done),
        latencies_ms=latencies,
        queue_delay_ms=float(wait.mean() / 1e6) if wait.size else 0.0,
        util_core=util.tolist(),
        bytes_moved=float(m_bytes[~noc_only].sum()),
        noc_link_util=link_util.tolist(),
        migrations=n_moved,
        t0_ns=int(t0), t1_ns=int(t1),
        tokens_generated=logical.tokens_generated,
        energy_j=float(np.sum(C.energy * fc)) + float(mem_j.sum()),
        busy_until_ns=np.ceil(busy_until).astype(np.int64).tolist(),
        backlog_ms=float(np.mean(np.maximum(busy_until - t1, 0.0)) / 1e6),
        tokens_dropped=tokens_dropped,
        open_mbs=len(open_mbs),
        oldest_inflight_ms=max(0.0, (t1 - min([o.arrival_ns for o in open_mbs.values()]
                                               + [p.arrival_ns for p in still], default=t1)) / 1e6),
    )
    new_state = PhysicalState(
        replicas=replicas,
        queue=CoreQueueState(
            busy_until_ns=np.ceil(sch.core_free).astype(np.int64).tolist(),
            vault_free_ns=np.ceil(sch.vault_free).astype(np.int64).tolist(),
            link_free_ns=np.ceil(sch.link_free).astype(np.int64).tolist(),
            running_compute=running_compute, running_memory=running_memory,
            open_compute=open_compute, open_memory=open_memory,
            pending=still, open_mbs=sorted(open_mbs.values(), key=lambda o: o.mb_id), dropped_mbs=dropped,
            reroutes=_carried_reroutes(carried_rr + new_rr, set(open_mbs), set(all_rows.mb[open_rows].tolist()))),
        next_evt_id=state.next_evt_id + len(compute) + len(memory),
        tensor_banks=tensor_banks,
    )
    return compute, memory, new_state, timing


def _dispatch_combine(tr: Traffic, e_piece: I64, e_core: I64, p_start: F64, p_end: F64, pieces: Pieces, rows: Rows,
                      chip: Chip, arch: ArchConfig) -> _Intervals:
    """MoE dispatch (activation reads of an expert piece: sent from the micro-batch's attention cores, 1/k from
    each) and combine (its output writes: sent back the same way); core-to-core, NoC only, over the piece's run."""
    sel = np.flatnonzero(tr.act)
    if not sel.size:
        z = np.zeros(0, np.int64)
        return _Intervals(core=z, start=np.zeros(0), end=np.zeros(0), bank=z, nbytes=np.zeros(0),
                          write=np.zeros(0, bool), hops=z, qos=z)
    mb = rows.mb[pieces.row[e_piece[sel]]]
    att, k = attention_cores(mb, arch)
    expert = np.repeat(e_core[sel], k)
    other = att.reshape(-1)
    is_combine = np.repeat(tr.write[sel], k)
    nbytes = np.repeat(tr.nbytes[sel] / k, k)
    bank_at_expert = np.repeat(tr.bank[sel], k)
    key_part, core_part = chip.vault_bank_parts(bank_at_expert)
    bank_at_other = key_part + core_part[other]
    src = np.where(is_combine, expert, other)
    bank = np.where(is_combine, bank_at_other, bank_at_expert)
    keep = other != expert
    s = np.repeat(p_start[tr.piece[sel]], k)
    e = np.repeat(p_end[tr.piece[sel]], k)
    return _Intervals(core=src[keep], start=s[keep], end=e[keep], bank=bank[keep], nbytes=nbytes[keep],
                      write=np.ones(int(keep.sum()), bool), hops=chip.hops(src[keep], chip.bank_vault_core(bank[keep])),
                      qos=np.where(is_combine[keep], 3, 2).astype(np.int64))


def _piece_links(tr: Traffic, exp_idx: I64, pieces: Pieces, chip: Chip) -> dict[int, tuple[int, ...]]:
    """The links each expert piece's remote traffic crosses (reads: vault -> core; writes: core -> vault)."""
    remote = np.flatnonzero(tr.hops > 0)
    if not remote.size:
        return {}
    out: dict[int, set[int]] = {}
    p_idx = exp_idx[tr.piece[remote]]
    core = pieces.core[p_idx]
    vault = chip.bank_vault_core(tr.bank[remote])
    for p, c, v, w in zip(p_idx.tolist(), core.tolist(), vault.tolist(), tr.write[remote].tolist(), strict=True):
        out.setdefault(p, set()).update(chip.route_links(c, v) if w else chip.route_links(v, c))
    return {p: tuple(sorted(s)) for p, s in out.items()}


def _carried_reroutes(rules: list[Reroute], open_now: set[int], open_rows_mbs: set[int]) -> list[ActiveReroute]:
    """Rules that still matter: each applies to the micro-batches that were open when it arrived (for a rule of this
    window: those with open rows now), while any of them still has open rows."""
    out: list[ActiveReroute] = []
    for r in rules:
        scope_mbs = set(r.within) if r.within is not None else set(open_rows_mbs)
        keep = sorted(scope_mbs & open_rows_mbs & open_now)
        if keep:
            out.append(ActiveReroute(t_apply_ns=r.t_apply_ns, scope=r.scope, from_core=r.from_core,
                                     to_core=r.to_core, mbs=list(r.mbs), experts=list(r.experts), open_mbs=keep))
    return out


def _checked_banks(banks: list[int], chip: Chip) -> I64:
    b = np.asarray(banks, dtype=np.int64)
    bad = np.flatnonzero((b < 0) | (b >= chip.BX * chip.BY * chip.L))
    if bad.size:
        raise BadInput(f"bank {int(b[bad[0]])} outside the bank grid",
                       field=f"state.queue.running_memory.bank[{bad[0]}]")
    return b


def _cat(parts: list[_Intervals]) -> _Intervals:
    out = _Intervals(core=np.concatenate([p.core for p in parts]), start=np.concatenate([p.start for p in parts]),
                     end=np.concatenate([p.end for p in parts]))
    for f in ("op", "cycles", "flops", "energy", "bank", "nbytes", "write", "hops", "qos"):
        vals = [getattr(p, f) for p in parts]
        if all(v is not None for v in vals):
            setattr(out, f, np.concatenate(vals))
    return out


def _emit_compute(C: _Intervals, f: F64, vocab: list[str], chip: Chip, id0: int, t0: float) -> ComputeEvents:
    assert C.op is not None and C.cycles is not None and C.flops is not None and C.energy is not None
    i = np.flatnonzero(f > 0)
    st = np.maximum(C.start[i], t0)
    i = i[np.lexsort((C.core[i], st))]
    st = np.maximum(C.start[i], t0)
    dur_s = (C.end[i] - C.start[i]) * 1e-9
    power = np.divide(C.energy[i], dur_s, out=np.zeros(i.size), where=dur_s > 0)
    dom = np.asarray(chip.core_domain, dtype=np.int64)
    dom_names = np.array([f"d{d}" for d in range(int(dom.max()) + 1)], dtype=object)
    vocab_arr = np.array(vocab, dtype=object)
    return ComputeEvents.model_construct(
        evt_id=list(range(id0, id0 + i.size)),
        t_start_ns=np.floor(st).astype(np.int64).tolist(),
        core_id=C.core[i].tolist(),
        duration_cycles=np.ceil(C.cycles[i] * f[i] - 1e-9).astype(np.int64).tolist(),
        flops=(C.flops[i] * f[i]).tolist(),
        op=vocab_arr[C.op[i]].tolist() if i.size else [],
        dvfs_domain=dom_names[dom[C.core[i]]].tolist(),
        power_hint=power.tolist(),
        energy_j=(C.energy[i] * f[i]).tolist(),
    )


def _emit_memory(M: _Intervals, f: F64, chip: Chip, id0: int, t0: float) -> MemoryEvents:
    assert M.bank is not None and M.nbytes is not None and M.write is not None and M.hops is not None
    assert M.qos is not None
    i = np.flatnonzero((f > 0) & (M.nbytes > 0))
    st = np.maximum(M.start[i], t0)
    i = i[np.lexsort((M.core[i], st))]
    st = np.maximum(M.start[i], t0)
    return MemoryEvents.model_construct(
        evt_id=list(range(id0, id0 + i.size)),
        t_start_ns=np.floor(st).astype(np.int64).tolist(),
        src_core=M.core[i].tolist(),
        dst_bank=chip.bank_strs(M.bank[i]),
        bytes=(M.nbytes[i] * f[i]).tolist(),
        rw=np.array(["r", "w"], dtype=object)[M.write[i].astype(np.int64)].tolist(),
        hops=M.hops[i].tolist(),
        noc_qos=np.array(QOS, dtype=object)[M.qos[i]].tolist(),
    )


__all__ = ["physicalize_window"]
