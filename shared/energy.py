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

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from numpy.typing import NDArray

from shared.chip import Chip
from shared.configs.arch import ArchConfig, RefreshConfig
from shared.contracts.events import NOC_ONLY_QOS, NOC_QOS, ComputeEvents, EnergyDeposit, MemoryEvents
from shared.contracts.ids import parse_bank_ids
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
    array_j: float
    tsv_io_j: float
    controller_j: float
    noc_j: float
    array_bank_j: F64  # (dies · banks per die,) the array share alone
    tsv_io_vault_j: F64  # (dies, cores): the TSV/IO share per (die, vault) before it is spread
    chip: Chip

    @cached_property
    def bank_j(self) -> F64:
        """(DRAM dies, banks per die): array + TSV/IO (`bank_energy`; built when asked: the physicalizer answers the
        two shares, the thermal step spreads them)."""
        return bank_energy(self.chip, self.array_bank_j, self.tsv_io_vault_j)

    @property
    def total_j(self) -> float:
        return self.array_j + self.tsv_io_j + self.controller_j + self.noc_j


def bank_energy(chip: Chip, array_bank_j: F64, tsv_io_vault_j: F64) -> F64:
    """(dies, banks per die) J: the array share where it was spent plus each (die, vault)'s TSV/IO share spread
    evenly over that vault's banks of that die."""
    per_die = chip.BX * chip.BY
    bank_j = np.zeros(chip.L * per_die)
    bank_j += array_bank_j
    v_of = chip.bank_vault_core(np.arange(per_die, dtype=np.int64))  # vault of each in-die bank position
    bank_j += (tsv_io_vault_j[:, v_of] / (chip.bpx * chip.bpy)).reshape(-1)
    return bank_j.reshape(chip.L, per_die)


def deposit_memory(chip: Chip, em: EnergyModel, src_core: I64, bank: I64, nbytes: F64,
                   noc_only: NDArray[np.bool_]) -> MemoryDeposit:
    """Where the energy of memory events is dissipated (see the module docstring). ``bank``: flat bank ids."""
    n = chip.n_cores
    per_die = chip.BX * chip.BY
    core_j = np.zeros(n)
    vault = chip.bank_vault_core(bank)
    dram = np.where(noc_only, 0.0, nbytes * em.dram_j_per_byte)
    e_arr = dram * em.split_array
    e_tsv = dram * em.split_tsv_io
    e_ctl = dram * em.split_controller
    arr: F64 = np.asarray(np.bincount(bank, weights=e_arr, minlength=chip.L * per_die), dtype=np.float64)
    # TSV/IO: per (die, vault), spread evenly over that vault's banks in that die
    dv: F64 = np.asarray(np.bincount(chip.bank_die_vault(bank), weights=e_tsv, minlength=chip.L * n),
                         dtype=np.float64)
    dv = dv.reshape(chip.L, n)
    core_j += np.bincount(vault, weights=e_ctl, minlength=n)
    # NoC: per directed link, half the energy on each end router
    link_b = chip.link_bytes(src_core, vault, nbytes) if nbytes.size else np.zeros(chip.n_links)
    e_link = link_b * em.noc_j_per_byte_hop
    ends = chip.link_ends
    core_j += 0.5 * (np.bincount(ends[:, 0], weights=e_link, minlength=n)
                     + np.bincount(ends[:, 1], weights=e_link, minlength=n))
    return MemoryDeposit(core_j=core_j, array_j=float(e_arr.sum()), tsv_io_j=float(e_tsv.sum()),
                         controller_j=float(e_ctl.sum()), noc_j=float(e_link.sum()), array_bank_j=arr,
                         tsv_io_vault_j=dv, chip=chip)


