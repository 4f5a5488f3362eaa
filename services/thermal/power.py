"""Power from a window's physical events (seed 001 §4.6, §6; ARCHITECTURE §5.4). SI inside: J, W, s, K.

Per window of length Δt (powers are window averages):

- logic dynamic, per core: ``Σ energy_j · (V/V0)² / Δt`` of its compute events (``energy_j``: MACs + scratchpad
  accesses at V0, priced by the lowering service with ``shared/energy.py``); reported as ``logic_dynamic`` (the MAC
  part, ``flops/2 · mac_pj``) and ``spm`` (the rest).
- DRAM dynamic and NoC: ``shared/energy.py``'s ``deposit_memory``: ``bytes · 8 · pj_per_bit`` split by
  ``dram.energy_split`` into the accessed bank (array), the vault's banks of the accessed die (TSV/IO) and the vault's
  logic core (controller); ``bytes · 8 · pj_per_bit_hop`` per link of the XY route, half on each end router.
  Dispatch/combine events are NoC only.
- leakage, per core and per bank, at the PREVIOUS window's temperature: the configured value at 45 °C scaled by the
  Liao–He–Lepak fit ``f(T;V) = A·T²·exp((α·V+β)/T) + B·exp(γ·V+δ)`` (row "leakage,Liao-He-Lepak 65nm leakage
  scaling", TCAD 2005; ×1.44 at 65 °C, ×1.72 at 85 °C vs 25 °C) or ``exp(β·(T − 45 °C))`` (row note "~0.9 %/K near
  85C") or none.
- DRAM refresh, per bank: ``refresh_energy_nj / tREFI(T_bank)`` with tREFI from the refresh curve
  (shared/energy.py; rows "refresh,DDR3 tREFI normal/extended").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.configs import ArchConfig
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.thermal import PowerBreakdown
from shared.dvfs import dynamic_scale, volts_for
from shared.energy import WindowDeposit, deposit_of_events, static_power
from shared.errors import BadInput


@dataclass(frozen=True)
class WindowPower:
    core_w: np.ndarray  # (cores,) everything dissipated in the logic layer under each core, W
    bank_w: np.ndarray  # (DRAM dies, banks per die) W
    breakdown: PowerBreakdown
    core_dynamic_w: np.ndarray
    core_memory_w: np.ndarray  # NoC routers + memory controllers on the logic die


def compute_power_from_events(compute: ComputeEvents, memory: MemoryEvents, arch: ArchConfig, *,
                              core_temp_c: np.ndarray, bank_temp_c: np.ndarray, freq_ghz: np.ndarray,
                              window_s: float) -> WindowPower:
    """Window-average power per core and per bank from columnar events (see the module docstring).

    ``core_temp_c`` (cores,), ``bank_temp_c`` (DRAM dies, banks per die): previous window's temperatures, °C;
    ``freq_ghz`` (cores,): the frequency the window ran at.
    """
    if not window_s > 0:
        raise BadInput("window length must be > 0", field="window_ms")
    return compute_power(deposit_of_events(compute, memory, arch), arch, core_temp_c=core_temp_c,
                         bank_temp_c=bank_temp_c, freq_ghz=freq_ghz, window_s=window_s)


def compute_power(dep: WindowDeposit, arch: ArchConfig, *, core_temp_c: np.ndarray, bank_temp_c: np.ndarray,
                  freq_ghz: np.ndarray, window_s: float, volts: np.ndarray | None = None) -> WindowPower:
    """Window-average power per core and per bank from the window's energy deposit (``shared.energy``; what
    ``compute_power_from_events`` computes from the events, or what the lowering service sent in their place).
    ``volts``: the cores' voltages at ``freq_ghz`` (``volts_for``) when the caller has them (a run of windows at the
    same clocks looks them up once)."""
    if not window_s > 0:
        raise BadInput("window length must be > 0", field="window_ms")
    bx_n, by_n, n_dies = arch.dram.banks
    V = volts_for(np.asarray(freq_ghz, dtype=float), arch) if volts is None else volts

    # logic dynamic: the events' energy at V0 (MACs + scratchpad, shared/energy.py) scaled by (V/V0)²
    vscale = dynamic_scale(V, arch)
    core_dyn = dep.core_compute_j * vscale / window_s
    # the MAC part (reported); the rest is scratchpad accesses. Both sit on the core; the power map is core_dyn.
    mac_w = float((dep.core_mac_j * vscale).sum() / window_s)
    dyn_w = float(core_dyn.sum())

    # memory: DRAM (array in the bank, TSV/IO in the vault's column of the die, controller on the logic die) + NoC
    mem = dep.memory
    bank_dyn = mem.bank_j.reshape(n_dies, bx_n * by_n) / window_s
    core_mem = mem.core_j / window_s

    # leakage and refresh at the previous window's temperatures
    core_leak, bank_leak, bank_ref = static_power(arch, core_temp_c, bank_temp_c, V)
    breakdown = PowerBreakdown(
        logic_dynamic=mac_w, spm=max(dyn_w - mac_w, 0.0), logic_leakage=float(core_leak.sum()),
        dram_dynamic=(mem.array_j + mem.tsv_io_j) / window_s, dram_refresh=float(np.sum(bank_ref)),
        dram_leakage=float(bank_leak.sum()), noc=mem.noc_j / window_s, dram_controller=mem.controller_j / window_s,
    )
    return WindowPower(core_dyn + core_leak + core_mem, bank_dyn + bank_ref + bank_leak, breakdown, core_dyn,
                       core_mem)
