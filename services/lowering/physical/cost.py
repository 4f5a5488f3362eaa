"""Stage 4: what each piece costs: duration on its core and dynamic energy (shared/energy.py).

- compute: fold-formula cycles (``costmodel.cycles_from_macs``) at ``freq_ghz[core]``; a split row's piece runs
  ``1/k`` of the row's cycles; an expert piece the MACs of its tokens (``tok_frac``) times its share of the weights
  (``w_frac``: 1, or 1/k for a striped expert's piece).
- DMA (double-buffered with compute, so ``duration = max(compute, DMA)``): local bytes / (vault bw × bw_eff) +
  remote bytes / min(vault bw × bw_eff, link bw) + the largest hop count × link latency.
- energy at V0: MACs · mac_pj + scratchpad accesses · spm_pj, with 64-bit SPM accesses = DMA fill and drain of the
  piece's bytes + operand streaming of the array (one A/B read per R/C MACs) + fp32 partial sums (one per R MACs).
  Its DRAM/NoC energy is priced per memory event by ``EnergyModel.memory_j``.

Units: ns, cycles, bytes, J.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from services.lowering.costmodel import cycles_from_macs, dtype_bytes
from services.lowering.physical.assign import Pieces, Rows
from services.lowering.physical.memory import Traffic
from shared.chip import Chip
from shared.configs.arch import ArchConfig
from shared.energy import EnergyModel, spm_accesses

F64 = NDArray[np.float64]


@dataclass
class Cost:
    dur_ns: F64
    cycles: F64  # occupancy of the core in its cycles: dur_ns · f
    macs: F64
    energy_j: F64


def cost(rows: Rows, p: Pieces, exp_traffic: Traffic, exp_idx: NDArray[np.int64], split_bytes: F64, chip: Chip,
         arch: ArchConfig, em: EnergyModel, freq: F64, vault_bw: F64) -> Cost:
    """``exp_traffic``: traffic of the expert pieces ``exp_idx``; ``split_bytes``: bytes of each split piece's row
    share (all local), indexed like ``p``."""
    R, C = arch.core.array
    b = dtype_bytes(arch.core.dtype, "arch.core.dtype")
    n_p = len(p)
    macs_row = rows.macs[p.row]
    macs = np.where(p.split, macs_row / p.k, macs_row * p.tok_frac * p.w_frac)
    cyc = np.where(p.split, cycles_from_macs(macs_row, p.tokens, R, C, arch.core.dataflow) / p.k,
                   cycles_from_macs(macs, p.tokens, R, C, arch.core.dataflow))
    comp_ns = cyc / freq[p.core]
    dma_ns = np.where(p.split, split_bytes / vault_bw[p.core], 0.0)
    nbytes = np.where(p.split, split_bytes, 0.0)
    if exp_idx.size:
        tr = exp_traffic
        vault = chip.bank_vault_core(tr.bank)
        bw = np.where(tr.hops > 0, np.minimum(vault_bw[vault], chip.link_bw_bytes_per_ns), vault_bw[vault])
        per = np.bincount(tr.piece, weights=tr.nbytes / bw, minlength=exp_idx.size)
        hop_max = np.zeros(exp_idx.size)
        np.maximum.at(hop_max, tr.piece, tr.hops.astype(np.float64))
        dma_ns[exp_idx] = per + hop_max * chip.link_latency_ns
        nbytes[exp_idx] = np.bincount(tr.piece, weights=tr.nbytes, minlength=exp_idx.size)
    dur = np.maximum(comp_ns, dma_ns)
    spm = spm_accesses(macs, nbytes, R, C, b)
    energy = em.compute_j(macs, spm)
    assert dur.shape == (n_p,)
    return Cost(dur_ns=dur, cycles=dur * freq[p.core], macs=macs, energy_j=energy)
