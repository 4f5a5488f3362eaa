"""Thermal influence matrix for placement (ARCHITECTURE §5.2): ``H[i, j]`` = steady temperature rise (K) of core i
(mean over its cells) per watt dissipated uniformly in core j's area of the logic layer, so ``T̂ = H·p + T_amb``.

``influence_vault_matrix``: ``Hv[i, j]`` = rise of core i per watt spread over the banks of vault j, the memory side
of the same superposition: evenly over all DRAM dies by default, or in the shares ``vault_dies[d]`` per die (bank
layer order: ``arch.geometry.stack``'s DRAM dies, the one farthest from the sink first), evenly over a die's banks of
the vault. Refresh and leakage heat every die alike; a vault's weight reads heat the dies their shards are on, and
TAPS's bank book fills the die nearest the sink first (services/placement/shards.py ``read_die_profile``).

Linear superposition of ``cores`` steady solves of the model's network (package ring included), cached per model.

Both matrices are rounded to ``H_DECIMALS`` decimals (1e-9 K/W, three orders below the solvers' 1e-6 K agreement).
Entries that are equal in exact arithmetic (mirror-image core pairs on a symmetric die) then compare equal in floating
point, so a placement heuristic that breaks ties by index places the same way whichever solver, DCT or BLAS computed
H. Without it, a change of the spectral solver's round-off (1e-15 relative) moved TAPS's Mixtral peak by 1.2 K.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.thermal.model import StackModel, get_model
from shared.configs import ArchConfig
from shared.errors import BadInput
from shared.limits import thermal_cache_size
from shared.lru import LRU

H_DECIMALS = 9
INFLUENCE_MAX_CELLS = 2**25  # cores × grid nodes of one influence matrix: its power and field columns (256 MB each)
# H and H_vault of TASMOE_THERMAL_CACHE_SIZE models (the setting read when an entry is added); H_vault for given die
# shares apart, so that asking for many shares never evicts a model's H
_H: LRU[str, np.ndarray] = LRU(over=lambda hs: len(hs) > 2 * thermal_cache_size())
_H_DIES: LRU[str, np.ndarray] = LRU(over=lambda hs: len(hs) > thermal_cache_size())


def check_influence_size(model: StackModel) -> None:
    """An influence matrix solves one steady field per core: refused (422 naming ``arch``) when ``cores × nodes``
    exceeds ``INFLUENCE_MAX_CELLS`` (a 64 × 64 mesh on a 512 × 512 grid would need tens of GB)."""
    cells = model.n_cores * model.net.n_nodes
    if cells > INFLUENCE_MAX_CELLS:
        raise BadInput(f"arch: an influence matrix of {model.n_cores} cores on a stack of {model.net.n_nodes} grid "
                       f"nodes needs {cells} node values per column set, more than {INFLUENCE_MAX_CELLS}: use fewer "
                       "cores or a coarser thermal.grid", field="arch")


def vault_die_shares(model: StackModel, vault_dies: Sequence[float] | None) -> np.ndarray | None:
    """(dram dies,) the share of a vault's watt on each DRAM die: ``vault_dies`` normalised to sum 1 (422 naming
    ``vault_dies`` when it has the wrong length, a negative or non-finite share, or sums to 0); None: evenly."""
    nd = len(model.dram_layers)
    if vault_dies is None:
        return None
    w = np.asarray(vault_dies, dtype=float)
    if w.shape != (nd,):
        raise BadInput(f"vault_dies has {w.size} shares, the stack has {nd} DRAM dies", field="vault_dies")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.max() > 0:
        raise BadInput("vault_dies: shares must be finite, >= 0 and not all 0", field="vault_dies")
    w = w / w.max()  # (1e308, 1e308) must not overflow the sum
    return np.asarray(w / w.sum(), dtype=float)


def _vault_source(model: StackModel, c: int, shares: np.ndarray | None) -> np.ndarray:
    """(dram dies, banks per die) W: 1 W in vault c, ``shares[d]`` of it on die d (None: evenly), evenly over the
    die's banks of c."""
    nd = len(model.dram_layers)
    bw = np.zeros((nd, model.n_banks_per_layer))
    if nd:
        mine = model.vault_of_bank == c
        cnt = max(int(mine.sum()), 1)
        bw[:, mine] = 1.0 / (nd * cnt) if shares is None else shares[:, None] / cnt
    return bw