@dataclass
class WindowDeposit:
    """One window's dynamic energy where it is dissipated (J): the compute events' energy at V0 per core and its MAC
    part, and the memory events' `MemoryDeposit`. The thermal step's power needs nothing else of the events."""

    core_compute_j: F64  # (cores,)
    core_mac_j: F64  # (cores,) capped at each event's energy
    memory: MemoryDeposit

    def to_contract(self) -> EnergyDeposit:
        m = self.memory
        ids = np.flatnonzero(m.array_bank_j)
        fields = {"core_compute_j": self.core_compute_j.tolist(), "core_mac_j": self.core_mac_j.tolist(),
                  "core_mem_j": m.core_j.tolist(), "bank_ids": ids.tolist(),
                  "bank_array_j": m.array_bank_j[ids].tolist(), "tsv_io_vault_j": m.tsv_io_vault_j.tolist(),
                  "array_j": m.array_j, "tsv_io_j": m.tsv_io_j, "controller_j": m.controller_j, "noc_j": m.noc_j}
        if all(math.isfinite(v) and v >= 0 for v in (m.array_j, m.tsv_io_j, m.controller_j, m.noc_j)):
            # all validation would check (the lists are floats and ints from arrays already)
            return EnergyDeposit.model_construct(**fields)
        return EnergyDeposit(**fields)  # the ValidationError naming the bad total

    @classmethod
    def from_contract(cls, dep: EnergyDeposit, chip: Chip, *, field: str = "deposit") -> WindowDeposit:
        """The deposit a request carried, checked against the chip (a 422 naming the bad field otherwise)."""
        n, n_banks = chip.n_cores, chip.L * chip.BX * chip.BY

        def vec(name: str, values: list[float], size: int) -> F64:
            a = np.asarray(values, dtype=np.float64)
            if a.shape != (size,):
                raise BadInput(f"{field}.{name} has {a.size} values, the chip needs {size}", field=f"{field}.{name}")
            return check_nonneg(a, f"{field}.{name}")

        core = vec("core_compute_j", dep.core_compute_j, n)
        mac = vec("core_mac_j", dep.core_mac_j, n)
        mem = vec("core_mem_j", dep.core_mem_j, n)
        vals = vec("bank_array_j", dep.bank_array_j, len(dep.bank_ids))
        ids = int_column(dep.bank_ids, f"{field}.bank_ids")
        if ids.size and not 0 <= ids.min() <= ids.max() < n_banks:
            bad = np.flatnonzero((ids < 0) | (ids >= n_banks))
            raise BadInput(f"{field}.bank_ids[{bad[0]}] = {ids[bad[0]]} is outside the {n_banks} banks",
                           field=f"{field}.bank_ids[{bad[0]}]")
        if np.unique(ids).size != ids.size:
            raise BadInput(f"{field}.bank_ids lists a bank twice", field=f"{field}.bank_ids")
        if len(dep.tsv_io_vault_j) != chip.L:
            raise BadInput(f"{field}.tsv_io_vault_j has {len(dep.tsv_io_vault_j)} rows, the chip {chip.L} DRAM dies",
                           field=f"{field}.tsv_io_vault_j")
        dv = _matrix_nonneg(dep.tsv_io_vault_j, (chip.L, n))  # the whole matrix at once when it is sound
        if dv is None:  # else row by row, for the message naming the first bad row or value
            dv = np.stack([vec(f"tsv_io_vault_j[{d}]", row, n) for d, row in enumerate(dep.tsv_io_vault_j)]) \
                if chip.L else np.zeros((0, n))
        arr = np.zeros(n_banks)
        arr[ids] = vals
        memory = MemoryDeposit(core_j=mem, array_j=dep.array_j, tsv_io_j=dep.tsv_io_j, controller_j=dep.controller_j,
                               noc_j=dep.noc_j, array_bank_j=arr, tsv_io_vault_j=dv, chip=chip)
        return cls(core_compute_j=core, core_mac_j=mac, memory=memory)


def _nonneg(a: F64) -> bool:
    """Every value of ``a`` a finite number >= 0 (a NaN fails both comparisons)."""
    return bool(a.size == 0 or (a.min() >= 0 and a.max() < np.inf))


def _matrix_nonneg(rows: list[list[float]], shape: tuple[int, int]) -> F64 | None:
    """``rows`` as a float64 matrix when it has ``shape`` and only finite values >= 0, else None."""
    try:
        a = np.asarray(rows, dtype=np.float64)
    except ValueError:  # rows of unequal lengths
        return None
    return a if a.shape == shape and _nonneg(a) else None


def check_nonneg(a: F64, field: str) -> F64:
    """``a``, when every value is a finite number >= 0; a 422 naming the first that is not (``field[i]``)."""
    if not _nonneg(a):
        bad = np.flatnonzero(~np.isfinite(a) | (a < 0))
        raise BadInput(f"{field}[{bad[0]}] must be a finite number >= 0", field=f"{field}[{bad[0]}]")
    return a


def int_column(values: list[int], field: str) -> I64:
    """``values`` as int64; a value past int64 (JSON and pydantic take any integer) is a 422 naming it."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        i = next(i for i, x in enumerate(values) if not -2**63 <= x < 2**63)
        raise BadInput(f"{field}[{i}] = {values[i]} is out of range", field=f"{field}[{i}]") from None


def deposit_of_events(compute: ComputeEvents, memory: MemoryEvents, arch: ArchConfig) -> WindowDeposit:
    """The `WindowDeposit` of a window's events (checked: a 422 naming the first bad event field)."""
    n_cores = arch.mesh.n_cores
    core_ids = int_column(compute.core_id, "compute_events.core_id")
    e_comp = np.asarray(compute.energy_j, dtype=float)
    if core_ids.size:
        bad = np.flatnonzero((core_ids < 0) | (core_ids >= n_cores))
        if bad.size:
            raise BadInput(f"compute_events.core_id[{bad[0]}] = {core_ids[bad[0]]} is outside the mesh "
                           f"(0..{n_cores - 1})", field=f"compute_events.core_id[{bad[0]}]")
        check_nonneg(e_comp, "compute_events.energy_j")
    fl = np.asarray(compute.flops, dtype=float)

    chip = Chip.from_arch(arch)
    nbytes = np.asarray(memory.bytes, dtype=float)
    src = int_column(memory.src_core, "memory_events.src_core")
    if len(memory):
        check_nonneg(nbytes, "memory_events.bytes")
        bad = np.flatnonzero((src < 0) | (src >= n_cores))
        if bad.size:
            raise BadInput(f"memory_events.src_core[{bad[0]}] = {src[bad[0]]} is outside the mesh",
                           field=f"memory_events.src_core[{bad[0]}]")
        bad = np.flatnonzero(int_column(memory.hops, "memory_events.hops") < 0)
        if bad.size:
            raise BadInput(f"memory_events.hops[{bad[0]}] must be >= 0", field=f"memory_events.hops[{bad[0]}]")
        bad_q = [i for i, x in enumerate(memory.noc_qos) if x not in NOC_QOS]
        if bad_q:
            raise BadInput(f"memory_events.noc_qos[{bad_q[0]}] = {memory.noc_qos[bad_q[0]]!r}: one of "
                           f"{', '.join(NOC_QOS)}", field=f"memory_events.noc_qos[{bad_q[0]}]")
    return deposit_of_arrays(core_ids, e_comp, fl, src.astype(np.int64), _bank_column(memory.dst_bank, chip), nbytes,
                             noc_only_mask(memory.noc_qos), arch, chip)


