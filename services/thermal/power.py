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
  (services/thermal/dvfs.py; rows "refresh,DDR3 tREFI normal/extended").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.thermal.dvfs import core_domains
from shared.chip import Chip
from shared.configs import ArchConfig
from shared.contracts.events import NOC_QOS, ComputeEvents, MemoryEvents
from shared.contracts.ids import parse_bank_ids
from shared.contracts.thermal import PowerBreakdown
from shared.energy import EnergyModel, deposit_memory, noc_only_mask, static_power
from shared.errors import BadInput


def volts_for(freq_ghz: np.ndarray, arch: ArchConfig) -> np.ndarray:
    """Core voltage for its frequency: the domain's step nearest to f (its ``volts`` or V0·f/f_max)."""
    dom = core_domains(arch)
    v = np.empty(len(freq_ghz))
    for c, (f, d) in enumerate(zip(freq_ghz, dom, strict=True)):
        spec = arch.dvfs.domains[d]
        steps = np.array(spec.steps_ghz)
        lvl = int(np.argmin(np.abs(steps - f)))
        v[c] = spec.volts[lvl] if spec.volts is not None else arch.power.v0 * f / steps[0]
    return v


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
    n_cores = arch.mesh.n_cores
    bx_n, by_n, n_dies = arch.dram.banks
    pw = arch.power
    V = volts_for(np.asarray(freq_ghz, dtype=float), arch)

    # logic dynamic: the events' energy at V0 (MACs + scratchpad, shared/energy.py) scaled by (V/V0)²
    core_ids = np.asarray(compute.core_id, dtype=int)
    e_comp = np.asarray(compute.energy_j, dtype=float)
    if core_ids.size:
        bad = np.flatnonzero((core_ids < 0) | (core_ids >= n_cores))
        if bad.size:
            raise BadInput(f"compute_events.core_id[{bad[0]}] = {core_ids[bad[0]]} is outside the mesh "
                           f"(0..{n_cores - 1})", field=f"compute_events.core_id[{bad[0]}]")
        bad = np.flatnonzero(~np.isfinite(e_comp) | (e_comp < 0))
        if bad.size:
            raise BadInput(f"compute_events.energy_j[{bad[0]}] must be a finite number >= 0",
                           field=f"compute_events.energy_j[{bad[0]}]")
    e_core = np.bincount(core_ids, e_comp, n_cores) if core_ids.size else np.zeros(n_cores)
    vscale = (V / pw.v0) ** 2
    core_dyn = e_core * vscale / window_s
    # the MAC part of each event (flops = 2 · MACs, priced at mac_pj: shared/energy.py), capped at its energy; the rest
    # is its scratchpad accesses. Both sit on the core; the split is reported, the power map is core_dyn.
    fl = np.asarray(compute.flops, dtype=float)
    e_mac = np.minimum(np.maximum(fl, 0.0) * 0.5 * pw.mac_pj * 1e-12, e_comp) if core_ids.size else np.zeros(0)
    mac_w = float((np.bincount(core_ids, e_mac, n_cores) * vscale).sum() / window_s) if core_ids.size else 0.0
    dyn_w = float(core_dyn.sum())

    # memory: DRAM (array in the bank, TSV/IO in the vault's column of the die, controller on the logic die) + NoC
    chip = Chip.from_arch(arch)
    nbytes = np.asarray(memory.bytes, dtype=float)
    src = np.asarray(memory.src_core, dtype=int)
    if len(memory):
        bad = np.flatnonzero(~np.isfinite(nbytes) | (nbytes < 0))
        if bad.size:
            raise BadInput(f"memory_events.bytes[{bad[0]}] must be a finite number >= 0",
                           field=f"memory_events.bytes[{bad[0]}]")
        bad = np.flatnonzero((src < 0) | (src >= n_cores))
        if bad.size:
            raise BadInput(f"memory_events.src_core[{bad[0]}] = {src[bad[0]]} is outside the mesh",
                           field=f"memory_events.src_core[{bad[0]}]")
        bad = np.flatnonzero(np.asarray(memory.hops, dtype=int) < 0)
        if bad.size:
            raise BadInput(f"memory_events.hops[{bad[0]}] must be >= 0", field=f"memory_events.hops[{bad[0]}]")
        bad_q = [i for i, x in enumerate(memory.noc_qos) if x not in NOC_QOS]
        if bad_q:
            raise BadInput(f"memory_events.noc_qos[{bad_q[0]}] = {memory.noc_qos[bad_q[0]]!r}: one of "
                           f"{', '.join(NOC_QOS)}", field=f"memory_events.noc_qos[{bad_q[0]}]")
    try:
        xyz = parse_bank_ids(memory.dst_bank)
    except ValueError as exc:
        i = str(exc)[1:str(exc).index("]")]
        raise BadInput(str(exc).split("] ", 1)[1], field=f"memory_events.dst_bank[{i}]") from None
    bad = np.flatnonzero((xyz[:, 0] >= chip.BX) | (xyz[:, 1] >= chip.BY) | (xyz[:, 2] >= chip.L))
    if bad.size:
        raise BadInput(f"bank {memory.dst_bank[bad[0]]} outside the {chip.BX}x{chip.BY}x{chip.L} bank grid",
                       field=f"memory_events.dst_bank[{bad[0]}]")
    banks = chip.flat_bank(xyz[:, 0], xyz[:, 1], xyz[:, 2]).astype(np.int64)
    dep = deposit_memory(chip, EnergyModel.from_arch(arch), src.astype(np.int64), banks, nbytes,
                         noc_only_mask(memory.noc_qos))
    bank_dyn = dep.bank_j.reshape(n_dies, bx_n * by_n) / window_s
    core_mem = dep.core_j / window_s

    # leakage and refresh at the previous window's temperatures
    core_leak, bank_leak, bank_ref = static_power(arch, core_temp_c, bank_temp_c, V)
    breakdown = PowerBreakdown(
        logic_dynamic=mac_w, spm=max(dyn_w - mac_w, 0.0), logic_leakage=float(core_leak.sum()),
        dram_dynamic=(dep.array_j + dep.tsv_io_j) / window_s, dram_refresh=float(np.sum(bank_ref)),
        dram_leakage=float(bank_leak.sum()), noc=dep.noc_j / window_s, dram_controller=dep.controller_j / window_s,
    )
    return WindowPower(core_dyn + core_leak + core_mem, bank_dyn + bank_ref + bank_leak, breakdown, core_dyn,
                       core_mem)
