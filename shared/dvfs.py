"""The DVFS governor and its voltages: one rule for the thermal service (which steps every core's level window by
window) and TAPS (which predicts the level a core settles at). Temperatures in °C, frequencies in GHz, volts in V.

Every core follows the steps, trips and hysteresis of its domain (``arch.dvfs.domains``; which domain a core belongs
to is ``shared.chip.core_domains``) on its OWN temperature. Level 0 is the fastest step. A core at level ``l`` steps
down while ``T ≥ trip_c[l]`` and steps back up only while ``T < trip_c[l−1] − hysteresis_c`` (so a core sitting
between the two thresholds keeps its level). Voltage: ``volts[l]`` when given, else ``V ∝ f`` with ``V0``
(``power.v0``) at ``steps_ghz[0]`` (seed 001 §4.6). Dynamic energy scales as ``(V/V0)²`` (``dynamic_scale``).
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


def step_levels(temps_c: np.ndarray, levels: np.ndarray, arch: ArchConfig) -> np.ndarray:
    """(cores,) next DVFS levels from per-core temperatures (°C) and current levels."""
    dom = _domains(arch)
    return np.array([level_step(float(t), int(lv), arch.dvfs.domains[d])
                     for t, lv, d in zip(temps_c, levels, dom, strict=True)], dtype=int)


def _volt(spec: DvfsDomain, lvl: int, v0: float) -> float:
    return float(spec.volts[lvl]) if spec.volts is not None else v0 * spec.steps_ghz[lvl] / spec.steps_ghz[0]


def freq_volt(levels: np.ndarray, arch: ArchConfig) -> tuple[np.ndarray, np.ndarray]:
    """(GHz, V) per core for the given levels."""
    dom = _domains(arch)
    f = np.empty(len(levels))
    v = np.empty(len(levels))
    for c, (lv, d) in enumerate(zip(levels, dom, strict=True)):
        spec = arch.dvfs.domains[d]
        lvl = min(max(int(lv), 0), len(spec.steps_ghz) - 1)
        f[c] = spec.steps_ghz[lvl]
        v[c] = _volt(spec, lvl, arch.power.v0)
    return f, v


def top_freqs(arch: ArchConfig) -> list[float]:
    """Per core, the top step of its DVFS domain (level 0: where every run starts), GHz."""
    return [float(f) for f in freq_volt(np.zeros(arch.mesh.n_cores, dtype=int), arch)[0]]


def volts_for(freq_ghz: np.ndarray, arch: ArchConfig) -> np.ndarray:
    """Core voltage for its frequency: the voltage of the domain's step nearest to f."""
    dom = _domains(arch)
    v = np.empty(len(freq_ghz))
    for c, (f, d) in enumerate(zip(freq_ghz, dom, strict=True)):
        spec = arch.dvfs.domains[d]
        v[c] = _volt(spec, int(np.argmin(np.abs(np.asarray(spec.steps_ghz) - f))), arch.power.v0)
    return v


def dynamic_scale(volts: np.ndarray | float, arch: ArchConfig) -> np.ndarray:
    """``(V/V0)²``: the factor on dynamic (switching) energy priced at V0 (``shared/energy.py``), ``E ∝ C·V²``."""
    return np.asarray((np.asarray(volts, dtype=float) / arch.power.v0) ** 2, dtype=float)
