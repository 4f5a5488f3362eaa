"""Load-balance face of the placer: replicate experts into a fixed number of slots and spread them over cores.

Problem (per layer): experts with loads ``w_e ≥ 0``, ``C`` cores, ``S`` replica slots in total (``E ≤ S ≤ E·C``).
Choose replica counts ``r_e ≥ 1`` with ``Σ r_e = S`` and put the ``r_e`` replicas of expert e on ``r_e`` *distinct*
cores; a replica carries ``w_e / r_e``; a core's load is the sum over its replicas. Minimise the max core load.
Unlike DeepSeek's EPLB, cores need not hold the same number of replicas.

Method, best of two constructions, each polished by local search:
(a) replica counts by water-filling — each extra slot goes to the expert with the largest per-replica load (this
    minimises the largest replica) — then longest-processing-time packing: replicas in decreasing size, each on the
    least-loaded core that does not already hold that expert (with and without EPLB's equal count per core);
(b) a binary search on a core capacity B: counts ``r_e = ⌈w_e / B⌉``, replicas packed best-fit decreasing into C
    bins of size B (distinct-core rule); the smallest B that packs wins; left-over slots are then added one replica
    at a time where they raise the max least.
Local search: move a replica off the most loaded core, or swap it with a smaller one elsewhere, while the max strictly
drops.

Lower bound reported: ``max(Σ w / C, min_r max_e w_e / r_e)``: no layout with S slots beats the mean core load, nor
splits the worst expert finer than water-filling does. ``gap = max_core_load / lower_bound − 1``.
"""

from __future__ import annotations

import csv
import heapq
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.placement.taps import validate_loads
from shared.errors import BadInput

MAX_EXPERT_CORE_PAIRS = 4_000_000  # the packer keeps an experts x cores table
MAX_LAYER_SLOTS2 = 1 << 26  # layers x slots^2: ~9 s on the 2-core machine (58 x 1024 slots, 1 x 8192)


def replica_counts(w: np.ndarray, slots: int, cores: int, start: np.ndarray | None = None) -> np.ndarray:
    """Water-filling: start at one replica each (or at ``start``), give every extra slot to argmax ``w_e / r_e``
    (ties: lower id), never more than ``cores`` replicas per expert."""
    r = np.ones(w.shape[0], dtype=np.int64) if start is None else start.astype(np.int64).copy()
    heap = [(-float(w[e]) / float(r[e]), e) for e in range(w.shape[0]) if r[e] < cores]
    heapq.heapify(heap)
    extra = slots - int(r.sum())
    while extra > 0 and heap:
        _, e = heapq.heappop(heap)
        if r[e] >= cores:
            continue
        r[e] += 1
        extra -= 1
        if r[e] < cores:
            heapq.heappush(heap, (-float(w[e]) / float(r[e]), e))
    return r


def _pack(sizes: np.ndarray, expert: np.ndarray, n_experts: int, cores: int, per_core: int | None = None) -> np.ndarray:
    """LPT with the distinct-core rule: replicas in decreasing size, each on the least-loaded core without that
    expert. ``per_core`` optionally caps the replicas per core (the balanced packing EPLB uses, one of the starting
    points tried). Returns the core of every replica."""
    order = np.lexsort((expert, -sizes))
    load = np.zeros(cores)
    count = np.zeros(cores, dtype=np.int64)
    hosts = np.zeros((n_experts, cores), dtype=bool)
    where = np.empty(sizes.shape[0], dtype=np.int64)
    for i in order:
        e = int(expert[i])
        blocked = hosts[e] | (count >= per_core) if per_core is not None else hosts[e]
        if blocked.all():
            blocked = hosts[e]
        c = int(np.argmin(np.where(blocked, np.inf, load)))
        count[c] += 1
        where[i] = c
        load[c] += sizes[i]
        hosts[e, c] = True
    return where


