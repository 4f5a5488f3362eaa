"""DVFS and DRAM refresh models (seed 001 §4.6, §6; ARCHITECTURE §5.4). Temperatures in °C at this edge.

DVFS: every core follows the steps, trips and hysteresis of its domain (``arch.dvfs.domains``) on its OWN temperature
(the state carries one level per core). Level 0 is the fastest step. A core at level ``l`` steps down while
``T ≥ trip_c[l]`` and steps back up only while ``T < trip_c[l−1] − hysteresis_c`` (so a core sitting between the
two thresholds keeps its level). Voltage: ``volts[l]`` when given, else ``V ∝ f`` with ``V0`` at ``steps_ghz[0]``.

Refresh: ``multiplier(T)`` reads ``arch.refresh.tref_curve`` as a step (default) or interpolates it; ``tREFI(T) =
tref_base_us / multiplier(T)`` (JEDEC doubles the refresh rate above 85 °C: ``energy_anchors.csv`` rows
"refresh,DDR3 tREFI normal/extended" and "DDR4 (automotive) tREFI"); refresh busy fraction ``tRFC/tREFI`` ("refresh
busy fraction tRFC/tREFI" row: 4.5 % at 7.8 µs, 9 % at 3.9 µs with tRFC = 350 ns); ``BW_eff = BW_raw·(1 − busy)``.
"""

from __future__ import annotations

import numpy as np

from shared.chip import core_domains as chip_core_domains
from shared.configs import ArchConfig
from shared.configs.arch import DvfsDomain, RefreshConfig
from shared.energy import trefi_us  # the refresh curve's owner (thermal and TAPS price refresh with it)


def core_domains(arch: ArchConfig) -> np.ndarray:
    """(cores,) index of each core's DVFS domain (the one rule: ``shared.chip.core_domains``)."""
    return np.asarray(chip_core_domains(arch), dtype=int)


def dvfs_level_step(temp_c: float, level: int, domain: DvfsDomain) -> int:
    """Next level of one core at temperature ``temp_c`` currently at ``level``."""
    n = len(domain.steps_ghz)
    lv = min(max(level, 0), n - 1)
    while lv < n - 1 and temp_c >= domain.trip_c[lv]:
        lv += 1
    while lv > 0 and temp_c < domain.trip_c[lv - 1] - domain.hysteresis_c:
        lv -= 1
    return lv


def dvfs_step(temps_c: np.ndarray, levels: np.ndarray, arch: ArchConfig) -> np.ndarray:
    """(cores,) next DVFS levels from per-core temperatures (°C) and current levels."""
    dom = core_domains(arch)
    return np.array([dvfs_level_step(float(t), int(lv), arch.dvfs.domains[d])
                     for t, lv, d in zip(temps_c, levels, dom, strict=True)], dtype=int)


def freq_volt(levels: np.ndarray, arch: ArchConfig) -> tuple[np.ndarray, np.ndarray]:
    """(GHz, V) per core for the given levels."""
    dom = core_domains(arch)
    f = np.empty(len(levels))
    v = np.empty(len(levels))
    v0 = arch.power.v0
    for c, (lv, d) in enumerate(zip(levels, dom, strict=True)):
        spec = arch.dvfs.domains[d]
        lvl = min(max(int(lv), 0), len(spec.steps_ghz) - 1)
        f[c] = spec.steps_ghz[lvl]
        v[c] = spec.volts[lvl] if spec.volts is not None else v0 * spec.steps_ghz[lvl] / spec.steps_ghz[0]
    return f, v


def busy_fraction(temp_c: float | np.ndarray, refresh: RefreshConfig) -> np.ndarray:
    """tRFC / tREFI(T), capped at 1."""
    return np.minimum(refresh.trfc_ns * 1e-3 / trefi_us(temp_c, refresh), 1.0)


def bw_eff_factor(temp_c: float | np.ndarray, refresh: RefreshConfig) -> np.ndarray:
    """BW_eff / BW_raw = 1 − tRFC/tREFI(T)."""
    return 1.0 - busy_fraction(temp_c, refresh)


def refresh_mhz(bank_temps_c: np.ndarray, refresh: RefreshConfig) -> float:
    """Refresh commands per second over all banks (one per bank per tREFI), in MHz."""
    return float(np.sum(1.0 / trefi_us(bank_temps_c, refresh)))  # 1/µs = MHz
