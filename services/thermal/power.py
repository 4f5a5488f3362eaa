"""Power from a window's physical events (seed 001 §4.6, §6; ARCHITECTURE §5.4). SI inside: J, W, s, K.

Per window of length Δt (powers are window averages):

- logic dynamic, per core: ``Σ FLOPs/2 · mac_pj · (V/V0)² / Δt``. ``mac_pj`` = 1.5 pJ per fp16 MAC (energy_anchors.csv
  rows "compute,fp mult 16b" 1.1 pJ + "compute,fp add 16b" 0.4 pJ, Horowitz ISSCC 2014, 45 nm 0.9 V; the sum is noted
  there as derived). One MAC = 2 FLOPs.
- DRAM dynamic, on the destination bank: ``bytes · 8 · pj_per_bit / Δt`` (row "dram,HBM2" 3.9 pJ/bit, Accelergy CACTI
  plug-in citing FGDRAM, MICRO'17).
- NoC: ``bytes · 8 · hops · pj_per_bit_hop / Δt`` (rows "noc,router 256-bit flit traversal (ISAAC)" 0.081 pJ/bit +
  "noc,on-chip wire (assumed)" 0.1 pJ/bit ≈ 0.18 pJ/bit/hop), spread evenly over the logic cores on the XY route
  from the source core to the bank's vault core (all of it on the source core when the route is empty).
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

from services.thermal.dvfs import core_domains, trefi_us
from shared.configs import ArchConfig
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.ids import parse_bank_id
from shared.contracts.thermal import PowerBreakdown
from shared.errors import BadInput

KELVIN = 273.15
T_LEAK_REF = 45.0 + KELVIN  # the configured leakage values are at 45 °C
# Liao, He, Lepak, TCAD 2005 (energy_anchors.csv, leakage row): T in K, V in volts
LIAO = {"A": 1.1432e-12, "B": 1.0126e-14, "alpha": 466.4029, "beta": -1224.74083, "gamma": 6.28153, "delta": 6.9094}


def liao(T_k: np.ndarray, V: np.ndarray | float) -> np.ndarray:
    c = LIAO
    T = np.asarray(T_k, dtype=float)
    out: np.ndarray = c["A"] * T * T * np.exp((c["alpha"] * V + c["beta"]) / T) + c["B"] * np.exp(
        c["gamma"] * np.asarray(V) + c["delta"])
    return out


def leakage_scale(T_k: np.ndarray, V: np.ndarray | float, arch: ArchConfig) -> np.ndarray:
    """Leakage at (T, V) relative to the configured value at 45 °C and V0."""
    T = np.asarray(T_k, dtype=float)
    model = arch.power.leak_model
    if model == "none":
        return np.ones_like(T)
    if model == "exp":
        out: np.ndarray = np.exp(arch.power.leak_beta_per_k * (T - T_LEAK_REF))
        return out
    ratio: np.ndarray = liao(T, V) / liao(np.array(T_LEAK_REF), arch.power.v0)
    return ratio


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
    core_noc_w: np.ndarray


def _xy_route(src: int, dst: int, mesh_x: int) -> list[int]:
    sx, sy = src % mesh_x, src // mesh_x
    dx, dy = dst % mesh_x, dst // mesh_x
    path = [src]
    x, y = sx, sy
    while x != dx:
        x += 1 if dx > x else -1
        path.append(y * mesh_x + x)
    while y != dy:
        y += 1 if dy > y else -1
        path.append(y * mesh_x + x)
    return path


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
    mesh_x = arch.mesh.cores[0]
    bx_n, by_n, n_dies = arch.dram.banks
    pw = arch.power
    V = volts_for(np.asarray(freq_ghz, dtype=float), arch)

    # logic dynamic
    core_ids = np.asarray(compute.core_id, dtype=int)
    flops = np.asarray(compute.flops, dtype=float)
    if core_ids.size:
        bad = np.flatnonzero((core_ids < 0) | (core_ids >= n_cores))
        if bad.size:
            raise BadInput(f"compute_events.core_id[{bad[0]}] = {core_ids[bad[0]]} is outside the mesh "
                           f"(0..{n_cores - 1})", field=f"compute_events.core_id[{bad[0]}]")
        bad = np.flatnonzero(~np.isfinite(flops) | (flops < 0))
        if bad.size:
            raise BadInput(f"compute_events.flops[{bad[0]}] must be a finite number >= 0",
                           field=f"compute_events.flops[{bad[0]}]")
    e_core = np.bincount(core_ids, flops, n_cores) / 2.0 * pw.mac_pj * 1e-12 if core_ids.size else np.zeros(n_cores)
    core_dyn = e_core * (V / pw.v0) ** 2 / window_s

    # memory: DRAM dynamic + NoC
    bank_dyn = np.zeros((n_dies, bx_n * by_n))
    core_noc = np.zeros(n_cores)
    if len(memory):
        nbytes = np.asarray(memory.bytes, dtype=float)
        hops = np.asarray(memory.hops, dtype=int)
        src = np.asarray(memory.src_core, dtype=int)
        bad = np.flatnonzero(~np.isfinite(nbytes) | (nbytes < 0))
        if bad.size:
            raise BadInput(f"memory_events.bytes[{bad[0]}] must be a finite number >= 0",
                           field=f"memory_events.bytes[{bad[0]}]")
        bad = np.flatnonzero((src < 0) | (src >= n_cores))
        if bad.size:
            raise BadInput(f"memory_events.src_core[{bad[0]}] = {src[bad[0]]} is outside the mesh",
                           field=f"memory_events.src_core[{bad[0]}]")
        bad = np.flatnonzero(hops < 0)
        if bad.size:
            raise BadInput(f"memory_events.hops[{bad[0]}] must be >= 0", field=f"memory_events.hops[{bad[0]}]")
        xyz = np.empty((len(memory), 3), dtype=int)
        for i, s in enumerate(memory.dst_bank):
            try:
                xyz[i] = parse_bank_id(s)
            except ValueError as exc:
                raise BadInput(str(exc), field=f"memory_events.dst_bank[{i}]") from None
        bad = np.flatnonzero((xyz[:, 0] >= bx_n) | (xyz[:, 1] >= by_n) | (xyz[:, 2] >= n_dies))
        if bad.size:
            raise BadInput(f"memory_events.dst_bank[{bad[0]}] = {memory.dst_bank[bad[0]]} is outside the "
                           f"{bx_n}x{by_n}x{n_dies} bank array", field=f"memory_events.dst_bank[{bad[0]}]")
        bank_idx = xyz[:, 1] * bx_n + xyz[:, 0]
        e_bank = nbytes * 8.0 * arch.dram.pj_per_bit * 1e-12
        flat = np.bincount(xyz[:, 2] * (bx_n * by_n) + bank_idx, e_bank, n_dies * bx_n * by_n)
        bank_dyn = flat.reshape(n_dies, bx_n * by_n) / window_s
        e_noc = nbytes * 8.0 * hops * arch.mesh.noc.pj_per_bit_hop * 1e-12
        cx, cy = arch.mesh.cores
        vault = (xyz[:, 1] // (by_n // cy)) * cx + xyz[:, 0] // (bx_n // cx)
        pair = src * n_cores + vault
        e_pair = np.bincount(pair, e_noc, n_cores * n_cores)
        for p in np.flatnonzero(e_pair):
            route = _xy_route(int(p // n_cores), int(p % n_cores), mesh_x)
            core_noc[route] += e_pair[p] / len(route)
        core_noc /= window_s

    # leakage and refresh at the previous window's temperatures
    Tc = np.asarray(core_temp_c, dtype=float) + KELVIN
    Tb = np.asarray(bank_temp_c, dtype=float) + KELVIN
    core_leak = pw.logic_leak_w_per_core * leakage_scale(Tc, V, arch)
    bank_leak = arch.dram.leak_w_per_bank * leakage_scale(Tb, pw.v0, arch)
    bank_ref = arch.refresh.refresh_energy_nj * 1e-9 / (trefi_us(bank_temp_c, arch.refresh) * 1e-6)
    breakdown = PowerBreakdown(
        logic_dynamic=float(core_dyn.sum()), logic_leakage=float(core_leak.sum()),
        dram_dynamic=float(bank_dyn.sum()), dram_refresh=float(np.sum(bank_ref)), dram_leakage=float(bank_leak.sum()),
        noc=float(core_noc.sum()),
    )
    return WindowPower(core_dyn + core_leak + core_noc, bank_dyn + bank_ref + bank_leak, breakdown, core_dyn,
                       core_noc)
