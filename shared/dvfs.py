"""The DVFS governor and its voltages: one rule for the thermal service (which steps every core's level window by
window) and TAPS (which predicts the level a core settles at). Temperatures in °C, frequencies in GHz, volts in V.

Every core follows the steps, trips and hysteresis of its domain (``arch.dvfs.domains``; which domain a core belongs
to is ``shared.chip.core_domains``) on its OWN temperature. Level 0 is the fastest step. A core at level ``l`` steps
down while ``T ≥ trip_c[l]`` and steps back up only while ``T < trip_c[l−1] − hysteresis_c`` (so a core sitting
between the two thresholds keeps its level). Voltage: ``volts[l]`` when given, else ``V ∝ f`` with ``V0``
(``power.v0``) at ``steps_ghz[0]`` (seed 001 §4.6). Dynamic energy scales as ``(V/V0)²`` (``dynamic_scale``).

With a hard limit (``arch.dtm``), a domain of ``n`` steps has ``len(dtm.duty)`` emergency levels past its last step:
level ``n + i`` runs the last step's clock modulated at ``dtm.duty[i]`` (effective clock ``steps_ghz[-1] ·
duty[i]``) at the last step's voltage, so a window's work pays the last step's energy per op and its power follows
the effective clock. The trips never choose these levels (``step`` stays within the DVFS steps); the thermal
service's hard limit does (services/thermal/dtm.py). Without ``arch.dtm`` a level past the last step is the last
step, as it always was.
"""

from __future__ import annotations

import numpy as np

from shared.chip import core_domains
from shared.configs import ArchConfig
from shared.configs.arch import DvfsDomain


def _domains(arch: ArchConfig) -> np.ndarray:
    """(cores,) index of each core's DVFS domain (the one rule: ``shared.chip.core_domains``)."""
    return np.asarray(core_domains(arch), dtype=int)


def level_step(temp_c: float, level: int, domain: DvfsDomain) -> int:
    """Next level of one core at temperature ``temp_c`` currently at ``level``."""
    n = len(domain.steps_ghz)
    lv = min(max(level, 0), n - 1)
    while lv < n - 1 and temp_c >= domain.trip_c[lv]:
        lv += 1
    while lv > 0 and temp_c < domain.trip_c[lv - 1] - domain.hysteresis_c:
        lv -= 1
    return lv


