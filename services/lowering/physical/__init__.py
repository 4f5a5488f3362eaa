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

Serving requests (``Context.serving``, ``serving``): the window carries requests instead of rows. At its start the
continuous-batching scheduler forms a micro-batch on every free pipeline lane, whose rows (the workload service's)
join admission; the micro-batches completing in the window credit their requests' tokens and free their lanes; then
the window's arrivals join the waiting queue or are shed. ``serving`` says how, and why formation happens at window
starts only (a lane freed inside a window waits for the next one: less than a window per iteration).

``step_window`` runs them on a window with the state as columns (``carry.Carry``) and the run's fixed inputs and
lookups (``carry.Context``); ``physicalize_window`` wraps it for one window of wire models, and an epoch
(``services.lowering.epoch``) calls it window after window without converting the state in between.

Units: ns (absolute simulated time) inside, ms in ``WindowTiming``, GHz (= cycles/ns), bytes, J.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from services.lowering.physical import deposit, serving
from services.lowering.physical.assign import Pieces, Rows, attention_cores
from services.lowering.physical.carry import Carry, Context, Intervals, LogicalRows, validate_rows
from services.lowering.physical.columns import LogicalMem, index_of
from services.lowering.physical.emit import Emitted, WindowResult
from services.lowering.physical.lookahead import Lowered, lower
from services.lowering.physical.memory import Traffic, traffic
from services.lowering.physical.overlays import Reroute, Transfer, apply_migrations, drop_recorded, parse_reroutes
from services.lowering.physical.schedule import schedule_transfers
from shared.chip import Chip
from shared.configs.arch import ArchConfig
from shared.configs.workload import ServingConfig
from shared.contracts.events import (
    ComputeEvents,
    MemoryEvents,
    OpenMicroBatch,
    PendingTokens,
    PhysicalState,
    WindowTiming,
)
from shared.contracts.placement import Overlays, Placement
from shared.contracts.workload import LogicalWindow
from shared.errors import BadInput

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
NO_OVERLAYS = Overlays()


def physicalize_window(win_idx: int, logical: LogicalWindow, placement: Placement, overlays: Overlays | None,
                       state: PhysicalState, arch: ArchConfig, freq_ghz: Sequence[float], window_ms: float,
                       bw_eff_factor: float | Sequence[float] = 1.0, *, n_layers: int | None = None,
                       serving: ServingConfig | None = None, microbatches: serving.MicroBatchFn | None = None,
                       ) -> tuple[ComputeEvents, MemoryEvents, PhysicalState, WindowTiming]:
    """Lower one logical window to physical events (see the module docstring).

    ``bw_eff_factor``: DRAM bandwidth left after refresh, one value or one per vault (core). ``n_layers``: the
    model's layer count (a micro-batch completes when its stages of layer ``n_layers − 1`` or later are done);
    default: the highest layer among the rows. ``overlays`` None and an empty ``Overlays`` give identical results.
    ``serving``: serve the window's requests, the micro-batches' rows from ``microbatches`` (``physical.serving``).
    """
    res = physicalize_one(win_idx, logical, placement, overlays, state, arch, freq_ghz, window_ms, bw_eff_factor,
                          n_layers=n_layers, serving=serving, microbatches=microbatches)
    return res.compute_events(), res.memory_events(), res.carry.to_state(res.ctx), res.timing


def physicalize_one(win_idx: int, logical: LogicalWindow, placement: Placement, overlays: Overlays | None,
                    state: PhysicalState, arch: ArchConfig, freq_ghz: Sequence[float], window_ms: float,
                    bw_eff_factor: float | Sequence[float] = 1.0, *, n_layers: int | None = None,
                    serving: ServingConfig | None = None, microbatches: serving.MicroBatchFn | None = None,
                    ) -> WindowResult:
    """`physicalize_window` with its events as columns (``WindowResult``: the wire events, their deposit and the
    next state on demand)."""
    if win_idx < 0:
        raise BadInput("window must be >= 0", field="window")
    ctx = Context.of(placement, arch, freq_ghz, window_ms, bw_eff_factor, n_layers=n_layers, serving=serving,
                     microbatches=microbatches)
    return step_window(ctx, Carry.from_state(state, ctx), logical, overlays)


def step_window(ctx: Context, carry: Carry, logical: LogicalWindow, overlays: Overlays | None) -> WindowResult:
    """One window from the state ``carry`` (not modified): the stages of the module docstring."""
    t0 = float(logical.t0_ns)
    t1 = t0 + ctx.window_ms * 1e6
    validate_rows(logical.compute)
    formed: serving.Formed | None = None
    requests = logical.requests
    if ctx.serving is not None:
        formed, logical = _formed(ctx, carry, logical)
    tensor_banks = dict(carry.tensor_banks)
    drop_recorded(tensor_banks, carry.replicas, ctx.placement)  # the replica state is the one record of its shards
    ov = _apply_overlays(ctx, carry, overlays or NO_OVERLAYS, tensor_banks, t0, t1)
    adm = _admit(ctx, carry, logical)
    low = lower(ctx, carry.replicas, adm.rows, adm.lm, adm.m_row, ov.reroutes,
                {o.mb_id: float(o.ready_ns) for o in carry.open_mbs}, carry.core_free, ov.vault_free, ov.link_free,
                tensor_banks, t0, t1, new_memory_rows=adm.new_memory_rows)
    fin = _complete(ctx, carry, adm, low, t1)
    served: tuple[serving.ServingCarry, dict[str, Any]] | None = None
    if formed is not None:
        assert ctx.serving is not None
        sc, cr = serving.credit(formed.carry, fin.done)
        sc, ar = serving.arrive(sc, requests, ctx.serving.queue_limit, int(t0), math.ceil(t1))
        served = sc, serving.report(sc, cr, ar, t1)
    C = Intervals.cat([carry.running_c, _new_compute(low)] if low.sp.size else [carry.running_c])
    M = Intervals.cat([carry.running_m, *_new_memory(ctx, low, ov)])
    fc = deposit.share(C.start, C.end, t0, t1)
    fm = deposit.share(M.start, M.end, t0, t1)
    ce, me = Emitted.compute(C, fc, t0), Emitted.memory(M, fm, t0)
    timing = _timing(ctx, logical, C, fc, M, fm, low, ov, adm, fin, t0, t1, served[1] if served else None)
    open_c, open_m, open_rows, open_m_row = _still_open(adm, ~low.row_done)
    nxt = Carry(
        replicas=carry.replicas, tensor_banks=tensor_banks,
        next_evt_id=carry.next_evt_id + len(ce) + len(me),
        core_free=_whole_ns(low.sch.core_free), vault_free=_whole_ns(low.sch.vault_free),
        link_free=_whole_ns(low.sch.link_free),
        running_c=C.take(deposit.remains(C.end, C.start, t1)), running_m=M.take(deposit.remains(M.end, M.start, t1)),
        open_c=open_c, open_m=open_m,
        pending=fin.still, open_mbs=sorted(fin.open_mbs.values(), key=lambda o: o.mb_id), dropped_mbs=adm.dropped,
        reroutes=_carried_reroutes(ov.reroutes, set(fin.open_mbs), set(open_rows.mb.tolist())),
        unique_ids=True, rows=open_rows, m_row=open_m_row, serving=served[0] if served else None)
    return WindowResult(ctx=ctx, compute=ce, memory=me, id0=carry.next_evt_id, timing=timing, carry=nxt)


def _formed(ctx: Context, carry: Carry, logical: LogicalWindow) -> tuple[serving.Formed, LogicalWindow]:
    """The micro-batches the free lanes form at the window start, and the window with their rows as its own."""
    assert ctx.serving is not None and ctx.microbatches is not None and carry.serving is not None
    if len(logical.compute) or len(logical.memory):
        raise BadInput("a served window carries requests, no rows: the scheduler forms the micro-batches",
                       field="logical.compute")
    formed = serving.form(carry.serving, ctx.serving, int(logical.t0_ns))
    rows = serving.rows_window(logical, formed.specs, ctx.microbatches)
    validate_rows(rows.compute)
    return formed, rows


def _still_open(adm: _Admitted, keep: NDArray[np.bool_]) -> tuple[LogicalRows, LogicalMem, Rows, I64]:
    """The rows ``keep`` (not scheduled) with their memory rows, in their order: as logical columns, as `Rows` and
    each memory row's row among them."""
    remap: I64 | None = None
    lc, rows = adm.lc, adm.rows
    if not keep.all():
        idx = np.flatnonzero(keep)
        lc, rows = lc.take(idx), rows.take(idx)
        remap = np.cumsum(keep) - 1
    has_row = adm.m_row >= 0
    m_keep = has_row
    if remap is not None:
        m_keep = has_row.copy()
        m_keep[has_row] = keep[adm.m_row[has_row]]
    lm, m_row = adm.lm, adm.m_row
    if not m_keep.all():
        m_idx = np.flatnonzero(m_keep)
        lm, m_row = lm.take(m_idx), m_row[m_idx]
    return lc, lm, rows, remap[m_row] if remap is not None else m_row


def _whole_ns(t: F64) -> F64:
    """Times as the state keeps them: whole ns (rounded up), as floats."""
    out: F64 = np.ceil(t).astype(np.int64).astype(np.float64)
    return out


# ---- 1. overlays ----------------------------------------------------------------------------------------------

@dataclass
class _Overlaid:
    """The window's overlays applied: migrations as scheduled transfers (holding vaults and links), and the reroute
    rules (those carried from earlier windows first)."""

    transfers: list[Transfer]
    n_moved: int
    reroutes: list[Reroute]
    tr_start: F64
    tr_dur: F64
    tr_sv: I64
    tr_dv: I64
    vault_free: F64
    link_free: F64


def _apply_overlays(ctx: Context, carry: Carry, overlays: Overlays, tensor_banks: dict[str, str], t0: float,
                    t1: float) -> _Overlaid:
    transfers: list[Transfer] = []
    n_moved, new_rr = 0, []
    if len(overlays.migrate):
        transfers, n_moved = apply_migrations(overlays, ctx.placement, carry.replicas, tensor_banks, ctx.chip, t0)
    if len(overlays.reroute):
        new_rr = [r for r in parse_reroutes(overlays, ctx.chip) if r.t_apply_ns < t1]
    vault_free = carry.vault_free.copy()
    link_free = carry.link_free
    z, zi = np.zeros(0), np.zeros(0, np.int64)
    tr_start, tr_dur, tr_sv, tr_dv = z, z, zi, zi
    if transfers:
        link_free = link_free.copy()
        tr_start, tr_dur, tr_sv, tr_dv = schedule_transfers(transfers, ctx.chip, ctx.vault_bw, vault_free,
                                                            carry.core_free, link_free)
    return _Overlaid(transfers=transfers, n_moved=n_moved, reroutes=carry.reroutes + new_rr, tr_start=tr_start,
                     tr_dur=tr_dur, tr_sv=tr_sv, tr_dv=tr_dv, vault_free=vault_free, link_free=link_free)


# ---- 2. admission ---------------------------------------------------------------------------------------------

@dataclass
class _Admitted:
    """The rows of the window: the open rows carried, then this window's rows of admitted micro-batches."""

    lc: LogicalRows
    lm: LogicalMem
    rows: Rows  # ``lc`` as the mapping stages read it
    m_row: I64  # per row of ``lm``: its compute row in ``rows`` (-1: none)
    new_memory_rows: bool  # memory rows arrived in this window
    tokens_dropped: int
    dropped: list[int]  # micro-batches shed by admission whose rows may still arrive


def _mb_tokens(tokens: F64, is_expert: NDArray[np.bool_], sel: NDArray[np.bool_]) -> int:
    """A micro-batch's tokens: those of its non-expert rows (all of them see every token), else of any row."""
    ne = sel & ~is_expert
    return int(tokens[ne].max()) if ne.any() else int(tokens[sel].max()) if sel.any() else 0


def _admit(ctx: Context, carry: Carry, logical: LogicalWindow) -> _Admitted:
    """A micro-batch new in this window is admitted while fewer than ``ctx.open_limit`` are open (earliest arrival
    first), else shed with its rows; rows of micro-batches shed earlier are dropped too. Only the rows kept are
    converted whole (a saturated queue sheds most of every window's rows)."""
    lc, lm = logical.compute, logical.memory
    tokens_dropped, remember = 0, []
    if not len(lc):
        new_c, new_m = LogicalRows.empty(), LogicalMem.of(lm, ctx)
    else:
        mb = np.asarray(lc.mb_id, dtype=np.int64)
        tgen = np.asarray(lc.t_gen_ns, dtype=np.float64)
        open_ids = {o.mb_id for o in carry.open_mbs}
        dropped_prev = set(carry.dropped_mbs)
        here = np.unique(mb)
        new = [int(m) for m in here.tolist() if m not in open_ids and m not in dropped_prev]
        arrival = {m: float(tgen[mb == m].min()) for m in new}
        new.sort(key=lambda m: (arrival[m], m))
        room = max(0, ctx.open_limit - len(open_ids))
        admitted, shed = new[:room], new[room:]
        keep = np.isin(mb, np.asarray(sorted(open_ids | set(admitted)), dtype=np.int64))
        if shed:
            tokens = np.asarray(lc.tokens).astype(np.float64)
            is_expert = np.asarray(lc.expert).astype(np.int64) >= 0
            tokens_dropped = sum(_mb_tokens(tokens, is_expert, mb == m) for m in shed)
        remember = sorted((dropped_prev & set(here.tolist())) | set(shed))
        if keep.all():
            new_c, new_m = LogicalRows.of(lc, ctx.ops), LogicalMem.of(lm, ctx)
        else:
            new_c = LogicalRows.of(lc, ctx.ops, np.flatnonzero(keep))
            idx = np.zeros(0, np.int64)
            if len(new_c) and len(lm):
                idx = np.flatnonzero(np.isin(np.asarray(lm.event_id, dtype=np.int64), new_c.event_id))
            new_m = LogicalMem.of(lm, ctx, idx.tolist())
    all_c = LogicalRows.cat(carry.open_c, new_c)
    all_m = LogicalMem.cat(carry.open_m, new_m)
    if not len(new_c) and not len(new_m) and carry.rows is not None and carry.m_row is not None:
        rows, m_row = carry.rows, carry.m_row  # the open rows as the last window left them
    else:
        rows = all_c.rows(ctx)
        m_row = index_of(rows.event_id, all_m.event_id)  # per memory row: its compute row (-1: none)
    if (len(new_c) or not carry.unique_ids) and len(rows) and np.unique(rows.event_id).size != len(rows):
        raise BadInput("event_id values must be unique (also against the open rows of earlier windows)",
                       field="logical.compute.event_id")
    return _Admitted(lc=all_c, lm=all_m, rows=rows, m_row=m_row, new_memory_rows=len(new_m) > 0,
                     tokens_dropped=tokens_dropped, dropped=remember)


# ---- completion -----------------------------------------------------------------------------------------------

@dataclass
class _Completed:
    done: list[PendingTokens]  # completed in this window
    still: list[PendingTokens]  # scheduled to complete in a later window
    open_mbs: dict[int, OpenMicroBatch]


def _complete(ctx: Context, carry: Carry, adm: _Admitted, low: Lowered, t1: float) -> _Completed:
    """A micro-batch whose rows are all scheduled, up to the last layer, completes when its last stage ends; the
    others stay open (ready when their last scheduled stage ends)."""
    all_rows, sch, row_done = adm.rows, low.sch, low.row_done
    last_layer = (ctx.n_layers - 1) if ctx.n_layers is not None else (int(all_rows.layer.max()) if len(all_rows)
                                                                      else -1)
    pending = list(carry.pending)
    open_mbs = {o.mb_id: o for o in carry.open_mbs}
    mbs = np.unique(all_rows.mb).tolist() if len(all_rows) else []
    if not row_done.any() and all(m in open_mbs for m in mbs):
        mbs = []  # nothing scheduled: every micro-batch stays open as it was
    for m in mbs:
        sel = all_rows.mb == m
        prev = open_mbs.pop(m, None)
        arrival = prev.arrival_ns if prev is not None else int(all_rows.tgen[sel].min())
        tok = prev.tokens if prev is not None else _mb_tokens(all_rows.tokens, all_rows.is_expert, sel)
        ready = float(sch.mb_ready.get(m, float(prev.ready_ns) if prev is not None else float(arrival)))
        if row_done[sel].all() and int(all_rows.layer[sel].max()) >= last_layer:
            pending.append(PendingTokens(mb_id=m, arrival_ns=arrival, finish_ns=int(np.ceil(ready)), tokens=tok))
        else:
            open_mbs[m] = OpenMicroBatch(mb_id=m, arrival_ns=arrival, ready_ns=int(np.ceil(ready)), tokens=tok)
    done = sorted((p for p in pending if p.finish_ns < t1), key=lambda p: (p.finish_ns, p.mb_id))
    still = sorted((p for p in pending if p.finish_ns >= t1), key=lambda p: (p.finish_ns, p.mb_id))
    return _Completed(done=done, still=still, open_mbs=open_mbs)


# ---- 7. new intervals -----------------------------------------------------------------------------------------

def _new_compute(low: Lowered) -> Intervals:
    """Each scheduled piece over its run."""
    sp, pc = low.sp, low.pc
    p_start = low.sch.start[sp]
    return Intervals(core=low.pieces.core[sp], start=p_start, end=p_start + pc.dur_ns[sp],
                     op=low.rows.op[low.pieces.row[sp]], cycles=pc.cycles[sp], flops=2.0 * pc.macs[sp],
                     energy=pc.energy_j[sp])


def _new_memory(ctx: Context, low: Lowered, ov: _Overlaid) -> list[Intervals]:
    """The scheduled pieces' traffic, the MoE dispatch/combine it causes and the migrations' transfers."""
    sp, pieces, chip = low.sp, low.pieces, ctx.chip
    if not sp.size:
        return [_transfer_intervals(ov, chip)] if ov.transfers else []
    p_start = low.sch.start[sp]
    p_end = p_start + low.pc.dur_ns[sp]
    tr = traffic(low.mr, pieces, sp, chip)
    e_piece = sp[tr.piece] if tr.piece.size else np.zeros(0, np.int64)
    e_core = pieces.core[e_piece]
    parts = [Intervals(core=e_core, start=p_start[tr.piece], end=p_end[tr.piece], bank=tr.bank, nbytes=tr.nbytes,
                       write=tr.write, hops=tr.hops, qos=np.zeros(tr.piece.size, np.int64)),
             _dispatch_combine(tr, e_piece, e_core, p_start, p_end, pieces, low.rows, chip, ctx.arch)]
    if ov.transfers:
        parts.append(_transfer_intervals(ov, chip))
    return parts


def _transfer_intervals(ov: _Overlaid, chip: Chip) -> Intervals:
    """Each migration reads at its source bank and writes at its destination bank over its transfer."""
    tf = ov.transfers
    tb_src = np.array([t.src_bank for t in tf], dtype=np.int64)
    tb_dst = np.array([t.dst_bank for t in tf], dtype=np.int64)
    tb_bytes = np.array([t.nbytes for t in tf])
    two = np.concatenate
    return Intervals(
        core=two([ov.tr_dv, ov.tr_dv]), start=two([ov.tr_start, ov.tr_start]),
        end=two([ov.tr_start + ov.tr_dur] * 2), bank=two([tb_src, tb_dst]), nbytes=two([tb_bytes, tb_bytes]),
        write=two([np.zeros(len(tf), bool), np.ones(len(tf), bool)]),
        hops=two([chip.hops(ov.tr_dv, ov.tr_sv), np.zeros(len(tf), np.int64)]), qos=np.ones(2 * len(tf), np.int64))


def _dispatch_combine(tr: Traffic, e_piece: I64, e_core: I64, p_start: F64, p_end: F64, pieces: Pieces, rows: Rows,
                      chip: Chip, arch: ArchConfig) -> Intervals:
    """MoE dispatch (activation reads of an expert piece: sent from the micro-batch's attention cores, 1/k from
    each) and combine (its output writes: sent back the same way); core-to-core, NoC only, over the piece's run."""
    sel = np.flatnonzero(tr.act)
    if not sel.size:
        z = np.zeros(0, np.int64)
        return Intervals(core=z, start=np.zeros(0), end=np.zeros(0), bank=z, nbytes=np.zeros(0),
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
    return Intervals(core=src[keep], start=s[keep], end=e[keep], bank=bank[keep], nbytes=nbytes[keep],
                     write=np.ones(int(keep.sum()), bool), hops=chip.hops(src[keep], chip.bank_vault_core(bank[keep])),
                     qos=np.where(is_combine[keep], 3, 2).astype(np.int64))


def _carried_reroutes(rules: list[Reroute], open_now: set[int], open_rows_mbs: set[int]) -> list[Reroute]:
    """Rules that still matter: each applies to the micro-batches that were open when it arrived (for a rule of this
    window: those with open rows now), while any of them still has open rows."""
    out: list[Reroute] = []
    for r in rules:
        scope_mbs = set(r.within) if r.within is not None else set(open_rows_mbs)
        keep = sorted(scope_mbs & open_rows_mbs & open_now)
        if keep:
            out.append(Reroute(r.t_apply_ns, r.scope, r.from_core, r.to_core, r.mbs, r.experts, tuple(keep)))
    return out


# ---- 9. timing ------------------------------------------------------------------------------------------------

def _timing(ctx: Context, logical: LogicalWindow, C: Intervals, fc: F64, M: Intervals, fm: F64, low: Lowered,
            ov: _Overlaid, adm: _Admitted, fin: _Completed, t0: float, t1: float,
            served: dict[str, Any] | None = None) -> WindowTiming:
    """What the window reports: tokens completed and their latencies, queueing, core and link utilisation, bytes and
    energy of the window's share of every interval, the backlog and what is in flight at its end. ``served``: the
    request scheduler's fields (``serving.report``), which replace the micro-batch ones (tokens completed, their
    latencies, the oldest token in flight)."""
    chip, n, window_ns = ctx.chip, ctx.chip.n_cores, t1 - t0
    assert C.energy is not None
    assert M.bank is not None and M.nbytes is not None and M.write is not None and M.qos is not None
    ov_c = np.clip(np.minimum(C.end, t1) - np.maximum(C.start, t0), 0.0, None)
    util = np.clip(np.bincount(C.core, weights=ov_c, minlength=n) / window_ns, 0.0, 1.0)
    m_bytes = M.nbytes * fm
    vault_of = chip.bank_vault_core(M.bank)
    rd = ~M.write
    link_b = chip.link_bytes(np.where(rd, vault_of, M.core), np.where(rd, M.core, vault_of), m_bytes)
    link_util = np.clip(link_b / (chip.link_bw_bytes_per_ns * window_ns), 0.0, 1.0)
    noc_only = M.qos >= 2
    mem_j = ctx.em.memory_j(m_bytes, chip.hops(M.core, vault_of), noc_only)
    sch, sp = low.sch, low.sp
    wait = sch.start[sp] - sch.stage_ready[low.p_stage[sp]] if sp.size else np.zeros(0)
    busy_until = np.maximum(sch.core_free, t0)
    latencies: list[float] = []
    if served is None:
        for p in fin.done:
            latencies.extend([(p.finish_ns - p.arrival_ns) / 1e6] * p.tokens)
    fields: dict[str, Any] = dict(
        tokens_completed=sum(p.tokens for p in fin.done),
        latencies_ms=latencies,
        queue_delay_ms=float(wait.mean() / 1e6) if wait.size else 0.0,
        util_core=util.tolist(),
        bytes_moved=float(m_bytes[~noc_only].sum()),
        noc_link_util=link_util.tolist(),
        migrations=ov.n_moved,
        t0_ns=int(t0), t1_ns=int(t1),
        tokens_generated=logical.tokens_generated,
        energy_j=float(np.sum(C.energy * fc)) + float(mem_j.sum()),
        busy_until_ns=np.ceil(busy_until).astype(np.int64).tolist(),
        backlog_ms=float(np.mean(np.maximum(busy_until - t1, 0.0)) / 1e6),
        tokens_dropped=adm.tokens_dropped,
        open_mbs=len(fin.open_mbs),
        oldest_inflight_ms=max(0.0, (t1 - min([o.arrival_ns for o in fin.open_mbs.values()]
                                               + [p.arrival_ns for p in fin.still], default=t1)) / 1e6),
    )
    if served is not None:
        fields.update(served)
    return WindowTiming(**fields)


__all__ = ["physicalize_one", "physicalize_window", "step_window"]
