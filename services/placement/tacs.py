"""TACS: online thermal-aware balancing, one decision per window (seed 001 §4.3, §6, §7; ARCHITECTURE §5.2).

Per call (temperatures °C, times ns, powers W, energies J):
1. Smooth the telemetry: ``T̃ = α·T + (1−α)·T̃_prev`` (α = ``smoothing_alpha``; decisions only).
2. Pressure ``S_c = [T̃_c − Thot]+ / (Temg − Thot) + γ·[q_c − q_tgt]+ / q_tgt`` (q = core utilisation) ranks the
   sources; a core is a source only when it is above ``Thot`` (its excess ``x_s = T̃_s − Thot > 0``) and has work
   (``q_s > 0`` or work of the pending window): TACS never moves work off an idle core, and utilisation alone (a busy
   but cool core) never triggers a move.
3. Candidate sources: the ``top_k_hot`` hottest cores (by T̃; a set that does not depend on Thot) that are sources.
   Sinks of a source: the cores within ``hop_radius`` hops plus the ``top_k_hot`` coolest cores: O(K·deg) edges.
4. Benefit versus cost (Science III). An action moves an instance's work from s to d (the expert's pending
   work on s: its FLOPs at ``mac_pj/2`` times ``(V/V0)²`` of the core that runs them, and its weight reads at the
   DRAM access energy, shared/energy.py, spread over the horizon τ below; so ``w_s`` on s and ``w_d`` on d, each
   core at its clock for the coming window, ``telemetry.freq_ghz``, else its domain's top step, with the voltage of
   shared/dvfs.py): a *reroute* (to another of its replicas; no weights move; or, for a striped expert, its slice
   to another core of its group: the compute moves, the slice's weight reads stay in the source's vault and cross
   the NoC with every token's activations) or a *migration* (a single-core expert and its weight shards). With H
   the steady-state influence matrix (K/W) and
   τ = max(``min_residency_ms``, window) the horizon the move holds for (``power_over: window`` spreads the pending
   energy over the window instead of τ: a sensitivity setting that takes the pending work as continuous):
   - benefit ``B = min(w_s·H[s,s] − w_d·H[s,d], x_s) · max(0, 1 − t_stream/τ)``: the hot core's drop, counted only
     up to its excess over Thot, and only after the weights have streamed (``t_stream = bytes / vault bandwidth``;
     0 for a reroute);
   - heat ``Q = (E_read·H[s,s] + E_write·H[s,d] + E_noc·H[s,s]) / τ``: the move's own energy over the horizon, seen at
     the hot core (``E_read = E_write = bytes · dram J/B``, ``E_noc = bytes · hops · NoC J/B/hop``; shared/energy.py);
     a reroute's bytes are the activations its tokens carry both ways;
   - NoC: ``μ · ΔNoĈ`` with ``ΔNoĈ = bytes·hops / (NoC link capacity over one window)``: μ in K per unit of added
     NoC load.
   A move is made when ``net = B − Q − μ·ΔNoĈ > 0`` (the reactive rule; step 6 replaces this test), the
   destination is not overloaded (``q_d ≤ q_tgt``) and stays cooler than the relieved source (rise
   ``w_d·H[d,d] − w_s·H[d,s]``; a Thot-independent rule, so that raising Thot cannot add destinations). Each source
   makes at most one move: the one of largest net (ties: ``λ·hops + η·rise``, then the lower core), a migration
   only among the ``min(top_k_hot, max_parallel_migrations)`` hottest candidates. A reroute moves no weights, so
   where it relieves as much it wins. Hence a higher Thot can only remove moves, and a higher μ can only pick moves
   with less NoC load (the argmax of ``B − Q − μ·ΔNoĈ`` has a non-increasing ΔNoĈ in μ).
5. Migrations respect ``min_residency_ms`` (since the expert's last change), the undo cool-down (no move back to its
   previous cores within ``undo_cooldown_ms``), the NoC guard (none while ``noc_load > noc_guard``), bank capacity
   (the free bytes of the destination vault's banks, from the LIVE occupancy: the placement's banks with every
   earlier TACS move of the replica state applied; a bank takes as many shards as fit) and bank bandwidth (the
   bytes written into one bank in one window, by every move of that window, within ``bank_bw_gbps`` · window).
6. Look-ahead (``lookahead_windows`` N > 0): instead of the reactive test, each source picks the move, or
   none, with the lowest predicted peak ``mean_t max_k T̂[t, k]`` (the hottest core's temperature over the next N
   windows, averaged: a move's own heat while its weights stream counts for as long as it lasts; the maximum over
   the horizon instead would refuse every migration out of a hot vault, whose reads come before any relief), plus
   ``μ·ΔNoĈ``. The
   prediction superposes the thermal model's pulse responses (thermal ``GET /v1/models/{hash}/pulse-response`` with
   slots of one window; ``Dc[t][k, c]``, ``Dv[t][k, c]``: rise of core k at the end of window t after 1 W in core c,
   or spread over vault c, during window 0; the exact discrete model, linear in power) on today's temperatures:
   ``T̂[t, k] = T̃[k] + ΔT[t, k]``, with ``C = cumsum(D)`` the response to power sustained from window 0 and
   - the shifted power, sustained from the window its weights have streamed (``m = ceil(t_stream / window)``; 0 for
     a reroute): ``w_d,core·Cc[t−m][k, d] − w_s,core·Cc[t−m][k, s] + w_vault·(Cv[t−m][k, d] − Cv[t−m][k, s])``,
     the powers of step 4 (the pending work's FLOP energy at each core's voltage, its weight reads' DRAM energy at
     the vault, over τ);
   - the move's own energy during windows 0..m−1: reads at vault s, writes at vault d, NoC at core s (for a reroute,
     its activations' NoC energy over τ, sustained).
   Source s scores among the cores not hotter than it now (hotter ones are other sources' to relieve; the move's
   destination is cooler than s by step 4's rule), so no move scores ``T̃_s`` and every hot core, not only the
   hottest, can act. A move is made when its score is lower than none's; the other constraints of steps 4–5 stay.
   Each source is scored against today's field alone (as the reactive rule), so its choice does not depend on Thot
   and a higher μ never picks more NoC load; sources interact only through the banks they claim (as in step 4). The
   powers are step 4's (the pending work over τ, held): an assumption about the work to come, stated, not fitted.
Overlays apply at the next window's start only; the returned ReplicaState records the change.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from services.placement.geometry import MIB, ChipGeometry, check_h, hops_matrix
from services.placement.shards import spread_pick
from shared.configs import ArchConfig
from shared.configs.tas import TacsParams
from shared.contracts.ids import (
    expert_id,
    parse_bank_ids,
    parse_expert_id,
    parse_weight_tensor_id,
)
from shared.contracts.placement import (
    OverlayMigrate,
    OverlayReroute,
    Overlays,
    Placement,
    ReplicaEntry,
    ReplicaState,
    Telemetry,
    check_cores_in_mesh,
)
from shared.contracts.workload import LogicalWindow
from shared.dvfs import dynamic_scale, top_freqs, volts_for
from shared.energy import EnergyModel
from shared.errors import BadInput
from shared.lru import LRU

ACT_BYTES_PER_TOKEN = 2 * 4096  # activation bytes a rerouted token carries each way (bf16, hidden 4096)


@dataclass(frozen=True)
class _PlacementIndex:
    """Parsed, reusable view of a placement: bank occupancy (bytes) per (vault core, slot)."""

    used: np.ndarray  # (n_cores, vault_banks) bytes


_INDEX_CACHE: LRU[tuple[int, tuple[int, ...]], tuple[Placement, _PlacementIndex]] = LRU(8)


def _index(placement: Placement, geom: ChipGeometry) -> _PlacementIndex:
    """Bank occupancy of a placement, parsed once per placement object and chip layout (LRU of 8; the object is held
    so its id stays valid; a registered placement is one object shared by every window's request, so the layout is in
    the key: the same placement on another chip is parsed again). One regex pass over all bank ids, then vectorised
    index arithmetic."""
    key = (id(placement), (geom.mesh_x, geom.mesh_y, geom.banks_x, geom.banks_y, geom.n_dram_layers))
    hit = _INDEX_CACHE.get(key)
    if hit is not None and hit[0] is placement:
        return hit[1]
    banks: list[str] = []
    sizes: list[int] = []
    for tp in placement.tensors.values():
        copies = [tp.dram_bank, *(tp.replica_banks or [])]
        banks.extend(copies)
        sizes.extend([int(tp.size_bytes or 0)] * len(copies))
    try:
        xyz = parse_bank_ids(banks)
        bad = bool(np.any((xyz[:, 0] >= geom.banks_x) | (xyz[:, 1] >= geom.banks_y)
                          | (xyz[:, 2] >= geom.n_dram_layers)))
    except ValueError:
        bad = True
    if bad:  # name the first offending tensor
        for tid, tp in placement.tensors.items():
            for bank in [tp.dram_bank, *(tp.replica_banks or [])]:
                try:
                    geom.bank_core_slot(bank)
                except ValueError as exc:
                    raise BadInput(f"placement.tensors.{tid}: {exc}", field=f"placement.tensors.{tid}") from None
    bx, by, layer = xyz[:, 0], xyz[:, 1], xyz[:, 2]
    core = (by // geom.vault_y) * geom.mesh_x + bx // geom.vault_x
    slot = ((by % geom.vault_y) * geom.vault_x + bx % geom.vault_x) * geom.n_dram_layers + layer
    used = np.zeros((geom.n_cores, geom.vault_banks))
    np.add.at(used, (core, slot), np.asarray(sizes, dtype=float))
    idx = _PlacementIndex(used=used)
    _INDEX_CACHE.put(key, (placement, idx))
    return idx


def replica_state_from_placement(placement: Placement, t_ns: int = 0) -> ReplicaState:
    """Every expert at its placement cores since ``t_ns``."""
    return ReplicaState(experts={eid: ReplicaEntry(cores=list(ep.cores), ts_created_ns=t_ns)
                                 for eid, ep in placement.experts.items()})


def validate_inputs(tele: Telemetry, placement: Placement, state: ReplicaState, geom: ChipGeometry,
                    smoothed: list[float] | None) -> None:
    n = geom.n_cores
    if len(tele.temps_core) != n:
        raise BadInput(f"telemetry.temps_core has {len(tele.temps_core)} values, the mesh has {n} cores",
                       field="telemetry.temps_core")
    if tele.util_core and len(tele.util_core) != n:
        raise BadInput(f"telemetry.util_core has {len(tele.util_core)} values, the mesh has {n} cores",
                       field="telemetry.util_core")
    if not all(math.isfinite(t) for t in tele.temps_core):
        raise BadInput("telemetry.temps_core must be finite", field="telemetry.temps_core")
    if tele.freq_ghz and len(tele.freq_ghz) != n:
        raise BadInput(f"telemetry.freq_ghz has {len(tele.freq_ghz)} values, the mesh has {n} cores",
                       field="telemetry.freq_ghz")
    if smoothed is not None and len(smoothed) != n:
        raise BadInput(f"smoothed has {len(smoothed)} values, the mesh has {n} cores", field="smoothed")
    check_cores_in_mesh({k: v.cores for k, v in placement.experts.items()}, n, "placement.experts")
    check_cores_in_mesh({k: v.cores for k, v in state.experts.items()}, n, "state.experts")


@dataclass
class _Action:
    kind: str  # "migrate" | "reroute"
    expert: str
    src: int
    dst: int
    cost: float
    drop: float
    noc_added: float
    net: float = 0.0  # benefit - heat - mu * NoC (K), module docstring step 4
    score: float = math.inf  # look-ahead: predicted peak + mu * NoC (°C), step 6
    shards: list[tuple[str, int, str, str]] | None = None  # (tensor id, size, src bank, dst bank)


def tacs_step(tele: Telemetry, placement: Placement, state: ReplicaState, params: TacsParams, arch: ArchConfig,
              H: np.ndarray, pending_window: LogicalWindow | None, smoothed: list[float] | None, now_ns: int, *,
              bank_bw_gbps: float = 25.0, pulse: tuple[np.ndarray, np.ndarray] | None = None
              ) -> tuple[Overlays, ReplicaState, list[float]]:
    """One TACS decision (see the module docstring). Returns (overlays for the next window, new state, smoothed T).
    ``pulse``: (Dc, Dv), each (N, cores, cores) K/W, the pulse responses over windows of ``params.window_ms``;
    required when ``params.lookahead_windows`` > 0 (step 6), at least that many windows."""
    geom = ChipGeometry.of(arch)
    n = geom.n_cores
    validate_inputs(tele, placement, state, geom, smoothed)
    H = check_h(H, n)
    alpha = params.smoothing_alpha
    temps_raw = np.asarray(tele.temps_core, dtype=float)
    # step 1: T̃ = α·T + (1−α)·T̃_prev (°C)
    temps = temps_raw if smoothed is None else alpha * temps_raw + (1 - alpha) * np.asarray(smoothed, dtype=float)
    util = np.asarray(tele.util_core, dtype=float) if tele.util_core else np.zeros(n)
    thot, temg = params.thresholds.Thot, params.thresholds.Temg
    # step 2: S_c = [T̃_c − Thot]+ / (Temg − Thot) + γ·[q_c − q_tgt]+ / q_tgt
    pressure = (np.maximum(temps - thot, 0) / (temg - thot)
                + params.gamma * np.maximum(util - params.q_target, 0) / params.q_target)

    t_apply = pending_window.t0_ns if pending_window is not None else now_ns
    if not np.greater(temps, thot).any():  # no core past Thot: no source (step 2), so no move; nothing else to price
        return _emit([], t_apply), state, [float(x) for x in temps]
    window_s = (params.window_ms * 1e-3 if pending_window is None or pending_window.t1_ns <= pending_window.t0_ns
                else (pending_window.t1_ns - pending_window.t0_ns) * 1e-9)
    residents = _Residents.of(placement, state, n)
    horizon_s = max(params.min_residency_ms * 1e-3, window_s)  # tau: the horizon a move holds for
    power_s = window_s if params.power_over == "window" else horizon_s  # the pending energy's time base (params)
    # the clock of each core in the coming window (telemetry; else its domain's top step) and its dynamic-energy
    # factor (V/V0)^2 (shared/dvfs.py): compute energy is priced at V0 (shared/energy.py), then scaled per core
    freq_ghz = np.asarray(tele.freq_ghz if tele.freq_ghz else top_freqs(arch), dtype=float)
    v_scale = dynamic_scale(volts_for(freq_ghz, arch), arch)
    work = _pending_work(pending_window, residents, arch, util, freq_ghz, power_s)

    hops = hops_matrix(geom.mesh_x, geom.mesh_y)
    excess = temps - thot  # K above Thot
    has_work = [util[c] > 0 or any(work.power_w.get(e, 0.0) > 0 for e in residents.on_core[c]) for c in range(n)]
    sources, mig_sources, coolest = _pick_sources(temps, util, excess, has_work, params)
    migrations_allowed = tele.noc_load <= params.noc_guard and params.max_parallel_migrations > 0
    rules = None
    if migrations_allowed and mig_sources:
        rules = _MigrationRules(
            placement=placement, state=state, geom=geom, sources=mig_sources,
            used=_live_used(_index(placement, geom), placement, state, geom),
            # bytes written into each bank of the chip this window (vault core, slot): at most bank_bw · window
            incoming=np.zeros((n, geom.vault_banks)), t_apply=t_apply,
            residency_ns=params.min_residency_ms * 1e6, undo_ns=params.undo_cooldown_ms * 1e6,
            bank_cap=arch.dram.bank_capacity_mb * MIB, bank_bw=bank_bw_gbps * 1e9, window_s=window_s,
            vault_bw=arch.dram.vault_bw_gbps * 1e9)
    pricer = _MovePricer(
        temps=temps, util=util, excess=excess, H=H, v_scale=v_scale, vault_w=work.vault_w, q_target=params.q_target,
        tau_s=horizon_s, window_s=window_s, energy=EnergyModel.from_arch(arch), hops=hops,
        noc_cap_bytes=_noc_capacity_bytes(geom, arch, window_s), lam=params.cost.lambda_hops,
        mu=params.cost.mu_noc, eta=params.cost.eta_temp,
        look=_Lookahead.of(temps, pulse, params.lookahead_windows) if params.lookahead_windows > 0 else None)

    actions: list[_Action] = []
    for src in sorted(sources, key=lambda c: (-pressure[c], c)):
        sinks = sorted({int(c) for c in np.flatnonzero((hops[src] <= params.hop_radius) & (hops[src] > 0))}
                       | {c for c in coolest if c != src})
        options = _source_options(src, residents, work, pricer, rules, sinks)
        act = _first_placeable(_ranked(options, pricer.look, src), rules)
        if act is not None:
            actions.append(act)

    return _emit(actions, t_apply), \
        _new_state(actions, state, t_apply), [float(x) for x in temps]


@dataclass(frozen=True)
class _Residents:
    """Where every expert runs now (the replica state overrides the placement) and which experts each core runs."""

    cores_of: dict[str, list[int]]
    striped: set[str]  # striped experts: rerouted within their group, never migrated
    on_core: list[list[str]]

    @classmethod
    def of(cls, placement: Placement, state: ReplicaState, n_cores: int) -> _Residents:
        cores_of: dict[str, list[int]] = {eid: ep.cores for eid, ep in placement.experts.items()}
        striped = {eid for eid, ep in placement.experts.items() if ep.policy == "stripe"}
        for eid, entry in state.experts.items():
            cores_of[eid] = entry.cores
        on_core: list[list[str]] = [[] for _ in range(n_cores)]
        for eid, cores in cores_of.items():
            for c in cores:
                on_core[c].append(eid)
        return cls(cores_of=cores_of, striped=striped, on_core=on_core)


@dataclass(frozen=True)
class _PendingWork:
    """Step 4's powers: each expert instance's pending work as a mean power over the time base."""

    tokens: dict[str, float]  # routed tokens of the pending window per expert
    weight_bytes: dict[str, float]  # the pending window's weight bytes of each expert
    power_w: dict[str, float]  # W per core of the expert at V0 (compute) plus its vault part
    vault_w: dict[str, float]  # the part of power_w spent in the expert's vault (its weight reads)


def _pending_work(pending_window: LogicalWindow | None, residents: _Residents, arch: ArchConfig, util: np.ndarray,
                  freq_ghz: np.ndarray, power_s: float) -> _PendingWork:
    """Instance power estimate (W) per (expert, core): the pending window's FLOPs and weight reads when it has any,
    else each core's utilisation at its peak FLOP rate, shared by the experts on it."""
    e_flop = EnergyModel.from_arch(arch).mac_j / 2  # J per FLOP (one MAC = 2 FLOPs; shared/energy.py)
    power_w: dict[str, float] = {}
    if pending_window is not None and len(pending_window.compute):
        flops, tokens = _expert_flops_tokens(pending_window)
        weight_bytes = _expert_weight_bytes(pending_window)
        vault_w: dict[str, float] = {}
        e_byte = EnergyModel.from_arch(arch).dram_j_per_byte
        for eid in set(flops) | set(weight_bytes):
            if eid in residents.cores_of:
                # the mean power over the horizon a move holds for (the energy of the pending work over tau; the
                # influence matrix H is steady-state, so a 3 ms burst must not count as sustained power), or over
                # the window itself with power_over: window (the work taken as continuous)
                n_copies = len(residents.cores_of[eid])
                power_w[eid] = ((flops.get(eid, 0.0) * e_flop + weight_bytes.get(eid, 0.0) * e_byte)
                                / power_s / n_copies)
                vault_w[eid] = weight_bytes.get(eid, 0.0) * e_byte / power_s / n_copies
        return _PendingWork(tokens=tokens, weight_bytes=weight_bytes, power_w=power_w, vault_w=vault_w)
    for c, experts in enumerate(residents.on_core):
        if experts:
            peak_flops = arch.core.array[0] * arch.core.array[1] * 2 * freq_ghz[c] * 1e9  # FLOP/s at its clock
            share = util[c] * peak_flops * e_flop / len(experts)
            for eid in experts:
                power_w[eid] = share  # identical share on every core of a replicated expert
    return _PendingWork(tokens={}, weight_bytes={}, power_w=power_w, vault_w={})