def _bank_column(names: list[str], chip: Chip) -> I64:
    """The flat ids of bank names (checked: a 422 naming the first that is no bank of the chip's grid). Names as
    `Chip.bank_str` writes them are looked up; any other spelling is parsed."""
    lookup = chip.bank_of_name
    found = [lookup.get(b, -1) for b in names]
    if -1 not in found:
        return np.asarray(found, dtype=np.int64)
    try:
        xyz = parse_bank_ids(names)
    except ValueError as exc:
        i = str(exc)[1:str(exc).index("]")]
        raise BadInput(str(exc).split("] ", 1)[1], field=f"memory_events.dst_bank[{i}]") from None
    bad = np.flatnonzero((xyz[:, 0] >= chip.BX) | (xyz[:, 1] >= chip.BY) | (xyz[:, 2] >= chip.L))
    if bad.size:
        raise BadInput(f"bank {names[bad[0]]} outside the {chip.BX}x{chip.BY}x{chip.L} bank grid",
                       field=f"memory_events.dst_bank[{bad[0]}]")
    return chip.flat_bank(xyz[:, 0], xyz[:, 1], xyz[:, 2]).astype(np.int64)


def deposit_of_arrays(core_ids: I64, e_comp: F64, flops: F64, src: I64, banks: I64, nbytes: F64,
                      noc_only: NDArray[np.bool_], arch: ArchConfig, chip: Chip) -> WindowDeposit:
    """The `WindowDeposit` of a window's events given as columns, already checked: compute events' cores, energy
    (J at V0) and FLOPs; memory events' source cores, flat bank ids, bytes and NoC-only flags (`deposit_of_events`
    for the events themselves; the physicalizer calls this with its own columns)."""
    n_cores = arch.mesh.n_cores
    e_core: F64 = np.asarray(np.bincount(core_ids, e_comp, n_cores) if core_ids.size else np.zeros(n_cores),
                             dtype=np.float64)
    # the MAC part of each event (flops = 2 · MACs, priced at mac_pj), capped at its energy; the rest is its
    # scratchpad accesses
    e_mac = np.minimum(np.maximum(flops, 0.0) * 0.5 * arch.power.mac_pj * 1e-12, e_comp) if core_ids.size \
        else np.zeros(0)
    mac_core: F64 = np.asarray(np.bincount(core_ids, e_mac, n_cores) if core_ids.size else np.zeros(n_cores),
                               dtype=np.float64)
    dep = deposit_memory(chip, EnergyModel.from_arch(arch), src, banks, nbytes, noc_only)
    return WindowDeposit(core_compute_j=e_core, core_mac_j=mac_core, memory=dep)


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
    ratio: np.ndarray = liao(T, V) / _liao_ref(arch.power.v0)
    return ratio


@lru_cache(maxsize=64)
def _liao_ref(v0: float) -> float:
    """The Liao fit at 45 °C and ``v0``: what every `leakage_scale` divides by."""
    return float(liao(np.array(T_LEAK_REF), v0))


@lru_cache(maxsize=64)
def _tref_curve(cfg: RefreshConfig) -> tuple[np.ndarray, np.ndarray]:
    """The refresh curve's temperatures (°C) and multipliers as arrays (read-only: shared by every call)."""
    t = np.array([p[0] for p in cfg.tref_curve])
    m = np.array([p[1] for p in cfg.tref_curve])
    t.flags.writeable = m.flags.writeable = False
    return t, m


def refresh_multiplier(temp_c: float | np.ndarray, refresh: RefreshConfig | None = None) -> np.ndarray:
    """Refresh-rate multiplier at ``temp_c`` (°C): ``tref_interp: step``: the multiplier of the first curve point at
    or above T (JEDEC: 1× up to 85 °C, 2× in (85, 95]), the last one beyond the curve; ``linear``: interpolated,
    constant beyond its ends."""
    cfg = refresh or RefreshConfig()
    t, m = _tref_curve(cfg)
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