def _best_fit(sizes: np.ndarray, expert: np.ndarray, n_experts: int, cores: int, cap: float) -> np.ndarray | None:
    """Best-fit decreasing into ``cores`` bins of capacity ``cap`` with the distinct-core rule; None if a replica
    does not fit."""
    order = np.lexsort((expert, -sizes))
    load = np.zeros(cores)
    hosts = np.zeros((n_experts, cores), dtype=bool)
    where = np.empty(sizes.shape[0], dtype=np.int64)
    for i in order:
        e = int(expert[i])
        room = cap - load
        ok = (room >= sizes[i] - 1e-9) & ~hosts[e]
        if not ok.any():
            return None
        c = int(np.argmin(np.where(ok, room, np.inf)))
        where[i] = c
        load[c] += sizes[i]
        hosts[e, c] = True
    return where


def _add_replicas(w: np.ndarray, r: np.ndarray, expert: np.ndarray, where: np.ndarray, cores: int,
                  extra: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Add ``extra`` replicas to a packed layout, one at a time, each where it raises the max core load least:
    a new replica of e shrinks e's other replicas (``w_e/r_e -> w_e/(r_e+1)``) and lands on the least-loaded core
    without e. Ties favour the expert with the larger replicas. Returns (counts, expert, where)."""
    n_e = int(w.shape[0])
    r = r.copy()
    hosts = np.zeros((n_e, cores), dtype=bool)
    hosts[expert, where] = True
    for _ in range(extra):
        piece = w / r
        load = hosts.T.astype(float) @ piece
        new_piece = w / (r + 1)
        shrunk = load[None, :] - hosts * (piece - new_piece)[:, None]
        free = np.where(hosts, np.inf, shrunk)
        c = np.argmin(free, axis=1)
        new_max = np.maximum(shrunk.max(axis=1), free[np.arange(n_e), c] + new_piece)
        new_max[r >= cores] = np.inf
        e = int(np.lexsort((np.arange(n_e), -piece, new_max))[0])
        hosts[e, int(c[e])] = True
        r[e] += 1
    ex, wh = np.nonzero(hosts)
    return r, ex.astype(np.int64), wh.astype(np.int64)


def _capacity_search(w: np.ndarray, cores: int, slots: int, lo: float, hi: float,
                     iters: int = 30) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Binary search on a core capacity B: replica counts ``r_e = ceil(w_e / B)``, packed best-fit decreasing; the
    smallest B that packs wins, and its left-over slots are added by `_add_replicas`. Returns (counts, expert, where)
    or None when no B in (lo, hi) packs."""
    n_e = int(w.shape[0])
    best: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    for _ in range(iters):
        if hi - lo <= 1e-6 * max(hi, 1e-12):
            break
        mid = 0.5 * (lo + hi)
        r = np.maximum(1, np.ceil(w / mid - 1e-9)).astype(np.int64)
        where = None
        if r.sum() <= slots and r.max() <= cores:
            expert = np.repeat(np.arange(n_e), r)
            where = _best_fit((w / r)[expert], expert, n_e, cores, mid)
        if where is None:
            lo = mid
        else:
            hi = mid
            best = (r, expert, where)
    if best is None:
        return None
    r, expert, where = best
    return _add_replicas(w, r, expert, where, cores, slots - int(r.sum()))


def _improve(sizes: np.ndarray, expert: np.ndarray, where: np.ndarray, n_experts: int, cores: int,
             max_iters: int = 10_000) -> np.ndarray:
    """Moves and swaps that strictly lower the load of the most loaded core without creating a new maximum."""
    where = where.copy()
    load = np.bincount(where, weights=sizes, minlength=cores)
    hosts = np.zeros((n_experts, cores), dtype=bool)
    hosts[expert, where] = True
    for _ in range(max_iters):
        top = int(np.argmax(load))
        peak = load[top]
        best: tuple[float, int, int, int] | None = None  # (new local max, replica, dest core, swap partner or -1)
        for i in (int(x) for x in np.flatnonzero(where == top)):
            e = int(expert[i])
            # move i to core b
            cand = load + sizes[i]
            cand[top] = np.inf
            cand[hosts[e]] = np.inf
            b = int(np.argmin(cand))
            if cand[b] < peak - 1e-12:
                val = max(cand[b], peak - sizes[i])
                if best is None or val < best[0]:
                    best = (val, i, b, -1)
            # swap i with a smaller replica j on another core
            js = np.flatnonzero((where != top) & (sizes < sizes[i]))
            if js.size == 0:
                continue
            bj = where[js]
            ej = expert[js]
            ok = ~hosts[e, bj] & ~hosts[ej, top]
            d = sizes[i] - sizes[js]
            new_b = load[bj] + d
            val_arr = np.maximum(new_b, peak - d)
            val_arr[~ok] = np.inf
            t = int(np.argmin(val_arr))
            if val_arr[t] < peak - 1e-12 and (best is None or val_arr[t] < best[0]):
                best = (float(val_arr[t]), i, int(bj[t]), int(js[t]))
        if best is None:
            break
        _, i, b, j = best
        e = int(expert[i])
        hosts[e, top] = False
        hosts[e, b] = True
        where[i] = b
        load[top] -= sizes[i]
        load[b] += sizes[i]
        if j >= 0:
            ex_j = int(expert[j])
            hosts[ex_j, b] = False
            hosts[ex_j, top] = True
            where[j] = top
            load[b] -= sizes[j]
            load[top] += sizes[j]
    return where


Layout = tuple[float, np.ndarray, np.ndarray, np.ndarray]  # (max core load, counts, expert of replica, core of replica)


def _lpt_layout(w: np.ndarray, r: np.ndarray, cores: int, slots: int) -> Layout:
    n_e = int(w.shape[0])
    expert = np.repeat(np.arange(n_e), r)
    sizes = (w / r)[expert]
    best: Layout | None = None
    for per_core in (None, -(-slots // cores)):
        cand = _improve(sizes, expert, _pack(sizes, expert, n_e, cores, per_core), n_e, cores)
        peak = float(np.bincount(cand, weights=sizes, minlength=cores).max())
        if best is None or peak < best[0] - 1e-12:
            best = (peak, r, expert, cand)
    assert best is not None
    return best


def _perturb_counts(w: np.ndarray, cores: int, slots: int, best: Layout, lb: float, *, recipients: int = 4,
                    donors: int = 8, rounds: int = 3) -> Layout:
    """Move one slot from an expert with small replicas (a donor) to one with large replicas (a recipient), repack
    (LPT + local search), keep the best strictly better layout; a few rounds while it improves and the layout is not
    provably optimal."""
    for _ in range(rounds):
        if best[0] <= lb * (1 + 1e-9):
            break
        r = best[1]
        piece = w / r
        rec = [int(e) for e in np.argsort(-piece, kind="stable")[:recipients] if r[e] < cores]
        don = [int(e) for e in np.argsort(piece, kind="stable")[:donors] if r[e] > 1]
        cand_best: Layout | None = None
        for b in rec:
            for a in don:
                if a == b:
                    continue
                r2 = r.copy()
                r2[a] -= 1
                r2[b] += 1
                lay = _lpt_layout(w, r2, cores, slots)
                if lay[0] < best[0] - 1e-9 and (cand_best is None or lay[0] < cand_best[0]):
                    cand_best = lay
        if cand_best is None:
            break
        best = cand_best
    return best


def balance_layer(w: np.ndarray, cores: int, slots: int) -> dict[str, Any]:
    n_e = int(w.shape[0])
    r0 = replica_counts(w, slots, cores)
    mean = float(w.sum() / cores)
    lb = max(mean, float((w / r0).max()))
    starts: list[tuple[np.ndarray, np.ndarray]] = []
    for per_core in (None, -(-slots // cores)):
        expert = np.repeat(np.arange(n_e), r0)
        starts.append((r0, _pack((w / r0)[expert], expert, n_e, cores, per_core)))
    best: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None
    for r, where0 in starts:
        expert = np.repeat(np.arange(n_e), r)
        sizes = (w / r)[expert]
        cand = _improve(sizes, expert, where0, n_e, cores)
        peak = float(np.bincount(cand, weights=sizes, minlength=cores).max())
        if best is None or peak < best[0] - 1e-12:
            best = (peak, r, expert, cand)
    assert best is not None
    found = _capacity_search(w, cores, slots, lb, best[0])
    if found is not None:
        r, expert, where0 = found
        sizes = (w / r)[expert]
        cand = _improve(sizes, expert, where0, n_e, cores)
        peak = float(np.bincount(cand, weights=sizes, minlength=cores).max())
        if peak < best[0] - 1e-12:
            best = (peak, r, expert, cand)
    best = _perturb_counts(w, cores, slots, best, lb)
    _, r, expert, where = best
    sizes = (w / r)[expert]
    load = np.bincount(where, weights=sizes, minlength=cores)
    mx = float(load.max())
    pairs = sorted(zip(where.tolist(), expert.tolist(), strict=True))
    return {
        "replicas": [[int(c), int(e)] for c, e in pairs],
        "replica_counts": [int(x) for x in r],
        "core_loads": [round(float(x), 6) for x in load],
        "max_over_mean": mx / mean if mean > 0 else 1.0,
        "lower_bound": lb,
        "gap": mx / lb - 1.0 if lb > 0 else 0.0,
    }


def balance(loads: Sequence[Sequence[float]], cores: int, slots: int) -> dict[str, Any]:
    """``{"layers": [{"layer", "replicas": [[core, expert], ...], "core_loads", "max_over_mean", "lower_bound",
    "gap", "replica_counts"}, ...]}`` for per-layer expert loads (see the module docstring)."""
    arr = validate_loads(loads, "loads")
    n_e = arr.shape[1]
    if cores < 1:
        raise BadInput("cores must be >= 1", field="cores")
    if slots < n_e:
        raise BadInput(f"slots ({slots}) must be >= the number of experts ({n_e}): every expert needs a replica",
                       field="slots")
    if n_e * cores > MAX_EXPERT_CORE_PAIRS:
        raise BadInput(f"experts x cores = {n_e * cores} exceeds {MAX_EXPERT_CORE_PAIRS}", field="cores")
    if slots > n_e * cores:
        raise BadInput(f"slots ({slots}) must be <= experts x cores ({n_e * cores}): no two replicas of one expert "
                       "share a core", field="slots")
    if arr.shape[0] * slots * slots > MAX_LAYER_SLOTS2:
        raise BadInput(f"{arr.shape[0]} layers x {slots} slots: the balancer's work grows as layers x slots^2 "
                       f"(~1.3e-7 s each here), at most {MAX_LAYER_SLOTS2} a request (fewer layers a request or "
                       "fewer slots)", field="slots")
    return {"layers": [{"layer": i, **balance_layer(arr[i], cores, slots)} for i in range(arr.shape[0])]}


def read_loads_file(path: str | Path) -> list[list[float]]:
    """Per-layer loads from a CSV like ``input_loads_E*.csv`` (columns ``expert_<i>``, one row per layer; other
    columns ignored) or a JSON list of lists."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: file not found", field="loads")
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{p}: malformed JSON: {exc.msg}", field="loads") from None
        if not isinstance(data, list) or not all(isinstance(r, list) for r in data):
            raise BadInput(f"{p}: expected a JSON list of per-layer lists", field="loads")
        return [[float(x) for x in row] for row in data]
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise BadInput(f"{p}: no rows", field="loads")
    cols = [c for c in rows[0] if c is not None and c.startswith("expert_")]
    if not cols:
        raise BadInput(f"{p}: no expert_<i> columns", field="loads")
    cols.sort(key=lambda c: int(c.split("_", 1)[1]))
    out = []
    for n, row in enumerate(rows):
        try:
            out.append([float(row[c]) for c in cols])
        except (TypeError, ValueError):
            raise BadInput(f"{p}: row {n + 1}: a load is missing or not a number", field=f"loads[{n}]") from None
    return out