def _expert_flops_tokens(window: LogicalWindow) -> tuple[dict[str, float], dict[str, float]]:
    """FLOPs and routed tokens of the pending window per expert (rows of no expert, ``expert < 0``, skipped)."""
    comp = window.compute
    flops: dict[str, float] = {}
    tokens: dict[str, float] = {}
    for layer, ex, tok, fl in zip(comp.layer, comp.expert, comp.tokens, comp.flops, strict=True):
        if ex < 0:
            continue
        eid = expert_id(layer, ex)
        flops[eid] = flops.get(eid, 0.0) + fl
        tokens[eid] = tokens.get(eid, 0.0) + tok
    return flops, tokens


def _expert_weight_bytes(window: LogicalWindow) -> dict[str, float]:
    """The weight stream per expert: bytes of its weight shards the pending window reads (the DRAM access energy of
    those reads moves with the expert)."""
    mem = window.memory
    weight_bytes: dict[str, float] = {}
    owner: dict[str, str] = {}  # weight shard id -> its expert's id ("" for any other tensor)
    for tid, nbytes in zip(mem.tensor_id, mem.bytes, strict=True):
        who = owner.get(tid)
        if who is None:
            try:
                layer, ex, _ = parse_weight_tensor_id(tid)
                who = owner[tid] = expert_id(layer, ex)
            except ValueError:
                who = owner[tid] = ""
        if who:
            weight_bytes[who] = weight_bytes.get(who, 0.0) + nbytes
    return weight_bytes