def _shares_key(shares: np.ndarray | None) -> str:
    return "" if shares is None else repr(tuple(round(float(x), 12) for x in shares))


def influence_for_model(model: StackModel) -> np.ndarray:
    check_influence_size(model)
    H = _H.get(model.key)
    if H is not None:
        return H.copy()
    n = model.n_cores
    nd, nb = len(model.dram_layers), model.n_banks_per_layer
    P = np.stack([model.node_power(np.eye(n)[j], np.zeros((nd, nb))) for j in range(n)], axis=1)
    T = model.solver.solve(0.0, P)  # G·ΔT = P: the rise over ambient
    H = np.round(np.stack([model.core_temps(T[:, j]) for j in range(n)], axis=1), H_DECIMALS)
    return _H.keep(model.key, H).copy()


def vault_influence_for_model(model: StackModel, vault_dies: Sequence[float] | None = None) -> np.ndarray:
    """(cores × vaults) K/W of 1 W in vault j, spread over its dies in the shares ``vault_dies`` (evenly: None)."""
    return vault_influence_at(model, vault_die_shares(model, vault_dies))


def vault_influence_at(model: StackModel, shares: np.ndarray | None) -> np.ndarray:
    """`vault_influence_for_model` at die shares already checked and normalised (`vault_die_shares`)."""
    check_influence_size(model)
    key = model.key + ":vault" + _shares_key(shares)
    cache = _H if shares is None else _H_DIES
    H = cache.get(key)
    if H is not None:
        return H.copy()
    n = model.n_cores
    cols = [model.node_power(np.zeros(n), _vault_source(model, j, shares)) for j in range(n)]
    T = model.solver.solve(0.0, np.stack(cols, axis=1))
    H = np.round(np.stack([model.core_temps(T[:, j]) for j in range(n)], axis=1), H_DECIMALS)
    return cache.keep(key, H).copy()


def influence_vault_matrix(arch: ArchConfig, vault_dies: Sequence[float] | None = None) -> np.ndarray:
    """(cores × vaults) K/W: steady rise at core i per W spread over vault j's banks (``vault_dies``: its share per
    DRAM die; evenly when None)."""
    return vault_influence_for_model(get_model(arch), vault_dies)


def influence_matrix(arch: ArchConfig) -> np.ndarray:
    """(cores × cores) K/W: steady rise at core i per W at core j."""
    return influence_for_model(get_model(arch))


# ------------------------------------------------------------------------------------------------ pulse responses

PULSE_MAX_WORK = 2e8  # transient steps × grid nodes per answer (the default stack: 2 · 10 orbits · 12 · 49164 = 1.2e7)
# one entry per (model, slot, lags, source kind: "core", or "vault" and its die shares); given die shares apart
_PULSES: LRU[tuple[str, float, int, str], np.ndarray] = LRU(over=lambda ps: len(ps) > 2 * thermal_cache_size())
_PULSES_DIES: LRU[tuple[str, float, int, str], np.ndarray] = LRU(over=lambda ps: len(ps) > thermal_cache_size())


def pulse_work(model: StackModel, lags: int) -> float:
    """Transient steps × grid nodes ``pulse_response`` takes: ``lags`` steps per core source and per vault source,
    one source per orbit of the mesh symmetries."""
    rep, _ = orbit_representatives(mesh_symmetries(model), model.n_cores)
    return 2.0 * np.unique(rep).size * lags * model.net.n_nodes


