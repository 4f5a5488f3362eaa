"""The hard limit of dynamic thermal management (``arch.dtm``): no cell of the stack, logic or DRAM, ever ends a window
above ``dtm.limit_c``, whatever the window's work.

The rule, applied after window k (field ``T_k``) to the levels the DVFS trips chose for window k+1 (and at a run's
start to the levels window 0 starts at): bound window k+1's field by stepping ``T_k`` one window at the maximum power
the cores can dissipate at those levels (`HardLimit.power`):

- every core's array at its peak MAC rate, ``array[0]·array[1]`` MACs per cycle of its (effective) clock, at
  ``power.mac_pj``, with the scratchpad accesses of that work (operand streaming and partial sums,
  ``shared.energy.spm_accesses``) and the DMA fill and drain of its vault's full raw bandwidth, all scaled by
  ``(V/V0)²`` at the level's voltage (what the window step charges a deposit);
- every vault streaming its full raw bandwidth from its own tiles, spread evenly over them
  (``shared.energy.deposit_memory``: array and TSV/IO shares in the tiles, the controller share on the core), and
  every NoC link at its full rate (half of each link's energy on each end router);
- leakage and refresh at ``T_k``'s block temperatures and the level's voltage, as the window step evaluates them.

While the bound's hottest cell exceeds ``limit_c − MARGIN_K``, every core steps one level deeper (each stopping at its
domain's deepest level): DVFS steps first, then the clock modulation of ``dtm.duty``. Stepping every core is the
simplest rule that holds the guarantee and always ends: the bound only falls as levels deepen, and after at most the
ladder's length every core is at its deepest. When even the deepest levels' bound exceeds the limit, the run goes on
at the deepest and the window's snapshot says so (``limit_unheld``). A core in emergency throttle recovers at most one
level a window (from level ``l`` the rule starts at ``l − 1``), as hardware releases its clock modulation by steps;
DVFS levels follow the trips as before.

Why it holds. The window step is linear in the field and the power, ``T_{k+1} = T_a + Φ·(T_k − T_a) + Ψ·P``, with
``Φ`` and ``Ψ`` non-negative (the exponential of a conductance network), so a deposit whose power is at or below the
maximum map cell by cell ends the window at or below the bound. ``MARGIN_K`` covers what separates the computed
steps from exact ones: the degree-6 rational exponential's error (≤ 2e-6 × the distance to the steady state,
< 2 mK for distances under 1000 K) on both the bound and the window, and the window's rounding to float32 (half an
ulp, < 3e-5 K at 500 K).

What is not covered: a deposit above the map, that is a vault's traffic concentrated on fewer tiles than all of its
own (the DRAM tile under an expert's shard streaming alone), or a core's compute past its array's peak rate. The
logic die sits under the DRAM and is the stack's hottest layer in every run here, and the map spreads each vault's
bandwidth over the tiles above its core; a bound over every placement of each vault's traffic is left for later.

Cost. Far from the limit nothing is solved: a window is skipped when ``max(T_k) + rise ≤ limit_c − MARGIN_K``, with
``rise`` the hottest cell's one-window rise from a uniform ambient field under the envelope of every level's maximum
power with leakage at ``limit_c`` (one solve per model and window length, kept); since ``Φ`` is non-negative with
rows summing to at most 1, that sum bounds every level's bound while the field stays under the limit. Near the limit
each window costs one thermal step per level tried: one when the chosen levels hold, one more per level stepped.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from services.thermal.model import KELVIN, StackModel
from shared.chip import Chip
from shared.configs import ArchConfig
from shared.dvfs import Governor, dynamic_scale
from shared.energy import LIAO, EnergyModel, deposit_memory, dtype_bytes, spm_accesses, static_power

# The bound's hottest cell must stay this far under the limit (K): the integrator's and the float32 state's error
# (module docstring), with a factor of 5 to spare.
MARGIN_K = 0.01


@dataclass(frozen=True)
class Decision:
    """The levels of the next window, whether their bound holds the limit, and the thermal steps it took."""

    levels: np.ndarray
    held: bool
    solves: int


def _max_memory_w(arch: ArchConfig) -> tuple[np.ndarray, np.ndarray]:
    """(cores,) and (DRAM dies, tiles per die) W: every vault at its full raw bandwidth from its own tiles, evenly
    over them (``deposit_memory`` of one second of it), plus every NoC link at its full rate."""
    chip = Chip.from_arch(arch)
    em = EnergyModel.from_arch(arch)
    n = chip.n_cores
    per_die = chip.BX * chip.BY
    bank = np.arange(chip.L * per_die, dtype=np.int64)
    owner = chip.bank_vault_core(bank % per_die)
    nbytes = np.full(bank.size, arch.dram.vault_bw_gbps * 1e9 / (chip.L * chip.bpx * chip.bpy))
    mem = deposit_memory(chip, em, owner, bank, nbytes, np.zeros(bank.size, dtype=bool))
    link_bytes_s = arch.mesh.noc.width_bits / 8 * arch.mesh.noc.link_freq_ghz * 1e9
    ends = np.bincount(chip.link_ends.ravel(), minlength=n).astype(np.float64)  # link ends at each router
    core_w = mem.core_j + 0.5 * link_bytes_s * em.noc_j_per_byte_hop * ends
    return core_w, mem.bank_j


class HardLimit:
    """The rule of the module docstring for one model and window length (``hard_limit`` keeps one per pair)."""

    def __init__(self, model: StackModel, window_s: float) -> None:
        arch = model.arch
        if arch.dtm is None:
            raise ValueError("arch.dtm is None: no hard limit")
        self.model = model
        self.window_s = window_s
        self.governor = Governor(arch)
        self.limit_k = arch.dtm.limit_c + KELVIN - MARGIN_K
        rows, cols = arch.core.array
        b = dtype_bytes(arch.core.dtype, "core.dtype")
        em = EnergyModel.from_arch(arch)
        macs_per_ghz = np.array([rows * cols * 1e9])  # MACs per second at 1 GHz
        vault_bytes_s = np.array([arch.dram.vault_bw_gbps * 1e9])
        zero = np.zeros(1)
        # J per second per GHz of clock at V0: the array's MACs and their operand and partial-sum accesses
        self.w_per_ghz = float(em.compute_j(macs_per_ghz, spm_accesses(macs_per_ghz, zero, rows, cols, b))[0])
        # W at V0: the DMA fill and drain of the vault's full bandwidth through the scratchpad
        self.dma_w = float(em.compute_j(zero, spm_accesses(zero, vault_bytes_s, rows, cols, b))[0])
        self.mem_core_w, self.mem_bank_w = _max_memory_w(arch)
        self.n_cells = model.net.n_cells
        self.rise = self._envelope_rise()

    def power(self, levels: np.ndarray, core_c: np.ndarray, bank_c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cores,), (DRAM dies, tiles per die) W: the most the cores at ``levels`` can dissipate in a window that
        starts with blocks at ``core_c``, ``bank_c`` (°C; module docstring)."""
        f, _ = self.governor.freq_volt(levels)
        V = self.governor.volts_for(f)  # the voltage the window step charges at this clock
        leak_c, leak_b, ref_b = static_power(self.model.arch, core_c, bank_c, V)
        core_w = (self.w_per_ghz * f + self.dma_w) * dynamic_scale(V, self.model.arch) + self.mem_core_w + leak_c
        return core_w, self.mem_bank_w + ref_b + leak_b

    def _envelope_rise(self) -> float:
        """The hottest cell's one-window rise (K) from a uniform ambient field under every level's maximum power,
        cell by cell the largest, with leakage at the limit and refresh at the curve's largest rate; inf when leakage
        may fall with temperature at some voltage (the Liao fit past ``V = −β/α``), so that no window is skipped."""
        model, gov = self.model, self.governor
        arch = model.arch
        volts = np.concatenate([v for _, v in gov.ladders] + [np.array([arch.power.v0])])
        if arch.power.leak_model == "liao" and float(volts.max()) >= -LIAO["beta"] / LIAO["alpha"]:
            return float("inf")
        limit_c = self.limit_k + MARGIN_K - KELVIN
        core_at = np.full(model.n_cores, limit_c)
        bank_at = np.full((len(model.dram_layers), model.n_banks_per_layer), limit_c)
        core_w = np.zeros(model.n_cores)
        for level in range(int(gov.deepest.max()) + 1):
            core_w = np.maximum(core_w, self.power(np.minimum(level, gov.deepest), core_at, bank_at)[0])
        _, leak_b, _ = static_power(arch, core_at, bank_at)
        temps = [limit_c, *(t for t, _ in arch.refresh.tref_curve)]
        ref_b = max(float(static_power(arch, limit_c, t)[2]) for t in temps)
        T1 = model.step(np.full(model.net.n_nodes, model.net.ambient), core_w, self.mem_bank_w + ref_b + leak_b,
                        self.window_s)
        return max(float((T1 - model.net.ambient).max()), 0.0)

    def decide(self, T: np.ndarray, core_c: np.ndarray, bank_c: np.ndarray, ran: np.ndarray,
               chosen: np.ndarray) -> Decision:
        """The next window's levels from the field ``T`` (K) after a window, its block temperatures (°C), the levels
        that window ran at and the ones the DVFS trips chose (module docstring)."""
        gov = self.governor
        cand = np.where(ran >= gov.n_dvfs, np.maximum(chosen, ran - 1), chosen)
        cand = np.minimum(cand, gov.deepest)
        if max(float(T.max()), self.model.net.ambient) + self.rise <= self.limit_k:
            return Decision(cand, True, 0)
        solves = 0
        while True:
            core_w, bank_w = self.power(cand, core_c, bank_c)
            T1 = self.model.step(T, core_w, bank_w, self.window_s)
            solves += 1
            if float(T1[:self.n_cells].max()) <= self.limit_k:
                return Decision(cand, True, solves)
            if np.all(cand >= gov.deepest):
                return Decision(cand, False, solves)
            cand = np.minimum(cand + 1, gov.deepest)


_LIMITS: weakref.WeakKeyDictionary[StackModel, dict[float, HardLimit]] = weakref.WeakKeyDictionary()


def hard_limit(model: StackModel, window_s: float) -> HardLimit | None:
    """The `HardLimit` of ``model`` for windows of ``window_s`` seconds (built once, kept while the model is), or
    None when its arch has no ``dtm``."""
    if model.arch.dtm is None:
        return None
    per_model = _LIMITS.setdefault(model, {})
    found = per_model.get(window_s)
    if found is None:
        found = per_model.setdefault(window_s, HardLimit(model, window_s))
    return found


__all__ = ["MARGIN_K", "Decision", "HardLimit", "hard_limit"]
