"""The best spread: how cool any placement of a run's work could keep the chip (a bound, not a policy).

A placement policy (TAPS offline, TACS online) moves work between cores and vaults; it does not change how much work
there is. So the lowest steady peak that *any* spatial distribution of a run's power reaches bounds what placement
can do: where even that peak is above the first DVFS trip, no placement keeps the chip at its top clock, and the
throttling that remains is the work's, not the policy's.

With ``H`` (cores × cores, K/W: rise of core i's mean per W in core j) and ``Hv`` (cores × vaults, K/W per W spread
evenly over vault j's dies) from `services.thermal.influence`, the core temperatures of a steady power map are
``T = T_amb + H·(p + l) + Hv·(q + s)`` with

- ``p`` (W per core) the logic's dynamic power (MACs, scratchpad, routers), free to move: ``Σ p = P_dyn``,
  ``0 ≤ p_c ≤`` the core's full-array power at its top clock (``mac_j · MACs per cycle · f_top``);
- ``l`` the logic leakage of each core at its own temperature and the top step's voltage (``shared.energy``'s
  ``static_power``): not free, it follows T (a fixed point, below);
- ``q`` (W per vault) the DRAM access power, free: ``Σ q = P_access``, ``0 ≤ q_v ≤`` the vault's bandwidth times the
  access energy (``vault_bw · J/B``);
- ``s`` the DRAM refresh and leakage, the run's own total spread evenly over the vaults (it is everywhere).

The best spread solves the linear programme ``min t`` subject to ``T_i − T_amb ≤ t`` for every core (HiGHS, scipy's
``linprog``), with ``l`` evaluated at the previous solution's temperatures until it moves less than 1 mW a core
(the leakage rises ~1 %/K: a few iterations). The uniform spread (``p``, ``q`` equal everywhere, ``l`` at its fixed
point) is reported beside it. Both are steady states: a run that sustains its load for many thermal time constants
approaches them; DVFS trips on the core means that ``H`` gives (``services/thermal/epoch.py``).

The most power the best spread can hold under a temperature (the first trip, by default) is found by scaling the
run's dynamic and access power together (bisection on the scale; the bound is monotone in it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from services.thermal.influence import influence_for_model, vault_influence_for_model
from services.thermal.model import get_model
from shared.configs import ArchConfig
from shared.dvfs import top_freqs, volts_for
from shared.energy import EnergyModel, static_power
from shared.errors import BadInput

LEAK_TOL_W = 1e-3  # the leakage fixed point stops when no core's leakage moves more than this (W)
LEAK_ITERATIONS = 50
SCALE_STEPS = 20  # bisection steps of the power scale (1e-6 of the run's power)


@dataclass(frozen=True)
class RunPower:
    """A run's mean power by what placement can move (W): dynamic logic power, logic leakage (reported, not used:
    the bound evaluates leakage at its own temperatures), DRAM access power, DRAM refresh and leakage."""

    logic_dynamic_w: float
    logic_leakage_w: float
    dram_access_w: float
    dram_static_w: float

    @classmethod
    def of_components(cls, mean_w: dict[str, float]) -> RunPower:
        """From a power report's component means (services/metrics/reduce.py ``POWER_COMPONENTS``)."""
        need = ("logic_dynamic", "spm", "noc", "logic_leakage", "dram_access", "dram_refresh", "dram_leakage")
        missing = [k for k in need if k not in mean_w]
        if missing:
            raise BadInput(f"power report: no component {missing[0]!r}", field=f"components.{missing[0]}")
        return cls(logic_dynamic_w=mean_w["logic_dynamic"] + mean_w["spm"] + mean_w["noc"],
                   logic_leakage_w=mean_w["logic_leakage"], dram_access_w=mean_w["dram_access"],
                   dram_static_w=mean_w["dram_refresh"] + mean_w["dram_leakage"])


