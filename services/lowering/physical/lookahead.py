"""Stages 3-6 on a look-ahead of layers per micro-batch: assign, memory, cost, then the list schedule.

Only the rows of the first ``ahead`` not-yet-scheduled layers of each micro-batch are lowered; when some micro-batch
has scheduled all its lowered stages and its next stage is ready before t1, the look-ahead grows and the window is
lowered again. Rows are mapped independently of each other and the scheduler only takes stages ready before t1, so
the result is the one of lowering every row (tests/lowering/test_physical.py).

The lowering of a set of rows (pieces, traffic, cost, stages: everything but the schedule) depends on the rows, their
memory rows, the reroute rules, where tensors live and, for a row split over replicas, the queues at the window
start; not on the window. A micro-batch waiting for its next stage has the same rows lowered window after window, so
``LookaheadCache`` keeps the last lowerings by their rows' event ids and only the schedule is run again. Over many
windows (an epoch: ``Context.many_windows``) it also lowers every row of a window once (its base) and takes a later
look-ahead's lowering from it (`restrict`): the pieces of a row, its traffic and its cost do not depend on the other
rows, and a subset keeps their order (the rows' order, expert rows after the others). A row split over replicas is
taken from the base only while the queues are the ones it was mapped with; a base that cannot be lowered (a bad row
beyond the look-ahead) is not used, so a bad row is refused in the window that lowers it, as one window at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from services.lowering.physical.assign import Pieces, Rows, assign, splits_over_replicas
from services.lowering.physical.columns import LogicalMem, Strings
from services.lowering.physical.cost import Cost, cost
from services.lowering.physical.memory import MemRows, TensorTable, Traffic, prepare, row_bytes, traffic
from services.lowering.physical.overlays import Reroute
from services.lowering.physical.schedule import PieceGroups, Schedule, Stages, schedule_groups
from shared.chip import Chip
from shared.configs.arch import ArchConfig
from shared.contracts.ids import expert_id
from shared.contracts.placement import Placement, ReplicaState
from shared.energy import EnergyModel
from shared.errors import BadInput

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
LOOKAHEAD_LAYERS = 2  # first look-ahead (layers per micro-batch); an optimisation only, results do not depend on it
CACHED_LOWERINGS = 8  # lowerings a LookaheadCache keeps (a window uses one per look-ahead it tries)


class LoweringContext(Protocol):
    """What the look-ahead needs of the run (``carry.Context`` is one)."""

    arch: ArchConfig
    placement: Placement
    chip: Chip
    em: EnergyModel
    freq: F64
    vault_bw: F64
    many_windows: bool
    access: Strings
    lookahead: LookaheadCache

    def lookups(self, replicas: ReplicaState, tensor_banks: dict[str, str],
                ) -> tuple[dict[tuple[int, int], list[int]], TensorTable]: ...


@dataclass
class LoweredRows:
    """One set of rows lowered: what the schedule takes of them."""

    rows: Rows
    pieces: Pieces
    mr: MemRows
    pc: Cost
    stages: Stages
    p_stage: I64
    order_key: I64  # per piece: its row's event id (pieces of a stage on a core run in event order)
    groups: PieceGroups
    links: dict[int, tuple[int, ...]]  # per expert piece with remote traffic: the links it crosses
    row_multi: NDArray[np.bool_]  # per row: split over replicas (its pieces depend on the queues)
    backlog: F64 | None  # the queues it was mapped with, when a row was split over replicas (None: it does not care)

    @cached_property
    def _blocks(self) -> tuple[I64, I64]:
        """Per row: its first piece and how many it has (every row has one piece at least)."""
        n = len(self.rows)
        first = np.full(n, len(self.pieces), dtype=np.int64)
        np.minimum.at(first, self.pieces.row, np.arange(len(self.pieces), dtype=np.int64))
        return first, np.bincount(self.pieces.row, minlength=n).astype(np.int64)

    def restrict(self, sel: I64) -> LoweredRows:
        """The lowering of rows ``sel`` (positions in ``rows``, in order) alone: each row's pieces are one block of
        ``pieces`` (`assign` lists the split rows' blocks, then the single-core expert rows', then the striped ones',
        then the rows split over replicas, each in row order), so the rows' blocks in that order are their pieces in
        `assign`'s."""
        rows = self.rows.take(sel)
        pos = np.full(len(self.rows), -1, dtype=np.int64)
        pos[sel] = np.arange(sel.size)
        p = self.pieces
        first, count = self._blocks
        by_block = sel[np.argsort(first[sel], kind="stable")]
        n_p = count[by_block]
        off = np.cumsum(n_p) - n_p
        keep = np.repeat(first[by_block] - off, n_p) + np.arange(int(n_p.sum()), dtype=np.int64)
        pieces = Pieces(row=pos[p.row[keep]], core=p.core[keep], home=p.home[keep], tok_frac=p.tok_frac[keep],
                        w_frac=p.w_frac[keep], tokens=p.tokens[keep], split=p.split[keep], k=p.k[keep])
        m = self.mr
        count = m.count[sel]
        start = np.cumsum(count) - count
        ent = np.repeat(m.start[sel] - start, count) + np.arange(int(count.sum()), dtype=np.int64)
        mr = MemRows(start=start, count=count, nbytes=m.nbytes[ent], write=m.write[ent], tensor=m.tensor[ent],
                     table=m.table)
        pc = Cost(dur_ns=self.pc.dur_ns[keep], cycles=self.pc.cycles[keep], macs=self.pc.macs[keep],
                  energy_j=self.pc.energy_j[keep])
        links: dict[int, tuple[int, ...]] = {}
        if self.links:
            new_idx = np.full(len(p), -1, dtype=np.int64)
            new_idx[keep] = np.arange(keep.size)
            links = {int(new_idx[q]): lk for q, lk in self.links.items() if new_idx[q] >= 0}
        row_multi = self.row_multi[sel]
        return _scheduled(rows, pieces, mr, pc, links, row_multi, self.backlog if row_multi.any() else None)


