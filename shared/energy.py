"""The energy model of the chip (one owner: lowering prices events with it, thermal deposits them with it).

SI inside (J, bytes). Constants come from ``ArchConfig`` (``power``, ``dram``, ``mesh.noc``), whose defaults cite
``../shared/reference/energy/energy_anchors.csv``.

- Compute: ``E = MACs · mac_pj + SPM accesses · spm_pj_per_access`` (at the reference voltage V0; thermal scales the
  dynamic part by ``(V/V0)²``).
- DRAM access: ``E = bytes · 8 · pj_per_bit``, dissipated where it is spent (``dram.energy_split``): the ``array``
  share in the accessed bank, the ``tsv_io`` share spread evenly over the banks of the accessed die that belong to the
  bank's vault (the die's TSV landing and I/O drivers sit in the vault's footprint), the ``controller`` share on the
  logic core under the vault.
- NoC: ``E = bytes · 8 · pj_per_bit_hop`` per link crossed (XY routing between the event's core and the bank's vault
  core, or the receiving core for dispatch/combine traffic); each link's energy is split half and half between the
  routers at its two ends, i.e. the logic cores. Dispatch/combine events (``noc_qos`` ``"dispatch"`` /
  ``"combine"``) move activations core to core: NoC energy only, no DRAM access.

``deposit_memory`` conserves energy exactly: the sum of what it deposits equals ``memory_energy_j`` summed over the
events (tests/test_energy.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shared.chip import Chip
from shared.configs.arch import ArchConfig, RefreshConfig
from shared.contracts.events import NOC_ONLY_QOS
from shared.errors import BadInput

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

DTYPE_BYTES: dict[str, int] = {"fp16": 2, "bf16": 2, "fp32": 4, "int8": 1}
ACC_BYTES = 4  # fp32 / int32 accumulators in the SPM
SPM_ACCESS_BYTES = 8  # the anchor row prices a 64-bit SRAM access


def dtype_bytes(dtype: str, field: str = "dtype") -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise BadInput(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}", field=field) from None


def spm_accesses(macs: F64, nbytes: F64, rows: int, cols: int, elem_bytes: int) -> F64:
    """64-bit scratchpad accesses of a piece of work on an ``rows × cols`` systolic array: the DMA fill and drain of
    its ``nbytes`` (each byte written once and read once), operand streaming (one A element per ``rows`` MACs and one
    B element per ``cols`` MACs, ``elem_bytes`` each) and fp32 partial sums (one per ``rows`` MACs).
    The physicalizer prices every compute piece with it; TAPS and TACS price an expert's work with it."""
    out: F64 = (2 * nbytes + macs * (elem_bytes / rows + elem_bytes / cols + ACC_BYTES / rows)) / SPM_ACCESS_BYTES
    return out



@dataclass(frozen=True)
class EnergyModel:
    mac_j: float  # J per MAC
    spm_j_per_access: float  # J per 64-bit scratchpad access
    dram_j_per_byte: float  # J per byte read or written
    split_array: float
    split_tsv_io: float
    split_controller: float
    noc_j_per_byte_hop: float  # J per byte per link crossed

    @classmethod
    def from_arch(cls, arch: ArchConfig, *, mac_pj: float | None = None) -> EnergyModel:
        sp = arch.dram.energy_split
        return cls(mac_j=(arch.power.mac_pj if mac_pj is None else mac_pj) * 1e-12,
                   spm_j_per_access=arch.power.spm_pj_per_access * 1e-12,
                   dram_j_per_byte=arch.dram.pj_per_bit * 8e-12,
                   split_array=sp.array, split_tsv_io=sp.tsv_io, split_controller=sp.controller,
                   noc_j_per_byte_hop=arch.mesh.noc.pj_per_bit_hop * 8e-12)

    def compute_j(self, macs: F64, spm_accesses: F64) -> F64:
        out: F64 = macs * self.mac_j + spm_accesses * self.spm_j_per_access
        return out

    def memory_j(self, nbytes: F64, hops: I64, noc_only: NDArray[np.bool_]) -> F64:
        """Energy of each memory event: DRAM (unless NoC-only) + NoC over ``hops`` links."""
        out: F64 = nbytes * (np.where(noc_only, 0.0, self.dram_j_per_byte) + hops * self.noc_j_per_byte_hop)
        return out


@dataclass
class MemoryDeposit:
    core_j: F64  # (cores,) on the logic die: NoC routers + memory controllers
    bank_j: F64  # (DRAM dies, banks per die): array + TSV/IO
    array_j: float
    tsv_io_j: float
    controller_j: float
    noc_j: float

    @property
    def total_j(self) -> float:
        return self.array_j + self.tsv_io_j + self.controller_j + self.noc_j