@dataclass(frozen=True)
class Spread:
    """One steady power map and what it gives (°C at the edges, W)."""

    peak_c: float  # the hottest core's mean temperature
    core_c: np.ndarray  # (cores,) °C
    core_dynamic_w: np.ndarray  # (cores,) p
    core_leakage_w: np.ndarray  # (cores,) l at core_c
    vault_access_w: np.ndarray  # (vaults,) q


@dataclass(frozen=True)
class SpreadBound:
    """The best and the uniform spread of a run's power, and the most power the best spread holds under
    ``under_c``."""

    best: Spread
    uniform: Spread
    under_c: float
    max_scale: float  # of the run's dynamic and access power, at which the best spread peaks at under_c (inf: never)
    run: RunPower


@dataclass(frozen=True)
class _Chip:
    H: np.ndarray
    Hv: np.ndarray
    ambient_c: float
    core_cap_w: np.ndarray
    vault_cap_w: np.ndarray
    arch: ArchConfig
    volts: np.ndarray

    @classmethod
    def of(cls, arch: ArchConfig) -> _Chip:
        model = get_model(arch)
        n = model.n_cores
        em = EnergyModel.from_arch(arch)
        f_top = np.asarray(top_freqs(arch), dtype=float)  # GHz per core
        macs = arch.core.array[0] * arch.core.array[1]
        return cls(H=influence_for_model(model), Hv=vault_influence_for_model(model),
                   ambient_c=float(arch.geometry.cooling.ambient_c),
                   core_cap_w=em.mac_j * macs * f_top * 1e9,
                   vault_cap_w=np.full(n, arch.dram.vault_bw_gbps * 1e9 * em.dram_j_per_byte),
                   arch=arch, volts=np.asarray(volts_for(f_top, arch), dtype=float))

    def leakage(self, core_c: np.ndarray) -> np.ndarray:
        core_leak, _, _ = static_power(self.arch, core_c, 0.0, V=self.volts)
        return np.asarray(core_leak, dtype=float)

    def temps(self, p: np.ndarray, leak: np.ndarray, q: np.ndarray, s: np.ndarray) -> np.ndarray:
        return np.asarray(self.ambient_c + self.H @ (p + leak) + self.Hv @ (q + s), dtype=float)


def _check(run: RunPower, chip: _Chip) -> None:
    for name in ("logic_dynamic_w", "logic_leakage_w", "dram_access_w", "dram_static_w"):
        v = getattr(run, name)
        if not (np.isfinite(v) and v >= 0):
            raise BadInput(f"{name}: must be a finite power >= 0 W, got {v!r}", field=name)
    if run.logic_dynamic_w > chip.core_cap_w.sum() * (1 + 1e-9):
        raise BadInput(f"logic_dynamic_w: {run.logic_dynamic_w:.4g} W is more than the cores draw at full load "
                       f"({chip.core_cap_w.sum():.4g} W)", field="logic_dynamic_w")
    if run.dram_access_w > chip.vault_cap_w.sum() * (1 + 1e-9):
        raise BadInput(f"dram_access_w: {run.dram_access_w:.4g} W is more than the vaults draw at full bandwidth "
                       f"({chip.vault_cap_w.sum():.4g} W)", field="dram_access_w")


