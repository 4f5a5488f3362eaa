"""TAPS as a MILP (``method=milp``), solved by ``scipy.optimize.milp`` (HiGHS) with a time limit.

Variables: ``x[i, c] ∈ {0, 1}`` (instance i on core c) and the peak ``t`` (°C). Minimise ``t`` subject to
- ``Σ_c x[i, c] = 1`` for every instance;
- ``t_base[k] + Σ_{i,c} H[k, c]·p_i·x[i, c] ≤ t`` for every core k (the peak of ``H·p + T_amb``, linear in x);
- ``Σ_i f_i·x[i, c] ≤ core_flops_tps`` for every core (capacity, FLOP/s);
- ``Σ_{r ∈ replicas(e)} x[r, c] ≤ 1`` for every replicated expert e and core c.
Only the peak is modelled (variance and smoothness are quadratic); the variance/smoothness of the answer are still
reported. Bank placement is done afterwards exactly as for the heuristic. When HiGHS stops at the time limit without an
incumbent better than the heuristic's peak, the heuristic's answer is returned (and ``meta.notes`` says so).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from services.placement.taps import Problem, assemble, heuristic_assign
from shared.configs import ArchConfig
from shared.configs.tas import TapsParams
from shared.contracts.placement import Placement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MilpResult:
    assign: np.ndarray | None  # (m,) or None when HiGHS found no feasible point
    peak_c: float | None
    optimal: bool
    gap: float | None
    status: str


def solve_peak_milp(pb: Problem, time_limit_s: float) -> MilpResult:
    m, n = pb.m, pb.n
    nv = m * n + 1
    t_idx = m * n
    c_obj = np.zeros(nv)
    c_obj[t_idx] = 1.0
    rows = []
    lo: list[np.ndarray] = []
    hi: list[np.ndarray] = []
    # assignment rows
    r = np.repeat(np.arange(m), n)
    A1 = sparse.csr_matrix((np.ones(m * n), (r, np.arange(m * n))), shape=(m, nv))
    rows.append(A1)
    lo.append(np.ones(m))
    hi.append(np.ones(m))
    # temperature rows: coefficient of x[i, c] in row k is H[k, c] * p_i
    coef = (pb.H[:, None, :] * pb.inst_power[None, :, None]).reshape(n, m * n)
    A2 = sparse.hstack([sparse.csr_matrix(coef), sparse.csr_matrix(-np.ones((n, 1)))]).tocsr()
    rows.append(A2)
    lo.append(np.full(n, -np.inf))
    hi.append(-pb.t_base)
    # capacity rows
    cc = np.tile(np.arange(n), m)
    A3 = sparse.csr_matrix((np.repeat(pb.inst_flops, n), (cc, np.arange(m * n))), shape=(n, nv))
    rows.append(A3)
    lo.append(np.full(n, -np.inf))
    hi.append(np.full(n, pb.cap_flops))
    # replica separation rows
    counts = np.bincount(pb.inst_expert)
    sep_r, sep_c = [], []
    row = 0
    for k in np.flatnonzero(counts > 1):
        inst = np.flatnonzero(pb.inst_expert == k)
        for core in range(n):
            sep_r.extend([row] * inst.size)
            sep_c.extend((inst * n + core).tolist())
            row += 1
    if row:
        rows.append(sparse.csr_matrix((np.ones(len(sep_r)), (sep_r, sep_c)), shape=(row, nv)))
        lo.append(np.full(row, -np.inf))
        hi.append(np.ones(row))
    A = sparse.vstack(rows).tocsr()
    integrality = np.ones(nv, dtype=np.int64)
    integrality[t_idx] = 0
    ub = np.ones(nv)
    ub[t_idx] = np.inf
    res = milp(c_obj, constraints=LinearConstraint(A, np.concatenate(lo), np.concatenate(hi)),
               integrality=integrality, bounds=Bounds(np.zeros(nv), ub),
               options={"time_limit": float(time_limit_s), "disp": False})
    gap = getattr(res, "mip_gap", None)
    if res.x is None:
        return MilpResult(None, None, False, None, str(res.message))
    x = res.x[: m * n].reshape(m, n)
    assign = np.argmax(x, axis=1).astype(np.int64)
    peak = float(pb.temps(assign).max())
    return MilpResult(assign, peak, res.status == 0, None if gap is None else float(gap), str(res.message))


def solve_milp(pb: Problem, taps: TapsParams, *, arch: ArchConfig, expert_bytes: int,
               weight_shard_mb: float) -> Placement:
    """MILP placement with the heuristic as fallback (see the module docstring)."""
    h_assign, h_notes = heuristic_assign(pb, taps.local_search_iters)
    h_peak = float(pb.temps(h_assign).max())
    res = solve_peak_milp(pb, taps.milp_time_limit_s)
    if res.assign is not None and res.peak_c is not None and (res.optimal or res.peak_c < h_peak - 1e-9):
        note = (f"MILP {'optimal' if res.optimal else 'time limit, incumbent kept'} (gap "
                f"{res.gap if res.gap is not None else float('nan'):.3g}); heuristic peak {h_peak:.3f} °C")
        return assemble(pb, res.assign, method="milp", extra_notes=[note], gap=res.gap,
                        arch=arch, expert_bytes=expert_bytes, weight_shard_mb=weight_shard_mb,
                        bank_bw_gbps=taps.capacity.bank_bw_gbps)
    note = f"MILP fell back to the heuristic ({res.status}; incumbent peak {res.peak_c})"
    return assemble(pb, h_assign, method="milp-fallback-heuristic", extra_notes=[*h_notes, note], gap=res.gap,
                    arch=arch, expert_bytes=expert_bytes, weight_shard_mb=weight_shard_mb,
                    bank_bw_gbps=taps.capacity.bank_bw_gbps)
