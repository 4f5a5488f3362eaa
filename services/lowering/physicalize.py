"""``physicalize_window`` (seed 001 §4.4): logical window + placement + TACS overlays → physical events and timing.

What it does, in order (all vectorised over events; one short loop over the window's (micro-batch, layer, phase)
stages, because a stage may start only when the previous one of its micro-batch has finished on every core):

1. Migrate overlays (seed §3.3) are applied first: ``obj_type = "expert"`` moves/adds/drops an expert instance's
   core (``src``/``dst`` are core ids; an empty or ``-1`` src adds a replica, an empty or ``-1`` dst drops one) and
   updates ``ReplicaState``; ``obj_type = "weight"`` moves one weight tensor between banks (kept in
   ``PhysicalState.tensor_banks``). Each costs a read at the source and a write at the destination with
   ``noc_qos = "migration"``, and occupies the receiving core's DMA for ``bytes / min(vault bw, link bw)``.
2. Work → cores. Routed-expert rows (``expert >= 0``) go to the cores of ``L{layer}E{expert}`` (ReplicaState first,
   else the placement). With replicas, tokens are split by a deterministic least-loaded (water-filling) rule over the
   replicas' estimated load (queued backlog + work already assigned in this window), ties to the lower core id.
   Other rows (attention, router, shared expert, dense, head) are split evenly over all cores (a GEMM split over N:
   every core sees all M tokens and 1/n of the weights and FLOPs).
3. Reroute overlays, in row order, move assignments from ``from_core`` to ``to_core`` for work generated at or after
   ``t_apply_ns``: scope ``"mb"`` for the micro-batches in ``mb_ids_json``; scope ``"expert"`` for routed-expert
   work (all of it when ``mb_ids_json`` is ``[]``; only the listed ``"L{l}E{e}"`` instances or micro-batch ids
   otherwise). The expert's weights stay where they are, so rerouted work reads them over the NoC.
4. Memory events: weight tensors ``W_*`` are read from ``tensor_banks`` / ``placement.tensors`` (when that bank is in
   the vault of one of the expert's current cores) / else a bank of the home core's vault; KV and activations live in
   the executing core's own vault. Weight bytes are not scaled for replicas (each replica streams the weights); KV and
   activation bytes follow the token share. ``hops`` = Manhattan distance core ↔ bank's vault core.
5. Duration of an event = ``max(compute, DMA)`` (double-buffered): compute = fold-formula cycles from MACs and tokens
   (``costmodel.cycles_from_macs``) at ``freq_ghz[core]``; DMA = local bytes / (vault bw × bw_eff) + remote bytes /
   min(vault bw × bw_eff, link bw) + max hops × link latency.
6. Timing: each core runs its events in order; stage ready = max(t_gen, previous stage of the micro-batch done);
   start = max(ready, core free). Work that starts after the window end is not emitted now: it is carried in
   ``PhysicalState.queue`` (aggregated per core, op and, for not-started routed-expert work, expert instance) and
   emitted in the window where it runs, so emitted power never exceeds what the cores can do. A micro-batch's tokens
   complete when its last layer finishes.
7. Carried work that has not started is not physicalized yet (ARCHITECTURE §4), so an expert migration (``src`` →
   ``dst``) or a scope-``"expert"`` reroute applying in this window moves that expert's queued work and its memory
   traffic to the new core before anything is scheduled (``_move_carried``); a migrated expert's traffic that was
   local to the source vault now lives in the destination's vault. Scope-``"mb"`` rows do not touch carried work.

Units: ns (absolute simulated time) inside, ms in ``WindowTiming``, frequencies in GHz (= cycles/ns), bytes, J.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from services.lowering.chip import Chip, stable_hash
from services.lowering.costmodel import ACC_BYTES, SPM_ACCESS_BYTES, cycles_from_macs, dtype_bytes, mac_pj_for
from shared.configs.arch import ArchConfig
from shared.contracts.events import (
    CarryCompute,
    CarryMemory,
    ComputeEvents,
    CoreQueueState,
    MemoryEvents,
    OpenMicroBatch,
    PendingTokens,
    PhysicalState,
    WindowTiming,
)
from shared.contracts.ids import expert_id, parse_expert_id
from shared.contracts.placement import Overlays, Placement, ReplicaEntry, ReplicaState
from shared.contracts.workload import LogicalWindow
from shared.errors import BadInput

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

# Order of ops inside one layer of a micro-batch: attention/dense → router → experts → LM head.
PHASE: dict[str, int] = {"attn": 0, "router": 1, "shared": 2, "fc": 2, "dense": 2, "head": 3}
UNKNOWN_PHASE = 2
_NONE = ("", "-1", "none", "None")


def _bc(idx: I64, weights: F64, minlength: int) -> F64:
    """``np.bincount`` that is float64 even when empty."""
    return np.bincount(idx, weights=weights, minlength=minlength).astype(np.float64)


@dataclass
class _Assign:
    """One (logical row, core) piece of work."""

    row: I64
    core: I64
    home: I64  # the core whose vault holds the row's weights by default
    tok_frac: F64  # share of the row's tokens (activations/KV scale with it)
    w_frac: F64  # share of the row's weights streamed by this core
    tokens: F64  # M seen by this core


def _water_fill(tokens: int, loads: list[float], per_token: list[float], cores: list[int]) -> list[int]:
    """Integer token split that equalises ``load + n·per_token`` (ties → lower core id).

    A bisection on the water level, 60 halvings at most. It stops early once ``(lo, hi)`` no longer changes (the
    midpoint is one of them): every further step would compute the same midpoint and keep the same bounds, so the
    result is the one of all 60 steps. The terms ``max(0, (mid − load)/per_token)`` are summed left to right in float
    as ``sum()`` did (adding 0.0 is exact), with two replicas unrolled: the same bits, ~3x faster
    (tests/lowering/test_water_fill.py compares it with the plain loop)."""
    k = len(cores)
    order = sorted(range(k), key=lambda i: (loads[i], cores[i]))
    lo, hi = min(loads), max(loads) + tokens * max(per_token) + 1.0
    pairs = list(zip(loads, per_token, strict=True))
    (l0, p0), (l1, p1) = pairs[0], pairs[-1]  # the two replicas of the unrolled sum (k == 2)
    for _ in range(60):
        mid = (lo + hi) / 2
        if k == 2:
            a = (mid - l0) / p0
            b = (mid - l1) / p1
            n = (a if a > 0.0 else 0.0) + (b if b > 0.0 else 0.0)
        else:
            n = 0.0
            for ld, p in pairs:
                x = (mid - ld) / p
                if x > 0.0:
                    n += x
        if n >= tokens:
            if hi == mid:
                break
            hi = mid
        else:
            if lo == mid:
                break
            lo = mid
    out = [int(max(0.0, (lo - loads[i]) / per_token[i])) for i in range(k)]
    rest = tokens - sum(out)
    j = 0
    while rest > 0:  # hand out what flooring left, least-loaded first
        i = order[j % k]
        out[i] += 1
        rest -= 1
        j += 1
    return out


def _parse_ids(s: str, field: str) -> list[object]:
    try:
        v = json.loads(s) if s.strip() else []
    except json.JSONDecodeError:
        raise BadInput(f"not a JSON array: {s!r}", field=field) from None
    if not isinstance(v, list):
        raise BadInput(f"not a JSON array: {s!r}", field=field)
    return v


def _expert_cores(key: str, placement: Placement, replicas: ReplicaState, chip: Chip) -> list[int]:
    ent = replicas.experts.get(key)
    if ent is not None and ent.cores:
        cores = ent.cores
    elif key in placement.experts:
        cores = placement.experts[key].cores
    else:
        raise BadInput(f"expert instance {key} has no placement", field=f"placement.experts.{key}")
    for c in cores:
        chip.check_core(c, f"placement.experts.{key}.cores")
    return list(cores)


@dataclass
class _Migration:
    core: int  # receiving core (its DMA does the move)
    src_bank: int
    dst_bank: int
    nbytes: float
    t_apply_ns: float


def _apply_migrations(overlays: Overlays, placement: Placement, replicas: ReplicaState,
                      tensor_banks: dict[str, str], chip: Chip, t0: int,
                      ) -> tuple[list[_Migration], int, list[tuple[str, int, int]]]:
    """Update replica state / tensor banks in place; return the transfers to schedule, the number of objects
    moved (an expert with its shards counts once; a lone weight shard counts once) and the expert moves
    ``(expert id, src core, dst core)`` (rows with both a source and a destination core)."""
    out: list[_Migration] = []
    moves: list[tuple[str, int, int]] = []
    moved: set[str] = set()
    mig = overlays.migrate
    for i in range(len(mig)):
        t_apply, obj_type, obj_id = mig.t_apply_ns[i], mig.obj_type[i], mig.obj_id[i]
        src, dst, size = mig.src[i], mig.dst[i], mig.size_bytes[i]
        f = f"overlays.migrate[{i}]"
        if size < 0:
            raise BadInput("size_bytes must be >= 0", field=f"{f}.size_bytes")
        if obj_type == "weight":
            sb = chip.parse_bank(src, f"{f}.src")
            db = chip.parse_bank(dst, f"{f}.dst")
            tensor_banks[obj_id] = chip.bank_str(db)
            moved.add(obj_id[2:].rpartition("_")[0] if obj_id.startswith("W_") else obj_id)
            if size > 0:
                out.append(_Migration(int(chip.bank_vault_core(np.array([db]))[0]), sb, db, float(size),
                                      float(max(t_apply, t0))))
        elif obj_type == "expert":
            try:
                layer, e = parse_expert_id(obj_id)
            except ValueError as exc:
                raise BadInput(str(exc), field=f"{f}.obj_id") from None
            key = expert_id(layer, e)
            moved.add(key)
            cores = _expert_cores(key, placement, replicas, chip)
            try:
                s_core = None if src.strip() in _NONE else chip.check_core(int(src), f"{f}.src")
                d_core = None if dst.strip() in _NONE else chip.check_core(int(dst), f"{f}.dst")
            except ValueError:
                raise BadInput(f"src/dst of an expert migration are core ids, got {src!r} -> {dst!r}",
                               field=f"{f}.src") from None
            new = [c for c in cores if c != s_core] if s_core is not None else list(cores)
            if d_core is not None and d_core not in new:
                new.append(d_core)
            if not new:
                raise BadInput(f"migration would leave {key} on no core", field=f)
            if s_core is not None and d_core is not None and s_core != d_core:
                moves.append((key, s_core, d_core))
            if new != cores:  # not yet applied (TACS may already have updated the replica state itself)
                prev = replicas.experts.get(key)
                replicas.experts[key] = ReplicaEntry(
                    cores=new, ts_created_ns=prev.ts_created_ns if prev is not None else int(t_apply),
                    last_change_ns=int(t_apply), prev_cores=cores)
            if d_core is not None and size > 0:  # the instance's weights, when no weight rows list them
                from_core = s_core if s_core is not None else cores[0]
                key_h = np.array([stable_hash(key)])
                sb = int(chip.vault_bank(np.array([from_core]), key_h)[0])
                db = int(chip.vault_bank(np.array([d_core]), key_h)[0])
                out.append(_Migration(d_core, sb, db, float(size), float(max(t_apply, t0))))
                tensor_banks[f"{key}_*"] = chip.bank_str(db)  # its shards now live in the destination vault
        else:
            raise BadInput(f"obj_type must be 'weight' or 'expert', got {obj_type!r}", field=f"{f}.obj_type")
    return out, len(moved), moves


# Integer code of a routed-expert instance in the carry tags: layer · 2^20 + expert; -1 = untagged.
_CODE_SHIFT = 20


def _expert_code(key: str, field: str) -> int:
    try:
        lv, e = parse_expert_id(key)
    except ValueError as exc:
        raise BadInput(str(exc), field=field) from None
    return (lv << _CODE_SHIFT) + e


def _tag_codes(tags: list[str], n_rows: int, field: str) -> I64:
    """Carry tags ("" or "L{l}E{e}") → integer codes (-1 = untagged); an empty tag list tags nothing."""
    if not tags:
        return np.full(n_rows, -1, dtype=np.int64)
    if len(tags) != n_rows:
        raise BadInput(f"{len(tags)} tags for {n_rows} carried records", field=field)
    memo: dict[str, int] = {"": -1}
    return np.array([memo[t] if t in memo else memo.setdefault(t, _expert_code(t, f"{field}[{i}]"))
                     for i, t in enumerate(tags)], dtype=np.int64)


def _code_strs(codes: I64) -> list[str]:
    mask = (1 << _CODE_SHIFT) - 1
    return ["" if c < 0 else expert_id(c >> _CODE_SHIFT, c & mask) for c in codes.tolist()]


@dataclass
class _Carry:
    """The carried work of the previous window as arrays (records may be moved between cores before emission)."""

    c_core: I64
    c_tail: NDArray[np.bool_]
    c_code: I64
    m_core: I64
    m_tail: NDArray[np.bool_]
    m_code: I64
    start: F64  # per core: where its tail resumes (ns)
    end: F64  # per core: where its tail ends (ns)
    m_rehome: I64 | None = None  # per memory record: the core whose vault now holds it after a migration (-1: none)


def _move_carried(cr: _Carry, overlays: Overlays, moves: list[tuple[str, int, int]], c_dur: F64, busy: F64,
                  chip: Chip, t0: float, t1: float) -> F64:
    """Move not-started carried work (tail records) of migrated / rerouted experts to their new cores, in place.

    Order: expert migrations (``src`` → ``dst`` cores), then reroute rows applying before ``t1`` in row order
    (scope ``"expert"``: the listed ``"L{l}E{e}"`` instances, or every routed expert's work when the list is empty;
    rows that list micro-batch ids, and scope ``"mb"``, do not touch carried work: the carry is aggregated per expert,
    not per micro-batch). FLOPs, energy and bytes are conserved: records change core, not size. A moved record keeps
    its duration (ns). A source's tail span and busy-until shrink by the work that left; a destination's tail starts
    no later than its head is done and lasts at least its own plus the arrived work. Returns busy-until per core (ns).
    """
    n = chip.n_cores
    if not (cr.c_tail & (cr.c_code >= 0)).any():
        return busy
    steps: list[tuple[int, int, list[int] | None, bool]] = [
        (s, d, [_expert_code(k, "overlays.migrate.obj_id")], True) for k, s, d in moves]
    rr = overlays.reroute
    rr_expert: list[str] = list(getattr(rr, "expert_id", None) or [""] * len(rr))
    for i in range(len(rr)):
        if rr.scope[i] != "expert" or rr.t_apply_ns[i] >= t1:
            continue
        ids = _parse_ids(rr.mb_ids_json[i], f"overlays.reroute[{i}].mb_ids_json")
        if any(isinstance(x, int | float) and not isinstance(x, bool) for x in ids):
            continue
        ex = [str(x) for x in ids if isinstance(x, str)] + ([rr_expert[i]] if rr_expert[i] else [])
        steps.append((int(rr.from_core[i]), int(rr.to_core[i]),
                      [_expert_code(x, f"overlays.reroute[{i}].mb_ids_json") for x in ex] or None, False))
    c_orig = cr.c_core.copy()
    movable_c = cr.c_tail & (cr.c_code >= 0)
    movable_m = cr.m_tail & (cr.m_code >= 0)
    rehome = np.full(cr.m_core.size, -1, dtype=np.int64)
    for src, dst, codes, migrated in steps:
        if src == dst:
            continue
        sel_c = movable_c & (cr.c_core == src)
        sel_m = movable_m & (cr.m_core == src)
        if codes is not None:
            sel_c &= np.isin(cr.c_code, codes)
            sel_m &= np.isin(cr.m_code, codes)
        cr.c_core[sel_c] = dst
        cr.m_core[sel_m] = dst
        # rerouted work reads the expert's weights where they are (over the NoC); a migrated expert's weights and
        # the work's activations are now in the destination's vault
        if migrated:
            rehome[sel_m] = dst
    cr.m_rehome = rehome
    moved = cr.c_core != c_orig
    if not moved.any():
        return busy
    out_d = _bc(c_orig[moved], weights=c_dur[moved], minlength=n)
    in_d = _bc(cr.c_core[moved], weights=c_dur[moved], minlength=n)
    stay = cr.c_tail & ~moved
    own = _bc(c_orig[stay], weights=c_dur[stay], minlength=n)  # tail work that stays on its core
    head_end = t0 + _bc(c_orig[~cr.c_tail], weights=c_dur[~cr.c_tail], minlength=n)
    busy = np.maximum(busy, t0)
    s_tail = np.maximum(cr.start, t0)
    # sources: the tail ends earlier by what left
    end = np.where(out_d > 0, np.maximum(cr.end - out_d, s_tail), cr.end)
    busy = np.where(out_d > 0, np.maximum(busy - out_d, t0), busy)
    # destinations: the arrived work is ready now; it runs in the core's tail, which starts when the core's head
    # (or, without a tail, its whole queue) is done and is stretched so that its duty stays <= 1
    start = np.where(in_d > 0, np.where(own > 0, np.minimum(s_tail, head_end), busy), cr.start)
    end = np.where(in_d > 0, np.maximum(np.where(own > 0, end, start), start + own + in_d), end)
    busy = np.where(in_d > 0, np.maximum(busy, end), busy)
    cr.start, cr.end = start, end
    return busy


def physicalize_window(win_idx: int, logical: LogicalWindow, placement: Placement, overlays: Overlays | None,
                       state: PhysicalState, arch: ArchConfig, freq_ghz: Sequence[float], window_ms: float,
                       bw_eff_factor: float | Sequence[float] = 1.0, *, n_layers: int | None = None,
                       ) -> tuple[ComputeEvents, MemoryEvents, PhysicalState, WindowTiming]:
    """Lower one logical window to physical events (see the module docstring).

    ``bw_eff_factor``: DRAM bandwidth left after refresh, one value or one per vault (core). ``n_layers``: the
    model's layer count (a micro-batch completes when layer ``n_layers − 1`` finishes); default: the highest layer in
    the window. ``overlays`` None and an empty ``Overlays`` give identical results.
    """
    chip = Chip.from_arch(arch)
    n = chip.n_cores
    if win_idx < 0:
        raise BadInput("window must be >= 0", field="window")
    if len(freq_ghz) != n:
        raise BadInput(f"freq_ghz has {len(freq_ghz)} values but the mesh has {n} cores", field="freq_ghz")
    freq = np.asarray(freq_ghz, dtype=np.float64)
    if not np.all(freq > 0):
        raise BadInput("freq_ghz must be > 0 for every core", field="freq_ghz")
    if not window_ms > 0:
        raise BadInput("window_ms must be > 0", field="window_ms")
    eff = np.broadcast_to(np.asarray(bw_eff_factor, dtype=np.float64), (n,)) if np.ndim(bw_eff_factor) == 0 \
        else np.asarray(bw_eff_factor, dtype=np.float64)
    if eff.shape != (n,) or not np.all((eff > 0) & (eff <= 1)):
        raise BadInput(f"bw_eff_factor must be in (0, 1], one value or {n}", field="bw_eff_factor")
    overlays = overlays or Overlays()
    t0 = float(logical.t0_ns)
    t1 = t0 + window_ms * 1e6

    # the caller's state is not changed: entries are replaced in this copy of the dict, never mutated in place
    # (a deep copy of the 256 entries took ~7 % of the service's time)
    replicas = state.replicas.model_copy(update={"experts": dict(state.replicas.experts)})
    tensor_banks = dict(state.tensor_banks)
    q = state.queue
    busy = np.zeros(n) if not q.busy_until_ns else np.asarray(q.busy_until_ns, dtype=np.float64)
    if busy.shape != (n,):
        raise BadInput(f"state.queue.busy_until_ns has {busy.size} values, the mesh {n}",
                       field="state.queue.busy_until_ns")
    free = np.maximum(busy, t0)

    R, C = arch.core.array
    b = dtype_bytes(arch.core.dtype, "arch.core.dtype")
    mac_j = mac_pj_for(arch.core.dtype, arch) * 1e-12
    spm_j = arch.power.spm_pj_per_access * 1e-12
    dram_j_per_byte = arch.dram.pj_per_bit * 8e-12
    noc_j_per_byte_hop = arch.mesh.noc.pj_per_bit_hop * 8e-12
    vault_bw = chip.vault_bw_bytes_per_ns * eff  # bytes/ns per vault
    link_bw = chip.link_bw_bytes_per_ns

    # ---- 1. migrations --------------------------------------------------------------------------------------
    migs, n_moved, exp_moves = _apply_migrations(overlays, placement, replicas, tensor_banks, chip, int(t0))
    # ... and the carried, not-started work of moved / rerouted experts follows them (before anything is scheduled)
    cc, cm = q.carry_compute, q.carry_memory
    c_dur = np.asarray(cc.duration_ns, dtype=np.float64)
    carry = _Carry(
        c_core=np.asarray(cc.core_id, dtype=np.int64), c_tail=np.asarray(cc.part, dtype=np.int64) == 1,
        c_code=_tag_codes(q.carry_compute_expert, len(cc), "state.queue.carry_compute_expert"),
        m_core=np.asarray(cm.src_core, dtype=np.int64), m_tail=np.asarray(cm.part, dtype=np.int64) == 1,
        m_code=_tag_codes(q.carry_memory_expert, len(cm), "state.queue.carry_memory_expert"),
        start=np.asarray(q.carry_start_ns, dtype=np.float64) if q.carry_start_ns else np.full(n, t0),
        end=np.asarray(q.carry_end_ns, dtype=np.float64) if q.carry_end_ns else np.full(n, t0))
    if carry.start.shape != (n,) or carry.end.shape != (n,):
        raise BadInput(f"state.queue.carry_start_ns / carry_end_ns need {n} values", field="state.queue.carry_start_ns")
    busy = _move_carried(carry, overlays, exp_moves, c_dur, busy, chip, t0, t1)
    free = np.maximum(busy, t0)

    # ---- 2. logical rows → assignments ----------------------------------------------------------------------
    lc = logical.compute.to_numpy()
    nrow = len(logical.compute)
    ev_ids = lc["event_id"].astype(np.int64) if nrow else np.zeros(0, np.int64)
    mb = lc["mb_id"].astype(np.int64) if nrow else np.zeros(0, np.int64)
    layer = lc["layer"].astype(np.int64) if nrow else np.zeros(0, np.int64)
    expert = lc["expert"].astype(np.int64) if nrow else np.zeros(0, np.int64)
    tokens = lc["tokens"].astype(np.float64) if nrow else np.zeros(0)
    flops = lc["flops"].astype(np.float64) if nrow else np.zeros(0)
    tgen = lc["t_gen_ns"].astype(np.float64) if nrow else np.zeros(0)
    op_type: list[str] = logical.compute.op_type
    if nrow and (np.any(tokens < 0) or np.any(flops < 0)):
        raise BadInput("tokens and flops must be >= 0", field="logical.compute")
    if nrow and np.unique(ev_ids).size != nrow:
        raise BadInput("event_id values must be unique", field="logical.compute.event_id")
    macs = flops / 2.0

    is_exp = expert >= 0
    # non-expert rows: every core, 1/n of the work, all tokens (GEMM split over N)
    ne = np.flatnonzero(~is_exp)
    a_row = [np.repeat(ne, n)]
    a_core = [np.tile(np.arange(n, dtype=np.int64), ne.size)]
    a_home = [a_core[0]]
    a_tok = [np.full(ne.size * n, 1.0 / n)]
    a_w = [np.full(ne.size * n, 1.0 / n)]
    # expert rows
    ex = np.flatnonzero(is_exp)
    keys = [expert_id(int(lv), int(e)) for lv, e in zip(layer[ex], expert[ex], strict=True)]
    cache: dict[str, list[int]] = {}
    single_rows: list[int] = []
    single_core: list[int] = []
    multi: list[tuple[int, list[int]]] = []
    for r, k in zip(ex.tolist(), keys, strict=True):
        cores = cache.get(k)
        if cores is None:
            cores = _expert_cores(k, placement, replicas, chip)
            cache[k] = cores
        if len(cores) == 1:
            single_rows.append(r)
            single_core.append(cores[0])
        else:
            multi.append((r, cores))
    sr = np.asarray(single_rows, dtype=np.int64)
    sc = np.asarray(single_core, dtype=np.int64)
    a_row.append(sr)
    a_core.append(sc)
    a_home.append(sc)
    a_tok.append(np.ones(sr.size))
    a_w.append(np.ones(sr.size))
    if multi:
        # estimated load (ns) per core: backlog + compute of the work assigned so far in this window
        est = cycles_from_macs(macs, tokens, R, C, arch.core.dataflow)
        load = (free - t0) + _bc(sc, weights=est[sr] / freq[sc], minlength=n)
        load += np.bincount(np.tile(np.arange(n), ne.size), weights=np.repeat(est[ne] / n, n), minlength=n) / freq
        mr: list[int] = []
        mc: list[int] = []
        mt: list[float] = []
        for r, cores in multi:
            t = round(tokens[r])
            kn = macs[r] / max(tokens[r], 1.0)
            per_tok = [max(kn / (R * C) / freq[c], 1e-9) for c in cores]
            split = _water_fill(t, [float(load[c]) for c in cores], per_tok, cores) if t > 0 else [0] * len(cores)
            if t == 0:
                split[0] = 0
                mr.append(r)
                mc.append(cores[0])
                mt.append(1.0)
            for c, s, p in zip(cores, split, per_tok, strict=True):
                if s > 0:
                    mr.append(r)
                    mc.append(c)
                    mt.append(s / t)
                    load[c] += s * p
        mr_a = np.asarray(mr, dtype=np.int64)
        mc_a = np.asarray(mc, dtype=np.int64)
        a_row.append(mr_a)
        a_core.append(mc_a)
        a_home.append(mc_a)
        a_tok.append(np.asarray(mt))
        a_w.append(np.ones(mr_a.size))
    A = _Assign(row=np.concatenate(a_row), core=np.concatenate(a_core), home=np.concatenate(a_home),
                tok_frac=np.concatenate(a_tok), w_frac=np.concatenate(a_w), tokens=np.zeros(0))
    A.tokens = np.where(is_exp[A.row], tokens[A.row] * A.tok_frac, tokens[A.row])

    # ---- 3. reroute overlays ----------------------------------------------------------------------------------
    rr = overlays.reroute
    rr_expert: list[str] = list(getattr(rr, "expert_id", None) or [""] * len(rr))  # extra column (placement)
    for i in range(len(rr)):
        t_apply, scope = rr.t_apply_ns[i], rr.scope[i]
        from_core, to_core = rr.from_core[i], rr.to_core[i]
        f = f"overlays.reroute[{i}]"
        chip.check_core(from_core, f"{f}.from_core")
        chip.check_core(to_core, f"{f}.to_core")
        ids = _parse_ids(rr.mb_ids_json[i], f"{f}.mb_ids_json")
        sel = (A.core == from_core) & (tgen[A.row] >= t_apply)
        mb_list = [int(x) for x in ids if isinstance(x, int | float) and not isinstance(x, bool)]
        ex_list = [str(x) for x in ids if isinstance(x, str)]
        if rr_expert[i]:
            ex_list.append(rr_expert[i])
        if scope == "mb":
            sel &= np.isin(mb[A.row], np.asarray(mb_list, dtype=np.int64))
        elif scope == "expert":
            sel &= is_exp[A.row]
            if mb_list:
                sel &= np.isin(mb[A.row], np.asarray(mb_list, dtype=np.int64))
        else:
            raise BadInput(f"scope must be 'mb' or 'expert', got {scope!r}", field=f"{f}.scope")
        if ex_list:  # only the listed expert instances' work
            want = []
            for x_id in ex_list:
                try:
                    lv, e = parse_expert_id(x_id)
                except ValueError as exc:
                    raise BadInput(str(exc), field=f"{f}.expert_id") from None
                want.append(lv * 100003 + e)
            codes = np.where(is_exp[A.row], layer[A.row] * 100003 + expert[A.row], -1)
            sel &= np.isin(codes, np.asarray(want, dtype=np.int64))
        A.core = np.where(sel, to_core, A.core)

    na = A.row.size
    # ---- 4. memory events of the assignments ------------------------------------------------------------------
    lm = logical.memory
    nmem = len(lm)
    if nmem:
        m_ev = np.asarray(lm.event_id, dtype=np.int64)
        order_ev = np.argsort(ev_ids, kind="stable")
        pos = np.searchsorted(ev_ids[order_ev], m_ev)
        pos_c = np.minimum(pos, max(nrow - 1, 0))
        if nrow == 0 or np.any(ev_ids[order_ev][pos_c] != m_ev):
            bad = int(np.flatnonzero((nrow == 0) | (ev_ids[order_ev][pos_c] != m_ev))[0])
            raise BadInput(f"memory row {bad} refers to unknown compute event {int(m_ev[bad])}",
                           field="logical.memory.event_id")
        m_row = order_ev[pos_c]
        m_bytes = np.asarray(lm.bytes, dtype=np.float64)
        if np.any(m_bytes < 0):
            raise BadInput("bytes must be >= 0", field="logical.memory.bytes")
        tids = lm.tensor_id
        acc_arr = np.asarray(lm.access)
        m_write = acc_arr == "write"
        bad_acc = np.flatnonzero(~m_write & (acc_arr != "read")).tolist()
        if bad_acc:
            raise BadInput(f"access must be 'read' or 'write', got {lm.access[bad_acc[0]]!r}",
                           field=f"logical.memory.access[{bad_acc[0]}]")
        t_code: dict[str, int] = {}
        t_inv = np.array([t_code.setdefault(t, len(t_code)) for t in tids], dtype=np.int64)
        uniq_t = np.array(list(t_code), dtype=object)
        t_is_w = np.array([t.startswith("W_") for t in t_code], dtype=bool)
        t_hash = np.array([stable_hash(t) for t in t_code], dtype=np.int64)
        # Bank of a weight shard's copy on the expert's cores[0] (t_bank, owner t_owner): a weight overlay
        # (state.tensor_banks) > the replica state's shard_banks (after a TACS migration) > placement.tensors >
        # none (-1: a bank of the home core's vault). Copies of replicas: placement.tensors[...].replica_banks.
        t_bank = np.full(uniq_t.size, -1, dtype=np.int64)
        t_owner = np.full(uniq_t.size, -1, dtype=np.int64)
        rep_bank: dict[tuple[int, int], int] = {}
        any_bank_info = bool(tensor_banks) or bool(placement.tensors) or any(
            e.shard_banks for e in replicas.experts.values())
        key_info: dict[str, tuple[str, list[int]]] = {}
        for j, t in enumerate(uniq_t.tolist() if any_bank_info else []):
            if not t_is_w[j]:
                continue
            key_s, _, shard_s = t[2:].rpartition("_")
            info = key_info.get(key_s)
            if info is None:
                try:
                    lv, e = parse_expert_id(key_s)
                    k_ = expert_id(lv, e)
                    info = (k_, cache.get(k_) or _expert_cores(k_, placement, replicas, chip))
                except (ValueError, BadInput):
                    info = ("", [])
                key_info[key_s] = info
            key, cores = info
            k_shard = int(shard_s) if shard_s.isdigit() else -1
            ent = replicas.experts.get(key) if key else None
            tp = placement.tensors.get(t)
            bank_s = tensor_banks.get(t) or (tensor_banks.get(f"{key}_*") if key else None)
            if bank_s is not None:
                where = f"state.tensor_banks.{t}"
            elif ent is not None and ent.shard_banks and 0 <= k_shard < len(ent.shard_banks):
                bank_s, where = ent.shard_banks[k_shard], f"state.replicas.experts.{key}.shard_banks"
            elif tp is not None:
                bank_s, where = tp.dram_bank, f"placement.tensors.{t}.dram_bank"
            if bank_s is not None:
                t_bank[j] = chip.parse_bank(bank_s, where)
                t_owner[j] = cores[0] if cores else -1
            if tp is not None and tp.replica_banks and len(cores) > 1:
                for c, rb in zip(cores[1:], tp.replica_banks, strict=False):
                    rep_bank[(j, c)] = chip.parse_bank(rb, f"placement.tensors.{t}.replica_banks")
        # sort memory rows by compute row, expand per assignment
        mo = np.argsort(m_row, kind="stable")
        cnt = np.bincount(m_row, minlength=nrow)
        start = np.concatenate([[0], np.cumsum(cnt)[:-1]]) if nrow else np.zeros(0, np.int64)
        per_a = cnt[A.row]
        e_a = np.repeat(np.arange(na), per_a)
        offs = np.arange(e_a.size) - np.repeat(np.cumsum(per_a) - per_a, per_a)
        e_m = mo[np.repeat(start[A.row], per_a) + offs]  # memory row index
        e_core = A.core[e_a]
        e_t = t_inv[e_m]
        is_w = t_is_w[e_t]
        e_bytes = m_bytes[e_m] * np.where(is_w, A.w_frac[e_a], A.tok_frac[e_a])
        default_core = np.where(is_w, A.home[e_a], e_core)
        key_part, core_part = chip.vault_bank_parts(t_hash)
        tb, own = t_bank[e_t], t_owner[e_t]
        use_tb = (tb >= 0) & ((own < 0) | (own == default_core))
        e_bank = np.where(use_tb, tb, key_part[e_t] + core_part[default_core])
        if rep_bank:  # replicas read their own copies
            for ev in np.flatnonzero(is_w & ~use_tb).tolist():
                copy = rep_bank.get((int(e_t[ev]), int(default_core[ev])))
                if copy is not None:
                    e_bank[ev] = copy
        e_rw_w = m_write[e_m]
        e_act = is_exp[A.row[e_a]] & ~is_w  # a routed expert's token activations (not its weights)
    else:
        e_a = np.zeros(0, np.int64)
        e_core = np.zeros(0, np.int64)
        e_bytes = np.zeros(0)
        e_bank = np.zeros(0, np.int64)
        e_rw_w = np.zeros(0, dtype=bool)
        e_act = np.zeros(0, dtype=bool)
    e_vault = chip.bank_vault_core(e_bank)
    e_hops = chip.hops(e_core, e_vault)
    e_qos_mig = np.zeros(e_a.size, dtype=bool)

    # ---- 5. durations and energy ------------------------------------------------------------------------------
    a_macs = macs[A.row] * np.where(is_exp[A.row], A.tok_frac, A.w_frac)
    a_cycles = cycles_from_macs(macs[A.row], A.tokens, R, C, arch.core.dataflow)
    a_cycles = np.where(is_exp[A.row], cycles_from_macs(a_macs, A.tokens, R, C, arch.core.dataflow),
                        a_cycles / n)
    a_f = freq[A.core]
    comp_ns = a_cycles / a_f
    bw_e = np.where(e_hops > 0, np.minimum(vault_bw[e_vault], link_bw), vault_bw[e_vault])
    dma_ns = _bc(e_a, weights=e_bytes / bw_e, minlength=na)
    hop_max = np.zeros(na)
    if e_a.size:
        np.maximum.at(hop_max, e_a, e_hops.astype(np.float64))
    dma_ns += hop_max * chip.link_latency_ns
    dur = np.maximum(comp_ns, dma_ns)
    a_bytes = _bc(e_a, weights=e_bytes, minlength=na)
    # SPM 64-bit accesses: DMA fill + drain of the bytes, plus operand streaming of the array (one A/B read per
    # R/C MACs) and partial-sum traffic (fp32, one per R MACs).
    spm_acc = (2 * a_bytes + a_macs * (b / R + b / C + ACC_BYTES / R)) / SPM_ACCESS_BYTES
    a_energy = a_macs * mac_j + spm_acc * spm_j
    a_flops = 2 * a_macs

    # ---- 6. scheduling over stages ----------------------------------------------------------------------------
    phase_of_row = np.array([PHASE.get(o, UNKNOWN_PHASE) for o in op_type], dtype=np.int64) if nrow \
        else np.zeros(0, np.int64)
    # stages per logical row (mb, layer, phase), mapped to the assignments
    if nrow:
        r_key = np.stack([mb, layer, phase_of_row], axis=1)
        uniq_st, r_st = np.unique(r_key, axis=0, return_inverse=True)
        r_st = r_st.reshape(-1)
    else:
        uniq_st, r_st = np.zeros((0, 3), np.int64), np.zeros(0, np.int64)
    st_inv = r_st[A.row]
    n_st = uniq_st.shape[0]
    st_gen = np.full(n_st, np.inf)
    np.minimum.at(st_gen, r_st, tgen)
    # monotone ready time along each micro-batch's (layer, phase) order, then global order by it
    st_gen_m = st_gen.copy()
    for i in range(1, n_st):
        if uniq_st[i, 0] == uniq_st[i - 1, 0]:
            st_gen_m[i] = max(st_gen_m[i], st_gen_m[i - 1])
    st_order = np.lexsort((uniq_st[:, 2], uniq_st[:, 1], uniq_st[:, 0], st_gen_m)) if n_st else np.zeros(0, np.int64)
    rank = np.empty(n_st, dtype=np.int64)
    rank[st_order] = np.arange(n_st)
    a_rank = rank[st_inv]
    a_order = np.lexsort((ev_ids[A.row], A.core, a_rank)) if na else np.zeros(0, np.int64)
    # groups = (stage, core) runs in that order; each group runs back to back on its core
    core_o = A.core[a_order]
    rank_o = a_rank[a_order]
    dur_o = dur[a_order]
    first = np.ones(na, dtype=bool)
    if na:
        first[1:] = (core_o[1:] != core_o[:-1]) | (rank_o[1:] != rank_o[:-1])
    g_idx = np.flatnonzero(first)
    g_core = core_o[g_idx]
    g_sum = np.add.reduceat(dur_o, g_idx) if na else np.zeros(0)
    g_of = np.cumsum(first) - 1
    g_bounds = np.searchsorted(rank_o[g_idx], np.arange(n_st + 1)) if na else np.zeros(n_st + 1, np.int64)

    # migrations occupy the receiving core's DMA first
    mig_start: list[float] = []
    mig_dur: list[float] = []
    for mg in migs:
        hop = int(chip.hops(np.array([mg.core]), chip.bank_vault_core(np.array([mg.src_bank])))[0])
        bw = min(float(vault_bw[mg.core]), link_bw) if hop > 0 else float(vault_bw[mg.core])
        d = mg.nbytes / bw + hop * chip.link_latency_ns
        s = max(mg.t_apply_ns, free[mg.core])
        free[mg.core] = s + d
        mig_start.append(s)
        mig_dur.append(d)

    open_prev = {o.mb_id: o for o in q.open_mbs}
    mb_ready: dict[int, float] = {k: float(o.ready_ns) for k, o in open_prev.items()}
    st_ready = np.zeros(n_st)
    st_end = np.zeros(n_st)
    g_base = np.zeros(g_idx.size)
    st_mb = uniq_st[:, 0].tolist()
    st_gen_l = st_gen.tolist()
    gb = g_bounds.tolist()
    for s_i, st in enumerate(st_order.tolist()):
        lo, hi = gb[s_i], gb[s_i + 1]
        m_id = st_mb[st]
        ready = max(st_gen_l[st], mb_ready.get(m_id, -np.inf))
        uc = g_core[lo:hi]
        base = np.maximum(free[uc], ready)
        g_base[lo:hi] = base
        ends = base + g_sum[lo:hi]
        free[uc] = ends
        end = float(ends.max())
        st_ready[st] = ready
        st_end[st] = end
        mb_ready[m_id] = end
    a_start = np.zeros(na)
    if na:
        cs = np.cumsum(dur_o)
        excl = cs - dur_o
        a_start[a_order] = g_base[g_of] + (excl - excl[g_idx][g_of])

    # ---- 7. token completion ------------------------------------------------------------------------------------
    last_layer = (n_layers - 1) if n_layers is not None else (int(layer.max()) if nrow else -1)
    pending = list(q.pending)
    open_mbs: dict[int, OpenMicroBatch] = dict(open_prev)
    mb_ids_here = np.unique(mb) if nrow else np.zeros(0, np.int64)
    for m_id in mb_ids_here.tolist():
        rows = mb == m_id
        nonexp = rows & ~is_exp
        tok = int(tokens[nonexp].max()) if nonexp.any() else int(tokens[rows].max())
        prev = open_mbs.pop(m_id, None)
        arrival = prev.arrival_ns if prev is not None else int(tgen[rows].min())
        tok = prev.tokens if prev is not None else tok
        st_m = uniq_st[:, 0] == m_id
        finish = int(np.ceil(st_end[st_m].max())) if st_m.any() else int(t0)
        if int(layer[rows].max()) >= last_layer:
            pending.append(PendingTokens(mb_id=m_id, arrival_ns=arrival, finish_ns=finish, tokens=tok))
        else:
            open_mbs[m_id] = OpenMicroBatch(mb_id=m_id, arrival_ns=arrival, ready_ns=finish, tokens=tok)
    done = [p for p in pending if p.finish_ns < t1]
    still = [p for p in pending if p.finish_ns >= t1]
    latencies: list[float] = []
    for p in sorted(done, key=lambda p: (p.finish_ns, p.mb_id)):
        latencies.extend([(p.finish_ns - p.arrival_ns) / 1e6] * p.tokens)

    # ---- 8. emission: carried work, then this window's events that start inside it ------------------------------
    # Carried work has two parts per core: the "head" (the remainder of events that straddled the previous window
    # end; it runs back to back from the window start) and the "tail" (events that had not started; they run at a
    # uniform duty D/(end − start) over their span, which keeps the idle gaps between dependent stages).
    c_core, c_tail = carry.c_core, carry.c_tail
    window_ns = t1 - t0
    c_start_core, c_end_core = carry.start, carry.end
    s_tail = np.maximum(c_start_core, t0)
    span = c_end_core - s_tail
    f_tail = np.where(span > 0, np.clip(np.divide(t1 - s_tail, span, out=np.ones(n), where=span > 0), 0.0, 1.0),
                      (s_tail < t1).astype(np.float64))
    head_tot = _bc(c_core[~c_tail], weights=c_dur[~c_tail], minlength=n)
    f_head = np.clip(np.divide(window_ns, head_tot, out=np.ones(n), where=head_tot > 0), 0.0, 1.0)
    fc = np.where(c_tail, f_tail[c_core], f_head[c_core]) if c_core.size else np.zeros(0)
    # chunk start: the part's start + the (scaled) durations of the core's earlier chunks of the same part
    c_off = np.zeros(c_core.size)
    if c_core.size:
        grp = c_core * 2 + c_tail
        o = np.lexsort((np.arange(c_core.size), grp))
        cs = np.cumsum(c_dur[o])
        firsts = np.searchsorted(grp[o], grp[o])
        c_off[o] = (cs - c_dur[o]) - np.where(firsts > 0, cs[np.maximum(firsts - 1, 0)], 0.0)
    emit_c_start = np.where(c_tail, s_tail[c_core], t0) + c_off * fc if c_core.size else np.zeros(0)
    emit_c_dur = c_dur * fc
    c_cyc = np.asarray(cc.cycles, dtype=np.float64) * freq[c_core] / freq[np.asarray(cc.core_id, dtype=np.int64)] \
        if c_core.size else np.zeros(0)  # moved records: same duration at the new core's clock
    emit_c_cycles = c_cyc * fc
    emit_c_flops = np.asarray(cc.flops, dtype=np.float64) * fc
    emit_c_energy = np.asarray(cc.energy_j, dtype=np.float64) * fc
    cm_core, cm_tail = carry.m_core, carry.m_tail
    cm_f = np.where(cm_tail, f_tail[cm_core], f_head[cm_core]) if cm_core.size else np.zeros(0)
    cm_bytes = np.asarray(cm.bytes, dtype=np.float64)
    cm_bank = np.array([chip.parse_bank(s, "state.queue.carry_memory.dst_bank") for s in cm.dst_bank],
                       dtype=np.int64) if len(cm) else np.zeros(0, np.int64)
    cm_hops = np.asarray(cm.hops, dtype=np.int64)
    cm_moved = cm_core != np.asarray(cm.src_core, dtype=np.int64)
    if cm_moved.any():  # moved traffic: local records of a migrated expert now live in the new vault
        rh = carry.m_rehome if carry.m_rehome is not None else np.full(cm_core.size, -1, dtype=np.int64)
        src_local = chip.bank_vault_core(cm_bank) == np.asarray(cm.src_core, dtype=np.int64)
        go = cm_moved & src_local & (rh >= 0)
        if go.any():
            h = np.array([stable_hash(t) for t in _code_strs(carry.m_code[go])], dtype=np.int64)
            cm_bank = cm_bank.copy()
            cm_bank[go] = chip.vault_bank(rh[go], h)
        cm_hops = np.where(cm_moved, chip.hops(cm_core, chip.bank_vault_core(cm_bank)), cm_hops)
    cm_w = np.array([r == "w" for r in cm.rw], dtype=bool)
    cm_mig = np.array([x == "migration" for x in cm.noc_qos], dtype=bool)
    cm_start = np.where(cm_tail, s_tail[cm_core], t0) if cm_core.size else np.zeros(0)

    # in-window share of each new assignment: events straddling t1 are split, the rest is carried
    f_now = np.where(dur > 0, np.clip(np.divide(t1 - a_start, dur, out=np.zeros(na), where=dur > 0), 0.0, 1.0),
                     (a_start < t1).astype(np.float64))
    f_later = 1.0 - f_now
    ef_now = f_now[e_a] if e_a.size else np.zeros(0)
    # migration memory events (read at the source bank, write at the destination bank): emitted when they start
    mg_core = np.array([m.core for m in migs], dtype=np.int64)
    mg_src = np.array([m.src_bank for m in migs], dtype=np.int64)
    mg_dst = np.array([m.dst_bank for m in migs], dtype=np.int64)
    mg_bytes = np.array([m.nbytes for m in migs], dtype=np.float64)
    mg_start = np.array(mig_start, dtype=np.float64)
    mg_dur = np.array(mig_dur, dtype=np.float64)
    mg_now = mg_start < t1
    mg_later = ~mg_now

    # compute events emitted now
    ids0 = state.next_evt_id
    vocab = sorted(set(op_type) | set(cc.op))
    op_code = {o: i for i, o in enumerate(vocab)}
    vocab_arr = np.array(vocab, dtype=object)
    row_op = np.array([op_code[o] for o in op_type], dtype=np.int64)
    cc_op = np.array([op_code[o] for o in cc.op], dtype=np.int64)
    o_new = np.flatnonzero(f_now > 0)
    o_new = o_new[np.lexsort((ev_ids[A.row[o_new]], A.core[o_new], a_start[o_new]))] if o_new.size else o_new
    fo = f_now[o_new]
    keep_c = emit_c_dur > 0
    ce_core = np.concatenate([c_core[keep_c], A.core[o_new]])
    ce_start = np.concatenate([emit_c_start[keep_c], a_start[o_new]])
    ce_dur_ns = np.concatenate([emit_c_dur[keep_c], dur[o_new] * fo])
    ce_cycles = np.concatenate([emit_c_cycles[keep_c], dur[o_new] * fo * freq[A.core[o_new]]])
    ce_flops = np.concatenate([emit_c_flops[keep_c], a_flops[o_new] * fo])
    ce_energy = np.concatenate([emit_c_energy[keep_c], a_energy[o_new] * fo])
    ce_ops = vocab_arr[np.concatenate([cc_op[keep_c], row_op[A.row[o_new]]])].tolist() if vocab else []
    n_ce = ce_core.size
    power = np.divide(ce_energy, ce_dur_ns * 1e-9, out=np.zeros(n_ce), where=ce_dur_ns > 0)
    dom = np.asarray(chip.core_domain, dtype=np.int64)
    dom_names = np.array([f"d{d}" for d in range(int(dom.max()) + 1)], dtype=object)
    compute = ComputeEvents.model_construct(
        evt_id=list(range(ids0, ids0 + n_ce)),
        t_start_ns=np.floor(ce_start).astype(np.int64).tolist(),
        core_id=ce_core.tolist(),
        duration_cycles=np.ceil(ce_cycles - 1e-9).astype(np.int64).tolist(),
        flops=ce_flops.tolist(),
        op=ce_ops,
        dvfs_domain=dom_names[dom[ce_core]].tolist(),
        power_hint=power.tolist(),
    )
    ids1 = ids0 + n_ce

    # memory events emitted now: carried, migrations, this window's
    keep_m = cm_bytes * cm_f > 0
    en = np.flatnonzero(ef_now > 0)
    en = en[np.lexsort((e_a[en], a_start[e_a[en]]))] if en.size else en
    mi = np.flatnonzero(mg_now)
    me_core = np.concatenate([cm_core[keep_m], mg_core[mi], mg_core[mi], e_core[en]])
    me_bank = np.concatenate([cm_bank[keep_m], mg_src[mi], mg_dst[mi], e_bank[en]])
    me_bytes = np.concatenate([(cm_bytes * cm_f)[keep_m], mg_bytes[mi], mg_bytes[mi], e_bytes[en] * ef_now[en]])
    me_w = np.concatenate([cm_w[keep_m], np.zeros(mi.size, bool), np.ones(mi.size, bool), e_rw_w[en]])
    me_mig = np.concatenate([cm_mig[keep_m], np.ones(2 * mi.size, bool), e_qos_mig[en]])
    me_start = np.concatenate([cm_start[keep_m], mg_start[mi], mg_start[mi], a_start[e_a[en]]])
    me_hops = np.concatenate([cm_hops[keep_m], chip.hops(mg_core[mi], chip.bank_vault_core(mg_src[mi])),
                              chip.hops(mg_core[mi], chip.bank_vault_core(mg_dst[mi])), e_hops[en]])
    n_me = me_core.size
    rw_names = np.array(["r", "w"], dtype=object)
    qos_names = np.array(["normal", "migration"], dtype=object)
    memory = MemoryEvents.model_construct(
        evt_id=list(range(ids1, ids1 + n_me)),
        t_start_ns=np.floor(me_start).astype(np.int64).tolist(),
        src_core=me_core.tolist(),
        dst_bank=chip.bank_strs(me_bank),
        bytes=me_bytes.tolist(),
        rw=rw_names[me_w.astype(np.int64)].tolist(),
        hops=me_hops.astype(np.int64).tolist(),
        noc_qos=qos_names[me_mig.astype(np.int64)].tolist(),
    )

    # ---- 9. carry for the next window -----------------------------------------------------------------------------
    rem_c = (1.0 - fc) * (c_dur > 0)
    lat = np.flatnonzero(f_later > 0)
    fl = f_later[lat]
    lat_tail = a_start[lat] >= t1  # not started: tail; straddling: head
    k_core = np.concatenate([c_core, A.core[lat]])
    k_part = np.concatenate([c_tail, lat_tail]).astype(np.int64)
    k_op = np.concatenate([cc_op, row_op[A.row[lat]]])
    k_dur = np.concatenate([c_dur * rem_c, dur[lat] * fl])
    k_cyc = np.concatenate([c_cyc * rem_c, dur[lat] * fl * freq[A.core[lat]]])
    a_code = np.where(is_exp[A.row], (layer[A.row] << _CODE_SHIFT) + expert[A.row], -1) if na \
        else np.zeros(0, np.int64)
    k_code = np.concatenate([np.where(c_tail, carry.c_code, -1), np.where(lat_tail, a_code[lat], -1)])
    k_flops = np.concatenate([np.asarray(cc.flops, dtype=np.float64) * rem_c, a_flops[lat] * fl])
    k_en = np.concatenate([np.asarray(cc.energy_j, dtype=np.float64) * rem_c, a_energy[lat] * fl])
    keep_k = k_dur > 0
    carry_compute, carry_c_tags = _aggregate_compute(vocab_arr, k_core[keep_k], k_part[keep_k], k_op[keep_k],
                                                     k_dur[keep_k], k_cyc[keep_k], k_flops[keep_k], k_en[keep_k],
                                                     k_code[keep_k])
    el = np.flatnonzero(ef_now < 1.0) if e_a.size else np.zeros(0, np.int64)
    n_ml = int(mg_later.sum())
    km_core = np.concatenate([cm_core, e_core[el], mg_core[mg_later], mg_core[mg_later]])
    km_part = np.concatenate([cm_tail, a_start[e_a[el]] >= t1, np.ones(2 * n_ml, bool)]).astype(np.int64)
    km_bank = np.concatenate([cm_bank, e_bank[el], mg_src[mg_later], mg_dst[mg_later]])
    km_bytes = np.concatenate([cm_bytes * (1 - cm_f), e_bytes[el] * (1.0 - ef_now[el]), mg_bytes[mg_later],
                               mg_bytes[mg_later]])
    km_w = np.concatenate([cm_w, e_rw_w[el], np.zeros(n_ml, bool), np.ones(n_ml, bool)])
    km_hops = np.concatenate([cm_hops, e_hops[el],
                              chip.hops(mg_core[mg_later], chip.bank_vault_core(mg_src[mg_later])),
                              chip.hops(mg_core[mg_later], chip.bank_vault_core(mg_dst[mg_later]))])
    km_mig = np.concatenate([cm_mig, e_qos_mig[el], np.ones(2 * n_ml, bool)])
    el_tail = a_start[e_a[el]] >= t1
    km_code = np.concatenate([np.where(cm_tail, carry.m_code, -1), np.where(el_tail, a_code[e_a[el]], -1),
                              np.full(2 * n_ml, -1, np.int64)])
    keep_km = km_bytes > 0
    carry_memory, carry_m_tags = _aggregate_memory(chip, km_core[keep_km], km_part[keep_km], km_bank[keep_km],
                                                   km_bytes[keep_km], km_w[keep_km], km_hops[keep_km],
                                                   km_mig[keep_km], km_code[keep_km])
    # span of each core's tail: from t1 (old tail remains) or its first deferred start, to its last piece's end
    resume = np.full(n, np.inf)
    c_end = np.full(n, -np.inf)
    dl = lat[lat_tail]
    if dl.size:
        np.minimum.at(resume, A.core[dl], a_start[dl])
        np.maximum.at(c_end, A.core[dl], a_start[dl] + dur[dl])
    if mg_later.any():
        np.minimum.at(resume, mg_core[mg_later], mg_start[mg_later])
        np.maximum.at(c_end, mg_core[mg_later], mg_start[mg_later] + mg_dur[mg_later])
    old_tail = _bc(c_core[c_tail], weights=(c_dur * rem_c)[c_tail], minlength=n) > 0
    resume = np.where(old_tail, t1, resume)
    c_end = np.where(old_tail, np.maximum(c_end, c_end_core), c_end)
    resume = np.where(np.isfinite(resume), resume, t1)
    c_end = np.where(np.isfinite(c_end), c_end, t1)

    # ---- 10. timing ------------------------------------------------------------------------------------------------
    busy_ns = np.zeros(n)
    iv_core = np.concatenate([ce_core, mg_core])
    iv_s = np.concatenate([ce_start, mg_start])
    iv_e = np.concatenate([ce_start + ce_dur_ns, mg_start + mg_dur])
    ov = np.clip(np.minimum(iv_e, t1) - np.maximum(iv_s, t0), 0.0, None)
    busy_ns += _bc(iv_core, weights=ov, minlength=n)
    util = np.clip(busy_ns / window_ns, 0.0, 1.0)
    rd = (me_w == 0)
    vault_of = chip.bank_vault_core(me_bank)
    link_b = chip.link_bytes(np.where(rd, vault_of, me_core), np.where(rd, me_core, vault_of), me_bytes)
    # MoE dispatch/combine: a routed expert's input activations are gathered at its core from the micro-batch's
    # attention, which ran split evenly over all n cores (1/n from each), and its outputs are scattered back the same
    # way (XY routing; `Chip.gather_link_share`). Approximation: this traffic is counted in the window that
    # physicalizes the work, not shifted with work that spills into later windows.
    act_rd = _bc(e_core[e_act & ~e_rw_w], weights=e_bytes[e_act & ~e_rw_w], minlength=n)
    act_wr = _bc(e_core[e_act & e_rw_w], weights=e_bytes[e_act & e_rw_w], minlength=n)
    link_b = link_b + act_rd @ chip.gather_link_share + act_wr @ chip.scatter_link_share
    link_util = np.clip(link_b / (link_bw * window_ns), 0.0, 1.0)
    wait = a_start - st_ready[st_inv] if na else np.zeros(0)
    act_byte_hops = float((act_rd + act_wr) @ chip.gather_link_share.sum(axis=1))  # Σ bytes × mean hops
    me_energy = float(np.sum(me_bytes * dram_j_per_byte) + np.sum(me_bytes * me_hops * noc_j_per_byte_hop)
                      + act_byte_hops * noc_j_per_byte_hop)
    busy_until = np.maximum(free, busy)
    timing = WindowTiming(
        tokens_completed=sum(p.tokens for p in done),
        latencies_ms=latencies,
        queue_delay_ms=float(wait.mean() / 1e6) if na else 0.0,
        util_core=util.tolist(),
        bytes_moved=float(me_bytes.sum()),
        noc_link_util=link_util.tolist(),
        migrations=n_moved,
        t0_ns=int(t0), t1_ns=int(t1),
        tokens_generated=logical.tokens_generated,
        energy_j=float(ce_energy.sum()) + me_energy,
        busy_until_ns=np.ceil(busy_until).astype(np.int64).tolist(),
        backlog_ms=float(np.mean(np.maximum(busy_until - t1, 0.0)) / 1e6),
    )
    new_state = PhysicalState(
        replicas=replicas,
        queue=CoreQueueState(
            busy_until_ns=np.ceil(busy_until).astype(np.int64).tolist(),
            pending_tokens=[],
            carry_compute=carry_compute,
            carry_memory=carry_memory,
            carry_start_ns=resume.tolist(),
            carry_end_ns=c_end.tolist(),
            carry_compute_expert=carry_c_tags,
            carry_memory_expert=carry_m_tags,
            pending=sorted(still, key=lambda p: (p.finish_ns, p.mb_id)),
            open_mbs=sorted(open_mbs.values(), key=lambda o: o.mb_id),
        ),
        next_evt_id=ids1 + n_me,
        tensor_banks=tensor_banks,
    )
    return compute, memory, new_state, timing


def _unique_pairs(key: I64, code: I64) -> tuple[I64, I64, I64]:
    """Distinct (key, code) pairs sorted by key then code (code >= -1), and each input's pair index."""
    m = int(code.max()) + 2 if code.size else 1
    uc, inv = np.unique(key * m + (code + 1), return_inverse=True)
    return uc // m, uc % m - 1, inv.reshape(-1)


