"""The steady temperature of a chip at full load, from its arch config's own energy constants.

A TDP-like power map, built with the simulator's own power path (``shared.energy``, ``services/thermal/power.py``):

- every core runs its systolic array at every cycle of its top DVFS step: ``array[0]·array[1]·f`` MACs per second at
  ``power.mac_pj``, with the scratchpad accesses the physicalizer prices for that work
  (``shared.energy.spm_accesses``: operand streaming, partial sums, and the DMA fill and drain of the bytes its vault
  delivers);
- every vault streams its full raw bandwidth ``dram.vault_bw_gbps`` from its own tiles, spread evenly over them and
  over the dies (``shared.energy.deposit_memory``: the array share in the tiles, the TSV/IO share in the vault's
  column of each die, the controller share on the core); a core reads its own vault, so no NoC hop;
- no vector work (a full MAC load), leakage and refresh at the steady state's own temperatures (a fixed point
  ``T = steady(P(T))``, as the thermal service's warm start; a few passes settle it to a millikelvin).

The map is solved by the thermal service's plain function (``services.thermal.service.solve_power_map``, steady mode).
Also reported: the same logic-die map scaled so that the logic die and the DRAM together dissipate ``--tdp-w`` (the
accelerator's TDP): not the config's power, a what-if of where the stack sits at that power (the network is linear
in the power; leakage and refresh are held at the config's full-load values).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m scripts.full_load_steady --arch configs/arch_hbm_on_logic.yaml \\
        --tdp-w 700
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in {None, ""}:  # `python scripts/full_load_steady.py` as well as `python -m scripts.full_load_steady`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from numpy.typing import NDArray

from services.thermal.power import WindowPower, compute_power
from services.thermal.service import solve_power_map
from shared.chip import Chip
from shared.configs import ArchConfig, load_arch
from shared.contracts.thermal import SolveResult
from shared.dvfs import top_freqs
from shared.energy import EnergyModel, WindowDeposit, deposit_memory, dtype_bytes, spm_accesses

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class FullLoad:
    """The full-load power (W) and its steady state."""

    power: WindowPower  # per core and per tile, with the breakdown by component
    result: SolveResult  # the steady state of that power (solve_power_map)
    passes: int  # fixed-point passes of leakage and refresh

    @property
    def logic_w(self) -> float:
        return float(self.power.core_w.sum())

    @property
    def dram_w(self) -> float:
        return float(self.power.bank_w.sum())

    @property
    def total_w(self) -> float:
        return self.logic_w + self.dram_w


def full_load_deposit(arch: ArchConfig, seconds: float = 1.0) -> WindowDeposit:
    """The dynamic energy (J) of ``seconds`` of full load (module docstring), where it is dissipated."""
    chip = Chip.from_arch(arch)
    n = chip.n_cores
    rows, cols = arch.core.array
    freq_hz = np.asarray(top_freqs(arch)) * 1e9
    macs: F64 = rows * cols * freq_hz * seconds
    vault_bytes: F64 = np.full(n, arch.dram.vault_bw_gbps * 1e9 * seconds)
    em = EnergyModel.from_arch(arch)
    acc = spm_accesses(macs, vault_bytes, rows, cols, dtype_bytes(arch.core.dtype, "core.dtype"))
    mac_j: F64 = macs * em.mac_j
    compute_j = em.compute_j(macs, acc)
    # every vault's bytes over its own tiles, evenly: one event per (core, die, tile of the vault)
    per_die = chip.BX * chip.BY
    bank = np.arange(chip.L * per_die, dtype=np.int64)
    owner = chip.bank_vault_core(bank % per_die)
    tiles_per_vault = chip.L * chip.bpx * chip.bpy
    nbytes: F64 = vault_bytes[owner] / tiles_per_vault
    memory = deposit_memory(chip, em, owner, bank, nbytes, np.zeros(bank.size, dtype=bool))
    return WindowDeposit(core_compute_j=compute_j, core_mac_j=mac_j, memory=memory)


def _bank_temps(arch: ArchConfig, result: SolveResult) -> F64:
    """(dies, tiles per die) °C: each tile at its vault's mean for its die (what ``solve_power_map`` reports)."""
    chip = Chip.from_arch(arch)
    vault_c = np.asarray(result.temps_bank_c, dtype=float)  # (cores, dies)
    owner = chip.bank_vault_core(np.arange(chip.BX * chip.BY, dtype=np.int64))
    out: F64 = vault_c[owner].T.copy()
    return out