@dataclass
class LookaheadCache:
    """The last lowerings by the event ids of their rows, for the reroute rules and the tensor table they were
    lowered with; emptied when either changes or memory rows arrive (they may belong to rows lowered before)."""

    entries: dict[bytes, LoweredRows] = field(default_factory=dict)
    reroutes: list[Reroute] = field(default_factory=list)
    table: TensorTable | None = None
    base: LoweredRows | None = None  # every row of a window, lowered once (over many windows only)
    _base_ids: tuple[I64, I64] | None = None  # the base's event ids, sorted, and their rows
    _layers: tuple[Rows, I64, I64, I64] | None = None

    def valid_for(self, reroutes: list[Reroute], table: TensorTable, new_memory_rows: bool) -> None:
        if new_memory_rows or table is not self.table or reroutes != self.reroutes:
            self.entries.clear()
            self.base = self._base_ids = None
            self.reroutes = list(reroutes)
            self.table = table

    def set_base(self, base: LoweredRows) -> None:
        order = np.argsort(base.rows.event_id, kind="stable")
        self.base, self._base_ids = base, (base.rows.event_id[order], order)

    def from_base(self, event_ids: I64, backlog: F64) -> LoweredRows | None:
        """The lowering of the rows ``event_ids`` taken from the base, when it holds them all (and, for a row split
        over replicas, was mapped with these queues)."""
        if self.base is None or self._base_ids is None or not event_ids.size:
            return None
        ids, order = self._base_ids
        at = np.minimum(np.searchsorted(ids, event_ids), ids.size - 1)
        if not np.array_equal(ids[at], event_ids):
            return None
        sel = order[at]
        if sel.size > 1 and not np.all(sel[1:] > sel[:-1]):  # not in the base's order
            return None
        base = self.base
        if base.backlog is not None and base.row_multi[sel].any() and not np.array_equal(base.backlog, backlog):
            return None
        return base.restrict(sel)

    def layers_of(self, rows: Rows) -> tuple[I64, I64, I64]:
        """The micro-batches of ``rows`` (sorted), each row's micro-batch among them and its layer after its
        micro-batch's first (the look-ahead counts layers from there); kept for the last ``rows`` (the open rows
        of a window that scheduled nothing are the next window's rows)."""
        if self._layers is None or self._layers[0] is not rows:
            if len(rows) and rows.mb.min() == rows.mb.max():  # one micro-batch
                mb_u, mb_inv = rows.mb[:1], np.zeros(len(rows), dtype=np.int64)
                rel = rows.layer - rows.layer.min()
            elif len(rows):
                mb_u, mb_inv = np.unique(rows.mb, return_inverse=True)
                first_layer = np.full(mb_u.size, np.iinfo(np.int64).max)
                np.minimum.at(first_layer, mb_inv, rows.layer)
                rel = rows.layer - first_layer[mb_inv]
            else:
                mb_u = mb_inv = rel = np.zeros(0, np.int64)
            self._layers = (rows, mb_u, mb_inv, rel)
        return self._layers[1], self._layers[2], self._layers[3]

    def get(self, key: bytes, backlog: F64) -> LoweredRows | None:
        hit = self.entries.get(key)
        if hit is None or (hit.backlog is not None and not np.array_equal(hit.backlog, backlog)):
            return None
        return hit

    def put(self, key: bytes, lowered: LoweredRows) -> None:
        if len(self.entries) >= CACHED_LOWERINGS:
            self.entries.clear()
        self.entries[key] = lowered