def deposit_memory(chip: Chip, em: EnergyModel, src_core: I64, bank: I64, nbytes: F64,
                   noc_only: NDArray[np.bool_]) -> MemoryDeposit:
    """Where the energy of memory events is dissipated (see the module docstring). ``bank``: flat bank ids."""
    n = chip.n_cores
    per_die = chip.BX * chip.BY
    core_j = np.zeros(n)
    bank_j = np.zeros(chip.L * per_die)
    vault = chip.bank_vault_core(bank)
    dram = np.where(noc_only, 0.0, nbytes * em.dram_j_per_byte)
    e_arr = dram * em.split_array
    e_tsv = dram * em.split_tsv_io
    e_ctl = dram * em.split_controller
    bank_j += np.bincount(bank, weights=e_arr, minlength=chip.L * per_die)
    # TSV/IO: per (die, vault), spread evenly over that vault's banks in that die
    die = bank // per_die
    dv = np.bincount(die * n + vault, weights=e_tsv, minlength=chip.L * n).reshape(chip.L, n)
    v_of = chip.bank_vault_core(np.arange(per_die, dtype=np.int64))  # vault of each in-die bank position
    bank_j += (dv[:, v_of] / (chip.bpx * chip.bpy)).reshape(-1)
    core_j += np.bincount(vault, weights=e_ctl, minlength=n)
    # NoC: per directed link, half the energy on each end router
    link_b = chip.link_bytes(src_core, vault, nbytes) if nbytes.size else np.zeros(chip.n_links)
    e_link = link_b * em.noc_j_per_byte_hop
    ends = chip.link_ends
    core_j += 0.5 * (np.bincount(ends[:, 0], weights=e_link, minlength=n)
                     + np.bincount(ends[:, 1], weights=e_link, minlength=n))
    return MemoryDeposit(core_j=core_j, bank_j=bank_j.reshape(chip.L, per_die), array_j=float(e_arr.sum()),
                         tsv_io_j=float(e_tsv.sum()), controller_j=float(e_ctl.sum()), noc_j=float(e_link.sum()))


def noc_only_mask(qos: list[str]) -> NDArray[np.bool_]:
    return np.isin(np.asarray(qos, dtype=object), NOC_ONLY_QOS) if qos else np.zeros(0, dtype=bool)


# ---- static power: leakage and refresh (thermal prices every window with it, TAPS its base field) ---------------

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


def refresh_multiplier(temp_c: float | np.ndarray, refresh: RefreshConfig | None = None) -> np.ndarray:
    """Refresh-rate multiplier at ``temp_c`` (°C): ``tref_interp: step``: the multiplier of the first curve point at
    or above T (JEDEC: 1× up to 85 °C, 2× in (85, 95]), the last one beyond the curve; ``linear``: interpolated,
    constant beyond its ends."""
    cfg = refresh or RefreshConfig()
    t = np.array([p[0] for p in cfg.tref_curve])
    m = np.array([p[1] for p in cfg.tref_curve])
    if cfg.tref_interp == "step":
        idx = np.minimum(np.searchsorted(t, np.asarray(temp_c, dtype=float), side="left"), t.size - 1)
        return np.asarray(m[idx], dtype=float)
    return np.asarray(np.interp(temp_c, t, m), dtype=float)


def trefi_us(temp_c: float | np.ndarray, refresh: RefreshConfig) -> np.ndarray:
    """tREFI (µs) at ``temp_c`` (°C): ``tref_base_us / multiplier(T)``."""
    return np.asarray(refresh.tref_base_us / refresh_multiplier(temp_c, refresh), dtype=float)


def static_power(arch: ArchConfig, core_temp_c: np.ndarray | float, bank_temp_c: np.ndarray | float,
                 V: np.ndarray | float | None = None) -> tuple[F64, F64, F64]:
    """(core leakage, bank leakage, bank refresh) in W at the given temperatures (°C; any shapes, broadcast):
    the configured leakage at 45 °C (``power.logic_leak_w_per_core``, ``dram.leak_w_per_bank``) scaled by
    `leakage_scale` (logic at the core voltage ``V``, default V0; DRAM at V0), and one refresh command per bank per
    tREFI(T): ``refresh_energy_nj / tREFI``."""
    pw = arch.power
    v = pw.v0 if V is None else V
    Tc = np.asarray(core_temp_c, dtype=float) + KELVIN
    Tb = np.asarray(bank_temp_c, dtype=float) + KELVIN
    core_leak = pw.logic_leak_w_per_core * leakage_scale(Tc, v, arch)
    bank_leak = arch.dram.leak_w_per_bank * leakage_scale(Tb, pw.v0, arch)
    bank_ref = arch.refresh.refresh_energy_nj * 1e-9 / (trefi_us(np.asarray(bank_temp_c, dtype=float), arch.refresh)
                                                        * 1e-6)
    return (np.asarray(core_leak, dtype=float), np.asarray(bank_leak, dtype=float),
            np.asarray(bank_ref, dtype=float))