def pulse_response(model: StackModel, slot_s: float, lags: int, vault_dies: Sequence[float] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Short-time responses for placement (TAPS's slot model, services/placement/slots.py).

    ``Dc[j, i, c]`` (K/W): rise of core i (mean over its cells) at the end of slot ``j`` (``j = 0`` is the end of the
    pulse itself) after 1 W dissipated uniformly in core c's area of the logic layer during slot 0 only (slots of
    ``slot_s`` seconds), the stack at ambient before it. ``Dv[j, i, c]``: the same for 1 W spread over the banks
    of vault c, the memory side (evenly over its dies, or in the shares ``vault_dies`` per die: the module
    docstring). Linear superposition: any schedule of slot-long power pulses
    gives ``ΔT(end of slot s) = Σ_(c, s' ≤ s) Dc[s − s', :, c]·P_c(s') + Dv[...]·Pv_c(s')``, and ``Σ_j Dc[j]`` tends
    to H (the steady influence matrix) as ``lags`` grows (the pulse's energy, sampled once per slot).

    ``2 · cores · lags`` transient steps of the model's own integrator (``StackModel.step``), cached per (model,
    slot, lags) and side (the vault side per die shares); rounded to ``H_DECIMALS`` like H."""
    return pulse_response_at(model, slot_s, lags, vault_die_shares(model, vault_dies))


def pulse_response_at(model: StackModel, slot_s: float, lags: int, shares: np.ndarray | None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """`pulse_response` at die shares already checked and normalised (`vault_die_shares`)."""
    base = (model.key, round(float(slot_s), 12), int(lags))
    Dc = _pulse_side(model, slot_s, lags, (*base, "core"), None)
    Dv = _pulse_side(model, slot_s, lags, (*base, "vault" + _shares_key(shares)), shares)
    return Dc.copy(), Dv.copy()


def _pulse_side(model: StackModel, slot_s: float, lags: int, key: tuple[str, float, int, str],
                shares: np.ndarray | None) -> np.ndarray:
    """(lags, cores, cores) K/W of one source kind, cached: the core sources (``key[3] == "core"``) or the vault
    sources in ``shares`` per die (the core side does not depend on them, so it is solved once for every share)."""
    cache = _PULSES if shares is None else _PULSES_DIES
    hit = cache.get(key)
    if hit is not None:
        return hit
    n = model.n_cores
    nd, nb = len(model.dram_layers), model.n_banks_per_layer
    amb = float(model.net.ambient)
    T0 = np.full(model.net.n_nodes, amb)
    zc, zb = np.zeros(n), np.zeros((nd, nb))
    group = mesh_symmetries(model)
    rep, to_c = orbit_representatives(group, n)
    side = key[3]
    D = np.zeros((lags, n, n))
    if side != "core" and not nd:
        return cache.keep(key, D)  # no DRAM: no vault source
    for c in np.unique(rep):
        core_w, bank_w = zc.copy(), zb.copy()
        if side == "core":
            core_w[c] = 1.0
        else:
            bank_w = _vault_source(model, int(c), shares)
        T = model.step(T0, core_w, bank_w, slot_s)
        D[0, :, c] = model.core_temps(T) - amb
        for j in range(1, lags):
            T = model.step(T, zc, zb, slot_s)
            D[j, :, c] = model.core_temps(T) - amb
    for c in range(n):  # the other sources of each orbit: D[:, p, p[r]] = D[:, :, r]
        r, p = int(rep[c]), group[to_c[c]]
        if r != c:
            D[:, p, c] = D[:, :, r]
    return cache.keep(key, np.round(D, H_DECIMALS))


def mesh_symmetries(model: StackModel) -> list[np.ndarray]:
    """The mesh symmetries (mirror x, mirror y, transpose on a square mesh, and their products) under which the stack
    is invariant, as core permutations ``p`` (core i goes to ``p[i]``); the identity first. A candidate counts only
    when both steady influence matrices are invariant under it (``H[p][:, p] = H`` to 1e-9 relative): a stack with
    an asymmetric floorplan, package or DRAM layout keeps the identity alone."""
    X, Y = model.arch.mesh.cores
    c = np.arange(X * Y)
    x, y = c % X, c // X
    gens = [y * X + (X - 1 - x), (Y - 1 - y) * X + x] + ([x * X + y] if X == Y else [])
    H, Hv = influence_for_model(model), vault_influence_for_model(model)

    def invariant(p: np.ndarray) -> bool:
        return all(np.allclose(M[np.ix_(p, p)], M, rtol=1e-9, atol=1e-12) for M in (H, Hv))

    group = [c]
    for g in (g for g in gens if invariant(g)):
        frontier = list(group)
        while frontier:
            new = []
            for h in frontier:
                q = g[h]
                if not any(np.array_equal(q, e) for e in group):
                    group.append(q)
                    new.append(q)
            frontier = new
    return group


def orbit_representatives(group: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(rep, how): for every core c the smallest core r of its orbit and the index of a group element p with
    ``p[r] = c``."""
    rep = np.arange(n)
    how = np.zeros(n, dtype=np.int64)
    for c in range(n):
        for k, p in enumerate(group):
            r = int(np.flatnonzero(p == c)[0])  # p[r] = c
            if r < rep[c]:
                rep[c], how[c] = r, k
    return rep, how
