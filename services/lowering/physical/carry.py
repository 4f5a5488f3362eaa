"""The physicalizer's state between windows as numpy columns (``Carry``), and what stays fixed over a run of windows
(``Context``).

A `PhysicalState` is the wire form: lists, strings, pydantic models. Between the windows of one epoch
(``services.lowering.epoch``) the state stays a ``Carry``: the same values (``Carry.from_state`` and
``Carry.to_state`` convert exactly, so a window gives the same result whether its state went through JSON or not),
with strings coded as ints (``Strings``) and the per-run lookups (an expert's cores, a tensor's bank) cached in the
``Context``.

Units as in ``physical/__init__``: ns, bytes, J.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from services.lowering.costmodel import mac_pj_for
from services.lowering.physical.assign import PHASE, UNKNOWN_PHASE, Rows
from services.lowering.physical.columns import LogicalMem, Strings
from services.lowering.physical.lookahead import LookaheadCache
from services.lowering.physical.memory import TensorTable
from services.lowering.physical.overlays import Reroute
from services.lowering.physical.serving import MicroBatchFn, ServingCarry
from shared.chip import Chip
from shared.configs.arch import ArchConfig
from shared.configs.workload import ServingConfig
from shared.contracts.events import (
    NOC_QOS,
    ActiveReroute,
    CoreQueueState,
    OpenMicroBatch,
    PendingTokens,
    PhysicalState,
    RunningCompute,
    RunningMemory,
    ServingState,
)
from shared.contracts.placement import Placement, ReplicaState
from shared.contracts.workload import LogicalCompute
from shared.energy import EnergyModel
from shared.errors import BadInput

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
B = NDArray[np.bool_]
QOS_CODE = {q: i for i, q in enumerate(NOC_QOS)}
RW = np.array(["r", "w"], dtype=object)
QOS_NAMES = np.array(NOC_QOS, dtype=object)


@dataclass
class Intervals:
    """Compute or memory work with real intervals, as arrays (running from earlier windows + new)."""

    core: I64
    start: F64
    end: F64
    # compute
    op: I64 | None = None  # codes of Context.ops
    cycles: F64 | None = None
    flops: F64 | None = None
    energy: F64 | None = None
    # memory
    bank: I64 | None = None
    nbytes: F64 | None = None
    write: B | None = None
    hops: I64 | None = None
    qos: I64 | None = None  # index into NOC_QOS

    def take(self, idx: I64 | B) -> Intervals:
        def opt(a: NDArray[Any] | None) -> Any:
            return a[idx] if a is not None else None

        return Intervals(core=self.core[idx], start=self.start[idx], end=self.end[idx], op=opt(self.op),
                         cycles=opt(self.cycles), flops=opt(self.flops), energy=opt(self.energy), bank=opt(self.bank),
                         nbytes=opt(self.nbytes), write=opt(self.write), hops=opt(self.hops), qos=opt(self.qos))

    @staticmethod
    def cat(parts: list[Intervals]) -> Intervals:
        if len(parts) == 1:
            return parts[0]
        out = Intervals(core=np.concatenate([p.core for p in parts]), start=np.concatenate([p.start for p in parts]),
                        end=np.concatenate([p.end for p in parts]))
        for f in ("op", "cycles", "flops", "energy", "bank", "nbytes", "write", "hops", "qos"):
            vals = [getattr(p, f) for p in parts]
            if all(v is not None for v in vals):
                setattr(out, f, np.concatenate(vals))
        return out


@dataclass
class LogicalRows:
    """`LogicalCompute` as columns (``op`` coded by Context.ops)."""

    event_id: I64
    t_gen: I64
    mb: I64
    layer: I64
    op: I64
    expert: I64
    tokens: I64
    flops: F64

    @classmethod
    def empty(cls) -> LogicalRows:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, z, z, z, z, np.zeros(0))

    @classmethod
    def of(cls, lc: LogicalCompute, ops: Strings, idx: I64 | None = None) -> LogicalRows:
        """Rows ``idx`` of ``lc`` (all when None), in that order."""
        if not len(lc) or (idx is not None and not idx.size):
            return cls.empty()

        def col(values: list[int] | list[float], dtype: type[np.int64] | type[np.float64]) -> NDArray[Any]:
            a = np.asarray(values).astype(dtype)
            return a if idx is None else a[idx]

        op_type = lc.op_type if idx is None else [lc.op_type[i] for i in idx.tolist()]
        return cls(event_id=col(lc.event_id, np.int64), t_gen=col(lc.t_gen_ns, np.int64), mb=col(lc.mb_id, np.int64),
                   layer=col(lc.layer, np.int64), op=ops.codes(op_type), expert=col(lc.expert, np.int64),
                   tokens=col(lc.tokens, np.int64), flops=col(lc.flops, np.float64))

    def to_contract(self, ops: Strings) -> LogicalCompute:
        return LogicalCompute.model_construct(
            event_id=self.event_id.tolist(), t_gen_ns=self.t_gen.tolist(), mb_id=self.mb.tolist(),
            layer=self.layer.tolist(), op_type=ops.decode(self.op), expert=self.expert.tolist(),
            tokens=self.tokens.tolist(), flops=self.flops.tolist())

    def __len__(self) -> int:
        return int(self.event_id.size)

    def take(self, idx: I64 | B) -> LogicalRows:
        return LogicalRows(*(getattr(self, k)[idx] for k in self.__dataclass_fields__))

    @staticmethod
    def cat(a: LogicalRows, b: LogicalRows) -> LogicalRows:
        if not len(a):
            return b
        if not len(b):
            return a
        return LogicalRows(*(np.concatenate([getattr(a, k), getattr(b, k)]) for k in a.__dataclass_fields__))

    def rows(self, ctx: Context) -> Rows:
        """The mapping view (`assign.Rows`): times, tokens and MACs as floats, the phase of each op."""
        return Rows(event_id=self.event_id, tgen=self.t_gen.astype(np.float64), mb=self.mb, layer=self.layer,
                    phase=ctx.phase_of(self.op), op=self.op, expert=self.expert,
                    tokens=self.tokens.astype(np.float64), macs=self.flops / 2.0)


@dataclass
class Context:
    """What stays fixed over a run of windows (one window, or an epoch): the arch and what derives from it, the
    placement, the clocks and the refresh factor, the serving config with the way to the workload service's
    micro-batch rows (``physical.serving``; None: the windows' own rows); and the lookups the windows share (string
    codes, the cores of an expert instance, the banks of a tensor). ``Context.of`` checks the clocks, the window,
    the refresh factor and that serving has its rows and the model's layer count."""

    arch: ArchConfig
    placement: Placement
    chip: Chip
    em: EnergyModel  # at the dtype's MAC energy: prices the pieces
    freq: F64  # GHz per core
    vault_bw: F64  # bytes/ns per vault after refresh
    window_ms: float
    n_layers: int | None
    open_limit: int
    ops: Strings = field(default_factory=Strings)
    tensors: Strings = field(default_factory=Strings)
    access: Strings = field(default_factory=lambda: Strings(("read", "write")))
    hints: Strings = field(default_factory=Strings)
    expert_cores: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # for ``_replicas``
    tensor_table: TensorTable | None = None  # for ``_replicas`` and its own tensor banks
    lookahead: LookaheadCache = field(default_factory=LookaheadCache)
    many_windows: bool = False  # an epoch: lookups worth building for later windows (`lookahead`)
    _replicas: ReplicaState | None = None
    dom_names: NDArray[np.object_] = field(default_factory=lambda: np.zeros(0, dtype=object))  # per core
    _phase: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    serving: ServingConfig | None = None
    microbatches: MicroBatchFn | None = None

    @classmethod
    def of(cls, placement: Placement, arch: ArchConfig, freq_ghz: Sequence[float], window_ms: float,
           bw_eff_factor: float | Sequence[float] = 1.0, *, n_layers: int | None = None,
           serving: ServingConfig | None = None, microbatches: MicroBatchFn | None = None) -> Context:
        chip = Chip.from_arch(arch)
        n = chip.n_cores
        if len(freq_ghz) != n:
            raise BadInput(f"freq_ghz has {len(freq_ghz)} values but the mesh has {n} cores", field="freq_ghz")
        freq = np.asarray(freq_ghz, dtype=np.float64)
        if not np.all(np.isfinite(freq) & (freq > 0)):
            raise BadInput("freq_ghz must be > 0 for every core", field="freq_ghz")
        if not window_ms > 0:
            raise BadInput("window_ms must be > 0", field="window_ms")
        eff = np.broadcast_to(np.asarray(bw_eff_factor, dtype=np.float64), (n,)) if np.ndim(bw_eff_factor) == 0 \
            else np.asarray(bw_eff_factor, dtype=np.float64)
        if eff.shape != (n,) or not np.all((eff > 0) & (eff <= 1)):
            raise BadInput(f"bw_eff_factor must be in (0, 1], one value or {n}", field="bw_eff_factor")
        if serving is not None:
            if n_layers is None:  # a micro-batch of prompt chunks only has no head row: its last layer is n_layers - 1
                raise BadInput("serving needs the model's layer count: a micro-batch completes after its last layer",
                               field="n_layers")
            if microbatches is None:
                raise TypeError("serving needs the workload service's micro-batch rows (microbatches)")
        em = EnergyModel.from_arch(arch, mac_pj=mac_pj_for(arch.core.dtype, arch))
        dom = np.asarray(chip.core_domain, dtype=np.int64)
        dom_names = np.array([f"d{d}" for d in range(int(dom.max()) + 1)], dtype=object)[dom]
        return cls(arch=arch, placement=placement, chip=chip, em=em, freq=freq,
                   vault_bw=chip.vault_bw_bytes_per_ns * eff, window_ms=window_ms, n_layers=n_layers,
                   open_limit=arch.schedule.open_limit(n), dom_names=dom_names, serving=serving,
                   microbatches=microbatches)

    def phase_of(self, op: I64) -> I64:
        """The phase (``assign.PHASE``) of each coded op."""
        if self._phase.size < len(self.ops):
            self._phase = np.array([PHASE.get(o, UNKNOWN_PHASE) for o in self.ops.names.tolist()], dtype=np.int64)
        out: I64 = self._phase[op]
        return out

    def lookups(self, replicas: ReplicaState, tensor_banks: dict[str, str],
                ) -> tuple[dict[tuple[int, int], list[int]], TensorTable]:
        """The cores of each expert instance (layer, expert) and the tensor table for this replica state and these
        tensor banks: kept while they stay the same (within an epoch: after its first windows)."""
        if self._replicas is not replicas:
            self._replicas = replicas
            self.expert_cores = {}
            self.tensor_table = None
        if self.tensor_table is None or self.tensor_table.tensor_banks != tensor_banks:
            self.tensor_table = TensorTable(self.tensors, self.placement, replicas, dict(tensor_banks), self.chip)
        return self.expert_cores, self.tensor_table