def full_load(arch: ArchConfig, *, tol_k: float = 1e-3, max_passes: int = 20) -> FullLoad:
    """The full-load power and its steady state, leakage and refresh at that state's temperatures (fixed point from
    the ambient, until no core or vault moves by ``tol_k``)."""
    dep = full_load_deposit(arch)
    n = arch.mesh.n_cores
    bx, by, dies = arch.dram.banks
    core_c: F64 = np.full(n, arch.geometry.cooling.ambient_c)
    bank_c: F64 = np.full((dies, bx * by), arch.geometry.cooling.ambient_c)
    freq = np.asarray(top_freqs(arch))
    prev: F64 | None = None
    for passes in range(1, max_passes + 1):
        power = compute_power(dep, arch, core_temp_c=core_c, bank_temp_c=bank_c, freq_ghz=freq, window_s=1.0)
        result = solve_power_map(arch, power.core_w.tolist(), power.bank_w.tolist(), mode="steady")
        core_c = np.asarray(result.temps_core_c, dtype=float)
        bank_c = _bank_temps(arch, result)
        now = np.concatenate([core_c, bank_c.ravel()])
        if prev is not None and float(np.abs(now - prev).max()) < tol_k:
            return FullLoad(power=power, result=result, passes=passes)
        prev = now
    raise RuntimeError(f"leakage and refresh did not settle to {tol_k} K in {max_passes} passes")


def scaled_to(arch: ArchConfig, load: FullLoad, total_w: float) -> SolveResult:
    """The steady state of ``load``'s map with the logic die's power scaled so that logic + DRAM = ``total_w``."""
    logic_w = total_w - load.dram_w
    if logic_w <= 0:
        raise ValueError(f"the DRAM alone dissipates {load.dram_w:.1f} W, more than {total_w:g} W")
    core_w = load.power.core_w * (logic_w / load.logic_w)
    return solve_power_map(arch, core_w.tolist(), load.power.bank_w.tolist(), mode="steady")


def _peaks(arch: ArchConfig, res: SolveResult) -> tuple[float, float]:
    logic = res.peak_c[arch.geometry.layer_names("logic")[0]]
    dram = max(res.peak_c[name] for name in arch.geometry.layer_names("dram"))
    return logic, dram


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--arch", default="configs/arch_hbm_on_logic.yaml", help="arch config")
    ap.add_argument("--tdp-w", type=float, default=None, help="also solve the map scaled to this total power (W)")
    args = ap.parse_args(argv)
    arch = load_arch(Path(args.arch))
    load = full_load(arch)
    b = load.power.breakdown
    area_mm2 = arch.geometry.die_mm[0] * arch.geometry.die_mm[1]
    print(f"{args.arch}: full load at {top_freqs(arch)[0]:g} GHz, steady after {load.passes} passes")
    print(f"  logic die {load.logic_w:.1f} W ({load.logic_w / area_mm2:.3f} W/mm^2): MAC {b.logic_dynamic:.1f}, "
          f"SPM {b.spm:.1f}, leakage {b.logic_leakage:.1f}, DRAM controllers {b.dram_controller:.1f}, NoC {b.noc:.1f}")
    print(f"  DRAM dies {load.dram_w:.1f} W: access {b.dram_dynamic:.1f}, refresh {b.dram_refresh:.1f}, "
          f"standby {b.dram_leakage:.1f}")
    print(f"  total {load.total_w:.1f} W")
    logic, dram = _peaks(arch, load.result)
    print(f"  steady peak: logic {logic:.2f} degC, DRAM {dram:.2f} degC (ambient "
          f"{arch.geometry.cooling.ambient_c:g} degC)")
    if args.tdp_w is not None:
        res = scaled_to(arch, load, args.tdp_w)
        logic, dram = _peaks(arch, res)
        print(f"  what-if, logic map scaled to {args.tdp_w:g} W in all ({args.tdp_w - load.dram_w:.1f} W on the logic "
              f"die): steady peak logic {logic:.2f} degC, DRAM {dram:.2f} degC")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