def _aggregate_compute(vocab: NDArray[np.object_], core: I64, part: I64, op: I64, dur: F64, cyc: F64, flops: F64,
                       energy: F64, code: I64) -> tuple[CarryCompute, list[str]]:
    """One record per (core, part, op, expert tag); returns the records and their tags."""
    if core.size == 0:
        return CarryCompute.empty(), []
    nop = len(vocab)
    key = (core * 2 + part) * nop + op
    uk, u_code, inv = _unique_pairs(key, code)

    def s(w: F64) -> list[float]:
        out: list[float] = _bc(inv, weights=w, minlength=uk.size).tolist()
        return out

    tags = _code_strs(u_code) if (u_code >= 0).any() else []
    return CarryCompute.model_construct(
        core_id=(uk // nop // 2).tolist(), part=((uk // nop) % 2).tolist(), op=vocab[uk % nop].tolist(),
        duration_ns=s(dur), cycles=s(cyc), flops=s(flops), energy_j=s(energy)), tags


def _aggregate_memory(chip: Chip, core: I64, part: I64, bank: I64, nbytes: F64, w: NDArray[np.bool_], hops: I64,
                      mig: NDArray[np.bool_], code: I64) -> tuple[CarryMemory, list[str]]:
    if core.size == 0:
        return CarryMemory.empty(), []
    # one record per (core, part, bank's vault, rw, qos, expert tag), at the group's last bank in input order:
    # bounds the state to a few records per core and expert however long the backlog grows
    nv = chip.n_cores
    vault = chip.bank_vault_core(bank)
    key = ((((core * 2 + part) * nv + vault) * 2 + w.astype(np.int64)) * 2) + mig.astype(np.int64)
    uk, u_code, inv = _unique_pairs(key, code)
    tot = _bc(inv, weights=nbytes, minlength=uk.size)
    first_bank = np.zeros(uk.size, dtype=np.int64)
    first_bank[inv] = bank
    first_hops = np.zeros(uk.size, dtype=np.int64)
    first_hops[inv] = hops
    u_mig = uk % 2
    u_w = (uk // 2) % 2
    u_cp = uk // 4 // nv
    tags = _code_strs(u_code) if (u_code >= 0).any() else []
    return CarryMemory.model_construct(
        src_core=(u_cp // 2).tolist(), part=(u_cp % 2).tolist(), dst_bank=chip.bank_strs(first_bank),
        bytes=tot.tolist(), rw=np.array(["r", "w"], dtype=object)[u_w].tolist(), hops=first_hops.tolist(),
        noc_qos=np.array(["normal", "migration"], dtype=object)[u_mig].tolist()), tags