def _noc_capacity_bytes(geom: ChipGeometry, arch: ArchConfig, window_s: float) -> float:
    """Bytes every NoC link of the mesh together carries in one window (ΔNoĈ's unit, step 4)."""
    X, Y = geom.mesh_x, geom.mesh_y
    links = 2 * ((X - 1) * Y + X * (Y - 1))
    return float(max(links, 1) * arch.mesh.noc.width_bits / 8 * arch.mesh.noc.link_freq_ghz * 1e9 * window_s)


def _pick_sources(temps: np.ndarray, util: np.ndarray, excess: np.ndarray, has_work: list[bool],
                  params: TacsParams) -> tuple[list[int], set[int], list[int]]:
    """Step 3: (the sources among the ``top_k_hot`` hottest cores, those of them that may migrate, the
    ``top_k_hot`` coolest cores). Hot and cool are ranked by T̃, then utilisation, then core: Thot-independent."""
    n = temps.shape[0]
    order_hot = np.lexsort((np.arange(n), -util, -temps))  # hottest first
    coolest = [int(c) for c in np.lexsort((np.arange(n), util, temps))[: params.top_k_hot]]
    candidates = [int(c) for c in order_hot[: params.top_k_hot]]
    k_mig = min(params.top_k_hot, params.max_parallel_migrations)
    sources = [c for c in candidates if excess[c] > 0 and has_work[c]]
    mig_sources = {c for c in candidates[:k_mig] if c in sources}
    return sources, mig_sources, coolest


