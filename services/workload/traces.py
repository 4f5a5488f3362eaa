"""Logical traces (seed 001 §3.1, §4.1): compute and memory events of a serving scenario, window by window.

Scenario (``WorkloadConfig``): micro-batch ``m`` arrives at ``t_m = m · sequence.step_interval_ms`` and carries
``sequence.micro_batch`` tokens (decode: one new token per sequence with a context of ``sequence.tokens``; prefill:
``micro_batch`` prompt tokens, attention costed at the per-token average of a ``sequence.tokens`` prompt). Every layer
of the model processes the micro-batch; ``t_gen_ns`` of every event of a micro-batch is its arrival time (the lowering
service chains the layers in time). Routing: ``services.workload.routing``.

Events, aggregated per (micro-batch, layer, op, expert) with a token count — never one row per token — in this order
within a micro-batch: for each layer ``attn``, then ``router``, ``shared`` (shared experts), ``fc`` per routed expert
with tokens (ascending id) on MoE layers, or ``dense`` on dense layers; finally ``head`` (layer = num_layers).

- FLOPs of an event = tokens × per-token ops of that op from the WorkloadIR (cube + vector, attention including the
  context), unless the config overrides them: ``operators.fc.flop_per_token`` (per token per routed expert) and
  ``operators.attn.flop_per_token`` (per token per layer); ``operators.attn.kv_bytes_per_token`` overrides the KV
  bytes one token adds to one layer.
- Memory events (bytes): ``fc`` reads every weight shard ``W_L{l}E{e}_{k}`` of its expert (shards of
  ``tensors.weight_shard_mb`` MiB, the last one the remainder) plus ``ACT_L{l}_MB{m}`` read and write (tokens·h·b);
  ``attn`` reads ``KV_L{l}_MB{m}`` (tokens · context · kv_bytes) and writes it (tokens · kv_bytes); ``router`` and
  ``head`` read the activations, ``shared`` and ``dense`` read and write them. Non-expert weights are not placed by
  TAPS and have no memory events.

Event ids are global and count from 0 in the order above, so they do not depend on the window size. A window ``k`` of
``window_ms`` holds the micro-batches arriving in ``[k·W, (k+1)·W)``.

Serving (``WorkloadConfig.serving``): a window holds the requests arriving in it (``services.workload.arrivals``) and
no events; the micro-batches a scheduler forms get theirs from ``services.workload.serving``, built on the same
`TracePlan` (slots, memory templates, routing stream).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import numpy.typing as npt

from services.workload.arrivals import OfferedRequests, offered_requests, requests_between
from services.workload.ir import ModelConfig, TransformerModel, build_ir
from services.workload.recorded import RecordedRouting, ReplayStream, check_against_model, routing_stats
from services.workload.routing import (
    MAX_DRAWS_PER_CHUNK,
    IntArray,
    RoutingStream,
    expert_counts,
    zipf_probabilities,
)
from services.workload.sources import WorkloadSources
from shared.configs import WorkloadConfig
from shared.contracts.ids import expert_id, weight_tensor_id
from shared.contracts.workload import LogicalCompute, LogicalMemory, LogicalWindow, RoutingStats
from shared.contracts.workload_api import DEFAULT_WINDOW_MS
from shared.errors import BadInput

OP_NAMES = ("attn", "router", "shared", "fc", "dense", "head")
ATTN, ROUTER, SHARED, FC, DENSE, HEAD = range(6)
MIB = 1 << 20
COMPUTE_HEADER = "event_id,t_gen_ns,mb_id,token_id,experts_json,flops_json,op_type\n"
MEMORY_HEADER = "event_id,tensor_id,access,bytes,locality_hint\n"
COMPUTE_CSV = "logical_compute.csv"
MEMORY_CSV = "logical_memory.csv"

FloatArray = npt.NDArray[np.float64]
ObjArray = npt.NDArray[np.object_]


MAX_SLOT_ROWS = 1 << 22  # memory rows of one micro-batch's event table: ~70x DeepSeek-V3's (58 x 256 x 4)
MAX_WINDOW_CELLS = 1 << 24  # tokens x experts x MoE layers drawn for one window (~7 s; DeepSeek-V3's default: 1.9M)
MAX_WINDOW_ROWS = 1 << 24  # event rows of one window (~1-2 GB as arrays): 4x the biggest micro-batch table
# windows of one trace: 200x the reference run's 9901 (docs/operations.md, "Security and limits")
MAX_TRACE_WINDOWS = 2_000_000


def _objects(items: list[str]) -> ObjArray:
    """A 1-D object array of Python strings (fancy indexing then ``tolist()`` gives the str objects back)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def resolve_routing(cfg: WorkloadConfig, mc: ModelConfig) -> tuple[int, int | None, int | None]:
    """(topk, n_group, topk_group): the config's when given, else the model's (top-k: ``num_experts_per_tok``;
    groups: DeepSeek's), validated against the model (0, None, None for a model without routed experts)."""
    r = cfg.routing
    moe = mc.moe
    if moe is None:
        return 0, None, None
    topk = r.topk if r.topk is not None else moe.num_activated_experts
    n_group = r.n_group if r.n_group is not None else moe.n_group
    topk_group = r.topk_group if r.topk_group is not None else moe.topk_group
    E = moe.num_routed_experts
    if topk > E:
        raise BadInput(f"routing.topk ({topk}) must be <= the {E} experts of {mc.name}", field="routing.topk")
    if n_group is not None and topk_group is not None:
        if E % n_group:
            raise BadInput(f"routing.n_group ({n_group}) must divide the {E} experts of {mc.name}",
                           field="routing.n_group")
        if topk > topk_group * (E // n_group):
            raise BadInput(f"routing.topk ({topk}) exceeds the {topk_group * (E // n_group)} experts of "
                           f"{topk_group} groups", field="routing.topk")
    return topk, n_group, topk_group


@dataclass(frozen=True)
class PerToken:
    """Per-token costs of each logical op, from the WorkloadIR (or the config's overrides), layer by layer: layers
    differ in their mixer (full/sliding/chunked attention, MLA, Mamba) and MLP (dense width, MoE, shared experts)."""

    flops: dict[int, float]  # op code -> ops per token at the first layer that has the op (fc: per routed expert)
    layer_flops: dict[tuple[int, int], float]  # (layer, op code) -> ops per token (fc: per token per routed expert)
    kv_read: dict[int, int]  # layer -> KV (or Mamba state) bytes one token reads at that layer
    kv_write: dict[int, int]  # layer -> KV bytes one token adds (Mamba: the state it writes back)
    kv_bytes: int  # KV bytes one token adds to one attention layer (the first one)
    act_bytes: int  # hidden-state bytes of one token (h · dtype)
    expert_bytes: int  # weights of one routed expert


_ROLE_OP = {"attn": ATTN, "router": ROUTER, "shared": SHARED, "expert": FC, "dense": DENSE, "head": HEAD}


def per_token_costs(cfg: WorkloadConfig, model: TransformerModel) -> PerToken:
    """Ops per token of every (layer, logical op) from the IR (``expert`` ops divided by top-k: per routed expert),
    and the KV bytes each layer reads and writes per token: a ``ctx``-token context reads ``keys_per_query ·
    kv_bytes`` (the whole context, its window or its chunk) and writes ``kv_bytes``; a Mamba layer reads and writes
    its sequence's state."""
    mc, T, ctx = model.config, model.shape.tokens, model.shape.ctx
    k_model = mc.moe.num_activated_experts if mc.moe else 1
    layer_flops: dict[tuple[int, int], float] = {}
    for la in model.layers:
        li = la.index if la.op_type != "embedding" else None
        if li is None:
            continue
        for op in la.ops:
            code = _ROLE_OP.get(str(op.attrs.get("role")))
            if code is None:
                continue
            layer_flops[(li, code)] = layer_flops.get((li, code), 0.0) + op.compute.total
    for key, v in layer_flops.items():
        layer_flops[key] = v / (T * k_model) if key[1] == FC else v / T
    ops = cfg.operators
    for key in layer_flops:
        if key[1] == FC and ops.fc.flop_per_token is not None:
            layer_flops[key] = float(ops.fc.flop_per_token)
        if key[1] == ATTN and ops.attn.flop_per_token is not None:
            layer_flops[key] = float(ops.attn.flop_per_token)
    flops: dict[int, float] = {}
    for (_, code), v in sorted(layer_flops.items()):
        flops.setdefault(code, v)
    for code in range(len(OP_NAMES)):
        flops.setdefault(code, 0.0)
    kv_read: dict[int, int] = {}
    kv_write: dict[int, int] = {}
    for li, mixer in enumerate(mc.layer_mixers):
        if mixer == "mamba":
            kv_read[li] = kv_write[li] = mc.state_bytes_per_sequence(li)
            continue
        kvb = mc.kv_bytes_per_token_layer(li)
        if ops.attn.kv_bytes_per_token is not None:
            kvb = round(ops.attn.kv_bytes_per_token)
        kv_read[li], kv_write[li] = mc.keys_per_query(li, ctx) * kvb, kvb
    first_attn = next((li for li, m in enumerate(mc.layer_mixers) if m != "mamba"), 0)
    return PerToken(flops=flops, layer_flops=layer_flops, kv_read=kv_read, kv_write=kv_write,
                    kv_bytes=kv_write.get(first_attn, 0), act_bytes=mc.hidden_size * mc.dtype_bytes,
                    expert_bytes=mc.expert_bytes)


@dataclass
class EventBlock:
    """Events of a run of consecutive micro-batches, as numpy columns."""

    c_event: IntArray
    c_slot: IntArray  # slot of the event in the plan's per-micro-batch slot table
    c_t: IntArray
    c_mb: IntArray
    c_layer: IntArray
    c_op: IntArray
    c_expert: IntArray
    c_tokens: IntArray
    c_flops: FloatArray
    m_event: IntArray
    m_tpl: IntArray  # memory template row
    m_mb: IntArray
    m_bytes: IntArray

    @property
    def n_compute(self) -> int:
        return len(self.c_event)


@dataclass
class TracePlan:
    """Everything about a trace that does not depend on the random draws: slots, costs, templates, schedule."""

    cfg: WorkloadConfig
    sources: WorkloadSources = field(default_factory=WorkloadSources.packaged, repr=False)
    mc: ModelConfig = field(init=False)
    costs: PerToken = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.mc = mc = self.sources.zoo.resolve_model(cfg.model)
        self.topk, self.n_group, self.topk_group = resolve_routing(cfg, mc)
        seq = cfg.sequence
        self.T = seq.micro_batch
        self.steps = seq.steps
        self.ctx = seq.tokens
        self.E = mc.moe.num_routed_experts if mc.moe else 0
        self.moe_layers: list[int] = mc.moe_layers
        self.recorded: RecordedRouting | None = None
        if cfg.routing.trace is not None:
            if not self.E:
                raise BadInput(f"routing.trace: {mc.name} has no routed experts to replay", field="routing.trace")
            self.recorded = self.sources.recorded.load(cfg.routing.trace, cfg.routing.trace_format)
            check_against_model(self.recorded, moe_layers=self.moe_layers, n_experts=self.E, topk=self.topk)
        ir = build_ir(mc, phase=cfg.phase, batch=self.T, seq_len=seq.tokens)
        if cfg.phase == "prefill":  # per-token costs of a micro_batch-token chunk of a `tokens`-long prompt
            ir = build_ir(mc, phase="prefill", batch=1, seq_len=seq.tokens)
        self.costs = per_token_costs(cfg, ir)
        shard = max(1, round(cfg.tensors.weight_shard_mb * MIB))
        n_sh = max(1, math.ceil(self.costs.expert_bytes / shard)) if self.E else 0
        # the per-micro-batch event table: every (MoE layer, expert) slot carries its shards' memory rows
        rows = len(self.moe_layers) * self.E * (n_sh + 2) + 4 * (mc.num_hidden_layers + 1)
        if rows > MAX_SLOT_ROWS:
            raise BadInput(f"{mc.name}: {self.E} experts x {len(self.moe_layers)} MoE layers x {n_sh} weight shards "
                           f"of {cfg.tensors.weight_shard_mb:g} MiB make {rows} memory rows per micro-batch; at most "
                           f"{MAX_SLOT_ROWS} (a larger tensors.weight_shard_mb, or a smaller model)",
                           field="tensors.weight_shard_mb")
        self.slot_rows = rows
        # the routing draw of one micro-batch: tokens x experts per MoE layer (~0.4 us a cell to draw and tabulate)
        self.routing_cells = self.T * max(self.E, 1) * max(len(self.moe_layers), 1)
        self.shard_bytes = [min(shard, self.costs.expert_bytes - s * shard) for s in range(n_sh)]
        self._build_slots()

    # --- slots: the fixed list of possible events of one micro-batch ------------------------------------------
    def _build_slots(self) -> None:
        mc = self.mc
        ns = mc.moe.shared_width if mc.moe else 0
        rows: list[tuple[int, int, int]] = []  # (layer, op, expert)
        fc_slots: list[int] = []
        for li in range(mc.num_hidden_layers):
            rows.append((li, ATTN, -1))
            if mc.is_moe_layer(li):
                rows.append((li, ROUTER, -1))
                if ns:
                    rows.append((li, SHARED, -1))
                for e in range(self.E):
                    fc_slots.append(len(rows))
                    rows.append((li, FC, e))
            else:
                rows.append((li, DENSE, -1))
        rows.append((mc.num_hidden_layers, HEAD, -1))
        table = np.asarray(rows, dtype=np.int64)
        layer, op = table[:, 0], table[:, 1]
        self.slot_layer, self.slot_op, self.slot_expert = layer, op, table[:, 2]
        self.fc_slots = np.asarray(fc_slots, dtype=np.int64)
        lf = self.costs.layer_flops
        self.slot_flops = np.asarray([lf.get((li, o), 0.0) for li, o in zip(layer.tolist(), op.tolist(), strict=True)],
                                     dtype=np.float64)
        self.n_fixed_events = int(np.count_nonzero(self.slot_op != FC))
        self._build_memory_templates()

    def _build_memory_templates(self) -> None:
        """Per slot, the memory rows of its event: tensor id prefix (+ ``MB{m}`` when per micro-batch), access,
        static bytes, bytes per token, locality hint."""
        c = self.costs
        prefix: list[str] = []
        dyn: list[bool] = []
        access: list[str] = []
        b_static: list[int] = []
        b_tok: list[int] = []
        hint: list[str] = []
        start: list[int] = []
        count: list[int] = []

        def row(p: str, d: bool, a: str, bs: int, bt: int, h: str) -> None:
            prefix.append(p)
            dyn.append(d)
            access.append(a)
            b_static.append(bs)
            b_tok.append(bt)
            hint.append(h)

        for li, o, e in zip(self.slot_layer.tolist(), self.slot_op.tolist(), self.slot_expert.tolist(), strict=True):
            start.append(len(prefix))
            act = f"ACT_L{li}_MB"
            if o == ATTN:
                row(f"KV_L{li}_MB", True, "read", 0, c.kv_read[li], "kv")
                row(f"KV_L{li}_MB", True, "write", 0, c.kv_write[li], "kv")
            elif o in (ROUTER, HEAD):
                row(act, True, "read", 0, c.act_bytes, "act")
            elif o in (SHARED, DENSE):
                row(act, True, "read", 0, c.act_bytes, "act")
                row(act, True, "write", 0, c.act_bytes, "act")
            else:
                for s, nb in enumerate(self.shard_bytes):
                    row(weight_tensor_id(li, e, s), False, "read", nb, 0, f"shard{s}")
                row(act, True, "read", 0, c.act_bytes, "act")
                row(act, True, "write", 0, c.act_bytes, "act")
            count.append(len(prefix) - start[-1])
        self.tpl_dyn = np.asarray(dyn, dtype=bool)
        self.tpl_static = np.asarray(b_static, dtype=np.int64)
        self.tpl_tok = np.asarray(b_tok, dtype=np.int64)
        self.slot_mem_start = np.asarray(start, dtype=np.int64)
        self.slot_mem_count = np.asarray(count, dtype=np.int64)
        self.tpl_prefix_obj = _objects(prefix)
        self.tpl_access_obj = _objects(access)
        self.tpl_hint_obj = _objects(hint)
        self.tpl_csv_suffix = _objects([f",{p},{a},{bs},{h}\n" if not d else ""
                                        for p, d, a, bs, h in zip(prefix, dyn, access, b_static, hint, strict=True)])
        self.op_names_obj = _objects(list(OP_NAMES))
        self.tpl_expert_json = _objects(
            [f'"[""{expert_id(li, e)}""]"' if e >= 0 else "[]"
             for li, e in zip(self.slot_layer.tolist(), self.slot_expert.tolist(), strict=True)])

    def nonexpert_per_step(self) -> tuple[float, float]:
        """(FLOPs, DRAM bytes) of one micro-batch's non-expert events (attention with its KV reads and writes at
        the trace's context, router, shared/dense FFN, head): every slot but the routed experts', all ``T`` tokens
        (what `events` generates for them, micro-batch after micro-batch)."""
        ne = self.slot_op != FC
        flops = float(self.T * self.slot_flops[ne].sum())
        nbytes = 0
        for slot in np.flatnonzero(ne).tolist():
            a = int(self.slot_mem_start[slot])
            tpl = np.arange(a, a + int(self.slot_mem_count[slot]))
            nbytes += int((self.tpl_static[tpl] + self.tpl_tok[tpl] * self.T).sum())
        return flops, float(nbytes)

    # --- schedule ---------------------------------------------------------------------------------------------
    @cached_property
    def mb_t_ns(self) -> IntArray:
        """Arrival time of every micro-batch, ns (integers, so window membership is exact)."""
        t: IntArray = np.rint(np.arange(self.steps) * (self.cfg.sequence.step_interval_ms * 1e6)).astype(np.int64)
        return t

    def window_end(self, k: int, w_ns: int) -> int:
        """The first micro-batch arriving at or after the end of window k (windows of ``w_ns`` ns)."""
        return int(np.searchsorted(self.mb_t_ns, (k + 1) * w_ns, side="left"))

    def window_range(self, k: int, w_ns: int) -> tuple[int, int]:
        """Window k's micro-batches ``[a, b)``: those arriving in ``[k·w_ns, (k+1)·w_ns)`` (the first arrives at
        0). Looked up one window at a time, so a stream of windows holds nothing per window of the run."""
        return (self.window_end(k - 1, w_ns) if k > 0 else 0), self.window_end(k, w_ns)

    def window_count(self, window_ms: float) -> int:
        """Windows of ``window_ms`` the run is cut into (through the last arrival), checked."""
        if not window_ms > 0:
            raise BadInput("window_ms must be > 0", field="window_ms")
        w_ns = round(window_ms * 1e6)
        if w_ns < 1:
            raise BadInput("window_ms must be at least 1 ns", field="window_ms")
        n_windows = int(self.mb_t_ns[-1] // w_ns) + 1
        per_window = min(self.steps, int(w_ns // max(1, round(self.cfg.sequence.step_interval_ms * 1e6))) + 1)
        for what, each, most in (("event rows", self.slot_rows, MAX_WINDOW_ROWS),
                                 ("token-expert routing cells", self.routing_cells, MAX_WINDOW_CELLS)):
            if per_window * each > most:  # one window is built whole: its event table, its routing draws
                raise BadInput(f"window_ms {window_ms:g} holds up to {per_window} micro-batches of {each} {what} "
                               f"each: {per_window * each} in one window, at most {most} (a shorter window, "
                               "micro-batches further apart (sequence.step_interval_ms) or smaller ones "
                               "(sequence.micro_batch))",
                               field="window_ms" if per_window > 1 else "sequence.micro_batch")
        if n_windows > MAX_TRACE_WINDOWS:  # a run of that many windows: each one a request, a row, a state
            raise BadInput(f"window_ms {window_ms:g} cuts the {self.mb_t_ns[-1] / 1e6:g} ms run into {n_windows} "
                           f"windows; at most {MAX_TRACE_WINDOWS} (a longer window or a shorter run: "
                           "sequence.steps x sequence.step_interval_ms)", field="window_ms")
        return n_windows

    def routing_stream(self, tokens: int | None = None) -> RoutingStream | ReplayStream:
        """The run's expert choices: replayed from ``routing.trace`` when the config names one, else drawn.
        ``tokens``: micro-batches of that many tokens instead of ``sequence.micro_batch`` (statistics)."""
        r = self.cfg.routing
        T = self.T if tokens is None else tokens
        if self.recorded is not None:
            return ReplayStream(self.recorded, moe_layers=self.moe_layers, n_experts=self.E, topk=self.topk,
                                tokens=T)
        return RoutingStream(seed=r.seed, n_layers=len(self.moe_layers), n_experts=max(self.E, 1),
                             topk=max(self.topk, 1), tokens=T, zipf_s=r.zipf_s, locality=r.locality,
                             n_group=self.n_group, topk_group=self.topk_group)

    def events_per_mb(self, counts: IntArray) -> IntArray:
        """Number of compute events of each micro-batch given its expert counts (n_mb, n_moe, E)."""
        # explicit row width: reshape(n, -1) fails for a window with no micro-batch (n = 0)
        flat = counts.reshape(len(counts), int(np.prod(counts.shape[1:])))
        active: IntArray = np.count_nonzero(flat, axis=1).astype(np.int64)
        return self.n_fixed_events + active

    # --- events -----------------------------------------------------------------------------------------------
    def events(self, mb0: int, counts: IntArray, event0: int) -> EventBlock:
        """Events of micro-batches ``mb0 .. mb0+len(counts)-1`` given their expert counts; ids from ``event0``."""
        n = len(counts)
        S = len(self.slot_op)
        tok = np.full((n, S), self.T, dtype=np.int64)
        if len(self.fc_slots):
            tok[:, self.fc_slots] = counts.reshape(n, int(np.prod(counts.shape[1:])))
        mb_rel, slot = np.nonzero(tok > 0)
        tokens = tok[mb_rel, slot]
        mb = mb_rel.astype(np.int64) + mb0
        ev = event0 + np.arange(len(slot), dtype=np.int64)
        rep = self.slot_mem_count[slot]
        total = int(rep.sum())
        first = np.cumsum(rep) - rep
        within = np.arange(total, dtype=np.int64) - np.repeat(first, rep)
        tpl = np.repeat(self.slot_mem_start[slot], rep) + within
        m_tokens = np.repeat(tokens, rep)
        return EventBlock(
            c_event=ev, c_slot=slot.astype(np.int64), c_t=self.mb_t_ns[mb], c_mb=mb,
            c_layer=self.slot_layer[slot], c_op=self.slot_op[slot],
            c_expert=self.slot_expert[slot], c_tokens=tokens, c_flops=tokens * self.slot_flops[slot],
            m_event=np.repeat(ev, rep), m_tpl=tpl, m_mb=np.repeat(mb, rep),
            m_bytes=self.tpl_static[tpl] + self.tpl_tok[tpl] * m_tokens,
        )

    # --- wire and CSV -----------------------------------------------------------------------------------------
    def tensor_ids(self, block: EventBlock) -> list[str]:
        tid = self.tpl_prefix_obj[block.m_tpl]
        di = np.flatnonzero(self.tpl_dyn[block.m_tpl])
        if len(di):
            tid[di] = list(map(str.__add__, tid[di].tolist(), map(str, block.m_mb[di].tolist())))
        out: list[str] = tid.tolist()
        return out

    def to_window(self, trace_id: str, k: int, t0: int, t1: int, block: EventBlock) -> LogicalWindow:
        """The wire form (columnar; built without re-validating the lists, which are consistent by construction)."""
        compute, memory = self.to_rows(block)
        n_mb = len(np.unique(block.c_mb)) if block.n_compute else 0
        return LogicalWindow.model_construct(trace_id=trace_id, window=k, t0_ns=t0, t1_ns=t1, compute=compute,
                                             memory=memory, tokens_generated=n_mb * self.T)

    def to_rows(self, block: EventBlock) -> tuple[LogicalCompute, LogicalMemory]:
        """The events' wire columns (built without re-validating the lists, consistent by construction)."""
        compute = LogicalCompute.model_construct(
            event_id=block.c_event.tolist(), t_gen_ns=block.c_t.tolist(), mb_id=block.c_mb.tolist(),
            layer=block.c_layer.tolist(), op_type=self.op_names_obj[block.c_op].tolist(),
            expert=block.c_expert.tolist(), tokens=block.c_tokens.tolist(), flops=block.c_flops.tolist())
        memory = LogicalMemory.model_construct(
            event_id=block.m_event.tolist(), tensor_id=self.tensor_ids(block),
            access=self.tpl_access_obj[block.m_tpl].tolist(), bytes=block.m_bytes.astype(np.float64).tolist(),
            locality_hint=self.tpl_hint_obj[block.m_tpl].tolist())
        return compute, memory

    def compute_csv(self, block: EventBlock) -> str:
        """Rows of logical_compute.csv (seed §3.1): ``token_id`` is the micro-batch's first token (global index
        ``mb · micro_batch``); ``experts_json`` the expert instance ``["L{l}E{e}"]`` (``[]`` when the op is not bound
        to a routed expert), CSV-quoted; ``flops_json`` the event's FLOPs as a one-element JSON array."""
        rows = zip(block.c_event.tolist(), block.c_t.tolist(), block.c_mb.tolist(), (block.c_mb * self.T).tolist(),
                   self.tpl_expert_json[block.c_slot].tolist(), block.c_flops.tolist(),
                   self.op_names_obj[block.c_op].tolist(), strict=True)
        return "".join([f"{e},{t},{m},{tk},{ej},[{f!r}],{o}\n" for e, t, m, tk, ej, f, o in rows])

    def memory_csv(self, block: EventBlock) -> str:
        """Rows of logical_memory.csv: weight-shard rows come from a precomputed suffix, the rest are formatted."""
        tpl = block.m_tpl
        suffix = self.tpl_csv_suffix[tpl]
        di = np.flatnonzero(self.tpl_dyn[tpl])
        if len(di):
            dt = tpl[di]
            suffix[di] = [f",{p}{m},{a},{b},{h}\n" for p, m, a, b, h in zip(
                self.tpl_prefix_obj[dt].tolist(), block.m_mb[di].tolist(), self.tpl_access_obj[dt].tolist(),
                block.m_bytes[di].tolist(), self.tpl_hint_obj[dt].tolist(), strict=True)]
        return "".join(map(str.__add__, map(str, block.m_event.tolist()), suffix.tolist()))


def serving_window_count(offered: OfferedRequests, window_ms: float, drain_ms: float = 0.0) -> int:
    """Windows of ``window_ms`` covering a serving run: its arrivals ``[0, duration)`` and the ``drain_ms`` after
    them (``services.workload.serving``), checked."""
    if not window_ms > 0:
        raise BadInput("window_ms must be > 0", field="window_ms")
    w_ns = round(window_ms * 1e6)
    if w_ns < 1:
        raise BadInput("window_ms must be at least 1 ns", field="window_ms")
    n = max(1, -(-(offered.duration_ns + round(drain_ms * 1e6)) // w_ns))
    if n > MAX_TRACE_WINDOWS:
        raise BadInput(f"window_ms {window_ms:g} cuts the {offered.duration_ns / 1e6:g} ms serving run into {n} "
                       f"windows; at most {MAX_TRACE_WINDOWS} (a longer window or a shorter serving.duration_ms)",
                       field="window_ms")
    return n


def serving_window(offered: OfferedRequests, trace_id: str, k: int, w_ns: int) -> LogicalWindow:
    """Window ``k`` of a serving run: the requests arriving in ``[k·w_ns, (k+1)·w_ns)``, no events (the
    micro-batches are formed at run time)."""
    return LogicalWindow.model_construct(
        trace_id=trace_id, window=k, t0_ns=k * w_ns, t1_ns=(k + 1) * w_ns, compute=LogicalCompute.empty(),
        memory=LogicalMemory.empty(), tokens_generated=0,
        requests=requests_between(offered, k * w_ns, (k + 1) * w_ns))


def make_plan(cfg: WorkloadConfig, sources: WorkloadSources | None = None) -> TracePlan:
    """The trace plan of ``cfg``, its model and recorded routing looked up in ``sources`` (default: the shipped
    models and samples)."""
    return TracePlan(cfg, sources or WorkloadSources.packaged())


def iter_blocks(plan: TracePlan, window_ms: float) -> Iterator[tuple[int, int, int, EventBlock]]:
    """(window k, t0_ns, t1_ns, events) for every window, generating routing one window at a time (memory of a
    window, not of the run: the window's micro-batches are looked up as it comes)."""
    n_windows = plan.window_count(window_ms)
    w_ns = round(window_ms * 1e6)
    stream = plan.routing_stream()
    event0 = 0
    for k in range(n_windows):
        a, b = plan.window_range(k, w_ns)
        counts = expert_counts(stream.take(b - a), max(plan.E, 1))
        block = plan.events(a, counts, event0)
        event0 += block.n_compute
        yield k, k * w_ns, (k + 1) * w_ns, block


def iter_windows(cfg: WorkloadConfig, window_ms: float = DEFAULT_WINDOW_MS, *, trace_id: str | None = None,
                 sources: WorkloadSources | None = None) -> Iterator[LogicalWindow]:
    """Streaming form: one ``LogicalWindow`` at a time; memory proportional to a window, not to the run."""
    plan = make_plan(cfg, sources)
    tid = trace_id or trace_id_of(cfg, window_ms, plan.sources)
    if cfg.serving is not None:  # requests, no events (services.workload.serving)
        offered = offered_requests(cfg.serving, plan.sources.arrivals.load(cfg.serving.trace))
        w_ns = round(window_ms * 1e6)
        for k in range(serving_window_count(offered, window_ms, cfg.serving.drain_ms)):
            yield serving_window(offered, tid, k, w_ns)
        return
    for k, t0, t1, block in iter_blocks(plan, window_ms):
        yield plan.to_window(tid, k, t0, t1, block)


def generate_logical_traces(cfg: WorkloadConfig, out_dir: str | Path, *, window_ms: float = DEFAULT_WINDOW_MS,
                            sources: WorkloadSources | None = None) -> tuple[str, str]:
    """Write ``logical_compute.csv`` and ``logical_memory.csv`` under ``out_dir`` window by window (appended, never
    one in-memory frame). Returns their paths. Byte-identical for the same config (the seed is in the config);
    the window size only changes how the files are chunked, not their content."""
    if cfg.serving is not None:
        raise BadInput("serving: a serving workload has no fixed micro-batches to write (a scheduler forms them at "
                       "run time); its windows carry the offered requests (iter_windows, GET /v1/traces/{id}/windows)",
                       field="serving")
    plan = make_plan(cfg, sources)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cpath, mpath = out / COMPUTE_CSV, out / MEMORY_CSV
    with cpath.open("w", encoding="utf-8", newline="") as fc, mpath.open("w", encoding="utf-8", newline="") as fm:
        fc.write(COMPUTE_HEADER)
        fm.write(MEMORY_HEADER)
        for _, _, _, block in iter_blocks(plan, window_ms):
            fc.write(plan.compute_csv(block))
            fm.write(plan.memory_csv(block))
    return str(cpath), str(mpath)


def route_counts(plan: TracePlan) -> IntArray:
    """Expert counts of the whole run, (steps, n_moe, E), in the smallest integer dtype that holds them."""
    stream = plan.routing_stream()
    L, E = len(plan.moe_layers), max(plan.E, 1)
    dtype = np.int16 if plan.T < 2**15 else np.int32
    out = np.zeros((plan.steps, L, E), dtype=dtype)
    step = max(1, MAX_DRAWS_PER_CHUNK // max(1, L * plan.T * (1 + E)))  # bounded memory per chunk
    for a in range(0, plan.steps, step):
        b = min(plan.steps, a + step)
        out[a:b] = expert_counts(stream.take(b - a), E)
    return out


STATS_DRAWS = 1 << 22  # doubles a routing summary may draw (tokens x MoE layers x (experts + 1))


def routing_summary(plan: TracePlan) -> RoutingStats | None:
    """Per-layer load skew and temporal locality of the run's routing (drawn or replayed), measured over its first
    tokens within a budget of 2²² draws (``layers·(E+1)`` per token; a fresh stream: the trace's own choices)."""
    L, E = len(plan.moe_layers), plan.E
    if not L or not E:
        return None
    # a micro-batch too big for the budget is measured on its first T' slots (a stream of T'-token micro-batches:
    # the same routing law, the same trace tokens in order when replaying)
    T = min(plan.T, max(1, STATS_DRAWS // (L * (E + 1))))
    n_mb = min(plan.steps, max(1, STATS_DRAWS // (L * (E + 1) * T)))
    stream = plan.routing_stream(tokens=T)
    picks = stream.take(n_mb)  # (n_mb, L, T, k)
    flat = np.ascontiguousarray(picks.transpose(0, 2, 1, 3)).reshape(n_mb * T, L, picks.shape[-1])
    nxt = routing_stats(flat, E, lag=1)
    seq = routing_stats(flat, E, lag=T)
    return RoutingStats(layers=list(plan.moe_layers), skew=nxt["skew"], cv=nxt["cv"], reuse_next=nxt["reuse"],
                        reuse_sequence=seq["reuse"], tokens=n_mb * T)


def expert_load_from_counts(plan: TracePlan, counts: IntArray) -> tuple[list[int], FloatArray]:
    """(MoE layer indices, (n_moe, E) share of the layer's token→expert assignments per expert; rows sum to 1)."""
    total = counts.sum(axis=0, dtype=np.int64).astype(np.float64)
    denom = float(plan.steps * plan.T * max(plan.topk, 1))
    return list(plan.moe_layers), (total / denom if len(plan.moe_layers) else total[:, :plan.E])


def expected_expert_load(plan: TracePlan) -> tuple[list[int], FloatArray]:
    """(MoE layer indices, (n_moe, E) expected shares) without generating the routing: the Zipf law's
    ``∝ (r+1)^-zipf_s`` over each layer's seeded permutation, or a replayed file's shares over the whole file."""
    stream = plan.routing_stream()
    if not plan.E:
        return list(plan.moe_layers), np.zeros((len(plan.moe_layers), 0))
    if isinstance(stream, RoutingStream):
        s = plan.cfg.routing.zipf_s
        rows = np.asarray([zipf_probabilities(plan.E, s, perm) for perm in stream.perms], dtype=np.float64)
        return list(plan.moe_layers), rows.reshape(len(plan.moe_layers), plan.E)
    return list(plan.moe_layers), stream.probabilities()


def expert_load(cfg: WorkloadConfig, sources: WorkloadSources | None = None) -> tuple[list[int], FloatArray]:
    """Per (MoE layer, expert) token share of the whole trace: exactly the routing the trace contains."""
    plan = make_plan(cfg, sources)
    return expert_load_from_counts(plan, route_counts(plan))


def trace_id_of(cfg: WorkloadConfig, window_ms: float, sources: WorkloadSources | None = None) -> str:
    """Content hash of the workload config and the window size (and of the replayed file, found in ``sources``)."""
    import hashlib

    text = cfg.canonical_json() + f"|window_ms={float(window_ms)!r}"
    if cfg.routing.trace is not None:  # the replayed file's content, not only its name
        text += f"|routing_trace={(sources or WorkloadSources.packaged()).recorded.sha256(cfg.routing.trace)}"
    if cfg.serving is not None:  # likewise the arrival trace's
        text += f"|serving_trace={(sources or WorkloadSources.packaged()).arrivals.load(cfg.serving.trace).sha256}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
