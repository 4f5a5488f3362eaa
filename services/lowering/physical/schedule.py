"""Stage 5: an event-driven list schedule of the hardware as it is.

A micro-batch's decode step is a chain of stages ``(layer, phase)``, phase attention → router → experts (+ shared,
dense) → head; a stage may start when the previous stage of its micro-batch has finished on every core it ran on
(the data dependency) and not before its rows were generated (``t_gen``). Different micro-batches are independent.
Resources: each core (its array and DMA: a piece holds its core for ``max(compute, DMA)``), each vault's channels
(held by migrations, ``transfers``) and each directed NoC link (held by the pieces whose reads or writes cross it and
by migrations). The scheduler repeatedly takes the ready stage with the earliest ready time
(ties: lower micro-batch id) and starts each of its pieces at ``max(ready, core free, vault free)``; the pieces of
one stage on one core run back to back in event order. Stages whose ready time is at or after the window end stay
open (the next window schedules them, after overlays that may still change them). No other barrier exists.

Migrations: ``bytes / W`` with ``W = min(bw of both vaults, link bw when it crosses the NoC)`` plus hops × link
latency, starting at ``max(t_apply, both vaults free, both vaults' cores free)``; they hold both vaults' channels.
Approximations: a piece reading a remote vault over the NoC holds the links but not that vault; MoE dispatch/combine
traffic (a few KB per expert) is not a link reservation.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from services.lowering.physical.overlays import Transfer
from shared.chip import Chip

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass
class Stages:
    """Distinct (mb, layer, phase) of the rows, sorted; ``of_row`` maps each row to its stage."""

    mb: I64
    layer: I64
    phase: I64
    tgen: F64  # earliest generation time of the stage's rows
    of_row: I64

    @classmethod
    def of(cls, mb: I64, layer: I64, phase: I64, tgen: F64) -> Stages:
        if not mb.size:
            z = np.zeros(0, np.int64)
            return cls(z, z, z, np.zeros(0), z)
        order = np.lexsort((phase, layer, mb))  # rows by (mb, layer, phase): the stages' order
        m, ly, ph = mb[order], layer[order], phase[order]
        first = np.ones(order.size, dtype=bool)
        first[1:] = (m[1:] != m[:-1]) | (ly[1:] != ly[:-1]) | (ph[1:] != ph[:-1])
        starts = np.flatnonzero(first)
        inv = np.empty(order.size, dtype=np.int64)
        inv[order] = np.cumsum(first) - 1
        return cls(m[starts], ly[starts], ph[starts], np.minimum.reduceat(tgen[order], starts), inv)

    def __len__(self) -> int:
        return int(self.mb.size)


@dataclass
class Schedule:
    start: F64  # per piece, ns; NaN = not scheduled (its stage stays open)
    stage_ready: F64  # per stage, NaN = not scheduled
    stage_end: F64
    core_free: F64
    vault_free: F64
    link_free: F64
    mb_ready: dict[int, float]  # per micro-batch: when its last scheduled stage ends


def schedule_transfers(transfers: list[Transfer], chip: Chip, vault_bw: F64, vault_free: F64, core_free: F64,
                       link_free: F64) -> tuple[F64, F64, I64, I64]:
    """Start, duration (ns), source and destination vault of each transfer; updates ``vault_free`` and ``link_free``
    in place.

    A transfer waits until both vaults' channels are free (no earlier migration holds them and the vaults' own cores,
    whose pieces stream from their vault, are done with the work already scheduled on them) and the links of its XY
    route are free; it holds all of them until it ends."""
    start = np.zeros(len(transfers))
    dur = np.zeros(len(transfers))
    sv = chip.bank_vault_core(np.array([t.src_bank for t in transfers], dtype=np.int64))
    dv = chip.bank_vault_core(np.array([t.dst_bank for t in transfers], dtype=np.int64))
    for i, t in enumerate(transfers):
        s, d = int(sv[i]), int(dv[i])
        hops = int(chip.hops(np.array([s]), np.array([d]))[0])
        bw = min(float(vault_bw[s]), float(vault_bw[d]))
        if hops > 0:
            bw = min(bw, chip.link_bw_bytes_per_ns)
        links = list(chip.route_links(s, d))
        start_ns = max(t.t_apply_ns, float(vault_free[s]), float(vault_free[d]), float(core_free[s]),
                       float(core_free[d]), float(link_free[links].max()) if links else -np.inf)
        start[i] = start_ns
        dur[i] = t.nbytes / bw + hops * chip.link_latency_ns  # ns: bytes / (bytes/ns) + per-hop latency
        vault_free[s] = vault_free[d] = start_ns + dur[i]
        if links:
            link_free[links] = start_ns + dur[i]
    return start, dur, sv, dv


@dataclass
class PieceGroups:
    """The pieces of a set of stages grouped by (stage, core): the part of the list schedule that does not depend on
    the window (the same rows lowered in two windows are scheduled from the same groups). The pieces of a group run
    back to back in event order: ``offset`` is each piece's start after its group's (``order``: pieces in
    (stage, core, event) order)."""

    stages: Stages
    n_pieces: int
    order: I64
    g_core: I64  # per group: its core
    g_sum: F64  # per group: its pieces' total duration
    g_of: I64  # per piece in ``order``: its group
    g_bounds: list[int]  # groups of stage s: g_bounds[s] .. g_bounds[s + 1] - 1
    g_links: dict[int, I64]  # group -> the links it holds
    offset: F64  # per piece in ``order``
    mbs: list[int]  # per stage
    tgen: list[float]  # per stage

    @classmethod
    def of(cls, stages: Stages, piece_stage: I64, piece_core: I64, piece_dur: F64, piece_order_key: I64,
           piece_links: dict[int, tuple[int, ...]] | None = None) -> PieceGroups:
        n_st = len(stages)
        na = piece_stage.size
        order = np.lexsort((piece_order_key, piece_core, piece_stage)) if na else np.zeros(0, np.int64)
        st_o = piece_stage[order]
        core_o = piece_core[order]
        dur_o = piece_dur[order]
        first = np.ones(na, dtype=bool)
        if na:
            first[1:] = (core_o[1:] != core_o[:-1]) | (st_o[1:] != st_o[:-1])
        g_idx = np.flatnonzero(first)
        g_of = np.cumsum(first) - 1
        g_links: dict[int, NDArray[np.int64]] = {}
        if piece_links:
            pos = np.empty(na, dtype=np.int64)
            pos[order] = np.arange(na)
            acc: dict[int, set[int]] = {}
            for p, links in piece_links.items():
                acc.setdefault(int(g_of[pos[p]]), set()).update(links)
            g_links = {g: np.fromiter(sorted(s), dtype=np.int64) for g, s in acc.items()}
        offset = np.zeros(0)
        if na:
            cs = np.cumsum(dur_o)
            excl = cs - dur_o
            offset = excl - excl[g_idx][g_of]
        return cls(stages=stages, n_pieces=na, order=order, g_core=core_o[g_idx],
                   g_sum=np.add.reduceat(dur_o, g_idx) if na else np.zeros(0), g_of=g_of,
                   g_bounds=np.searchsorted(st_o[g_idx], np.arange(n_st + 1)).tolist(), g_links=g_links,
                   offset=offset, mbs=stages.mb.tolist(), tgen=stages.tgen.tolist())


def list_schedule(stages: Stages, piece_stage: I64, piece_core: I64, piece_dur: F64, piece_order_key: I64,
                  mb_ready0: dict[int, float], core_free: F64, vault_free: F64, t1: float,
                  link_free: F64 | None = None, piece_links: dict[int, tuple[int, ...]] | None = None) -> Schedule:
    """Schedule stages whose ready time is before ``t1`` (see the module docstring). ``mb_ready0``: per micro-batch,
    the end of its last stage scheduled in an earlier window. ``piece_links``: the NoC links a piece's remote reads
    and writes cross; the pieces of a stage on one core hold the union of their links for their run and start when
    those links are free. The input arrays are not modified."""
    groups = PieceGroups.of(stages, piece_stage, piece_core, piece_dur, piece_order_key, piece_links)
    return schedule_groups(groups, mb_ready0, core_free, vault_free, t1, link_free)


def schedule_groups(groups: PieceGroups, mb_ready0: dict[int, float], core_free: F64, vault_free: F64, t1: float,
                    link_free: F64 | None = None) -> Schedule:
    """`list_schedule` of pieces already grouped (`PieceGroups`)."""
    gr = groups
    n_st = len(gr.stages)
    free = core_free.copy()
    vfree = vault_free.copy()
    lfree = link_free.copy() if link_free is not None else np.zeros(0)
    g_core, g_sum, g_bounds, g_links = gr.g_core, gr.g_sum, gr.g_bounds, gr.g_links
    g_base = np.full(g_core.size, np.nan)
    st_ready = np.full(n_st, np.nan)
    st_end = np.full(n_st, np.nan)
    mb_ready = dict(mb_ready0)
    # stages of each micro-batch in (layer, phase) order: they are contiguous in `stages` (sorted by mb first)
    heap: list[tuple[float, int, int]] = []
    mbs = gr.mbs
    tgen = gr.tgen
    i = 0
    while i < n_st:  # first stage of every micro-batch
        m = mbs[i]
        heapq.heappush(heap, (max(tgen[i], mb_ready.get(m, -np.inf)), m, i))
        j = i
        while j < n_st and mbs[j] == m:
            j += 1
        i = j
    while heap:
        ready, m, s = heapq.heappop(heap)
        if ready >= t1:
            break
        lo, hi = g_bounds[s], g_bounds[s + 1]
        uc = g_core[lo:hi]
        base = np.maximum(np.maximum(free[uc], vfree[uc]), ready)
        held = [g for g in range(lo, hi) if g in g_links] if g_links else []
        for g in held:
            base[g - lo] = max(base[g - lo], float(lfree[g_links[g]].max()))
        ends = base + g_sum[lo:hi]
        free[uc] = ends
        for g in held:
            lfree[g_links[g]] = ends[g - lo]
        g_base[lo:hi] = base
        end = float(ends.max()) if hi > lo else ready
        st_ready[s] = ready
        st_end[s] = end
        mb_ready[m] = end
        if s + 1 < n_st and mbs[s + 1] == m:
            heapq.heappush(heap, (max(end, tgen[s + 1]), m, s + 1))
    start = np.full(gr.n_pieces, np.nan)
    if gr.n_pieces:
        start[gr.order] = g_base[gr.g_of] + gr.offset
    return Schedule(start=start, stage_ready=st_ready, stage_end=st_end, core_free=free, vault_free=vfree,
                    link_free=lfree, mb_ready=mb_ready)