def _best_maps(chip: _Chip, p_total: float, q_total: float, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The LP: (p, q) minimising the hottest core of ``offset + H·p + Hv·q`` under the sums and the caps."""
    n = chip.H.shape[0]
    # x = [p (n), q (n), t]: minimise t; H·p + Hv·q − t ≤ −offset; Σp = P, Σq = Q; caps; t free
    c = np.zeros(2 * n + 1)
    c[-1] = 1.0
    a_ub = np.hstack([chip.H, chip.Hv, -np.ones((n, 1))])
    a_eq = np.zeros((2, 2 * n + 1))
    a_eq[0, :n] = 1.0
    a_eq[1, n:2 * n] = 1.0
    bounds = [(0.0, float(x)) for x in chip.core_cap_w] + [(0.0, float(x)) for x in chip.vault_cap_w] + [(None, None)]
    res = linprog(c, A_ub=a_ub, b_ub=-offset, A_eq=a_eq, b_eq=[p_total, q_total], bounds=bounds, method="highs")
    if res.status != 0:  # pragma: no cover - feasible by _check (the sums are within the caps)
        raise RuntimeError(f"the best-spread programme did not solve: {res.message}")
    x = np.asarray(res.x, dtype=float)
    return np.maximum(x[:n], 0.0), np.maximum(x[n:2 * n], 0.0)


def _spread(chip: _Chip, run: RunPower, scale: float, *, best: bool) -> Spread:
    """The steady map of ``scale`` × the run's movable power, best (the LP) or uniform, with the leakage at its own
    temperatures (fixed point)."""
    n = chip.H.shape[0]
    p_total, q_total = run.logic_dynamic_w * scale, run.dram_access_w * scale
    s = np.full(n, run.dram_static_w / n)
    p, q = np.full(n, p_total / n), np.full(n, q_total / n)
    leak = chip.leakage(chip.temps(p, np.zeros(n), q, s))
    for _ in range(LEAK_ITERATIONS):
        if best:
            p, q = _best_maps(chip, p_total, q_total, chip.H @ leak + chip.Hv @ s)
        T = chip.temps(p, leak, q, s)
        new_leak = chip.leakage(T)
        moved = float(np.abs(new_leak - leak).max())
        leak = new_leak
        if moved < LEAK_TOL_W:
            break
    T = chip.temps(p, leak, q, s)
    return Spread(peak_c=float(T.max()), core_c=T, core_dynamic_w=p, core_leakage_w=leak, vault_access_w=q)


def spread_bound(arch: ArchConfig, run: RunPower, *, under_c: float | None = None) -> SpreadBound:
    """The best and the uniform spread of ``run``'s power on ``arch`` (module docstring), and the largest scale of
    its movable power whose best spread peaks at ``under_c`` (default: the first DVFS trip of the first domain)."""
    chip = _Chip.of(arch)
    _check(run, chip)
    if under_c is None:
        if not arch.dvfs.domains or not arch.dvfs.domains[0].trip_c:
            raise BadInput("arch: no DVFS trip to hold the bound under; give under_c", field="under_c")
        under_c = float(arch.dvfs.domains[0].trip_c[0])
    if not np.isfinite(under_c):
        raise BadInput(f"under_c: must be finite, got {under_c!r}", field="under_c")
    best = _spread(chip, run, 1.0, best=True)
    uniform = _spread(chip, run, 1.0, best=False)
    return SpreadBound(best=best, uniform=uniform, under_c=under_c, max_scale=_max_scale(chip, run, under_c, best),
                       run=run)


def _max_scale(chip: _Chip, run: RunPower, under_c: float, at_one: Spread) -> float:
    """The largest scale of the movable power (within what the cores and vaults draw at full load) whose best
    spread peaks at or under ``under_c``; 0 when even none of it does, inf when all of it at full load does."""
    movable = run.logic_dynamic_w + run.dram_access_w
    if movable <= 0:
        return float("inf") if at_one.peak_c <= under_c else 0.0
    cap = min(chip.core_cap_w.sum() / run.logic_dynamic_w if run.logic_dynamic_w > 0 else np.inf,
              chip.vault_cap_w.sum() / run.dram_access_w if run.dram_access_w > 0 else np.inf)

    def peak(scale: float) -> float:
        return at_one.peak_c if scale == 1.0 else _spread(chip, run, scale, best=True).peak_c

    if peak(0.0) > under_c:
        return 0.0
    if peak(cap) <= under_c:
        return float("inf")
    lo, hi = (0.0, 1.0) if peak(1.0) > under_c else (1.0, cap)
    for _ in range(SCALE_STEPS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if peak(mid) <= under_c else (lo, mid)
    return lo


__all__ = ["RunPower", "Spread", "SpreadBound", "spread_bound"]
