"""TAPS's slot model: the peak of a placement's temperatures over one micro-batch period, not only of its mean
(Science III).

Why: in decode every expert a micro-batch routes to streams its whole copy of the weights, layer after layer. Each
expert's core and vault run a ~7 ms burst once per period, and the run's peak is the hottest burst, not the hottest
mean: the mean field's spread is ~0.3 K while a burst lifts its core ~1 K over it, ~22 % more when the same core's
next burst follows one slot later, ~15 % more in a corner. A placement that only flattens the mean (TAPS before)
packed consecutive layers on one core and put experts in corners: hotter than the default mapping.

Model (SI inside; temperatures °C):
- The period ``P`` (s, one micro-batch step) is cut into ``S`` slots of ``t_s = P / S``; layer ``l`` of a
  micro-batch runs in slot ``l`` (``S = max(layers, round(P / t_layer))``, ``t_layer`` the layer's critical path: the
  slowest instance of the load-balanced placement, the same timing model as the critical-path constraint).
- Instance i dissipates its energy per step during its layer's slot: ``pc_i = E_logic,i / t_s`` in its core (MACs,
  scratchpad, the DRAM controller's share) and ``pv_i = E_vault,i / t_s`` in its vault (the DRAM array and TSV/IO
  shares), priced by ``shared.energy`` as the physicalizer prices them.
- Periodic responses from the thermal service's pulse responses ``D`` (``lags`` slots after a 1 W pulse) and the
  steady H: ``R[j] = Σ_(m: m mod S = j) D[m] + (H − Σ_m D[m]) / S`` (the response's tail beyond ``lags`` is spread
  evenly over the period; so ``mean_j R[j] = H / S``: the slot model's mean is the mean field of the instances'
  logic share through H and vault share through H_vault, instance by instance; the steady model mixes the two at
  the instances' mean share, `taps.instance_influence`, so the two agree in total, not core by core).
- ``T[k, s] = t_base[k] + Σ_i pc_i·Rc[(s − slot_i) mod S][k, core_i] + pv_i·Rv[(s − slot_i) mod S][k, core_i]``.
- Objective: ``w_peak·max_(k,s) T[k, s] + w_var·var(T̄) + w_smooth·Σ_adjacent (T̄_i − T̄_j)²`` with ``T̄ = mean_s T``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.placement.taps import Problem, _feasible

PULSE_LAGS = 12  # slots of short-time response asked of the thermal service; the tail beyond is spread evenly
PULSE_MAX_CORES = 256  # larger meshes: the steady model alone (the (S, cores, cores) responses grow as n²)


def slot_count(period_s: float, layer_s: float, n_slots_min: int) -> int:
    """Slots per period: ``max(n_slots_min, round(period / layer))`` (a saturated chip has layers longer than the
    period's share: then every slot is a layer)."""
    return max(int(n_slots_min), round(period_s / layer_s) if layer_s > 0 else 0, 1)


def periodic_response(D: np.ndarray, H: np.ndarray, S: int) -> np.ndarray:
    """(S, n, n) periodic response from pulse responses ``D`` (lags, n, n) and the steady ``H`` (see the module
    docstring)."""
    lags, n, _ = D.shape
    R = np.zeros((S, n, n))
    for j in range(lags):
        R[j % S] += D[j]
    R += (H - D.sum(axis=0))[None, :, :] / S
    return R


@dataclass
class SlotModel:
    S: int
    slot_s: float
    Rc: np.ndarray  # (S, n, n) K/W, core sources
    Rv: np.ndarray  # (S, n, n) K/W, vault sources
    inst_slot: np.ndarray  # (m,) slot of each instance (its model layer mod S)
    inst_pc: np.ndarray  # (m,) W in its core during its slot
    inst_pv: np.ndarray  # (m,) W in its vault during its slot

    def kernel(self, i: int) -> np.ndarray:
        """(S, n_k, n_c): ``T[k, s]`` added by instance i on core c (indexed ``[s, k, c]``)."""
        idx = (np.arange(self.S) - int(self.inst_slot[i])) % self.S
        out: np.ndarray = self.inst_pc[i] * self.Rc[idx] + self.inst_pv[i] * self.Rv[idx]
        return out

    def columns(self, inst: np.ndarray, cores: np.ndarray) -> np.ndarray:
        """(r, S, n_k): ``T[k, s]`` added by instance ``inst[r]`` on core ``cores[r]``."""
        idx = (np.arange(self.S)[None, :] - self.inst_slot[inst][:, None]) % self.S  # (r, S)
        c = cores[:, None]
        out: np.ndarray = (self.inst_pc[inst][:, None, None] * self.Rc[idx, :, c]
                           + self.inst_pv[inst][:, None, None] * self.Rv[idx, :, c])
        return out

    def temps(self, pb: Problem, assign: np.ndarray) -> np.ndarray:
        """(S, n) temperatures at every slot end."""
        n = pb.n
        Uc = np.zeros((self.S, n))
        Uv = np.zeros((self.S, n))
        np.add.at(Uc, (self.inst_slot, assign), self.inst_pc)
        np.add.at(Uv, (self.inst_slot, assign), self.inst_pv)
        T = np.tile(pb.t_base, (self.S, 1))
        for s0 in np.flatnonzero(Uc.any(axis=1) | Uv.any(axis=1)):  # circular convolution over slots
            idx = (np.arange(self.S) - s0) % self.S
            T += self.Rc[idx] @ Uc[s0] + self.Rv[idx] @ Uv[s0]
        return T


def objective_terms(pb: Problem, T: np.ndarray) -> dict[str, float]:
    """The slot objective's terms of slot temperatures ``T`` (S, n)."""
    Tm = T.mean(axis=0)
    d = Tm[pb.adj_i] - Tm[pb.adj_j]
    peak, var, smooth = float(T.max()), float(Tm.var()), float((d * d).sum())
    return {"objective": pb.w_peak * peak + pb.w_var * var + pb.w_smooth * smooth, "peak_c": peak,
            "mean_peak_c": float(Tm.max()), "var_k2": var, "smooth_k2": smooth}


def _objectives(pb: Problem, T: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Objective of ``T + delta[r]`` for every candidate r (``delta`` (r, S, n))."""
    M = T[None] + delta
    peak = M.max(axis=(1, 2))
    Tm = M.mean(axis=1)  # (r, n)
    var = Tm.var(axis=1)
    d = Tm[:, pb.adj_i] - Tm[:, pb.adj_j]
    smooth = (d * d).sum(axis=1)
    out: np.ndarray = pb.w_peak * peak + pb.w_var * var + pb.w_smooth * smooth
    return out


REFINE_MAX_ITERS = 400  # applied changes per refinement (each is one improving move or swap)
SWAP_MAX = 256  # swap partners scored per mover ((partners, slots, cores) temperatures each)


def refine(pb: Problem, sm: SlotModel, assign: np.ndarray, iters: int, movers: int = 8) -> np.ndarray:
    """Local search on the slot objective: at the hottest (core, slot), the ``movers`` instances that heat it most,
    in that order, are tried on every other core (a move) and against the instances of the coolest quarter of the
    cores (a swap; the ``SWAP_MAX`` least powerful of them); the best strictly improving feasible change of the first
    instance that has one is applied. Stops after ``min(iters, REFINE_MAX_ITERS)`` changes or when none improves.
    Constraints as the steady heuristic's (capacity, critical path, vault banks, replica separation:
    ``taps._feasible``)."""
    assign = assign.copy()
    T = sm.temps(pb, assign)
    cur = objective_terms(pb, T)["objective"]
    n_cool = max(4, pb.n // 4)
    for _ in range(min(iters, REFINE_MAX_ITERS)):
        s_hot, k_hot = np.unravel_index(int(np.argmax(T)), T.shape)
        lag = (s_hot - sm.inst_slot) % sm.S
        contrib = sm.inst_pc * sm.Rc[lag, k_hot, assign] + sm.inst_pv * sm.Rv[lag, k_hot, assign]
        cool = np.zeros(pb.n, dtype=bool)
        cool[np.argsort(T.max(axis=0), kind="stable")[:n_cool]] = True
        tol = cur - 1e-9 * max(1.0, abs(cur))
        best: tuple[float, np.ndarray, np.ndarray] | None = None
        for i in (int(x) for x in np.argsort(-contrib, kind="stable")[:movers]):
            a = int(assign[i])
            K = sm.kernel(i)  # (S, n, n)
            options: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (objectives, deltas, candidates)
            delta = np.moveaxis(K - K[:, :, a:a + 1], 2, 0)  # (b, S, n): i moves a -> b
            objs = _objectives(pb, T, delta)
            objs[a] = np.inf
            moves = np.tile(assign, (pb.n, 1))
            moves[:, i] = np.arange(pb.n)
            options.append((objs, delta, moves))
            js = np.flatnonzero(cool[assign] & (assign != a))
            if js.size > SWAP_MAX:  # a large model: the least powerful partners (bounded work per candidate)
                js = js[np.argsort(sm.inst_pc[js] + sm.inst_pv[js], kind="stable")[:SWAP_MAX]]
            if js.size:
                bj = assign[js]
                sd = np.moveaxis(K[:, :, bj] - K[:, :, a:a + 1], 2, 0) \
                    + sm.columns(js, np.full(js.size, a)) - sm.columns(js, bj)  # i -> b_j and j -> a
                swaps = np.tile(assign, (js.size, 1))
                swaps[:, i] = bj
                swaps[np.arange(js.size), js] = a
                options.append((_objectives(pb, T, sd), sd, swaps))
            for objs_, deltas, cands in options:
                for r in (int(x) for x in np.argsort(objs_, kind="stable")[:8]):
                    if not objs_[r] < tol:
                        break
                    if _feasible(pb, cands[r]):
                        if best is None or objs_[r] < best[0]:
                            best = (float(objs_[r]), cands[r], deltas[r])
                        break
            if best is not None:
                break
        if best is None:
            break
        cur, assign = best[0], best[1].copy()
        T = T + best[2]
    return assign
