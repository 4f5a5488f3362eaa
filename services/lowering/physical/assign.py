"""Stage 2: logical rows → pieces of work on cores.

- Non-expert rows (attention, router, shared/dense FFN, head) are split over the micro-batch's attention cores
  (``arch.schedule``: all cores, or the ``group_cores`` cores of group ``mb mod groups``) as a GEMM split over N:
  every core sees all M tokens and ``1/k`` of the weights and FLOPs.
- Routed-expert rows (``expert >= 0``) go to the cores of ``L{layer}E{expert}`` (ReplicaState first, else the
  placement). With replicas, tokens are split by water-filling over the replicas' queues at the window start
  (``busy_until − t0``) plus the row's own tokens, ties to the lower core id. The split of a row does not depend on
  the other rows, so lowering a subset of the rows (``physical.__init__``'s look-ahead) gives the same pieces.
- A striped expert (placement policy ``stripe``: its weights spread over the vaults of its ``k`` cores) runs
  tensor-parallel: one piece per core, every token on each (``tok_frac`` 1: the dispatch and combine reach all ``k``),
  ``1/k`` of its weights and MACs each (``w_frac`` = 1/k), read from that core's own vault.
- Reroute rules move pieces from ``from_core`` to ``to_core`` for rows generated at or after ``t_apply_ns``, in
  rule order. The expert's weights stay where they are, so rerouted work reads them over the NoC.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from services.lowering.physical.overlays import Reroute, expert_code, expert_cores
from shared.chip import Chip, attention_groups
from shared.configs.arch import ArchConfig
from shared.contracts.ids import expert_id
from shared.contracts.placement import Placement, ReplicaState
from shared.contracts.workload import LogicalCompute
from shared.errors import BadInput

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

# Order of ops inside one layer of a micro-batch: attention → router → experts (+ shared, dense) → LM head.
PHASE: dict[str, int] = {"attn": 0, "router": 1, "shared": 2, "fc": 2, "dense": 2, "head": 3}
UNKNOWN_PHASE = 2


@dataclass
class Rows:
    """The logical rows being mapped (this window's admitted rows + the open rows carried from earlier windows).
    ``op``: the op of each row coded by its caller's table (`from_logical`: codes of its sorted distinct ops)."""

    event_id: I64
    tgen: F64
    mb: I64
    layer: I64
    phase: I64
    op: I64
    expert: I64
    tokens: F64
    macs: F64

    @classmethod
    def from_logical(cls, lc: LogicalCompute) -> Rows:
        n = len(lc)
        if not n:
            z = np.zeros(0, np.int64)
            return cls(z, np.zeros(0), z, z, z, z, z, np.zeros(0), np.zeros(0))
        a = lc.to_numpy()
        names, op = np.unique(np.asarray(lc.op_type, dtype=object), return_inverse=True)
        return cls(event_id=a["event_id"].astype(np.int64), tgen=a["t_gen_ns"].astype(np.float64),
                   mb=a["mb_id"].astype(np.int64), layer=a["layer"].astype(np.int64),
                   phase=np.array([PHASE.get(o, UNKNOWN_PHASE) for o in names.tolist()], dtype=np.int64)[op],
                   op=op.astype(np.int64).reshape(-1), expert=a["expert"].astype(np.int64),
                   tokens=a["tokens"].astype(np.float64), macs=a["flops"].astype(np.float64) / 2.0)

    def __len__(self) -> int:
        return int(self.event_id.size)

    def take(self, idx: I64) -> Rows:
        return Rows(self.event_id[idx], self.tgen[idx], self.mb[idx], self.layer[idx], self.phase[idx], self.op[idx],
                    self.expert[idx], self.tokens[idx], self.macs[idx])

    @property
    def is_expert(self) -> NDArray[np.bool_]:
        out: NDArray[np.bool_] = self.expert >= 0
        return out


@dataclass
class Pieces:
    """One (row, core) piece of work. ``split``: a non-expert row split over ``k`` cores."""

    row: I64
    core: I64
    home: I64  # the core whose vault holds the piece's weights by default
    tok_frac: F64  # share of the row's tokens (activations/KV scale with it)
    w_frac: F64  # share of the row's weights streamed by this core (and, for an expert piece, of its MACs per token)
    tokens: F64  # M seen by this core
    split: NDArray[np.bool_]
    k: I64  # number of cores the row is split over (1 for expert pieces)

    def __len__(self) -> int:
        return int(self.row.size)


def is_striped(key: str, placement: Placement) -> bool:
    """The expert instance ``key`` is placed striped over its cores (tensor-parallel)."""
    ep = placement.experts.get(key)
    return ep is not None and ep.policy == "stripe"


def splits_over_replicas(key: str, cores: list[int], placement: Placement) -> bool:
    """`assign` water-fills the rows of expert instance ``key`` (on ``cores``) over its replicas by the queues at the
    window start: it has several cores and is not striped. Its pieces then depend on the queues; a single-core or a
    striped expert's do not."""
    return len(cores) > 1 and not is_striped(key, placement)


def attention_cores(mb: I64, arch: ArchConfig) -> tuple[I64, int]:
    """``(rows, k)`` matrix of the cores each micro-batch's non-expert work is split over, and k."""
    groups, k = attention_groups(arch)
    g = mb % groups
    return g[:, None] * k + np.arange(k, dtype=np.int64)[None, :], k


def water_fill(tokens: int, loads: list[float], per_token: list[float], cores: list[int]) -> list[int]:
    """Integer token split that equalises ``load + n·per_token`` (ties → lower core id).

    A bisection on the water level, 60 halvings at most, stopping once ``(lo, hi)`` no longer changes."""
    k = len(cores)
    order = sorted(range(k), key=lambda i: (loads[i], cores[i]))
    lo, hi = min(loads), max(loads) + tokens * max(per_token) + 1.0
    pairs = list(zip(loads, per_token, strict=True))
    for _ in range(60):
        mid = (lo + hi) / 2
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
        out[order[j % k]] += 1
        rest -= 1
        j += 1
    return out


def assign(rows: Rows, placement: Placement, replicas: ReplicaState, reroutes: list[Reroute], chip: Chip,
           arch: ArchConfig, backlog_ns: F64, freq: F64,
           cores_of: dict[tuple[int, int], list[int]] | None = None) -> Pieces:
    """Map rows to pieces (see the module docstring). ``backlog_ns``: per core, work queued before this window's.
    ``cores_of``: the cores of the instances (layer, expert) looked up so far for this placement and replica state
    (filled here; a caller lowering many windows keeps it)."""
    R, C = arch.core.array
    is_exp = rows.is_expert
    ne = np.flatnonzero(~is_exp)
    cores_m, k = attention_cores(rows.mb[ne], arch)
    p_row = [np.repeat(ne, k)]
    p_core = [cores_m.reshape(-1).astype(np.int64)]
    p_tok = [np.full(ne.size * k, 1.0 / k)]
    p_w = [np.full(ne.size * k, 1.0 / k)]
    ex = np.flatnonzero(is_exp)
    cache: dict[tuple[int, int], list[int]] = {} if cores_of is None else cores_of
    single_r: list[int] = []
    single_c: list[int] = []
    stripe_r: list[int] = []
    stripe_c: list[list[int]] = []
    multi: list[tuple[int, list[int]]] = []
    for r, lv, e in zip(ex.tolist(), rows.layer[ex].tolist(), rows.expert[ex].tolist(), strict=True):
        cores = cache.get((lv, e))
        if cores is None:
            cores = expert_cores(expert_id(lv, e), placement, replicas, chip)
            cache[(lv, e)] = cores
        if len(cores) == 1:
            single_r.append(r)
            single_c.append(cores[0])
        elif splits_over_replicas(expert_id(lv, e), cores, placement):
            multi.append((r, cores))
        else:
            stripe_r.append(r)
            stripe_c.append(cores)
    sr = np.asarray(single_r, dtype=np.int64)
    sc = np.asarray(single_c, dtype=np.int64)
    p_row.append(sr)
    p_core.append(sc)
    p_tok.append(np.ones(sr.size))
    p_w.append(np.ones(sr.size))
    if stripe_r:  # each row a block of its cores, in row order
        n_c = np.array([len(c) for c in stripe_c], dtype=np.int64)
        p_row.append(np.repeat(np.asarray(stripe_r, dtype=np.int64), n_c))
        p_core.append(np.concatenate([np.asarray(c, dtype=np.int64) for c in stripe_c]))
        p_tok.append(np.ones(int(n_c.sum())))
        p_w.append(np.repeat(1.0 / n_c, n_c))
    if multi:
        load = backlog_ns.copy()  # per row: the queue at the window start, so a row's split is its own business
        mr: list[int] = []
        mc: list[int] = []
        mt: list[float] = []
        for r, cores in multi:
            t = round(float(rows.tokens[r]))
            kn = rows.macs[r] / max(float(rows.tokens[r]), 1.0)
            per_tok = [max(kn / (R * C) / freq[c], 1e-9) for c in cores]
            if t == 0:
                mr.append(r)
                mc.append(cores[0])
                mt.append(1.0)
                continue
            shares = water_fill(t, [float(load[c]) for c in cores], per_tok, cores)
            for c, s in zip(cores, shares, strict=True):
                if s > 0:
                    mr.append(r)
                    mc.append(c)
                    mt.append(s / t)
        p_row.append(np.asarray(mr, dtype=np.int64))
        p_core.append(np.asarray(mc, dtype=np.int64))
        p_tok.append(np.asarray(mt))
        p_w.append(np.ones(len(mr)))
    row = np.concatenate(p_row)
    core = np.concatenate(p_core)
    split: NDArray[np.bool_] = ~is_exp[row]
    pieces = Pieces(row=row, core=core, home=core.copy(), tok_frac=np.concatenate(p_tok),
                    w_frac=np.concatenate(p_w), tokens=np.zeros(0), split=split,
                    k=np.where(split, k, 1).astype(np.int64))
    pieces.tokens = np.where(split, rows.tokens[row], rows.tokens[row] * pieces.tok_frac)
    _reroute(pieces, rows, reroutes)
    return pieces


def _reroute(p: Pieces, rows: Rows, reroutes: list[Reroute]) -> None:
    if not reroutes or not len(p):
        return
    mb = rows.mb[p.row]
    is_exp = ~p.split
    codes = np.where(is_exp, (rows.layer[p.row] << 20) + rows.expert[p.row], -1)
    tgen = rows.tgen[p.row]
    for rr in reroutes:
        sel = (p.core == rr.from_core) & (tgen >= rr.t_apply_ns)
        if rr.scope == "mb":
            sel &= np.isin(mb, np.asarray(rr.mbs, dtype=np.int64))
        elif rr.scope == "expert":
            sel &= is_exp
            if rr.mbs:
                sel &= np.isin(mb, np.asarray(rr.mbs, dtype=np.int64))
        else:  # pragma: no cover - parse_reroutes refuses it
            raise BadInput(f"scope {rr.scope!r}", field="overlays.reroute.scope")
        if rr.experts:
            sel &= np.isin(codes, np.asarray(rr.experts, dtype=np.int64))
        if rr.within is not None:
            sel &= np.isin(mb, np.asarray(rr.within, dtype=np.int64))
        p.core = np.where(sel, rr.to_core, p.core)


__all__ = ["PHASE", "Pieces", "Rows", "assign", "attention_cores", "expert_code", "is_striped", "splits_over_replicas",
           "water_fill"]