@dataclass
class _MigrationRules:
    """Step 5: what a migration must respect, and the live bank occupancy the chosen migrations claim from."""

    placement: Placement
    state: ReplicaState
    geom: ChipGeometry
    sources: set[int]  # the sources allowed to migrate
    used: np.ndarray  # (cores, vault banks) bytes held now; updated as migrations are chosen
    incoming: np.ndarray  # (cores, vault banks) bytes written into each bank by this window's migrations
    t_apply: int  # ns
    residency_ns: float
    undo_ns: float
    bank_cap: float  # bytes one bank holds
    bank_bw: float  # B/s one bank is written at
    window_s: float
    vault_bw: float  # B/s a vault streams at


@dataclass(frozen=True)
class _MovePricer:
    """Step 4's price of a move; with a look-ahead, step 6's predicted peak as its score."""

    temps: np.ndarray  # (n,) °C, smoothed
    util: np.ndarray  # (n,) core utilisation
    excess: np.ndarray  # (n,) K above Thot
    H: np.ndarray  # (n, n) K/W, steady-state influence
    v_scale: np.ndarray  # (n,) dynamic-energy factor (V/V0)^2 of each core's clock
    vault_w: dict[str, float]  # W of each expert instance's weight reads, spent in its vault
    q_target: float
    tau_s: float  # the horizon a move holds for
    window_s: float
    energy: EnergyModel
    hops: np.ndarray  # (n, n) NoC hops
    noc_cap_bytes: float  # NoC bytes per window
    lam: float  # tie-break weight per hop
    mu: float  # K per unit of added NoC load
    eta: float  # tie-break weight per K of rise
    look: _Lookahead | None

    def price(self, kind: str, eid: str, src: int, dst: int, power_w: float, nbytes: float, stream_s: float, *,
              vault_moves: bool = True) -> _Action | None:
        """The move's net benefit (module docstring, step 4); None when it is not worth making or not allowed.
        ``vault_moves`` False: the work's weight reads stay in src's vault (a striped expert's slice), ``power_w``
        is its compute alone."""
        H, temps = self.H, self.temps
        vault_w = self.vault_w.get(eid, 0.0) if vault_moves else 0.0
        # the instance's power on src, and the same work's on dst, each core's compute at its voltage; at V0 (factor
        # 1: every core at its top step with V ∝ f) exactly power_w, as before the factor was counted
        src_w = power_w if self.v_scale[src] == 1.0 else (power_w - vault_w) * float(self.v_scale[src]) + vault_w
        dst_w = power_w if self.v_scale[dst] == 1.0 else (power_w - vault_w) * float(self.v_scale[dst]) + vault_w
        if src_w == dst_w:  # K
            drop, rise = src_w * (H[src, src] - H[src, dst]), src_w * (H[dst, dst] - H[dst, src])
        else:
            drop, rise = src_w * H[src, src] - dst_w * H[src, dst], dst_w * H[dst, dst] - src_w * H[dst, src]
        if not (drop > 0 and temps[dst] + rise < temps[src] - drop and self.util[dst] <= self.q_target):
            return None
        # B = min(drop, x_s) · max(0, 1 − t_stream/τ)
        benefit = min(drop, float(self.excess[src])) * max(0.0, 1.0 - stream_s / self.tau_s)
        dram_j = 0.0 if kind == "reroute" else nbytes * self.energy.dram_j_per_byte
        noc_j = nbytes * self.hops[src, dst] * self.energy.noc_j_per_byte_hop
        # Q = (E_read·H[s,s] + E_write·H[s,d] + E_noc·H[s,s]) / τ
        heat = (dram_j * (H[src, src] + H[src, dst]) + noc_j * H[src, src]) / self.tau_s
        noc_added = nbytes * self.hops[src, dst] / self.noc_cap_bytes  # ΔNoĈ
        net = benefit - heat - self.mu * noc_added
        if self.look is None and not net > 0:  # the reactive rule; step 6 scores every allowed move instead
            return None
        act = _Action(kind, eid, src, dst, cost=float(self.lam * self.hops[src, dst] + self.eta * rise),
                      drop=float(drop), noc_added=float(noc_added), net=float(net))
        if self.look is not None:
            delta = self._predicted_rise(self.look, kind, src, dst, src_w - vault_w, dst_w - vault_w, vault_w,
                                         stream_s, dram_j, noc_j)
            act.score = self.look.peak(delta, src) + self.mu * float(noc_added)
        return act

    def _predicted_rise(self, look: _Lookahead, kind: str, src: int, dst: int, core_src_w: float,
                        core_dst_w: float, vault_w: float, stream_s: float, dram_j: float, noc_j: float
                        ) -> np.ndarray:
        """Step 6: (N, n) K the move adds to today's field: the shifted power from the window its weights have
        streamed, plus the move's own energy until then (a reroute's NoC energy over τ, sustained)."""
        stream_windows = 0 if kind == "reroute" else max(1, math.ceil(stream_s / self.window_s - 1e-9))
        delta = look.shift(src, dst, core_src_w, core_dst_w, vault_w, start=stream_windows)
        if kind == "reroute":
            delta += look.sustained(look.Cc, src, noc_j / self.tau_s, 0, look.n_windows)
        else:
            slot_s = stream_windows * self.window_s
            delta += look.sustained(look.Cv, src, dram_j / slot_s, 0, stream_windows) \
                + look.sustained(look.Cv, dst, dram_j / slot_s, 0, stream_windows) \
                + look.sustained(look.Cc, src, noc_j / slot_s, 0, stream_windows)
        return delta


