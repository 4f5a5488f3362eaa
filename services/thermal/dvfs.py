"""DRAM refresh models (seed 001 §6; ARCHITECTURE §5.4). Temperatures in °C at this edge. The DVFS governor the
thermal service steps every window (one level per core in the state) is ``shared/dvfs.py``, the one rule TAPS also
predicts with.

Refresh: ``multiplier(T)`` reads ``arch.refresh.tref_curve`` as a step (default) or interpolates it; ``tREFI(T) =
tref_base_us / multiplier(T)`` (JEDEC doubles the refresh rate above 85 °C: ``energy_anchors.csv`` rows
"refresh,DDR3 tREFI normal/extended" and "DDR4 (automotive) tREFI"); refresh busy fraction ``tRFC/tREFI`` ("refresh
busy fraction tRFC/tREFI" row: 4.5 % at 7.8 µs, 9 % at 3.9 µs with tRFC = 350 ns); ``BW_eff = BW_raw·(1 − busy)``.
"""

from __future__ import annotations

import numpy as np

from shared.configs.arch import RefreshConfig
from shared.energy import trefi_us  # the refresh curve's owner (thermal and TAPS price refresh with it)


def busy_fraction(temp_c: float | np.ndarray, refresh: RefreshConfig) -> np.ndarray:
    """tRFC / tREFI(T), capped at 1."""
    return np.minimum(refresh.trfc_ns * 1e-3 / trefi_us(temp_c, refresh), 1.0)


def bw_eff_factor(temp_c: float | np.ndarray, refresh: RefreshConfig) -> np.ndarray:
    """BW_eff / BW_raw = 1 − tRFC/tREFI(T)."""
    return 1.0 - busy_fraction(temp_c, refresh)


def refresh_mhz(bank_temps_c: np.ndarray, refresh: RefreshConfig) -> float:
    """Refresh commands per second over all banks (one per bank per tREFI), in MHz."""
    return float(np.sum(1.0 / trefi_us(bank_temps_c, refresh)))  # 1/µs = MHz


def refresh_mhz_rows(bank_temps_c: np.ndarray, refresh: RefreshConfig) -> np.ndarray:
    """``refresh_mhz`` of every row of ``bank_temps_c`` (rows, ...) at once: each row's rates summed as one
    contiguous run, as ``refresh_mhz`` sums a C-ordered array (the same numbers)."""
    rate = np.ascontiguousarray(1.0 / trefi_us(bank_temps_c, refresh))
    out: np.ndarray = np.sum(rate.reshape(rate.shape[0], -1), axis=1)
    return out