@dataclass
class Lowered:
    """The rows lowered last (``rows``: the look-ahead subset) with their schedule; ``row_done``: per row of the
    window, whether its stage was scheduled; ``sp``: the scheduled pieces, by start, core, event."""

    rows: Rows
    pieces: Pieces
    mr: MemRows
    pc: Cost
    p_stage: I64
    sch: Schedule
    row_done: NDArray[np.bool_]
    sp: I64


def lower(ctx: LoweringContext, replicas: ReplicaState, all_rows: Rows, lm: LogicalMem, m_row: I64,
          reroutes: list[Reroute], mb_ready0: dict[int, float], core_free: F64, vault_free: F64, link_free: F64,
          tensor_banks: dict[str, str], t0: float, t1: float, *, new_memory_rows: bool) -> Lowered:
    """Lower and schedule the window's rows ``all_rows`` (see the module docstring). ``lm`` / ``m_row``: the memory
    rows and the row of ``all_rows`` each belongs to (-1: none); ``mb_ready0``: per open micro-batch, when its last
    scheduled stage ends; ``core_free`` / ``vault_free`` / ``link_free``: the resources at the window start (after
    the overlays' transfers); ``new_memory_rows``: memory rows arrived in this window."""
    cores_of, table = ctx.lookups(replicas, tensor_banks)
    cache = ctx.lookahead
    cache.valid_for(reroutes, table, new_memory_rows)
    backlog = np.maximum(core_free - t0, 0.0)
    mb_u, mb_inv, rel_layer = cache.layers_of(all_rows)
    ahead = LOOKAHEAD_LAYERS
    while True:
        lowered = rel_layer < ahead
        sub = np.flatnonzero(lowered)
        sub_ids = all_rows.event_id[sub]
        key = sub_ids.tobytes()
        lw = cache.get(key, backlog)
        if lw is None:
            lw = cache.from_base(sub_ids, backlog)
        if lw is None and ctx.many_windows and sub.size < len(all_rows):
            try:
                every = np.arange(len(all_rows))
                cache.set_base(_lower_rows(ctx, replicas, all_rows, every, len(all_rows), lm, m_row, reroutes,
                                           backlog, cores_of, table))
            except BadInput:  # a row beyond the look-ahead: refused when a window lowers it, not before
                cache.base = None
            lw = cache.from_base(sub_ids, backlog)
        if lw is None:
            lw = _lower_rows(ctx, replicas, all_rows.take(sub), sub, len(all_rows), lm, m_row, reroutes, backlog,
                             cores_of, table)
        cache.put(key, lw)
        sch = schedule_groups(lw.groups, mb_ready0, core_free, vault_free, t1, link_free)
        sub_done = ~np.isnan(sch.stage_ready[lw.stages.of_row]) if len(lw.rows) else np.zeros(0, dtype=bool)
        if sub.size == len(all_rows) or not sub_done.any():  # all lowered, or every micro-batch still has a stage
            break
        # micro-batches that ran out of lowered stages while still ready before t1
        lowered_open = np.zeros(mb_u.size, dtype=bool)
        lowered_open[mb_inv[sub[~sub_done]]] = True
        rest = np.flatnonzero(~lowered)
        if mb_u.size == 1:
            next_gen = all_rows.tgen[rest].min(keepdims=True)
        else:
            next_gen = np.full(mb_u.size, np.inf)
            np.minimum.at(next_gen, mb_inv[rest], all_rows.tgen[rest])
        mb_rd = np.array([sch.mb_ready.get(int(m), -np.inf) for m in mb_u.tolist()])
        if not np.any(~lowered_open & np.isfinite(next_gen) & (np.maximum(mb_rd, next_gen) < t1)):
            break
        ahead *= 4
    row_done = np.zeros(len(all_rows), dtype=bool)
    row_done[sub] = sub_done
    sp = np.flatnonzero(~np.isnan(sch.start))
    if sp.size:
        sp = sp[np.lexsort((lw.order_key[sp], lw.pieces.core[sp], sch.start[sp]))]
    return Lowered(rows=lw.rows, pieces=lw.pieces, mr=lw.mr, pc=lw.pc, p_stage=lw.p_stage, sch=sch,
                   row_done=row_done, sp=sp)