def _source_options(src: int, residents: _Residents, work: _PendingWork, pricer: _MovePricer,
                    rules: _MigrationRules | None, sinks: list[int]) -> list[_Action]:
    """Every allowed move of source ``src``: a reroute for an expert with several cores, else (a source allowed to
    migrate) a migration to one of ``sinks``. Experts without work on ``src`` stay: moving them relieves nothing."""
    options: list[_Action] = []
    for eid in residents.on_core[src]:
        cores = residents.cores_of[eid]
        power_w = work.power_w.get(eid, 0.0)
        if power_w <= 0:
            continue
        if len(cores) >= 2:
            options.extend(_reroute_options(src, eid, cores, eid in residents.striped, power_w, work, pricer))
        elif rules is not None and src in rules.sources:
            options.extend(_migration_options(src, eid, cores, power_w, residents, pricer, rules, sinks))
    return options


def _reroute_options(src: int, eid: str, cores: list[int], striped: bool, power_w: float, work: _PendingWork,
                     pricer: _MovePricer) -> list[_Action]:
    """Reroutes of ``src``'s share of ``eid`` to its other cores (no weights move)."""
    if striped:
        # this core's slice of a striped expert to another core of its group: its compute moves, its weight reads
        # stay in src's vault and cross the NoC, with every token's activations both ways
        nbytes = work.tokens.get(eid, 0.0) * ACT_BYTES_PER_TOKEN * 2 + work.weight_bytes.get(eid, 0.0) / len(cores)
        moved_w, vault_moves = power_w - work.vault_w.get(eid, 0.0), False
    else:  # this core's share to another replica: activations move, weights stay
        nbytes = work.tokens.get(eid, 0.0) / len(cores) * ACT_BYTES_PER_TOKEN * 2
        moved_w, vault_moves = power_w, True
    options: list[_Action] = []
    for dst in cores:
        if dst != src:
            act = pricer.price("reroute", eid, src, dst, moved_w, nbytes, 0.0, vault_moves=vault_moves)
            if act is not None:
                options.append(act)
    return options


