"""TAPS: offline thermal-aware placement of expert instances on cores (seed 001 §4.2, ARCHITECTURE §5.2).

Model (SI inside):
- routed token rate of one MoE layer ``R = micro_batch·topk / step_interval`` (tokens/s; prefill multiplies by the
  sequence length); expert ``e`` of layer ``l`` gets the share ``load[l][e] / Σ_e load[l][e]`` of it (the load
  profile may be counts or probabilities: only its shape per layer matters);
- FLOP rate of an instance ``f = share·R·flops_per_token / replicas`` (FLOP/s), power ``p̂ = E · steps/s`` with
  ``E`` its energy per step as the physicalizer prices it (``instance_energy``: MACs, scratchpad accesses and the
  stream of its copy of the weights, shared/energy.py), its MACs and scratchpad accesses at the voltage of the DVFS
  level the cores settle at (``base_power``: the governor of ``shared/dvfs.py`` on the predicted mean field); every
  core also leaks (``shared.energy.static_power`` at its predicted temperature and voltage);
- temperatures ``T̂ = T_base + H_inst·p̂`` (°C; K/W, cores × cores): an instance's heat enters where it is
  dissipated, its logic share on the logic die (the thermal service's ``H``), its vault share in the DRAM dies
  above (``H_vault``), mixed at the instances' mean shares (``instance_influence``);
- objective ``w_peak·max(T̂) + w_var·var(T̂) + w_smooth·Σ_(i,j) adjacent (T̂_i − T̂_j)²``; with the thermal service's
  pulse responses, ``placer`` refines the answer on the slot model (``slots.py``: the peak over a micro-batch period,
  where the bursts of the weight streams are, not only of the mean).
When the demand exceeds the chip (``Σ f > n_cores·core_flops_tps``) the chip saturates: every rate (and so power and
bank traffic) is scaled to the sustainable throughput, a mean utilisation of ``1/CAPACITY_HEADROOM`` (noted).
Constraints: per-core FLOP rate ≤ ``core_flops_tps``; per-layer critical path (Science III): the instances of one layer
on one core take at most ``(1 + CRITICAL_PATH_TOL)`` times the layer's slowest instance (``layer_budgets``: the
load-balanced placement's critical path); hard vault capacity: a core's instances' shards fit its vault's banks, packed
by bytes (a bank holds as many shards as fit: ``shards.vault_copies``; a model whose shards do not fit the chip's banks
is refused with the numbers, ``shards.check_fits``);
two replicas of one expert never share a core; weight shards in the vault of the core that uses them, spilling to the
nearest vault with room, each bank within ``bank_capacity_mb`` and ``bank_bw_gbps`` where possible.

Replication where it helps: in every MoE layer the ``replicate_hot_k`` most loaded experts are candidates for a second
replica (traffic split evenly); `placer.build_placement` solves with and without them and keeps the replicas only
when the predicted objective is lower and the predicted peak falls by more than the predicted mean core temperature
rises (`placer.replicas_help`: a replica halves its expert's compute on each core but streams a second copy of the
weights; in decode, where the stream dominates, replication warms the chip and is dropped). The choice is noted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from services.placement.geometry import MIB, ChipGeometry, adjacent_pairs, analytic_influence, check_h, hops_matrix
from services.placement.shards import BankBook, check_fits, read_die_profile, shard_sizes, vault_copies
from shared.chip import attention_share, stripe_groups, vault_bw_raw_gbps
from shared.configs import ArchConfig, WorkloadConfig
from shared.configs.tas import TapsParams
from shared.contracts.ids import expert_id, parse_expert_id, weight_tensor_id
from shared.contracts.placement import ExpertPlacement, Placement, PlacementMeta, TensorPlacement
from shared.dvfs import dynamic_scale, freq_volt, step_levels
from shared.energy import EnergyModel, dtype_bytes, spm_accesses, static_power
from shared.errors import BadInput

log = logging.getLogger(__name__)

CRITICAL_PATH_TOL = 0.01  # a layer's slowest core may be 1 % slower than in the load-balanced placement

MAX_INSTANCES = 65_536  # expert instances per request (DeepSeek-V3: 58 x 256 = 14 848)
MAX_INSTANCE_CORES = 2**24  # instances x cores: the heuristic keeps (instances, cores) arrays (128 MiB each at this)
CAPACITY_HEADROOM = 1.15  # when demand exceeds the chip, rates are scaled to a mean utilisation of 1/1.15


@dataclass
class Problem:
    """Everything the optimisers need, as arrays. ``m`` instances, ``n`` cores."""

    geom: ChipGeometry
    H: np.ndarray  # (n, n) K/W: rise at core i per W of an instance on core j (`instance_influence`)
    t_base: np.ndarray  # (n,) °C: ambient + the base field (`base_power`: leakage, refresh, non-expert work)
    w_peak: float
    w_var: float
    w_smooth: float
    inst_expert: np.ndarray  # (m,) index into expert_layer/expert_e
    inst_power: np.ndarray  # (m,) W
    inst_flops: np.ndarray  # (m,) FLOP/s
    inst_tokens_step: np.ndarray  # (m,) expected routed tokens per step
    expert_layer: np.ndarray  # (k,) model layer index
    expert_e: np.ndarray  # (k,) expert index in its layer
    cap_flops: float  # FLOP/s per core (possibly scaled, see notes)
    steps_per_s: float
    t_amb: float
    notes: list[str] = field(default_factory=list)
    h_source: str = "given"
    # per-layer critical path (Science III): an instance's time per step (s) and, per instance, the budget of its
    # layer on one core; None = no budget (the MILP oracle's problems, tests)
    inst_time: np.ndarray | None = None  # (m,)
    inst_budget: np.ndarray | None = None  # (m,)
    # hard vault capacity: the expert copies each instance holds (1) and the copies one core's vault holds, its
    # banks packed by bytes (`shards.vault_copies`)
    inst_copies: np.ndarray | None = None  # (m,)
    vault_cap: float = math.inf
    # energy per micro-batch step of each instance (J): in its core and in its vault (``instance_energy``)
    inst_e_logic: np.ndarray | None = None  # (m,)
    inst_e_vault: np.ndarray | None = None  # (m,)
    H_core: np.ndarray | None = None  # (n, n) K/W: rise per W on the logic die alone (the thermal service's H)
    # where the instances' weight reads heat the DRAM dies: the share per die (`shards.read_die_profile`) and the
    # vault influence for it (cores × vaults K/W); None: evenly over the dies (`H_vault`)
    read_dies: np.ndarray | None = None
    H_vault_reads: np.ndarray | None = None
    base_field: BaseField | None = None  # what ``t_base`` comes from (`base_power`); None: leakage-free library use
    # experts striped over groups of this many consecutive cores (`stripe_influence`): a layer's time is summed over a
    # group, whose instances run one after another on all of its cores
    stripe: int = 1
    # derived (filled by __post_init__)
    adj_i: np.ndarray = field(init=False)
    adj_j: np.ndarray = field(init=False)
    BH: np.ndarray = field(init=False)  # (edges, n): edge differences of every column of H
    HS: np.ndarray = field(init=False)  # (n,) Σ_edges (BH[:, c])² = smooth(H[:, c])
    Hmean: np.ndarray = field(init=False)  # (n,) column means of H
    Hvar: np.ndarray = field(init=False)  # (n,) column variances of H

    def __post_init__(self) -> None:
        self.adj_i, self.adj_j = adjacent_pairs(self.geom.mesh_x, self.geom.mesh_y)
        self.BH = self.H[self.adj_i, :] - self.H[self.adj_j, :]
        self.HS = (self.BH ** 2).sum(axis=0)
        self.Hmean = self.H.mean(axis=0)
        self.Hvar = self.H.var(axis=0)

    @property
    def n(self) -> int:
        return self.geom.n_cores

    @property
    def m(self) -> int:
        return int(self.inst_power.shape[0])

    def core_power(self, assign: np.ndarray) -> np.ndarray:
        """(n,) W: the predicted mean power of each core's area of the logic die: the base (`base_power`: leakage,
        its share of the non-expert work) plus the logic share (``inst_e_logic``: MACs, scratchpad, the DRAM
        controller) of the instances it runs; the vault shares heat the DRAM dies, not this area."""
        p = self.inst_power
        if self.inst_e_logic is not None and self.inst_e_vault is not None:
            tot = self.inst_e_logic + self.inst_e_vault
            p = p * np.divide(self.inst_e_logic, tot, out=np.ones_like(tot), where=tot > 0)
        base = np.zeros(self.n) if self.base_field is None else self.base_field.core_w
        return base + np.bincount(assign, weights=p, minlength=self.n)

    def temps(self, assign: np.ndarray) -> np.ndarray:
        p = np.bincount(assign, weights=self.inst_power, minlength=self.n)
        return np.asarray(self.t_base + self.H @ p)

    def terms(self, T: np.ndarray) -> dict[str, float]:
        d = T[self.adj_i] - T[self.adj_j]
        peak, var, smooth = float(T.max()), float(T.var()), float((d * d).sum())
        return {"objective": self.w_peak * peak + self.w_var * var + self.w_smooth * smooth,
                "peak_c": peak, "var_k2": var, "smooth_k2": smooth}

    def objective(self, T: np.ndarray) -> float:
        return self.terms(T)["objective"]

    def delta_objective(self, T: np.ndarray, cols_plus: np.ndarray, cols_minus: np.ndarray | None,
                        w: np.ndarray) -> np.ndarray:
        """Objective after ``T + w_r·(H[:, plus_r] − H[:, minus_r])`` for every candidate r, vectorised.

        var and smooth use the incremental quadratic forms (``var(T + w d) = var T + 2w cov(T, d) + w² var d``, the same
        for the edge-difference sum); the peak takes the max of the (candidates × cores) matrix."""
        D = self.H[:, cols_plus]  # (n, r)
        BD = self.BH[:, cols_plus]
        if cols_minus is not None:
            D = D - self.H[:, cols_minus]
            BD = BD - self.BH[:, cols_minus]
        M = T[:, None] + D * w[None, :]
        peak = M.max(axis=0)
        Tc = T - T.mean()
        cov = (Tc @ D) / self.n
        var_d = D.var(axis=0)
        var = T.var() + 2 * w * cov + w * w * var_d
        BT = T[self.adj_i] - T[self.adj_j]
        smooth = float(BT @ BT) + 2 * w * (BT @ BD) + w * w * (BD * BD).sum(axis=0)
        return np.asarray(self.w_peak * peak + self.w_var * var + self.w_smooth * smooth)


# --------------------------------------------------------------------------------------------------------------------
# inputs


MAX_LOAD = 1e200  # a load of any scale, with room for sums and products of a row (1e308 overflowed them to inf)


def validate_loads(expert_load: Sequence[Sequence[float]], field_name: str = "expert_load") -> np.ndarray:
    """(layers, experts) float array; every row the same length, finite, non-negative, not all zero."""
    if len(expert_load) == 0:
        raise BadInput(f"{field_name} must have at least one layer", field=field_name)
    n_e = len(expert_load[0])
    if n_e == 0:
        raise BadInput(f"{field_name}[0] must list at least one expert", field=f"{field_name}[0]")
    for i, row in enumerate(expert_load):
        if len(row) != n_e:
            raise BadInput(f"{field_name}[{i}] has {len(row)} experts but {field_name}[0] has {n_e}",
                           field=f"{field_name}[{i}]")
    arr = np.asarray(expert_load, dtype=float)
    bad = np.argwhere(~np.isfinite(arr) | (arr < 0) | (arr > MAX_LOAD))
    if bad.size:
        i, j = (int(x) for x in bad[0])
        raise BadInput(f"{field_name}[{i}][{j}] must be a finite non-negative load up to {MAX_LOAD:g} (any scale: "
                       f"loads are shares), got {arr[i, j]}", field=f"{field_name}[{i}][{j}]")
    zero = np.flatnonzero(arr.sum(axis=1) <= 0)
    if zero.size:
        raise BadInput(f"{field_name}[{int(zero[0])}] is all zeros", field=f"{field_name}[{int(zero[0])}]")
    return arr


def check_size(instances: int, cores: int) -> None:
    """The placer's bounds (422 naming ``expert_load``): at most ``MAX_INSTANCES`` instances and ``MAX_INSTANCE_CORES``
    instance-core pairs (the heuristic keeps (instances, cores) arrays: 65 536 instances on 4096 cores asked for 2 GB
    each, and a MILP job's heuristic grew a test process past 20 GB)."""
    if instances > MAX_INSTANCES:
        raise BadInput(f"expert_load has {instances} expert instances; the placer takes at most {MAX_INSTANCES}",
                       field="expert_load")
    if instances * cores > MAX_INSTANCE_CORES:
        raise BadInput(f"expert_load has {instances} expert instances on {cores} cores: {instances * cores} "
                       f"instance-core pairs, the placer takes at most {MAX_INSTANCE_CORES}", field="expert_load")


def routed_tokens_per_step(wl: WorkloadConfig) -> float:
    """Expert-token pairs of one micro-batch step: micro_batch x top-k (x the prompt's tokens in prefill).
    ``routing.topk`` must be resolved (None: the model's, which the placement service asks the workload service
    for: `services.placement.service.with_model_topk`)."""
    if wl.routing.topk is None:
        raise BadInput("workload.routing.topk: not resolved (the model's experts per token)",
                       field="workload.routing.topk")
    tok = wl.sequence.micro_batch * wl.routing.topk
    if wl.phase == "prefill":
        tok *= wl.sequence.tokens
    return float(tok)


def build_problem(arch: ArchConfig, wl: WorkloadConfig, taps: TapsParams, expert_load: Sequence[Sequence[float]],
                  expert_flops_per_token: float, H: np.ndarray | None = None, *,
                  moe_layers: Sequence[int] | None = None, expert_bytes: float = 0.0,
                  critical_path_tol: float | None = None, replicate_hot_k: int | None = None,
                  nonexpert_flops_per_step: float = 0.0, nonexpert_bytes_per_step: float = 0.0,
                  H_vault: np.ndarray | None = None,
                  vault_influence: Callable[[np.ndarray], np.ndarray] | None = None) -> Problem:
    """The placement problem; ``replicate_hot_k`` (default ``taps.replicate_hot_k``): the most loaded experts of each
    layer that get a second replica in it. ``nonexpert_*_per_step``: one micro-batch's non-expert work (the workload
    service's trace summary), part of the placement-independent base field with the static power (`base_power`);
    ``H_vault`` (cores × vaults K/W, the thermal service's): where the vault shares of the base and of the
    instances heat the cores (`base_power`, `instance_influence`; None: counted at the core). The base's (refresh,
    leakage, non-expert traffic) heats every DRAM die alike; the instances' weight reads heat the dies the bank book
    puts their shards on: ``vault_influence(shares)`` (the thermal service's H_vault for a vault's watt in those
    shares per die) at `shards.read_die_profile` of the mean vault's shards; None: ``H_vault`` for both."""
    loads = validate_loads(expert_load)
    n_layers, n_experts = loads.shape
    check_size(n_layers * n_experts, arch.mesh.n_cores)
    layers = _moe_layer_indices(n_layers, moe_layers)
    if not (math.isfinite(expert_flops_per_token) and expert_flops_per_token > 0):
        raise BadInput("expert_flops_per_token must be > 0", field="expert_flops_per_token")
    geom = ChipGeometry.of(arch)
    n = geom.n_cores
    notes: list[str] = []
    if H is None:  # library use without the thermal service's H (the placement service always passes it)
        H, source = analytic_influence(arch), "analytic"
        notes.append("H: analytic single-layer resistor kernel (no influence matrix given)")
    else:
        source = "given"
    H = check_h(H, n)

    steps_per_s = 1e3 / wl.sequence.step_interval_ms
    k_hot = min(taps.replicate_hot_k if replicate_hot_k is None else replicate_hot_k, n_experts) if n >= 2 else 0
    inst_expert, tok_step = _instances(loads, k_hot, routed_tokens_per_step(wl))
    expert_layer = np.repeat(np.asarray(layers), n_experts)
    expert_e = np.tile(np.arange(n_experts), n_layers)
    flops = tok_step * steps_per_s * expert_flops_per_token  # FLOP/s per instance
    e_compute, e_ctrl, e_vault = instance_energy(arch, tok_step, expert_flops_per_token, float(expert_bytes))
    flops, steps_per_s, cap = _sustainable_rates(flops, steps_per_s, taps.capacity.core_flops_tps, n, notes)
    flops, steps_per_s = _streamable_rates(
        flops, steps_per_s, inst_expert.shape[0] * float(expert_bytes) + nonexpert_bytes_per_step,
        vault_bw_raw_gbps(arch) * 1e9, notes)
    Hv = None if H_vault is None else check_h(H_vault, n)
    inst_copies = None
    vault_cap = math.inf
    read_dies = H_reads = None
    if expert_bytes > 0:
        vault_cap, shards_per_vault = _vault_capacity(arch, wl, geom, int(expert_bytes), int(inst_expert.shape[0]))
        inst_copies = np.ones(inst_expert.shape[0])
        if Hv is not None and vault_influence is not None:  # the mean vault's shards
            read_dies = read_die_profile(geom, shards_per_vault)
            H_reads = check_h(vault_influence(read_dies), n)
    base = base_power(arch, H, Hv, steps_per_s, nonexpert_flops_per_step, nonexpert_bytes_per_step,
                      float(e_compute.sum()) * steps_per_s, float(e_ctrl.sum()) * steps_per_s,
                      float(e_vault.sum()) * steps_per_s, H_reads)
    notes.extend(base.notes)
    # the instances' MACs and scratchpad accesses at the cores' mean (V/V0)²: exact when every core settles at one
    # DVFS level (both shipped chips; a placement that moves a core across a trip is not modelled)
    e_logic = e_compute * float(base.dyn_scale.mean()) + e_ctrl
    power_w = (e_logic + e_vault) * steps_per_s  # W, mean
    # the instances' heat (the base field's is in t_base): their vault share where their shards are
    H_inst = stripe_influence(instance_influence(H, Hv if H_reads is None else H_reads, e_logic, e_vault), arch)
    inst_time = inst_budget = None
    if critical_path_tol is not None:
        inst_time, inst_budget = layer_budgets(arch, taps, tok_step * expert_flops_per_token, expert_bytes,
                                               expert_layer[inst_expert], critical_path_tol)
    obj = taps.objective
    return Problem(geom=geom, H=H_inst, H_core=H, base_field=base, t_base=base.t_base_c, w_peak=obj.w_peak,
                   w_var=obj.w_var, w_smooth=obj.w_smooth,
                   inst_expert=inst_expert, inst_power=power_w, inst_flops=flops, inst_tokens_step=tok_step,
                   expert_layer=expert_layer, expert_e=expert_e, cap_flops=cap, steps_per_s=steps_per_s,
                   t_amb=arch.geometry.cooling.ambient_c, notes=notes, h_source=source, inst_time=inst_time,
                   inst_budget=inst_budget, inst_copies=inst_copies, vault_cap=vault_cap, inst_e_logic=e_logic,
                   inst_e_vault=e_vault, read_dies=read_dies, H_vault_reads=H_reads,
                   stripe=arch.schedule.expert_stripe)


def _moe_layer_indices(n_layers: int, moe_layers: Sequence[int] | None) -> list[int]:
    """The model layer of each row of the load profile (default ``0..L-1``): as many as rows, distinct, >= 0."""
    layers = list(range(n_layers)) if moe_layers is None else [int(x) for x in moe_layers]
    if len(layers) != n_layers:
        raise BadInput(f"moe_layers lists {len(layers)} layers but expert_load has {n_layers}", field="moe_layers")
    if len(set(layers)) != len(layers) or any(x < 0 for x in layers):
        raise BadInput("moe_layers must be distinct non-negative layer indices", field="moe_layers")
    return layers


def _instances(loads: np.ndarray, k_hot: int, tokens_per_step: float) -> tuple[np.ndarray, np.ndarray]:
    """(the expert of each instance, its expected routed tokens per step): one instance per expert, two for the
    ``k_hot`` most loaded experts of each layer, which share their expert's tokens evenly."""
    n_layers, n_experts = loads.shape
    share = loads / loads.sum(axis=1, keepdims=True)
    n_rep = np.ones((n_layers, n_experts), dtype=np.int64)
    if k_hot:
        hot = np.argsort(-loads, axis=1, kind="stable")[:, :k_hot]
        np.put_along_axis(n_rep, hot, 2, axis=1)
    reps = n_rep.ravel()
    inst_expert = np.repeat(np.arange(n_layers * n_experts), reps)
    tok_step = (share.ravel() * tokens_per_step / reps)[inst_expert]
    return inst_expert, tok_step


def _sustainable_rates(flops: np.ndarray, steps_per_s: float, cap: float, n_cores: int, notes: list[str]
                       ) -> tuple[np.ndarray, float, float]:
    """(instance FLOP/s, steps/s, per-core FLOP/s capacity) the chip sustains: when demand exceeds the chip, every
    rate scaled to a mean utilisation of 1/CAPACITY_HEADROOM; a per-core capacity below the busiest instance relaxed
    to it. Each adjustment is noted."""
    total = float(flops.sum())
    if total > cap * n_cores:
        # the chip saturates: work queues and the sustained rate is what heats it. Scale every rate so the mean
        # core utilisation is 1/CAPACITY_HEADROOM (room for the packing to respect per-core capacity).
        rho = cap * n_cores / (total * CAPACITY_HEADROOM)
        notes.append(f"demand {total:.3g} FLOP/s exceeds the chip's {cap * n_cores:.3g} FLOP/s: rates scaled by "
                     f"{rho:.3g} to the sustainable throughput (mean core utilisation {1 / CAPACITY_HEADROOM:.0%})")
        flops = flops * rho
        steps_per_s = steps_per_s * rho  # micro-batches keep their size; fewer of them per second
    if flops.size and flops.max() > cap:
        notes.append(f"the busiest instance needs {flops.max():.3g} FLOP/s, more than a core's {cap:.3g}: per-core "
                     "capacity relaxed to it")
        cap = float(flops.max()) * (1 + 1e-9)
    return flops, steps_per_s, cap


def _streamable_rates(flops: np.ndarray, steps_per_s: float, bytes_per_step: float, stream_bps: float,
                      notes: list[str]) -> tuple[np.ndarray, float]:
    """(instance FLOP/s, steps/s) within the DRAM bandwidth: every step streams ``bytes_per_step`` (each instance's
    whole copy of its expert's weights, decode's cost, and the non-expert bytes) from the vaults, whose sum is
    ``stream_bps`` (bytes/s: `shared.chip.vault_bw_raw_gbps`). A step rate above ``stream_bps / bytes_per_step`` is
    not one the chip can run (the roofline); like `_sustainable_rates`' FLOP bound, every rate is then scaled to a
    mean utilisation of 1/CAPACITY_HEADROOM of it, and the note says so. Without it a workload whose nominal step
    rate no chip reaches (a serving workload's ``sequence``, which its run does not use) is modelled as reading
    far more than the vaults deliver: every bank "busy", shards spilled to other vaults, a mean field of hundreds
    of °C."""
    demand = bytes_per_step * steps_per_s
    if bytes_per_step <= 0 or demand <= stream_bps:
        return flops, steps_per_s
    rho = stream_bps / (demand * CAPACITY_HEADROOM)
    notes.append(f"demand {demand:.3g} B/s of weight and activation streams exceeds the vaults' {stream_bps:.3g} "
                 f"B/s: rates scaled by {rho:.3g} to the streamable step rate (mean vault utilisation "
                 f"{1 / CAPACITY_HEADROOM:.0%})")
    return flops * rho, steps_per_s * rho


def _vault_capacity(arch: ArchConfig, wl: WorkloadConfig, geom: ChipGeometry, expert_bytes: int,
                    n_instances: int) -> tuple[float, float]:
    """(expert copies one core's vault holds, weight shards per vault on average); BadInput when a shard fits no
    bank or the copies do not fit the chip.

    Counted in expert copies packed by bytes (`shards.pack_banks`: a bank holds as many shards as fit): every
    instance holds one copy of the same shards, so a vault's capacity is the copies its banks hold, and a core's
    instances within it keep their shards in its vault (no read over the NoC from a remote one)."""
    sizes = shard_sizes(expert_bytes, wl.tensors.weight_shard_mb)
    bank_cap = arch.dram.bank_capacity_mb * MIB
    if max(sizes) > bank_cap:
        raise BadInput(f"a weight shard of {max(sizes) / MIB:.0f} MiB does not fit a {bank_cap / MIB:.0f} MiB "
                       "bank: lower workload.tensors.weight_shard_mb", field="workload.tensors.weight_shard_mb")
    check_fits(n_instances, sizes, bank_cap, geom)
    vault_cap = float(vault_copies(sizes, bank_cap, geom.vault_banks))
    return vault_cap, n_instances * len(sizes) / geom.n_cores


def work_energy(arch: ArchConfig, macs: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute J at V0, controller J, vault J) of pieces of work of ``macs`` MACs streaming ``nbytes`` from the
    local vault, priced as the physicalizer prices a piece (shared/energy.py): MACs at ``mac_pj`` and the scratchpad
    accesses of both (``spm_accesses``), at the reference voltage V0 (the thermal service scales them by ``(V/V0)²``,
    ``shared.dvfs.dynamic_scale``); the DRAM access energy of the bytes split by ``dram.energy_split``: the
    controller share on the logic core, the array and TSV/IO shares in the vault (not voltage-scaled)."""
    em = EnergyModel.from_arch(arch)
    R, C = arch.core.array
    spm = spm_accesses(macs, nbytes, R, C, dtype_bytes(arch.core.dtype, "arch.core.dtype"))
    dram = nbytes * em.dram_j_per_byte
    return (np.asarray(em.compute_j(macs, spm), dtype=float), np.asarray(em.split_controller * dram, dtype=float),
            np.asarray((em.split_array + em.split_tsv_io) * dram, dtype=float))


@dataclass(frozen=True)
class BaseField:
    """The placement-independent power TAPS's temperatures sit on (`base_power`)."""

    core_w: np.ndarray  # (n,) W on the logic die under each core
    vault_w: np.ndarray  # (n,) W in each core's vault (DRAM dies)
    temps_c: np.ndarray  # (n,) °C: the predicted mean field (base + the instances' power spread evenly)
    t_base_c: np.ndarray  # (n,) °C: ambient + the base alone (core_w through H, vault_w through H_vault)
    levels: np.ndarray  # (n,) the DVFS level each core settles at on that field
    dyn_scale: np.ndarray  # (n,) (V/V0)² at that level
    notes: list[str]


BASE_FIELD_PASSES = 60  # fixed-point passes at most (to < 1 mK: 3 on the default chip, 8 on the seed's)
# the passes price leakage at most at this temperature: a field past it has run away (leakage growing faster than the
# stack removes its heat, no steady state without throttling); far beyond any part's rating (silicon's junction
# limit is ~150 degC), low enough that every power stays finite
RUNAWAY_C = 500.0


def instance_influence(H: np.ndarray, H_vault: np.ndarray | None, e_logic: np.ndarray,
                       e_vault: np.ndarray) -> np.ndarray:
    """(n, n) K/W: the rise at core i per W of an instance on core j, ``a·H + (1 − a)·H_vault`` with
    ``a = Σ e_logic / Σ (e_logic + e_vault)`` the instances' logic share of their energy: its MACs, scratchpad and
    DRAM controller heat the logic die under the core (``H``), the array and TSV/IO shares of its weight reads the
    core's vault in the DRAM dies (``H_vault``). One mix for every instance keeps the optimisers' single column per
    core; an instance's own share differs from the mean (decode: more tokens, more MACs against the same stream),
    so the split is exact for the total, not per instance (the slot model, which picks among the candidates, keeps
    the two apart). Without ``H_vault`` (library use): ``H``. ``build_problem`` passes the vault matrix of the
    dies the bank book fills (`shards.read_die_profile`). The seed's chip (DRAM at 2 W/(m·K)) is where it matters:
    with the reads' heat counted at the core TAPS's mean field was 11.5 K above the simulated one, spread evenly over
    a vault's eight dies 9.8 K, in the dies the book fills (nearest the sink) 2.1 K (measured on two micro-batches;
    ``tests/orchestrator/test_policy_model.py`` bounds the hottest core's error on that chip)."""
    if H_vault is None:
        return H
    tot = float(e_logic.sum() + e_vault.sum())
    a = float(e_logic.sum()) / tot if tot > 0 else 1.0
    return np.asarray(a * H + (1.0 - a) * H_vault, dtype=float)


def stripe_influence(H_inst: np.ndarray, arch: ArchConfig) -> np.ndarray:
    """Striped experts (``arch.schedule.expert_stripe`` = k > 1): an instance "on core j" stands for its expert
    striped over j's stripe group (`shared.chip.stripe_groups`), its power spread evenly over the group's k cores and
    their vaults, so column j becomes the mean of the group's columns. Every core of a group is then the same target;
    the per-core capacities (FLOP/s, vault copies) summed over a group are the group's (a striped copy takes 1/k of
    each of its k vaults), so the optimisers' per-core constraints bound the groups' totals. The layer budgets stay
    per core (an approximation: a group runs its instances one after another, each on all k cores). k = 1: as
    given."""
    groups = stripe_groups(arch)
    if groups.shape[1] == 1:
        return H_inst
    mean = H_inst[:, groups].mean(axis=2)  # (n, groups)
    return np.asarray(np.repeat(mean, groups.shape[1], axis=1), dtype=float)


def base_power(arch: ArchConfig, H: np.ndarray, H_vault: np.ndarray | None, steps_per_s: float,
               nonexpert_flops_per_step: float, nonexpert_bytes_per_step: float,
               expert_compute_w: float, expert_ctrl_w: float, expert_vault_w: float,
               H_vault_reads: np.ndarray | None = None) -> BaseField:
    """The placement-independent power TAPS's temperatures sit on, per core on the logic die and per vault.

    - Non-expert work (attention with its KV traffic, router, shared/dense FFN, head): per micro-batch step
      ``nonexpert_flops_per_step`` FLOPs and ``nonexpert_bytes_per_step`` DRAM bytes, split over the attention
      cores (``shared.chip.attention_share``) and read from each core's own vault, priced by `work_energy`, times
      ``steps_per_s``.
    - Static power (``shared.energy.static_power``, the thermal service's own model): logic leakage per core at its
      voltage, DRAM leakage and refresh of each vault's banks; a vault's banks are taken at its core's temperature
      (the stack is a few hundred µm thick).
    - The DVFS level of each core (``shared.dvfs``, the governor the thermal service steps every window): the
      compute energy (non-expert and the instances', ``expert_compute_w`` at V0) scales by ``(V/V0)²`` at it,
      leakage by the voltage.

    All at the temperatures of the mean field (the base plus the instances' power spread evenly over the cores: the
    placement moves it, not its total; ``expert_compute_w`` scaled and ``expert_ctrl_w`` on the logic die,
    ``expert_vault_w`` in the vaults, through ``H_vault_reads``, the dies the bank book fills, when given), by
    fixed-point
    iteration from 45 °C at level 0 (where the thermal service's warm start begins), stepping the governor once a
    pass, until the levels hold and the field moves < 1 mK (leakage changes by ~1 %/K: a few passes), at most
    ``BASE_FIELD_PASSES`` (a field that does not settle is noted, with its cause, and its last pass used: the levels,
    their scale and the powers priced at them belong together)."""
    n = arch.mesh.n_cores
    share = attention_share(arch)
    e_comp, e_ctrl, e_vault = work_energy(arch, share * nonexpert_flops_per_step / 2, share * nonexpert_bytes_per_step)
    Hv = H if H_vault is None else H_vault
    Hr = Hv if H_vault_reads is None else H_vault_reads  # the instances' weight reads (build_problem)
    banks = ChipGeometry.of(arch).vault_banks
    t_amb = arch.geometry.cooling.ambient_c
    T = np.full(n, 45.0)
    levels = np.zeros(n, dtype=int)
    notes: list[str] = []
    for k in range(BASE_FIELD_PASSES):
        f, V = freq_volt(levels, arch)  # this pass's levels: returned with the scale and powers priced at them
        scale = dynamic_scale(V, arch)
        leak, bank_leak, bank_ref = static_power(arch, T, T, V)
        core_w = (e_comp * scale + e_ctrl) * steps_per_s + leak
        vault_w = e_vault * steps_per_s + (bank_leak + bank_ref) * banks
        expert_logic_w = expert_compute_w * float(scale.mean()) + expert_ctrl_w
        t_base = t_amb + H @ core_w + Hv @ vault_w
        T_new = np.minimum(t_base + H @ np.full(n, expert_logic_w / n) + Hr @ np.full(n, expert_vault_w / n),
                           RUNAWAY_C)  # leakage is priced at most there: every power of the next pass stays finite
        new_levels = step_levels(T_new, levels, arch)
        held = np.array_equal(new_levels, levels)
        moved = float(np.abs(T_new - T).max())
        T = T_new
        if held and moved < 1e-3:
            break
        if k == BASE_FIELD_PASSES - 1:
            cause = ("the DVFS levels kept changing (a governor cycling between levels)" if not held else
                     f"the field still moved {moved:.3g} K a pass (leakage feeding back on temperature)")
            notes.append(f"base field: not settled in {BASE_FIELD_PASSES} passes: {cause}; the last pass is used")
            break
        levels = new_levels
    if float(T.max()) >= RUNAWAY_C:
        notes.append(f"base field: runs away (leakage feeding back on temperature past {RUNAWAY_C:g} °C at the "
                     "DVFS levels it settles at): there is no steady state without the DTM limit's clock "
                     "modulation, which TAPS does not model; its temperatures are capped there (the run's DTM "
                     "throttles the chip)")
    if levels.any():
        notes.append(f"DVFS: the predicted mean field ({T.min():.1f}-{T.max():.1f} °C) holds the cores at "
                     f"{f.min():g}-{f.max():g} GHz: compute energy priced at (V/V0)² = {scale.min():.3g}-"
                     f"{scale.max():.3g}")
    return BaseField(core_w=core_w, vault_w=vault_w, temps_c=T, t_base_c=t_base, levels=levels, dyn_scale=scale,
                     notes=notes)


def instance_energy(arch: ArchConfig, tok_step: np.ndarray, expert_flops_per_token: float,
                    expert_bytes: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute J at V0, controller J, vault J) per micro-batch step of each instance, priced as the physicalizer
    prices its pieces (`work_energy`, shared/energy.py): ``macs = tokens·flops_per_token/2`` at ``mac_pj``; the
    scratchpad accesses of those MACs and of the weight stream (``spm_accesses``); the stream itself,
    ``P(active)·expert_bytes`` at the DRAM access energy (decode reads every weight of an expert it routes a token
    to; ``P(active) = 1 − e^(−tokens)``, Poisson arrivals of the expected ``tokens`` per step), split by
    ``dram.energy_split``: the controller share on the logic core, the array and TSV/IO shares in the vault."""
    macs = tok_step * expert_flops_per_token / 2
    stream = -np.expm1(-tok_step) * expert_bytes
    return work_energy(arch, np.asarray(macs, dtype=float), np.asarray(stream, dtype=float))


def layer_budgets(arch: ArchConfig, taps: TapsParams, flops_step: np.ndarray, expert_bytes: float,
                  inst_layer: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Per instance: its time per step, ``t_i = max(flops_i / core_flops_tps, expert_bytes / vault_bw)`` (s; compute
    or the stream of its whole copy of the weights, whichever is longer: decode is the second), and its layer's
    budget on one core, ``(1 + tol) · max_(i in layer) t_i``: the layer's critical path in the load-balanced
    placement, where every instance of a layer has a core of its own (``instances ≤ cores``; a layer with more
    instances than cores gets ``(1 + tol) · Σ t_i / cores`` or its longest instance, whichever is larger). On a
    striped chip the units are the stripe groups (each instance on all of its group's cores, at k times the bandwidth
    and compute: times and budgets alike divided by k, so kept per core and summed per group, `_layer_time`)."""
    n = arch.mesh.n_cores // arch.schedule.expert_stripe
    t = np.maximum(flops_step / taps.capacity.core_flops_tps, expert_bytes / (arch.dram.vault_bw_gbps * 1e9))
    budget = np.empty_like(t)
    for layer in np.unique(inst_layer):
        sel = inst_layer == layer
        bound = max(float(t[sel].max()), float(t[sel].sum()) / n) if sel.sum() > n else float(t[sel].max())
        budget[sel] = (1.0 + tol) * bound
    return t, budget


# --------------------------------------------------------------------------------------------------------------------
# heuristic: heat-ordered greedy + local search


def _layer_time(pb: Problem, assign: np.ndarray) -> np.ndarray | None:
    """(instances, cores): the time per step of instance i's layer already on each core (excluding nothing); on a
    striped chip, on each core's group (`per_group`)."""
    if pb.inst_time is None:
        return None
    layer = pb.expert_layer[pb.inst_expert]
    keys, inv = np.unique(layer, return_inverse=True)
    lt = np.zeros((keys.size, pb.n))
    placed = assign >= 0
    np.add.at(lt, (inv[placed], assign[placed]), pb.inst_time[placed])
    return np.asarray(per_group(lt, pb.stripe)[inv])


def _swap_cores(assign: np.ndarray, load: np.ndarray, h: int, b: int, stripe: int) -> None:
    """Swap what cores h and b run, and their loads; on a striped chip (``stripe`` > 1) what their groups run, each
    core with the one in the same position of the other group (per-core loads and copies swap with them)."""
    gh, gb = h // stripe * stripe, b // stripe * stripe
    for off in range(stripe) if stripe > 1 else (None,):
        c, d = (h, b) if off is None else (gh + off, gb + off)
        on_c, on_d = assign == c, assign == d
        load[c], load[d] = load[d], load[c]
        assign[on_c] = d
        assign[on_d] = c


def per_group(x: np.ndarray, stripe: int) -> np.ndarray:
    """``x`` (..., cores) summed over each stripe group of ``stripe`` consecutive cores, the sum on every core of the
    group (``stripe`` 1: ``x``)."""
    if stripe == 1:
        return x
    shape = x.shape
    sums = x.reshape(*shape[:-1], shape[-1] // stripe, stripe).sum(axis=-1)
    return np.asarray(np.repeat(sums, stripe, axis=-1), dtype=float)


def _sibling_cores(pb: Problem, assign: np.ndarray, i: int) -> np.ndarray:
    """Boolean (n,) mask of the cores holding another replica of instance i's expert."""
    mask = np.zeros(pb.n, dtype=bool)
    sib = np.flatnonzero(pb.inst_expert == pb.inst_expert[i])
    for s in sib:
        if s != i and assign[s] >= 0:
            mask[assign[s]] = True
    return mask


def greedy(pb: Problem) -> tuple[np.ndarray, int]:
    """Place instances hottest first, each on the core that minimises the objective so far.
    Returns (assignment (m,), number of capacity violations)."""
    order = np.argsort(-pb.inst_power, kind="stable")
    assign = np.full(pb.m, -1, dtype=np.int64)
    load = np.zeros(pb.n)
    T = pb.t_base.copy()
    cores = np.arange(pb.n)
    has_rep = np.bincount(pb.inst_expert, minlength=int(pb.inst_expert.max()) + 1) > 1
    violations = 0
    vcopies = np.zeros(pb.n)
    _, layer_of = np.unique(pb.expert_layer[pb.inst_expert], return_inverse=True)
    members = [np.flatnonzero(layer_of == k) for k in range(int(layer_of.max()) + 1)] if pb.m else []
    for i in order:
        w = pb.inst_power[i]
        f = pb.inst_flops[i]
        objs = pb.delta_objective(T, cores, None, np.full(pb.n, w))
        ok = load + f <= pb.cap_flops * (1 + 1e-12)
        if pb.inst_copies is not None:
            fits = vcopies + pb.inst_copies[i] <= pb.vault_cap * (1 + 1e-12)
            if (ok & fits).any():
                ok &= fits
            else:
                violations += 1
        if pb.inst_time is not None and pb.inst_budget is not None:
            # instance i's row of `_layer_time` from its layer's instances alone (the same sums, in the same order)
            mates = members[int(layer_of[i])]
            at = assign[mates]
            row = np.zeros(pb.n)
            np.add.at(row, at[at >= 0], pb.inst_time[mates[at >= 0]])
            within = per_group(row, pb.stripe) + pb.inst_time[i] <= pb.inst_budget[i] * (1 + 1e-12)
            if (ok & within).any():
                ok &= within
            else:
                violations += 1
        if has_rep[pb.inst_expert[i]]:
            sib = _sibling_cores(pb, assign, int(i))
            ok &= ~sib
            if not ok.any():
                ok = ~sib
                violations += 1
        elif not ok.any():
            ok = np.ones(pb.n, dtype=bool)
            violations += 1
        c = int(np.argmin(np.where(ok, objs, np.inf)))
        assign[i] = c
        load[c] += f
        if pb.inst_copies is not None:
            vcopies[c] += pb.inst_copies[i]
        T += w * pb.H[:, c]
    return assign, violations


LS_WORK_BUDGET = 3e7  # evaluated (candidate x core) entries per local search: bounds its time on huge problems


def local_search(pb: Problem, assign: np.ndarray, iters: int, *, hot_cores: int = 3, movers: int = 8,
                 work_budget: float = LS_WORK_BUDGET) -> np.ndarray:
    """Improve ``assign`` by moves and swaps that lower the objective, working on the hottest cores first.

    Each iteration looks at the ``hot_cores`` hottest cores, then the mesh neighbours of the hottest one (their heat
    spreads into it), in turn; for the ``movers`` most powerful instances on one it scores, vectorised, every move to
    another core and every swap with a less powerful instance on one of the ``max(8, n/4)`` coolest cores, plus
    swapping the whole contents of the core with another core's, and applies the best strictly improving candidate
    of the first core that has one. Stops after ``iters`` applied changes, when none improves, or when the evaluated
    (candidates × cores) entries exceed ``work_budget`` (deterministic, bounds the time on huge problems).
    """
    search = _LocalSearch(pb, assign.copy())
    hop1 = hops_matrix(pb.geom.mesh_x, pb.geom.mesh_y) == 1
    n_cool = max(8, pb.n // 4)
    for _ in range(iters):
        if search.work > work_budget:
            break
        search.start_iteration(n_cool)
        best: _Candidate | None = None
        temps = search.temps
        hot = [int(x) for x in np.argsort(-temps, kind="stable")[:hot_cores]]
        around = [int(x) for x in np.flatnonzero(hop1[hot[0]]) if int(x) not in hot]
        for h in hot + sorted(around, key=lambda c: -temps[c]):
            best = search.best_from_core(h, movers, best)
            if best is not None:
                break
        if best is None:
            break
        search.apply(best)
    return search.assign


_Candidate = tuple[float, str, int, int]  # (objective after it, "cores" | "move" | "swap", h or i, b or j)


class _LocalSearch:
    """The local search's state: the assignment, each core's load (FLOP/s) and predicted temperature (°C), the
    objective, and the (candidates × cores) entries evaluated so far."""

    def __init__(self, pb: Problem, assign: np.ndarray) -> None:
        self.pb = pb
        self.assign = assign
        self.load = np.bincount(assign, weights=pb.inst_flops, minlength=pb.n)
        self.temps = pb.temps(assign)
        self.cur = pb.objective(self.temps)
        self.cores = np.arange(pb.n)
        self.cap = pb.cap_flops * (1 + 1e-12)
        self.multi = np.bincount(pb.inst_expert)[pb.inst_expert] > 1  # (m,) instance has a sibling replica
        self.layer_of = pb.expert_layer[pb.inst_expert]
        self.work = 0  # candidate temperature vectors evaluated x cores: a deterministic budget
        # per iteration (`start_iteration`)
        self.layer_time: np.ndarray | None = None
        self.vault_copies: np.ndarray | None = None
        self.cool_mask = np.zeros(pb.n, dtype=bool)

    def start_iteration(self, n_cool: int) -> None:
        pb = self.pb
        # per-layer time on every core (the critical-path budget), None without one
        self.layer_time = _layer_time(pb, self.assign)
        self.vault_copies = (None if pb.inst_copies is None
                             else np.bincount(self.assign, weights=pb.inst_copies, minlength=pb.n))
        self.cool_mask = np.zeros(pb.n, dtype=bool)
        self.cool_mask[np.argsort(self.temps, kind="stable")[:n_cool]] = True

    def _improves(self, obj: float, best: _Candidate | None) -> bool:
        """Strictly better than the current objective (by a relative 1e-9) and than the best candidate so far."""
        return bool(obj < self.cur - 1e-9 * max(1.0, abs(self.cur)) and (best is None or obj < best[0]))

    def best_from_core(self, h: int, movers: int, best: _Candidate | None) -> _Candidate | None:
        """The best candidate so far after scoring core h's: swapping its contents with another core's, then moving
        or swapping each of its ``movers`` most powerful instances."""
        pb = self.pb
        on_h = np.flatnonzero(self.assign == h)
        if on_h.size == 0:
            return best
        best = self._core_swap(h, best)
        on_h = on_h[np.argsort(-pb.inst_power[on_h], kind="stable")[:movers]]
        for i in (int(x) for x in on_h):
            best = self._move(i, h, best)
            best = self._swap(i, h, best)
        return best

    def _core_swap(self, h: int, best: _Candidate | None) -> _Candidate | None:
        """Swap the whole contents of h with another core (always feasible: loads and replicas swap together); on a
        striped chip of h's group with another group, core by core (`_swap_cores`)."""
        pb, cores = self.pb, self.cores
        core_w = per_group(np.bincount(self.assign, weights=pb.inst_power, minlength=pb.n), pb.stripe)
        cobjs = pb.delta_objective(self.temps, cores, np.full(pb.n, h), core_w[h] - core_w)
        cobjs[cores // pb.stripe == h // pb.stripe] = np.inf
        b = int(np.argmin(cobjs))
        if self._improves(cobjs[b], best):
            return (float(cobjs[b]), "cores", h, b)
        return best

    def _move(self, i: int, h: int, best: _Candidate | None) -> _Candidate | None:
        """Moves of instance i from h to any core b within capacity, replica, layer-budget and vault rules."""
        pb, cores = self.pb, self.cores
        power_w = pb.inst_power[i]
        objs = pb.delta_objective(self.temps, cores, np.full(pb.n, h), np.full(pb.n, power_w))
        self.work += pb.n * pb.n
        ok = (self.load + pb.inst_flops[i] <= self.cap) & (cores != h)
        if self.multi[i]:
            ok &= ~_sibling_cores(pb, self.assign, i)
        if self.layer_time is not None and pb.inst_time is not None and pb.inst_budget is not None:
            ok &= self.layer_time[i] + pb.inst_time[i] <= pb.inst_budget[i] * (1 + 1e-12)
        if self.vault_copies is not None and pb.inst_copies is not None:
            ok &= self.vault_copies + pb.inst_copies[i] <= pb.vault_cap * (1 + 1e-12)
        if ok.any():
            b = int(np.argmin(np.where(ok, objs, np.inf)))
            if self._improves(objs[b], best):
                return (float(objs[b]), "move", i, b)
        return best

    def _swap(self, i: int, h: int, best: _Candidate | None) -> _Candidate | None:
        """Swaps of instance i (on h) with a less powerful instance j on one of the coolest cores."""
        pb, assign, load, cap = self.pb, self.assign, self.load, self.cap
        power_w = pb.inst_power[i]
        js = np.flatnonzero(self.cool_mask[assign] & (assign != h) & (pb.inst_power < power_w))
        if js.size == 0:
            return best
        self.work += js.size * pb.n
        bj = assign[js]
        dw = power_w - pb.inst_power[js]
        sobjs = pb.delta_objective(self.temps, bj, np.full(js.size, h), dw)
        df = pb.inst_flops[i] - pb.inst_flops[js]
        sok = (load[bj] + df <= cap) & (load[h] - df <= cap)
        if self.multi[i]:
            sok &= ~_sibling_cores(pb, assign, i)[bj]
        if self.multi[js].any():
            for t in (int(x) for x in np.flatnonzero(self.multi[js])):
                if _sibling_cores(pb, assign, int(js[t]))[h]:
                    sok[t] = False
        lt = self.layer_time
        if lt is not None and pb.inst_time is not None and pb.inst_budget is not None:
            ti, tj = pb.inst_time[i], pb.inst_time[js]
            same = self.layer_of[js] == self.layer_of[i]
            # i lands on bj (leaving j's time there when j is of its layer); j lands on h likewise
            sok &= lt[i][bj] - np.where(same, tj, 0.0) + ti <= pb.inst_budget[i] * (1 + 1e-12)
            sok &= lt[js, h] - np.where(same, ti, 0.0) + tj <= pb.inst_budget[js] * (1 + 1e-12)
        vb = self.vault_copies
        if vb is not None and pb.inst_copies is not None:
            db = pb.inst_copies[i] - pb.inst_copies[js]
            sok &= (vb[bj] + db <= pb.vault_cap * (1 + 1e-12)) & (vb[h] - db <= pb.vault_cap * (1 + 1e-12))
        if sok.any():
            t = int(np.argmin(np.where(sok, sobjs, np.inf)))
            if self._improves(sobjs[t], best):
                return (float(sobjs[t]), "swap", i, int(js[t]))
        return best

    def apply(self, best: _Candidate) -> None:
        """Make the chosen change, updating loads and temperatures incrementally, then the objective."""
        pb, assign, load, temps = self.pb, self.assign, self.load, self.temps
        _, kind, i, x = best
        if kind == "cores":
            h, b = i, x
            core_w = per_group(np.bincount(assign, weights=pb.inst_power, minlength=pb.n), pb.stripe)
            temps += (core_w[h] - core_w[b]) * (pb.H[:, b] - pb.H[:, h])
            _swap_cores(assign, load, h, b, pb.stripe)
        elif kind == "move":
            h, b = int(assign[i]), x
            load[h] -= pb.inst_flops[i]
            load[b] += pb.inst_flops[i]
            temps += pb.inst_power[i] * (pb.H[:, b] - pb.H[:, h])
            assign[i] = b
        else:
            h, j = int(assign[i]), x
            b = int(assign[j])
            df = pb.inst_flops[i] - pb.inst_flops[j]
            load[h] -= df
            load[b] += df
            temps += (pb.inst_power[i] - pb.inst_power[j]) * (pb.H[:, b] - pb.H[:, h])
            assign[i], assign[j] = b, h
        self.cur = pb.objective(temps)


# --------------------------------------------------------------------------------------------------------------------
# output


def assemble(pb: Problem, assign: np.ndarray, *, arch: ArchConfig, expert_bytes: int, weight_shard_mb: float,
             bank_bw_gbps: float, method: str, extra_notes: Sequence[str] = (),
             gap: float | None = None) -> Placement:
    """Turn an assignment into ``placement.json``: cores per expert, shards in banks, predicted temperatures."""
    geom = pb.geom
    book = BankBook(geom, arch.dram.bank_capacity_mb * MIB, bank_bw_gbps * 1e9)
    sizes = shard_sizes(int(expert_bytes), weight_shard_mb)
    n_exp = int(pb.expert_layer.shape[0])
    groups = stripe_groups(arch)
    if groups.shape[1] > 1:
        return _assemble_striped(pb, assign, groups, arch=arch, sizes=sizes, bank_bw_gbps=bank_bw_gbps, method=method,
                                 extra_notes=extra_notes, gap=gap)
    cores_of: list[list[int]] = [[] for _ in range(n_exp)]
    for i in range(pb.m):  # replica order = instance order
        cores_of[int(pb.inst_expert[i])].append(int(assign[i]))
    experts = {
        expert_id(int(pb.expert_layer[k]), int(pb.expert_e[k])): ExpertPlacement(
            cores=cores_of[k], policy="replicate" if len(cores_of[k]) > 1 else "single")
        for k in range(n_exp)
    }
    # shards: hottest (most read) instances pick banks first; demand = bytes/step · P(instance active in a step)
    p_active = 1.0 - np.exp(-pb.inst_tokens_step)
    first = np.zeros(pb.m, dtype=np.int64)  # replica index of each instance
    seen: dict[int, int] = {}
    for i in range(pb.m):
        k = int(pb.inst_expert[i])
        first[i] = seen.get(k, 0)
        seen[k] = first[i] + 1
    # a vault with more shards than banks shares banks (packed by bytes): there its shards the size of the largest
    # go first (first-fit decreasing), so that a remainder never takes the bank a whole shard needs and no shard
    # spills while the vault's capacity (`shards.vault_copies`) holds; a vault with a bank for every shard keeps
    # the instances' order
    tight = np.bincount(assign, minlength=pb.n) * len(sizes) > geom.vault_banks
    hot = np.argsort(-p_active, kind="stable")
    order = [(int(i), s) for i in hot for s in range(len(sizes))]
    if tight.any() and len(set(sizes)) > 1:
        later = [tight[assign[i]] and sizes[s] < sizes[0] for i, s in order]
        order = [o for o, d in zip(order, later, strict=True) if not d] + \
            [o for o, d in zip(order, later, strict=True) if d]
    banks: dict[tuple[int, int, int], str] = {}
    for i, s in order:
        size = sizes[s]
        v, slot = book.place(int(assign[i]), size, size * pb.steps_per_s * p_active[i])
        banks[(int(pb.inst_expert[i]), int(first[i]), s)] = geom.slot_bank_id(v, slot)
    tensors: dict[str, TensorPlacement] = {}
    for k in range(n_exp):
        layer, e = int(pb.expert_layer[k]), int(pb.expert_e[k])
        nrep = len(cores_of[k])
        for s, size in enumerate(sizes):
            tensors[weight_tensor_id(layer, e, s)] = TensorPlacement(
                dram_bank=banks[(k, 0, s)], size_bytes=size,
                replica_banks=[banks[(k, r, s)] for r in range(1, nrep)] if nrep > 1 else None)
    return Placement(experts=experts, tensors=tensors,
                     meta=_meta(pb, assign, book, method=method, extra_notes=extra_notes, gap=gap))


def _meta(pb: Problem, assign: np.ndarray, book: BankBook, *, method: str, extra_notes: Sequence[str],
          gap: float | None) -> PlacementMeta:
    """What TAPS predicts of an assignment: the core temperatures and powers, the objective's terms."""
    T = pb.temps(assign)
    terms = pb.terms(T)
    load = np.bincount(assign, weights=pb.inst_flops, minlength=pb.n)
    terms.update({
        "peak_rise_k": float(T.max() - pb.t_amb),
        "total_power_w": float(pb.inst_power.sum()),
        "capacity_util_max": float(load.max() / pb.cap_flops),
        "bank_bw_util_max": book.bw_util_max(),
    })
    return PlacementMeta(method=method, predicted_core_temps_c=[round(float(t), 4) for t in T],
                         predicted_core_power_w=[round(float(x), 6) for x in pb.core_power(assign)],
                         predicted_peak_c=round(float(T.max()), 4), objective=terms, optimality_gap=gap,
                         notes=[*pb.notes, *extra_notes, *book.notes()])


def _assemble_striped(pb: Problem, assign: np.ndarray, groups: np.ndarray, *, arch: ArchConfig, sizes: list[int],
                      bank_bw_gbps: float, method: str, extra_notes: Sequence[str], gap: float | None) -> Placement:
    """`assemble` for striped experts: an instance on core j is its expert striped over j's group (policy
    ``stripe``); each shard a slice of 1/k in every core's vault of the group, the most read instances first
    (``dram_bank``: the first core's slice, ``replica_banks``: the others'). Replicas are not made on a striped chip
    (`build_placement`): one instance per expert."""
    geom = pb.geom
    book = BankBook(geom, arch.dram.bank_capacity_mb * MIB, bank_bw_gbps * 1e9)
    k = groups.shape[1]
    group_of = np.arange(pb.n) // k
    p_active = 1.0 - np.exp(-pb.inst_tokens_step)
    experts: dict[str, ExpertPlacement] = {}
    tensors: dict[str, TensorPlacement] = {}
    for i in np.argsort(-p_active, kind="stable").tolist():
        e = int(pb.inst_expert[i])
        layer, ex = int(pb.expert_layer[e]), int(pb.expert_e[e])
        cores = [int(c) for c in groups[group_of[int(assign[i])]]]
        experts[expert_id(layer, ex)] = ExpertPlacement(cores=cores, policy="stripe")
        for s, size in enumerate(sizes):
            banks = [geom.slot_bank_id(*book.place(c, size / k, size / k * pb.steps_per_s * p_active[i]))
                     for c in cores]
            tensors[weight_tensor_id(layer, ex, s)] = TensorPlacement(dram_bank=banks[0], size_bytes=size,
                                                                       replica_banks=banks[1:])
    experts = {key: experts[key] for key in sorted(experts, key=_expert_order)}
    return Placement(experts=experts, tensors=tensors,
                     meta=_meta(pb, assign, book, method=method, extra_notes=extra_notes, gap=gap))


def _expert_order(key: str) -> tuple[int, int]:
    layer, e = parse_expert_id(key)
    return layer, e


ILS_MAX_INSTANCES = 128  # iterated local search (random kicks + local search) only for problems up to this size
ILS_ROUNDS = 24


def _feasible(pb: Problem, assign: np.ndarray) -> bool:
    load = np.bincount(assign, weights=pb.inst_flops, minlength=pb.n)
    if np.any(load > pb.cap_flops * (1 + 1e-12)):
        return False
    pairs = pb.inst_expert.astype(np.int64) * pb.n + assign
    if np.unique(pairs).size != pairs.size:
        return False
    if pb.inst_copies is not None and np.any(np.bincount(assign, weights=pb.inst_copies, minlength=pb.n)
                                            > pb.vault_cap * (1 + 1e-12)):
        return False
    lt = _layer_time(pb, assign)
    if lt is None or pb.inst_budget is None:
        return True
    return bool(np.all(lt[np.arange(pb.m), assign] <= pb.inst_budget * (1 + 1e-12)))


def iterated_local_search(pb: Problem, assign: np.ndarray, iters: int, rounds: int, seed: int) -> np.ndarray:
    """Kick the best assignment (swap two random instances on different cores, twice), re-run the local search, keep
    the result when its objective is lower. Deterministic: ``numpy.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    best = assign
    best_obj = pb.objective(pb.temps(best))
    for _ in range(rounds):
        cand = best.copy()
        for _ in range(2):
            i, j = rng.choice(pb.m, 2, replace=False)
            cand[i], cand[j] = cand[j], cand[i]
        if not _feasible(pb, cand):
            continue
        cand = local_search(pb, cand, iters)
        obj = pb.objective(pb.temps(cand))
        if obj < best_obj - 1e-9 * max(1.0, abs(best_obj)):
            best, best_obj = cand, obj
    return best


def heuristic_assign(pb: Problem, iters: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Greedy + local search; small problems (≤ ILS_MAX_INSTANCES) also get ILS_ROUNDS rounds of iterated local
    search seeded with ``seed`` (the workload's routing seed)."""
    assign, viol = greedy(pb)
    notes = [f"{viol} instances could not respect core capacity or replica separation"] if viol else []
    assign = local_search(pb, assign, iters)
    if pb.m <= ILS_MAX_INSTANCES and _feasible(pb, assign):
        assign = iterated_local_search(pb, assign, iters, ILS_ROUNDS, seed)
    return assign, notes