def _lower_rows(ctx: LoweringContext, replicas: ReplicaState, rows: Rows, sub: I64, n_all: int, lm: LogicalMem,
                m_row: I64, reroutes: list[Reroute], backlog: F64, cores_of: dict[tuple[int, int], list[int]],
                table: TensorTable) -> LoweredRows:
    """Assign, memory and cost of ``rows`` (rows ``sub`` of the window's ``n_all``), and their stages."""
    chip, arch = ctx.chip, ctx.arch
    pieces = assign(rows, ctx.placement, replicas, reroutes, chip, arch, backlog, ctx.freq, cores_of)
    pos = np.full(n_all + 1, -1, dtype=np.int64)  # the last entry: memory rows of no compute row
    pos[sub] = np.arange(sub.size)
    m_sub_row = pos[m_row]
    msel = np.flatnonzero(m_sub_row >= 0)
    write = _checked_memory(lm, msel, ctx)
    mr = prepare(m_sub_row[msel], lm.nbytes[msel], write, lm.tensor[msel], len(rows), table)
    exp_idx = np.flatnonzero(~pieces.split)
    exp_tr = traffic(mr, pieces, exp_idx, chip)
    split_bytes = row_bytes(mr, len(rows))[pieces.row] / pieces.k
    pc = cost(rows, pieces, exp_tr, exp_idx, split_bytes, chip, arch, ctx.em, ctx.freq, ctx.vault_bw)
    row_multi = _split_over_replicas(rows, cores_of, ctx.placement)
    return _scheduled(rows, pieces, mr, pc, piece_links(exp_tr, exp_idx, pieces, chip), row_multi,
                      backlog if row_multi.any() else None)


def _scheduled(rows: Rows, pieces: Pieces, mr: MemRows, pc: Cost, links: dict[int, tuple[int, ...]],
               row_multi: NDArray[np.bool_], backlog: F64 | None) -> LoweredRows:
    """Lowered rows with their stages and the pieces grouped for the schedule."""
    stages = Stages.of(rows.mb, rows.layer, rows.phase, rows.tgen)
    p_stage = stages.of_row[pieces.row] if len(pieces) else np.zeros(0, np.int64)
    order_key = rows.event_id[pieces.row]
    groups = PieceGroups.of(stages, p_stage, pieces.core, pc.dur_ns, order_key, links)
    return LoweredRows(rows=rows, pieces=pieces, mr=mr, pc=pc, stages=stages, p_stage=p_stage, order_key=order_key,
                       groups=groups, links=links, row_multi=row_multi, backlog=backlog)


def _split_over_replicas(rows: Rows, cores_of: dict[tuple[int, int], list[int]], placement: Placement
                         ) -> NDArray[np.bool_]:
    """Per row: an expert row `assign` splits over replicas by the queues at the window start
    (`splits_over_replicas`), so that its pieces depend on them."""
    out = np.zeros(len(rows), dtype=bool)
    ex = np.flatnonzero(rows.is_expert)
    out[ex] = [splits_over_replicas(expert_id(lv, e), cores_of[(lv, e)], placement)
               for lv, e in zip(rows.layer[ex].tolist(), rows.expert[ex].tolist(), strict=True)]
    return out


def _checked_memory(lm: LogicalMem, msel: I64, ctx: LoweringContext) -> NDArray[np.bool_]:
    """Whether each memory row ``msel`` of ``lm`` writes; a 422 for an access that is neither (its index among the
    rows lowered) or bytes that are not finite and >= 0."""
    acc = lm.access[msel]
    write: NDArray[np.bool_] = acc == ctx.access.code("write")
    bad_acc = np.flatnonzero(~write & (acc != ctx.access.code("read")))
    if bad_acc.size:
        i = int(bad_acc[0])
        raise BadInput(f"access must be 'read' or 'write', got {ctx.access.names[acc[i]]!r}",
                       field=f"logical.memory.access[{i}]")
    nb = lm.nbytes[msel]
    if np.any(~np.isfinite(nb) | (nb < 0)):
        raise BadInput("bytes must be finite and >= 0", field="logical.memory.bytes")
    return write


def piece_links(tr: Traffic, exp_idx: I64, pieces: Pieces, chip: Chip) -> dict[int, tuple[int, ...]]:
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