def _migration_options(src: int, eid: str, cores: list[int], power_w: float, residents: _Residents,
                       pricer: _MovePricer, rules: _MigrationRules, sinks: list[int]) -> list[_Action]:
    """Migrations of single-core expert ``eid`` and its weight shards from ``src`` to a sink (step 5's rules)."""
    ent = rules.state.experts.get(eid)
    since = max(ent.ts_created_ns, ent.last_change_ns or 0) if ent is not None else 0
    if rules.t_apply - since < rules.residency_ns:
        return []  # minimum residency
    shards = _current_shards(eid, ent, rules.placement, cores, rules.geom)
    size = float(sum(sz for _, sz, _, _ in shards))
    if any(sz / rules.window_s > rules.bank_bw for _, sz, _, _ in shards):
        return []  # a shard cannot be written within one window at bank bandwidth
    options: list[_Action] = []
    for dst in sinks:
        if (ent is not None and ent.prev_cores and dst in ent.prev_cores and ent.last_change_ns is not None
                and rules.t_apply - ent.last_change_ns < rules.undo_ns):
            continue  # undo cool-down
        if eid in residents.on_core[dst]:
            continue
        act = pricer.price("migrate", eid, src, dst, power_w, size, size / rules.vault_bw)
        if act is not None:
            act.shards = [(t, sz, rules.geom.slot_bank_id(v, sl), "") for t, sz, v, sl in shards]
            options.append(act)
    return options