@dataclass
class Carry:
    """`PhysicalState` in memory (see the module docstring): the same fields, as columns."""

    replicas: ReplicaState
    tensor_banks: dict[str, str]
    next_evt_id: int
    core_free: F64  # busy_until_ns as floats
    vault_free: F64
    link_free: F64
    running_c: Intervals
    running_m: Intervals
    open_c: LogicalRows
    open_m: LogicalMem
    pending: list[PendingTokens]
    open_mbs: list[OpenMicroBatch]
    dropped_mbs: list[int]
    reroutes: list[Reroute]  # ``within``: the micro-batches open when the rule arrived
    unique_ids: bool = False  # the open rows' event ids are known to be unique
    # derived from open_c / open_m, kept by the window that made them (None: derive them)
    rows: Rows | None = None  # open_c as `assign.Rows`
    m_row: I64 | None = None  # per open memory row: its row of open_c (-1: none)
    serving: ServingCarry | None = None  # the request scheduler's state (``Context.serving``)

    @classmethod
    def from_state(cls, state: PhysicalState, ctx: Context) -> Carry:
        """The state, checked against the chip: a 422 naming the first bad field of ``state``."""
        chip, n = ctx.chip, ctx.chip.n_cores
        q = state.queue
        core_free = np.asarray(q.busy_until_ns, dtype=np.float64) if q.busy_until_ns else np.zeros(n)
        vault_free = np.asarray(q.vault_free_ns, dtype=np.float64) if q.vault_free_ns else np.zeros(n)
        if core_free.shape != (n,):
            raise BadInput(f"state.queue.busy_until_ns has {core_free.size} values, the mesh {n}",
                           field="state.queue.busy_until_ns")
        if vault_free.shape != (n,):
            raise BadInput(f"state.queue.vault_free_ns has {vault_free.size} values, the mesh {n}",
                           field="state.queue.vault_free_ns")
        link_free = np.asarray(q.link_free_ns, dtype=np.float64) if q.link_free_ns else np.zeros(chip.n_links)
        if link_free.shape != (chip.n_links,):
            raise BadInput(f"state.queue.link_free_ns has {link_free.size} values, the mesh {chip.n_links} links",
                           field="state.queue.link_free_ns")
        validate_rows(q.open_compute, "state.queue.open_compute")
        _validate_running(q, n)
        rc, rm = q.running_compute, q.running_memory
        running_c = Intervals(core=np.asarray(rc.core_id, dtype=np.int64),
                              start=np.asarray(rc.start_ns, dtype=np.float64),
                              end=np.asarray(rc.end_ns, dtype=np.float64), op=ctx.ops.codes(rc.op),
                              cycles=np.asarray(rc.cycles, dtype=np.float64),
                              flops=np.asarray(rc.flops, dtype=np.float64),
                              energy=np.asarray(rc.energy_j, dtype=np.float64))
        running_m = Intervals(core=np.asarray(rm.src_core, dtype=np.int64),
                              start=np.asarray(rm.start_ns, dtype=np.float64),
                              end=np.asarray(rm.end_ns, dtype=np.float64), bank=_checked_banks(rm.bank, chip),
                              nbytes=np.asarray(rm.bytes, dtype=np.float64),
                              write=np.array([r == "w" for r in rm.rw], dtype=bool),
                              hops=np.asarray(rm.hops, dtype=np.int64),
                              qos=np.array([QOS_CODE[x] for x in rm.noc_qos], dtype=np.int64))
        reroutes = [Reroute(r.t_apply_ns, r.scope, r.from_core, r.to_core, tuple(r.mbs), tuple(r.experts),
                            tuple(r.open_mbs)) for r in q.reroutes]
        if state.serving is not None and ctx.serving is None:
            raise BadInput("a serving scheduler's state, but the request serves no requests (serving: null)",
                           field="state.serving")
        serving = ServingCarry.of(state.serving or ServingState(), ctx.open_limit) if ctx.serving is not None \
            else None
        return cls(replicas=state.replicas, tensor_banks=dict(state.tensor_banks), next_evt_id=state.next_evt_id,
                   core_free=core_free, vault_free=vault_free, link_free=link_free, running_c=running_c,
                   running_m=running_m, open_c=LogicalRows.of(q.open_compute, ctx.ops),
                   open_m=LogicalMem.of(q.open_memory, ctx), pending=list(q.pending), open_mbs=list(q.open_mbs),
                   dropped_mbs=list(q.dropped_mbs), reroutes=reroutes, serving=serving)

    def to_state(self, ctx: Context) -> PhysicalState:
        rc, rm = self.running_c, self.running_m
        assert rc.op is not None and rc.cycles is not None and rc.flops is not None and rc.energy is not None
        assert rm.bank is not None and rm.nbytes is not None and rm.write is not None and rm.hops is not None
        assert rm.qos is not None
        running_compute = RunningCompute.model_construct(
            core_id=rc.core.tolist(), op=ctx.ops.decode(rc.op), start_ns=rc.start.tolist(), end_ns=rc.end.tolist(),
            cycles=rc.cycles.tolist(), flops=rc.flops.tolist(), energy_j=rc.energy.tolist())
        running_memory = RunningMemory.model_construct(
            src_core=rm.core.tolist(), bank=rm.bank.tolist(), bytes=rm.nbytes.tolist(),
            rw=RW[rm.write.astype(np.int64)].tolist(), hops=rm.hops.tolist(), noc_qos=QOS_NAMES[rm.qos].tolist(),
            start_ns=rm.start.tolist(), end_ns=rm.end.tolist())
        reroutes = [ActiveReroute(t_apply_ns=r.t_apply_ns, scope=r.scope, from_core=r.from_core, to_core=r.to_core,
                                  mbs=list(r.mbs), experts=list(r.experts), open_mbs=list(r.within or ()))
                    for r in self.reroutes]
        return PhysicalState(
            replicas=self.replicas,
            queue=CoreQueueState(
                busy_until_ns=self.core_free.astype(np.int64).tolist(),
                vault_free_ns=self.vault_free.astype(np.int64).tolist(),
                link_free_ns=self.link_free.astype(np.int64).tolist(),
                running_compute=running_compute, running_memory=running_memory,
                open_compute=self.open_c.to_contract(ctx.ops), open_memory=self.open_m.to_contract(ctx),
                pending=self.pending, open_mbs=self.open_mbs, dropped_mbs=self.dropped_mbs, reroutes=reroutes),
            next_evt_id=self.next_evt_id,
            tensor_banks=self.tensor_banks,
            serving=self.serving.to_state() if self.serving is not None else None,
        )