class Governor:
    """The DVFS rule of one arch, its tables built once (the thermal service asks it every window of a run): the
    domain of every core, each domain's steps (GHz), voltages, trips and trips minus hysteresis."""

    def __init__(self, arch: ArchConfig) -> None:
        self.dom = _domains(arch)
        self.domains: list[tuple[np.ndarray | slice, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        # every level of each domain, the emergency levels past the DVFS steps included: clock (GHz) and voltage
        self.ladders: list[tuple[np.ndarray, np.ndarray]] = []
        duty = np.asarray(arch.dtm.duty if arch.dtm is not None else (), dtype=float)
        self.n_dvfs = np.zeros(self.dom.size, dtype=np.int64)  # per core: its domain's DVFS steps
        self.deepest = np.zeros(self.dom.size, dtype=np.int64)  # per core: its domain's deepest level
        for d, spec in enumerate(arch.dvfs.domains):
            sel = self.dom == d
            if not sel.any():
                continue
            n = len(spec.steps_ghz)
            steps = np.array(spec.steps_ghz, dtype=float)
            volts = np.array([_volt(spec, lvl, arch.power.v0) for lvl in range(n)])
            self.domains.append((
                slice(None) if sel.all() else sel,  # one domain for every core: no gather
                steps,
                volts,
                np.array(spec.trip_c, dtype=float),
                np.array([x - spec.hysteresis_c for x in spec.trip_c]),  # level_step's trip_c[l - 1] - hysteresis_c
            ))
            self.ladders.append((np.concatenate([steps, steps[-1] * duty]),
                                np.concatenate([volts, np.full(duty.size, volts[-1])])))
            self.n_dvfs[sel] = n
            self.deepest[sel] = n + duty.size - 1

    def _check(self, what: str, a: np.ndarray) -> None:
        if a.shape != self.dom.shape:
            raise ValueError(f"{what}: {a.size} values for {self.dom.size} cores")

    def step(self, temps_c: np.ndarray, levels: np.ndarray) -> np.ndarray:
        """(cores,) next levels: `level_step` for every core at once. The trips ascend, so the cores' climb ends at
        the count of trips at or below T (``T >= trip_c[l]`` holds for a prefix of ``l``) and their descent at the
        count of ``trip_c[l] − hysteresis_c`` that T is not below: the same comparisons, no loop."""
        t = np.asarray(temps_c, dtype=float)
        lv_in = np.asarray(levels)
        self._check("step_levels temperatures", t)
        self._check("step_levels levels", lv_in)
        out = np.zeros(self.dom.size, dtype=int)
        for sel, steps, _, trip, back in self.domains:
            if steps.size == 1:
                continue  # one step: level 0
            tc = t[sel][:, None]
            lv = np.minimum(np.maximum(lv_in[sel].astype(np.int64), 0), steps.size - 1)
            climb = np.count_nonzero(tc >= trip, axis=1)
            stay = back.size - np.count_nonzero(tc < back, axis=1)
            out[sel] = np.minimum(np.maximum(lv, climb), stay)
        return out

    def freq_volt(self, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(GHz, V) per core for the given levels: a DVFS step's clock and voltage, an emergency level's effective
        clock at the last step's voltage (levels past a domain's deepest level are its deepest)."""
        lv = np.asarray(levels)
        self._check("freq_volt levels", lv)
        f = np.empty(self.dom.size)
        v = np.empty(self.dom.size)
        for (sel, _, _, _, _), (clocks, volts) in zip(self.domains, self.ladders, strict=True):
            idx = np.clip(lv[sel].astype(np.int64), 0, clocks.size - 1)
            f[sel] = clocks[idx]
            v[sel] = volts[idx]
        return f, v

    def volts_for(self, freq_ghz: np.ndarray) -> np.ndarray:
        """Core voltage for its frequency: the voltage of the domain's step nearest to f (the first of equally near
        ones). A clock below the last step (an emergency level's) is nearest the last step: its voltage."""
        f = np.asarray(freq_ghz, dtype=float)
        self._check("volts_for frequencies", f)
        v = np.empty(self.dom.size)
        for sel, steps, volts, _, _ in self.domains:
            v[sel] = volts[np.argmin(np.abs(steps[None, :] - f[sel][:, None]), axis=1)]
        return v


def step_levels(temps_c: np.ndarray, levels: np.ndarray, arch: ArchConfig) -> np.ndarray:
    """(cores,) next DVFS levels from per-core temperatures (°C) and current levels (`level_step` for every core)."""
    return Governor(arch).step(temps_c, levels)


def _volt(spec: DvfsDomain, lvl: int, v0: float) -> float:
    return float(spec.volts[lvl]) if spec.volts is not None else v0 * spec.steps_ghz[lvl] / spec.steps_ghz[0]


def freq_volt(levels: np.ndarray, arch: ArchConfig) -> tuple[np.ndarray, np.ndarray]:
    """(GHz, V) per core for the given levels (``Governor.freq_volt``)."""
    return Governor(arch).freq_volt(levels)


def top_freqs(arch: ArchConfig) -> list[float]:
    """Per core, the top step of its DVFS domain (level 0: where every run starts), GHz."""
    return [float(f) for f in freq_volt(np.zeros(arch.mesh.n_cores, dtype=int), arch)[0]]


def volts_for(freq_ghz: np.ndarray, arch: ArchConfig) -> np.ndarray:
    """Core voltage for its frequency: the voltage of the domain's step nearest to f."""
    return Governor(arch).volts_for(freq_ghz)


def dynamic_scale(volts: np.ndarray | float, arch: ArchConfig) -> np.ndarray:
    """``(V/V0)²``: the factor on dynamic (switching) energy priced at V0 (``shared/energy.py``), ``E ∝ C·V²``."""
    return np.asarray((np.asarray(volts, dtype=float) / arch.power.v0) ** 2, dtype=float)