def _ranked(options: list[_Action], look: _Lookahead | None, src: int) -> list[_Action]:
    """Best first: the largest net (step 4), or with a look-ahead the lowest score among the moves that beat leaving
    the field as it is (step 6); ties by cost, destination, expert."""
    if look is None:
        options.sort(key=lambda a: (-a.net, a.cost, a.dst, a.expert))
        return options
    return sorted((a for a in options if a.score < float(look.T0[src]) - 1e-9),
                  key=lambda a: (a.score, a.cost, a.dst, a.expert))


def _first_placeable(options: list[_Action], rules: _MigrationRules | None) -> _Action | None:
    """The source's move: the first option whose shards find banks (a reroute always does); a chosen migration
    claims its banks in the live occupancy, which later sources of the same call see."""
    for act in options:
        if act.kind == "migrate":
            assert rules is not None
            dst_banks = _pick_banks(act, rules.used, rules.geom, rules.bank_cap, rules.incoming,
                                    rules.bank_bw * rules.window_s)
            if dst_banks is None:
                continue
            act.shards = [(t, sz, src, dst)
                          for (t, sz, src, _), dst in zip(act.shards or [], dst_banks, strict=True)]
            _occupy(rules.used, act, rules.geom)
        return act
    return None


@dataclass
class _Lookahead:
    """Predicted core temperatures over the next N windows (module docstring, step 6): today's field plus the
    superposed pulse responses of the power a move adds or removes."""

    T0: np.ndarray  # (n,) °C, the smoothed field
    Cc: np.ndarray  # (N, n, n) K/W: rise at the end of window t per W in core c sustained from window 0
    Cv: np.ndarray  # (N, n, n) K/W: the same per W spread over vault c

    @property
    def n_windows(self) -> int:
        return int(self.Cc.shape[0])

    @classmethod
    def of(cls, T0: np.ndarray, pulse: tuple[np.ndarray, np.ndarray] | None, n_windows: int) -> _Lookahead:
        if pulse is None:
            raise BadInput("params.lookahead_windows > 0 needs the thermal model's pulse responses (this service "
                           "asks the thermal service for them)", field="params.lookahead_windows")
        Dc, Dv = (np.asarray(p, dtype=float) for p in pulse)
        n = T0.shape[0]
        if Dc.ndim != 3 or Dc.shape[0] < n_windows or Dc.shape[1:] != (n, n) or Dv.shape != Dc.shape:
            raise BadInput(f"pulse responses of shape {Dc.shape} / {Dv.shape}: need ({n_windows}+, {n}, {n})",
                           field="params.lookahead_windows")
        return cls(T0=T0, Cc=np.cumsum(Dc[:n_windows], axis=0), Cv=np.cumsum(Dv[:n_windows], axis=0))

    def sustained(self, C: np.ndarray, c: int, watts: float, start: int, stop: int) -> np.ndarray:
        """(N, n) K: ``watts`` at source c (a core's area, or a vault, by ``C``) during windows start..stop-1."""
        N = self.n_windows
        out = np.zeros((N, C.shape[1]))
        if watts == 0.0 or start >= min(stop, N):
            return out
        out[start:] += C[: N - start, :, c]
        if stop < N:
            out[stop:] -= C[: N - stop, :, c]
        return out * watts

    def shift(self, s: int, d: int, w_core_s: float, w_core_d: float, w_vault: float, *, start: int
              ) -> np.ndarray:
        """(N, n) K: an expert's work moved from core s (and vault s) to d from window ``start`` on: ``w_core_s``
        leaves core s, ``w_core_d`` (the same work at d's voltage) arrives at d, ``w_vault`` moves vault."""
        N = self.n_windows
        out: np.ndarray = self.sustained(self.Cc, d, w_core_d, start, N) \
            - self.sustained(self.Cc, s, w_core_s, start, N)
        out += self.sustained(self.Cv, d, w_vault, start, N) - self.sustained(self.Cv, s, w_vault, start, N)
        return out

    def peak(self, delta: np.ndarray, s: int) -> float:
        """Source s's score of a move (°C): the hottest predicted temperature, averaged over the horizon, among the
        cores not hotter than s now (hotter ones are other sources' to relieve). No move scores ``T0[s]``."""
        near = self.T0[s] >= self.T0
        return float((self.T0[near][None, :] + delta[:, near]).max(axis=1).mean())


def _current_shards(eid: str, ent: ReplicaEntry | None, placement: Placement, cores: list[int],
                    geom: ChipGeometry) -> list[tuple[str, int, int, int]]:
    """(tensor id, bytes, vault core, slot) of each weight shard of ``eid``'s current copy: the banks recorded in the
    replica state after a TACS migration; else the placement's bank while its vault core still hosts the expert; else
    (the expert moved and the state does not say where its shards went) the same slot in the current core's vault —
    the physicalizer tracks the true banks, this only prices the move."""
    out: list[tuple[str, int, int, int]] = []
    moved = ent.shard_banks if ent is not None and ent.shard_banks else None
    try:
        layer, expert = parse_expert_id(eid)
    except ValueError:  # not an expert's id: no weight shard is its
        return out
    for k, (tid, tp) in enumerate(placement.expert_shards(layer, expert)):
        if moved is not None and k < len(moved):
            core, slot = geom.bank_core_slot(moved[k])
        else:
            core, slot = geom.bank_core_slot(tp.dram_bank)
            if core not in cores:
                core = cores[0]
        out.append((tid, int(tp.size_bytes or 0), core, slot))
    return out


