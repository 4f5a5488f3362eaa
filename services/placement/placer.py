"""The TAPS entry point: the heuristic (``taps``) or the MILP (``milp``) on one problem, with and without the
replicas of the hottest experts, keeping the replicas only where TAPS's predictions say they help
(`replicas_help`). It sits above both solvers so that neither imports the other (``milp`` builds on ``taps``'s problem
and assembly)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from services.placement.geometry import MIB, ChipGeometry
from services.placement.milp import solve_milp
from services.placement.shards import pack_banks, shard_sizes
from services.placement.slots import (
    PULSE_LAGS,
    PULSE_MAX_CORES,
    SlotModel,
    objective_terms,
    periodic_response,
    refine,
    slot_count,
)
from services.placement.taps import CRITICAL_PATH_TOL, Problem, _feasible, assemble, build_problem, heuristic_assign
from shared.configs import ArchConfig, WorkloadConfig
from shared.configs.tas import TapsParams
from shared.contracts.placement import Placement
from shared.errors import BadInput

# (slot seconds, lags, a vault's watt per DRAM die or None: evenly) -> (Dc, Dv) pulse responses (lags, cores, cores)
# K/W from the thermal service, or None
PulseFn = Callable[[float, int, np.ndarray | None], tuple[np.ndarray, np.ndarray] | None]


def slot_model(pb: Problem, pulse: PulseFn, H_vault: np.ndarray) -> SlotModel | None:
    """The slot model of a problem (``slots.py``): the period of one micro-batch step cut into slots of the layers'
    critical path, the thermal service's pulse responses made periodic. None when the problem has no timing or
    energy split, or the mesh is too large for the pulse responses."""
    if pb.inst_time is None or pb.inst_e_logic is None or pb.inst_e_vault is None or pb.n > PULSE_MAX_CORES:
        return None
    period = 1.0 / pb.steps_per_s
    n_layers = int(pb.expert_layer.max()) + 1
    S = slot_count(period, float(pb.inst_time.max()), n_layers)
    slot_s = period / S
    got = pulse(slot_s, PULSE_LAGS, pb.read_dies)  # the vault sources where the instances' shards are
    if got is None:
        return None
    Dc, Dv = got
    inst_slot = pb.expert_layer[pb.inst_expert].astype(np.int64) % S
    H_core = pb.H if pb.H_core is None else pb.H_core  # the logic die's own response (pb.H mixes in the vaults')
    H_reads = H_vault if pb.H_vault_reads is None else pb.H_vault_reads  # Dv's steady sum: the same die shares
    return SlotModel(S=S, slot_s=slot_s, Rc=periodic_response(Dc, H_core, S), Rv=periodic_response(Dv, H_reads, S),
                     inst_slot=inst_slot, inst_pc=pb.inst_e_logic / slot_s, inst_pv=pb.inst_e_vault / slot_s)


def build_placement(arch: ArchConfig, workload: WorkloadConfig, taps: TapsParams,
                    expert_load: Sequence[Sequence[float]], expert_flops_per_token: float,
                    H: np.ndarray | None = None, *, moe_layers: Sequence[int] | None = None, expert_bytes: int = 0,
                    method: str | None = None, H_vault: np.ndarray | None = None,
                    pulse: PulseFn | None = None, nonexpert_flops_per_step: float = 0.0,
                    nonexpert_bytes_per_step: float = 0.0,
                    vault_influence: Callable[[np.ndarray], np.ndarray] | None = None) -> Placement:
    """TAPS placement (``method``: ``heuristic`` (default from ``taps.method``) or ``milp``).

    ``expert_load[l][e]``: load profile of MoE layer ``moe_layers[l]`` (default ``0..L-1``), any non-negative scale;
    ``expert_flops_per_token``: FLOPs one token costs in one expert; ``expert_bytes``: weight bytes of one expert
    (split into ``workload.tensors.weight_shard_mb`` shards); H: cores × cores K/W (the thermal service's; None:
    the analytic single-layer kernel, noted in ``meta.notes``: the placement service always passes thermal's H).

    ``pulse`` and ``H_vault`` (the thermal service's pulse responses and vault influence matrix; the placement
    service passes both): the heuristic's answer is refined on the slot model (``slots.py``), and so is the default
    mapping; the lower slot objective wins, and when nothing beats the default mapping itself, TAPS keeps its cores
    (its shards laid out by TAPS's bank book, ``shards.py``; noted). Without them: the steady model alone.
    ``vault_influence`` (the thermal service's H_vault for a vault's watt in given shares per DRAM die): where the
    instances' weight reads heat the dies (``build_problem``); the pulse responses are asked for the same shares.
    """
    method = method or taps.method
    if method not in ("heuristic", "milp"):
        raise BadInput(f"unknown method {method!r} (heuristic | milp)", field="method")
    solver = _Solver(arch=arch, workload=workload, taps=taps, expert_load=expert_load,
                     expert_flops_per_token=expert_flops_per_token, H=H, moe_layers=moe_layers,
                     expert_bytes=expert_bytes, method=method, H_vault=H_vault, pulse=pulse,
                     nonexpert_flops_per_step=nonexpert_flops_per_step,
                     nonexpert_bytes_per_step=nonexpert_bytes_per_step, vault_influence=vault_influence)
    if solver.striped:  # a striped expert streams from k vaults already; a second copy would take k more
        k_hot = 0
        why = (f"replication: not on a striped chip (arch.schedule.expert_stripe = {arch.schedule.expert_stripe}: "
               "each expert's weights stream from its group's vaults)") if taps.replicate_hot_k > 0 else ""
    else:
        k_hot, why = _replicas_that_fit(arch, workload, taps, expert_load, expert_bytes)
    pb, plc = solver.solve(k_hot)
    if pb.m == pb.expert_layer.shape[0]:  # nothing replicated (k = 0, or a one-core chip)
        if why:
            return plc.model_copy(update={"meta": plc.meta.model_copy(update={"notes": [*plc.meta.notes, why]})})
        return plc
    _, plain = solver.solve(0)
    keep, note = replicas_help(plc, plain, taps.replicate_hot_k)
    chosen = plc if keep else plain
    return chosen.model_copy(update={"meta": chosen.meta.model_copy(update={"notes": [*chosen.meta.notes, note]})})


@dataclass(frozen=True)
class _Solver:
    """One `build_placement` request: solves its problem with a given number of replicated hot experts."""

    arch: ArchConfig
    workload: WorkloadConfig
    taps: TapsParams
    expert_load: Sequence[Sequence[float]]
    expert_flops_per_token: float
    H: np.ndarray | None
    moe_layers: Sequence[int] | None
    expert_bytes: int
    method: str
    H_vault: np.ndarray | None
    pulse: PulseFn | None
    nonexpert_flops_per_step: float
    nonexpert_bytes_per_step: float
    vault_influence: Callable[[np.ndarray], np.ndarray] | None

    @property
    def striped(self) -> bool:
        return self.arch.schedule.expert_stripe > 1

    def solve(self, k_hot: int) -> tuple[Problem, Placement]:
        """The problem with the ``k_hot`` hottest experts of each layer replicated, and its placement."""
        arch, workload, taps = self.arch, self.workload, self.taps
        pb = build_problem(arch, workload, taps, self.expert_load, self.expert_flops_per_token, self.H,
                           moe_layers=self.moe_layers, expert_bytes=float(self.expert_bytes),
                           critical_path_tol=CRITICAL_PATH_TOL, replicate_hot_k=k_hot,
                           nonexpert_flops_per_step=self.nonexpert_flops_per_step,
                           nonexpert_bytes_per_step=self.nonexpert_bytes_per_step, H_vault=self.H_vault,
                           vault_influence=self.vault_influence)
        if self.method == "heuristic":
            return pb, self._heuristic(pb, k_hot)
        return pb, solve_milp(pb, taps, arch=arch, expert_bytes=self.expert_bytes,
                              weight_shard_mb=workload.tensors.weight_shard_mb, seed=workload.routing.seed)

    def _heuristic(self, pb: Problem, k_hot: int) -> Placement:
        """The heuristic's answer; on the slot model when the thermal service's pulse responses allow it."""
        arch, pulse, H_vault, striped = self.arch, self.pulse, self.H_vault, self.striped
        assign, notes = heuristic_assign(pb, self.taps.local_search_iters, self.workload.routing.seed)
        sm = None if pulse is None or H_vault is None or striped else slot_model(pb, pulse, H_vault)
        if striped and pulse is not None:
            notes = [*notes, f"striped experts (arch.schedule.expert_stripe = {arch.schedule.expert_stripe}): "
                     "steady model only (the slot model times one core's weight stream)"]
        if sm is not None:
            return self._on_slots(pb, sm, assign, notes, k_hot)
        if pulse is not None and not striped:
            notes = [*notes, "slot model not available for this chip (no timing, more than "
                     f"{PULSE_MAX_CORES} cores, or a stack too large for the pulse responses): steady model only"]
        return assemble(pb, assign, arch=arch, expert_bytes=self.expert_bytes,
                        weight_shard_mb=self.workload.tensors.weight_shard_mb,
                        bank_bw_gbps=self.taps.capacity.bank_bw_gbps, method="heuristic", extra_notes=notes)

    def _on_slots(self, pb: Problem, sm: SlotModel, assign: np.ndarray, notes: list[str], k_hot: int) -> Placement:
        """The heuristic's answer and the default mapping, each refined on the slot model; the lower wins, and the
        default mapping's cores when nothing beats them."""
        iters = self.taps.local_search_iters
        tried = [("heuristic", refine(pb, sm, assign, iters))]
        default = np.arange(pb.m, dtype=np.int64) % pb.n
        plain = k_hot == 0 or pb.m == pb.expert_layer.shape[0]
        if plain and _feasible(pb, default):  # the default mapping is an assignment of this very problem
            tried = [("default", default), *tried, ("default refined", refine(pb, sm, default, iters))]
        temps = [sm.temps(pb, a) for _, a in tried]
        scored = [(objective_terms(pb, T), name, a, T) for (name, a), T in zip(tried, temps, strict=True)]
        terms, name, best, T_best = min(scored, key=lambda t: t[0]["objective"])
        T = T_best.mean(axis=0)  # the slot model's mean field (each instance's shares through H and H_vault)
        summary = "; ".join(f"{n}: {t['objective']:.6g} (peak {t['peak_c']:.3f} °C)" for t, n, _, _ in scored)
        note = (f"slot model ({sm.S} slots of {sm.slot_s * 1e3:.3g} ms per micro-batch period, the bursts of the "
                f"weight streams): {summary}; kept: {name}")
        if name == "default":  # the default core mapping, its shards laid out by TAPS's bank book (shards.py)
            note += ("; TAPS kept the default mapping's cores (no placement it found has a lower predicted "
                     "objective) and spread each vault's weight reads over its columns")
        plc = assemble(pb, best, arch=self.arch, expert_bytes=self.expert_bytes,
                       weight_shard_mb=self.workload.tensors.weight_shard_mb,
                       bank_bw_gbps=self.taps.capacity.bank_bw_gbps, method="heuristic", extra_notes=[*notes, note])
        meta = plc.meta.model_copy(update={"objective": {**plc.meta.objective, **terms},
                                           "predicted_peak_c": round(terms["peak_c"], 4),
                                           "predicted_core_temps_c": [round(float(t), 4) for t in T]})
        return plc.model_copy(update={"meta": meta})


def _replicas_that_fit(arch: ArchConfig, workload: WorkloadConfig, taps: TapsParams,
                       expert_load: Sequence[Sequence[float]], expert_bytes: int) -> tuple[int, str]:
    """``taps.replicate_hot_k``, or 0 when a second copy of the ``replicate_hot_k`` hottest experts of each layer
    does not fit the chip's banks (packed by bytes): a replica is an option, the model is not. The note says so
    when the model alone fits (when it does not, `taps.build_problem` refuses it with the numbers)."""
    k = taps.replicate_hot_k
    if k <= 0 or expert_bytes <= 0 or arch.mesh.n_cores < 2 or not expert_load:
        return k, ""
    n_layers, n_e = len(expert_load), len(expert_load[0])
    geom = ChipGeometry.of(arch)
    sizes = shard_sizes(int(expert_bytes), workload.tensors.weight_shard_mb)
    cap, banks = arch.dram.bank_capacity_mb * MIB, geom.n_cores * geom.vault_banks
    copies = n_layers * (n_e + min(k, n_e))
    if pack_banks(sizes, copies, cap) <= banks:
        return k, ""
    if pack_banks(sizes, n_layers * n_e, cap) > banks:
        return 0, ""  # the model alone does not fit: build_problem refuses it with its own numbers
    return 0, (f"replication of the {k} most loaded expert(s) per layer: not tried, {copies} expert copies do not "
               f"fit the chip's {banks} banks (the model's {n_layers * n_e} do)")


def replicas_help(with_: Placement, without: Placement, k: int) -> tuple[bool, str]:
    """Replication where it helps (Science III): whether to keep the placement with the replicas of the ``k`` most
    loaded experts of each layer, and the note that says why. A replica halves its expert's compute per core but
    streams a second copy of its weights (decode reads every weight of an expert it routes to): more energy, all of
    it heat. The replicas are kept when, on TAPS's own predictions, the placement with them has the lower objective
    **and** a lower peak, lower by more than the mean core temperature rises (°C, each the mean over the cores of
    ``meta.predicted_core_temps_c``): a hot spot made cooler by warming the whole chip as much is not a gain. A fixed
    one-for-one exchange of peak against mean, not a tunable. Both placements come from the same solver path; on the
    slot model each is cut into slots of its own critical path, so where compute (which replicas halve) rather than
    the weight stream sets the step, the two peaks are read on different slot grids."""
    a, b = with_.meta.objective["objective"], without.meta.objective["objective"]
    t_with, t_without = with_.meta.predicted_core_temps_c, without.meta.predicted_core_temps_c
    if not t_with or not t_without:
        raise ValueError("replicas_help needs both placements' predicted core temperatures")
    gain = without.meta.objective["peak_c"] - with_.meta.objective["peak_c"]  # K the peak falls with them
    warming = float(np.mean(t_with)) - float(np.mean(t_without))  # K the mean core temperature rises with them
    keep = a < b and gain > max(warming, 0.0)
    note = (f"replication of the {k} most loaded expert(s) per layer: predicted objective {a:.6g} with, {b:.6g} "
            f"without; peak {gain:+.4f} K lower with them, mean core temperature {warming:+.4f} K higher: "
            f"{'kept' if keep else 'dropped'}")
    return keep, note
