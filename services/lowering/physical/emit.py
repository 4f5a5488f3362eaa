"""What one physicalized window answers: its events (the window's share of every interval, as the wire columns),
their energy deposit and the window's timing, with the state after it.

The events are kept as columns (``WindowResult``) and written to the wire models only when asked: an epoch that
answers the deposit only (``events: false``) never builds the event lists. The deposit is computed from the same
columns the event lists are written from, so it equals ``shared.energy.deposit_of_events`` of those events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from services.lowering.physical.carry import QOS_NAMES, RW, Carry, Context, Intervals
from shared.contracts.events import ComputeEvents, EnergyDeposit, MemoryEvents, WindowTiming
from shared.energy import check_nonneg, deposit_of_arrays

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass
class Emitted:
    """The intervals that emit an event this window (``idx``, in event order), their window share ``f`` (per
    interval) and their start in the window."""

    iv: Intervals
    f: F64
    idx: I64
    start: F64

    @classmethod
    def compute(cls, C: Intervals, f: F64, t0: float) -> Emitted:
        """Every compute interval with a share in the window, by start then core."""
        return cls._sorted(C, f, np.flatnonzero(f > 0), t0)

    @classmethod
    def memory(cls, M: Intervals, f: F64, t0: float) -> Emitted:
        """Every memory interval with a share and bytes in the window, by start then source core."""
        assert M.nbytes is not None
        return cls._sorted(M, f, np.flatnonzero((f > 0) & (M.nbytes > 0)), t0)

    @classmethod
    def _sorted(cls, iv: Intervals, f: F64, i: I64, t0: float) -> Emitted:
        start_ns = np.maximum(iv.start[i], t0)  # clipped to the window's start
        core = iv.core[i]
        one_start = start_ns.size and start_ns.min() == start_ns.max()  # e.g. all running since before the window
        order = np.argsort(core, kind="stable") if one_start else np.lexsort((core, start_ns))  # then by core alone
        return cls(iv=iv, f=f, idx=i[order], start=start_ns[order])

    def __len__(self) -> int:
        return int(self.idx.size)


@dataclass
class WindowResult:
    """One window: the events it emits (from ``next_evt_id``: compute first, then memory), its timing and the state
    after it (``carry``)."""

    ctx: Context
    compute: Emitted
    memory: Emitted
    id0: int
    timing: WindowTiming
    carry: Carry

    def compute_events(self) -> ComputeEvents:
        e, ctx = self.compute, self.ctx
        C, i, f = e.iv, e.idx, e.f
        assert C.op is not None and C.cycles is not None and C.flops is not None and C.energy is not None
        dur_s = (C.end[i] - C.start[i]) * 1e-9
        power = np.divide(C.energy[i], dur_s, out=np.zeros(i.size), where=dur_s > 0)
        core = C.core[i]
        return ComputeEvents.model_construct(
            evt_id=list(range(self.id0, self.id0 + i.size)),
            t_start_ns=np.floor(e.start).astype(np.int64).tolist(),
            core_id=core.tolist(),
            duration_cycles=np.ceil(C.cycles[i] * f[i] - 1e-9).astype(np.int64).tolist(),
            flops=(C.flops[i] * f[i]).tolist(),
            op=ctx.ops.decode(C.op[i]),
            dvfs_domain=ctx.dom_names[core].tolist(),
            power_hint=power.tolist(),
            energy_j=(C.energy[i] * f[i]).tolist(),
        )

    def memory_events(self) -> MemoryEvents:
        e = self.memory
        M, i, f = e.iv, e.idx, e.f
        assert M.bank is not None and M.nbytes is not None and M.write is not None and M.hops is not None
        assert M.qos is not None
        id0 = self.id0 + len(self.compute)
        return MemoryEvents.model_construct(
            evt_id=list(range(id0, id0 + i.size)),
            t_start_ns=np.floor(e.start).astype(np.int64).tolist(),
            src_core=M.core[i].tolist(),
            dst_bank=self.ctx.chip.bank_strs(M.bank[i]),
            bytes=(M.nbytes[i] * f[i]).tolist(),
            rw=RW[M.write[i].view(np.uint8)].tolist(),
            hops=M.hops[i].tolist(),
            noc_qos=QOS_NAMES[M.qos[i]].tolist(),
        )

    def deposit(self) -> EnergyDeposit:
        """`deposit_of_events` of this window's events, from their columns (the same numbers and the same checks
        on them: a 422 naming an event field that is not a finite number >= 0)."""
        c, m = self.compute, self.memory
        C, ci, M, mi = c.iv, c.idx, m.iv, m.idx
        assert C.energy is not None and C.flops is not None
        assert M.bank is not None and M.nbytes is not None and M.qos is not None
        e_comp = C.energy[ci] * c.f[ci]
        if ci.size and not _finite_nonneg(e_comp):
            check_nonneg(e_comp, "compute_events.energy_j")
        nbytes = M.nbytes[mi] * m.f[mi]
        if mi.size and not _finite_nonneg(nbytes):
            check_nonneg(nbytes, "memory_events.bytes")
        return deposit_of_arrays(C.core[ci], e_comp, C.flops[ci] * c.f[ci], M.core[mi], M.bank[mi], nbytes,
                                 M.qos[mi] >= 2, self.ctx.arch, self.ctx.chip).to_contract()


def _finite_nonneg(a: F64) -> bool:
    """Every value of ``a`` (not empty) finite and >= 0 (a NaN fails the first comparison)."""
    return bool(a.min() >= 0) and bool(np.isfinite(a.max()))
