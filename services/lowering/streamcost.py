"""Cost of an ISA stream: instructions between two SYNC_WAITs overlap (DMA beside TE/VE), so a segment costs
``max(DMA bytes / bw, TE cycles + VE cycles)``; TE cycles per tile from the fold formula, VE cycles from the vector
width and the op's passes. Energy: MACs, SPM accesses (every byte a DMA moves in or out, every operand byte TE/VE
reads or writes, in 64-bit accesses) and DRAM bits."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from services.lowering.costmodel import (
    DTYPE_BYTES,
    SPM_ACCESS_BYTES,
    VE_PASSES,
    DramBytesReport,
    fold_cycles,
    mac_pj_for,
)
from services.lowering.isa import LOADS, STORES, TE_OPS, VE_OPS, DeviceProfile, Instr, Opcode
from shared.configs.arch import ArchConfig

_VE_KIND = {
    Opcode.VE_ADD_TILE: "add", Opcode.VE_MUL_TILE: "mul", Opcode.VE_GELU_TILE: "gelu", Opcode.VE_SILU_TILE: "silu",
    Opcode.VE_RMSNORM_TILE: "rmsnorm", Opcode.VE_LAYERNORM_TILE: "layernorm", Opcode.VE_SOFTMAX_TILE: "softmax",
}


@dataclass
class StreamCost(DramBytesReport):
    cycles: float = 0.0
    te_cycles: float = 0.0
    ve_cycles: float = 0.0
    dma_cycles: float = 0.0
    dram_read_bytes: float = 0.0
    dram_write_bytes: float = 0.0
    macs: float = 0.0
    spm_accesses: float = 0.0
    energy_j: float = 0.0
    instructions: int = 0
    opcode_counts: dict[str, int] = field(default_factory=dict)


def stream_cost(instrs: list[Instr], profile: DeviceProfile, arch: ArchConfig | None = None) -> StreamCost:
    R, C = profile.array
    df: Literal["os", "ws"] = "os" if profile.dataflow == "os" else "ws"
    out = StreamCost(instructions=len(instrs))
    counts: Counter[str] = Counter()
    seg_dma = seg_te = seg_ve = 0.0
    spm_bytes = 0.0

    def close() -> None:
        nonlocal seg_dma, seg_te, seg_ve
        out.cycles += max(seg_dma / profile.dma_bytes_per_cycle, seg_te + seg_ve)
        seg_dma = seg_te = seg_ve = 0.0

    for ins in instrs:
        counts[ins.opcode.value] += 1
        op, imm = ins.opcode, ins.imm
        if op == Opcode.SYNC_WAIT:
            close()
            continue
        eb = DTYPE_BYTES.get(str(imm.get("dtype", profile.dtype)), profile.elem)
        if op in LOADS or op in STORES:
            nbytes = float(imm.get("rows", 0)) * float(imm.get("cols", 0)) * eb
            seg_dma += nbytes
            out.dma_cycles += nbytes / profile.dma_bytes_per_cycle
            spm_bytes += nbytes
            if op in LOADS:
                out.dram_read_bytes += nbytes
            else:
                out.dram_write_bytes += nbytes
        elif op in TE_OPS:
            m, k, n = int(imm["m"]), int(imm["k"]), int(imm["n"])
            cyc = float(fold_cycles(m, k, n, R, C, df))
            seg_te += cyc
            out.te_cycles += cyc
            out.macs += float(m) * k * n
            spm_bytes += (m * k * math.ceil(n / C) + k * n + m * n * math.ceil(k / R)) * eb
        elif op in VE_OPS:
            elems = float(imm.get("rows", 0)) * float(imm.get("cols", 0))
            cyc = math.ceil(elems / profile.vector_width) * VE_PASSES[_VE_KIND[op]]
            seg_ve += cyc
            out.ve_cycles += cyc
            spm_bytes += 2 * elems * eb
    close()
    out.opcode_counts = dict(sorted(counts.items()))
    out.spm_accesses = spm_bytes / SPM_ACCESS_BYTES
    mac_j = mac_pj_for(profile.dtype, arch) * 1e-12 if profile.dtype in DTYPE_BYTES else 1.5e-12
    spm_j = (arch.power.spm_pj_per_access if arch is not None else 10.0) * 1e-12
    dram_j = (arch.dram.pj_per_bit if arch is not None else 3.9) * 8e-12
    vec_j = (arch.power.vector_pj_per_op if arch is not None else 0.4) * 1e-12
    out.energy_j = out.macs * mac_j + out.spm_accesses * spm_j + out.dram_bytes * dram_j + \
        out.ve_cycles * profile.vector_width * vec_j
    return out