def _live_used(idx: _PlacementIndex, placement: Placement, state: ReplicaState, geom: ChipGeometry) -> np.ndarray:
    """Bank occupancy (bytes, (cores, vault banks)) now: the placement's, with every TACS migration recorded in the
    replica state applied (a moved expert's shards leave their placement banks for ``shard_banks``)."""
    used = idx.used.copy()
    for eid, ent in sorted(state.experts.items()):
        if not ent.shard_banks:
            continue
        try:
            layer, expert = parse_expert_id(eid)
        except ValueError:  # not an expert's id: no weight shard is its
            continue
        for bank, (_, tp) in zip(ent.shard_banks, placement.expert_shards(layer, expert), strict=False):
            size = float(tp.size_bytes or 0)
            c0, s0 = geom.bank_core_slot(tp.dram_bank)
            c1, s1 = geom.bank_core_slot(bank)
            used[c0, s0] = max(used[c0, s0] - size, 0.0)
            used[c1, s1] += size
    return used


def _occupy(used: np.ndarray, act: _Action, geom: ChipGeometry) -> None:
    """Apply a chosen migration to the live occupancy (later sources of the same call see it)."""
    for _, size, src, dst in act.shards or []:
        c0, s0 = geom.bank_core_slot(src)
        c1, s1 = geom.bank_core_slot(dst)
        used[c0, s0] = max(used[c0, s0] - size, 0.0)
        used[c1, s1] += size


def _pick_banks(act: _Action, used_all: np.ndarray, geom: ChipGeometry, bank_cap: float, incoming: np.ndarray,
                write_cap: float) -> list[str] | None:
    """Banks in the destination vault for the action's shards, packed by bytes: a bank takes a shard when its free
    bytes hold it (``used_all``: the live occupancy) and the bytes written into it this window stay within
    ``write_cap`` (``bank_bw_gbps`` over one window; ``incoming``: what earlier moves of this window write, per
    (vault core, slot)); among those, spread over the vault's columns as TAPS spreads them (``shards.spread_pick``
    on the bytes each bank holds: the shards of an expert are read one after another, a column holding several of
    them is one hot spot). None when a shard finds no such bank. ``incoming`` is updated when the action is
    placed."""
    d = act.dst
    out: list[str] = []
    used = used_all[d].copy()  # this action's shards count as they are placed
    written = incoming[d].copy()
    for _, size, _, _ in act.shards or []:
        mask = (used + size <= bank_cap + 1e-6) & (written + size <= write_cap * (1 + 1e-9))
        if not mask.any():
            return None
        b = spread_pick(used, used, mask, geom.n_dram_layers)
        out.append(geom.slot_bank_id(d, b))
        used[b] += size
        written[b] += size
    incoming[d] = written
    return out


def _emit(actions: list[_Action], t_apply: int) -> Overlays:
    """Reroute rows (scope ``expert``, ``mb_ids_json = ["L{l}E{e}"]``: all of that expert's work on ``from_core`` from
    ``t_apply`` on) for every action; for a migration also one ``expert`` row and one ``weight`` row per shard."""
    rr: dict[str, list[object]] = {k: [] for k in OverlayReroute.model_fields}
    mg: dict[str, list[object]] = {k: [] for k in OverlayMigrate.model_fields}
    for a in actions:
        rr["t_apply_ns"].append(t_apply)
        rr["scope"].append("expert")
        rr["from_core"].append(a.src)
        rr["to_core"].append(a.dst)
        rr["mb_ids_json"].append(json.dumps([a.expert]))
        rr["reason"].append("migrate" if a.kind == "migrate" else "hot_core")
        rr["expected_gain"].append(round(a.drop, 6))
        if a.kind != "migrate":
            continue
        total = sum(sz for _, sz, _, _ in a.shards or []) or 1
        mg["t_apply_ns"].append(t_apply)
        mg["obj_type"].append("expert")
        mg["obj_id"].append(a.expert)
        mg["src"].append(str(a.src))
        mg["dst"].append(str(a.dst))
        mg["size_bytes"].append(0)
        mg["cost"].append(round(a.cost, 6))
        for tid, sz, src, dst in a.shards or []:
            mg["t_apply_ns"].append(t_apply)
            mg["obj_type"].append("weight")
            mg["obj_id"].append(tid)
            mg["src"].append(src)
            mg["dst"].append(dst)
            mg["size_bytes"].append(sz)
            mg["cost"].append(round(a.cost * sz / total, 6))
    return Overlays(reroute=OverlayReroute.model_validate(rr), migrate=OverlayMigrate.model_validate(mg))


def _new_state(actions: list[_Action], state: ReplicaState, t_apply: int) -> ReplicaState:
    moved = [a for a in actions if a.kind == "migrate"]
    if not moved:
        return state
    experts = dict(state.experts)
    for a in moved:
        experts[a.expert] = ReplicaEntry(cores=[a.dst], ts_created_ns=t_apply, last_change_ns=t_apply,
                                         prev_cores=[a.src], shard_banks=[dst for _, _, _, dst in a.shards or []])
    return ReplicaState(experts=experts)