def validate_rows(lc: LogicalCompute, where: str = "logical.compute") -> None:
    if not len(lc):
        return
    tok = np.asarray(lc.tokens, dtype=np.float64)
    fl = np.asarray(lc.flops, dtype=np.float64)
    if np.any(tok < 0):
        raise BadInput("tokens must be >= 0", field=f"{where}.tokens[{int(np.flatnonzero(tok < 0)[0])}]")
    bad = ~np.isfinite(fl) | (fl < 0)
    if np.any(bad):
        raise BadInput("flops must be finite and >= 0", field=f"{where}.flops[{int(np.flatnonzero(bad)[0])}]")


def _validate_running(q: CoreQueueState, n: int) -> None:
    """The carried running work must name cores of this mesh, known QoS classes and finite, ordered intervals."""
    for name, cols, core_col in (("running_compute", q.running_compute, "core_id"),
                                 ("running_memory", q.running_memory, "src_core")):
        core = np.asarray(getattr(cols, core_col), dtype=np.int64)
        start = np.asarray(cols.start_ns, dtype=np.float64)
        end = np.asarray(cols.end_ns, dtype=np.float64)
        bad = np.flatnonzero((core < 0) | (core >= n))
        if bad.size:
            raise BadInput(f"core {int(core[bad[0]])} outside the mesh (0..{n - 1})",
                           field=f"state.queue.{name}.{core_col}[{bad[0]}]")
        bad = np.flatnonzero(~np.isfinite(start) | ~np.isfinite(end) | (end < start))
        if bad.size:
            raise BadInput("intervals must be finite with end_ns >= start_ns",
                           field=f"state.queue.{name}.end_ns[{bad[0]}]")
    bad_q = [i for i, x in enumerate(q.running_memory.noc_qos) if x not in QOS_CODE]
    if bad_q:
        raise BadInput(f"noc_qos must be one of {', '.join(NOC_QOS)}",
                       field=f"state.queue.running_memory.noc_qos[{bad_q[0]}]")


def _checked_banks(banks: list[int], chip: Chip) -> I64:
    b = np.asarray(banks, dtype=np.int64)
    bad = np.flatnonzero((b < 0) | (b >= chip.BX * chip.BY * chip.L))
    if bad.size:
        raise BadInput(f"bank {int(b[bad[0]])} outside the bank grid",
                       field=f"state.queue.running_memory.bank[{bad[0]}]")
    return b
