"""The workload service's plain functions (what the endpoints call) and its trace LRU.

Stateless: a trace is identified by the content hash of its workload config and window size; the LRU keeps the config
and, once computed, the routing counts (steps x MoE layers x experts) and the event-id offsets, all rebuildable from
the config (a serving trace: its offered requests, ``services.workload.serving``). A trace id that fell out of the LRU
answers 404 ``unknown_trace``: the caller re-POSTs the config.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from services.workload.ir import ModelConfig, TransformerModel, build_ir
from services.workload.ir.hf_config import from_hf_config
from services.workload.routing import IntArray
from services.workload.serving import ServingPlan
from services.workload.sources import WorkloadSources
from services.workload.traces import (
    FC,
    TracePlan,
    expected_expert_load,
    expert_load_from_counts,
    make_plan,
    route_counts,
    routing_summary,
    trace_id_of,
)
from services.workload.zoo import normalize_name, read_config_file
from shared.configs import WorkloadConfig
from shared.contracts.workload import (
    MAX_WINDOWS_PER_CALL,
    ExpertLoad,
    LogicalWindow,
    MicroBatchRows,
    MicroBatchSpec,
    RoutingStats,
    TraceSummary,
)
from shared.errors import BadInput, NotFound, TasmoeError
from shared.lru import LRU
from shared.slo import drain_to_judge_ms

Phase = Literal["prefill", "decode"]


# --- models and IR ------------------------------------------------------------------------------------------------
def model_summary(sources: WorkloadSources, mc: ModelConfig) -> dict[str, Any]:
    ir = build_ir(mc, phase="decode", batch=1, seq_len=1)
    moe = mc.moe
    mixers: dict[str, int] = {}
    for m in mc.layer_mixers:
        mixers[m] = mixers.get(m, 0) + 1
    sha = sources.zoo.model_hash(mc.name)
    return {
        "name": mc.name, "family": mc.family, "attention": mc.attention_kind,
        "num_layers": mc.num_hidden_layers, "hidden_size": mc.hidden_size,
        "num_routed_experts": moe.num_routed_experts if moe else 0,
        "num_activated_experts": moe.num_activated_experts if moe else 0,
        "num_shared_experts": moe.num_shared_experts if moe else 0,
        "moe_layers": mc.moe_layers, "mixers": mixers,
        "params_total": ir.params_total, "params_active": ir.params_active,
        "registered": sha is not None, "sha256": sha,
    }


def list_models(sources: WorkloadSources) -> list[dict[str, Any]]:
    zoo = sources.zoo
    return [model_summary(sources, zoo.get_model_config(n)) for n in zoo.known_models()]


def register(sources: WorkloadSources, name: str, config: dict[str, Any] | str, *,
             generic: bool = False) -> tuple[dict[str, Any], bool]:
    """Register (persist) a config.json under ``name``: (summary, created). Same content again: not created."""
    raw = read_config_file(config) if isinstance(config, str) else config
    created = normalize_name(name) not in sources.zoo.registered_models()
    mc = sources.zoo.register_model(name, raw, generic=generic)
    return model_summary(sources, mc), created


def describe_model(sources: WorkloadSources, name: str) -> dict[str, Any]:
    mc = sources.zoo.get_model_config(name)
    return {**model_summary(sources, mc), "config": mc.model_dump(mode="json")}


def ir_report(sources: WorkloadSources, *, model: str, phase: Phase = "decode", batch: int = 1, seq_len: int = 2048,
              config: dict[str, Any] | None = None, generic: bool = False) -> dict[str, Any]:
    """The WorkloadIR summary of one forward pass: parameters, FLOPs and bytes per token, per-layer rows and the
    per-expert FLOPs per token placement needs. ``config``: an inline HuggingFace ``config.json`` instead of a zoo
    model (named ``model``)."""
    mc = (from_hf_config(config, name=model, generic=generic) if config is not None
          else sources.zoo.get_model_config(model))
    ir = build_ir(mc, phase=phase, batch=batch, seq_len=seq_len)
    return ir_to_dict(ir)


def ir_to_dict(ir: TransformerModel) -> dict[str, Any]:
    T = ir.shape.tokens
    bd = ir.get_ops_breakdown()
    fp = ir.get_memory_footprint()
    layers = []
    total_rw = 0
    for la in ir.layers:
        c, m = la.compute, la.memory
        total_rw += m.read_bytes + m.write_bytes
        layers.append({
            "name": la.name, "layer": la.index, "op_type": la.op_type, "n_ops": len(la.ops),
            "cube_ops": c.cube_ops, "vector_ops": c.vector_ops, "flops": c.total,
            "weight_bytes": m.weight_bytes, "activation_bytes": m.activation_bytes,
            "read_bytes": m.read_bytes, "write_bytes": m.write_bytes,
            "params_total": la.params_total, "params_active": la.params_active,
            "comm": None if la.comm is None else {"pattern": la.comm.pattern, "tensor_bytes": la.comm.tensor_bytes,
                                                  "participants": la.comm.participants, "scope": la.comm.scope},
        })
    mc = ir.config
    expert = sum(op.compute.total for la in ir.layers if la.op_type == "moe" for op in la.ops
                 if op.attrs.get("role") == "expert")
    k = mc.moe.num_activated_experts if mc.moe else 0
    n_moe = len(mc.moe_layers)
    meta = ir.metadata
    return {
        "model": mc.name, "phase": meta.phase, "batch": meta.batch, "seq_len": meta.seq_len, "tokens": T,
        "attention": meta.attention,
        "params_total": ir.params_total, "params_active": ir.params_active,
        "flops_per_token": bd.total / T, "matmul_flops_per_token": bd.cube_ops / T,
        "vector_ops_per_token": bd.vector_ops / T, "bytes_per_token": total_rw / T,
        "weight_bytes": fp.weight_bytes, "active_weight_bytes": fp.active_weight_bytes,
        "kv_cache_bytes": fp.kv_cache_bytes, "kv_bytes_per_token_layer": mc.kv_bytes_per_token_layer(),
        "mixers": list(mc.layer_mixers), "mlps": list(mc.layer_mlps),
        "moe_layers": mc.moe_layers, "num_routed_experts": meta.num_routed_experts, "topk": k,
        # FLOPs one token costs one activated routed expert in one MoE layer (placement's heat per token)
        "expert_flops_per_token": expert / (T * k * n_moe) if n_moe else 0.0,
        "expert_bytes": mc.expert_bytes,
        "ops_by_type": bd.by_op_type, "layers": layers,
    }


# --- traces -------------------------------------------------------------------------------------------------------
@dataclass
class TraceEntry:
    trace_id: str
    cfg: WorkloadConfig
    window_ms: float
    plan: TracePlan
    counts: IntArray | None = None  # (steps, n_moe, E) routing counts, computed on first use
    mb_event0: IntArray | None = None  # id of the first event of each micro-batch
    stats: RoutingStats | None = None  # routing skew and locality, computed on first use
    serving: ServingPlan | None = None  # the offered requests and micro-batch rows of a serving workload
    lock: threading.Lock = field(default_factory=threading.Lock)

    def window_count(self, window_ms: float) -> int:
        """Windows of ``window_ms`` in the trace (checked): through the last arrival, or the serving run's length."""
        return self.serving.window_count(window_ms) if self.serving is not None else self.plan.window_count(window_ms)

    def routing_stats(self) -> RoutingStats | None:
        """The routing's per-layer skew and locality (computed once per entry)."""
        with self.lock:
            if self.stats is None and self.plan.E:
                self.stats = routing_summary(self.plan)
            return self.stats

    def ensure_routing(self) -> tuple[IntArray, IntArray]:
        with self.lock:
            if self.counts is None or self.mb_event0 is None:
                counts = route_counts(self.plan)
                per_mb = self.plan.events_per_mb(counts)
                self.mb_event0 = np.concatenate([[0], np.cumsum(per_mb)]).astype(np.int64)
                self.counts = counts
            return self.counts, self.mb_event0


class TraceCache:
    """LRU of trace entries by id (thread-safe: sync endpoints run in a thread pool)."""

    def __init__(self, capacity: int = 32) -> None:
        self._items: LRU[str, TraceEntry] = LRU(capacity)

    def put(self, entry: TraceEntry) -> TraceEntry:
        """The entry kept under its id: the first one (its routing may be computed already), else ``entry``."""
        return self._items.keep(entry.trace_id, entry)

    def find(self, trace_id: str) -> TraceEntry | None:
        """The entry kept under ``trace_id``, or None."""
        return self._items.get(trace_id)

    def get(self, trace_id: str) -> TraceEntry:
        entry = self._items.get(trace_id)
        if entry is None:
            raise NotFound(f"unknown trace {trace_id!r} (not in this replica's cache): POST /v1/traces again",
                           field="trace_id", code="unknown_trace")
        return entry

    def __len__(self) -> int:
        return len(self._items)


def _prefixed(exc: TasmoeError, prefix: str) -> TasmoeError:
    if exc.field and not exc.field.startswith(prefix):
        exc.field = f"{prefix}{exc.field}"
    return exc


def create_trace(cache: TraceCache, sources: WorkloadSources, cfg: WorkloadConfig,
                 window_ms: float) -> TraceSummary:
    """Validate the workload against its model, cache it, return the summary (routing is computed lazily); the
    model and a replayed routing file are found in ``sources`` (the app's). A trace already kept under its id (a
    content hash: the config, the window and the files it reads) is answered from the cache, unbuilt: the cache keeps
    the first entry of an id anyway, so a second build would be thrown away."""
    try:
        tid = trace_id_of(cfg, window_ms, sources)
        kept = cache.find(tid)
        if kept is not None:
            return trace_summary(kept)
        plan = make_plan(cfg, sources)
        serving = ServingPlan(plan) if cfg.serving is not None else None
        entry = TraceEntry(trace_id=tid, cfg=cfg, window_ms=float(window_ms), plan=plan, serving=serving)
        entry.window_count(window_ms)
    except TasmoeError as exc:
        if exc.field and exc.field != "window_ms":
            raise _prefixed(exc, "workload.") from None
        raise
    return trace_summary(cache.put(entry))


def trace_summary(entry: TraceEntry) -> TraceSummary:
    plan = entry.plan
    n_windows = entry.window_count(entry.window_ms)
    common = dict(
        trace_id=entry.trace_id, model=plan.mc.name, window_ms=entry.window_ms, n_windows=n_windows,
        n_layers=plan.mc.num_hidden_layers, n_experts=plan.E, topk=plan.topk, moe_layers=list(plan.moe_layers),
        flops_per_token_expert=float(plan.costs.flops[FC]) if plan.E else 0.0,
        expert_bytes=plan.costs.expert_bytes, shard_bytes=list(plan.shard_bytes),
        t_end_ns=n_windows * round(entry.window_ms * 1e6),
        routing_source=f"trace:{entry.cfg.routing.trace}" if entry.cfg.routing.trace else "zipf",
        routing_stats=entry.routing_stats())
    if entry.serving is not None:  # no fixed micro-batches: the offered requests instead
        off = entry.serving.offered
        prompt, output = int(off.prompt_tokens.sum()), int(off.output_tokens.sum())
        return TraceSummary.model_validate({
            **common, "steps": 0, "micro_batch": 0, "tokens_total": output, "serving": True,
            "n_requests": off.n, "offered_prompt_tokens": prompt, "offered_output_tokens": output,
            "offered_rate_rps": off.offered_rate_rps, "rate_factor": off.rate_factor,
            "drain_to_judge_ms": drain_to_judge_ms(off.t_arrival_ns, off.output_tokens, off.duration_ns,
                                                   slo_ttft_ms=entry.serving.sv.slo.ttft_p99_ms,
                                                   slo_tpot_ms=entry.serving.sv.slo.tpot_p99_ms),
            "mb_event_stride": entry.serving.stride})
    ne_flops, ne_bytes = plan.nonexpert_per_step()
    return TraceSummary.model_validate({
        **common, "steps": plan.steps, "micro_batch": plan.T, "tokens_total": plan.steps * plan.T,
        "nonexpert_flops_per_step": ne_flops, "nonexpert_bytes_per_step": ne_bytes})


def _in_range(entry: TraceEntry, k: int, window_ms: float | None, field: str) -> tuple[float, int]:
    """(window ms, windows of the trace): ``window_ms``, or the trace's; window ``k`` one of them, else ``NotFound``
    naming ``field``."""
    wm = entry.window_ms if window_ms is None else window_ms
    n_windows = entry.window_count(wm)
    if not 0 <= k < n_windows:
        raise NotFound(f"window {k} out of range: the trace has {n_windows} windows of {wm} ms", field=field,
                       code="unknown_window")
    return wm, n_windows


def get_window(entry: TraceEntry, k: int, window_ms: float | None = None) -> LogicalWindow:
    """Window ``k`` of the trace (``window_ms`` defaults to the trace's), with its global event ids."""
    wm, _ = _in_range(entry, k, window_ms, "k")
    w_ns = round(wm * 1e6)
    if entry.serving is not None:
        return entry.serving.window(entry.trace_id, k, w_ns)
    counts, mb_event0 = entry.ensure_routing()
    a, b = entry.plan.window_range(k, w_ns)
    block = entry.plan.events(a, counts[a:b].astype(np.int64), int(mb_event0[a]))
    return entry.plan.to_window(entry.trace_id, k, k * w_ns, (k + 1) * w_ns, block)


def get_windows(entry: TraceEntry, start: int, count: int, window_ms: float | None = None) -> list[LogicalWindow]:
    """Windows ``start`` .. ``start + count - 1`` of the trace (fewer where the trace ends first), each as
    `get_window` gives it. ``start`` past the last window is ``NotFound`` (field ``start``)."""
    wm, n_windows = _in_range(entry, start, window_ms, "start")
    if not 1 <= count <= MAX_WINDOWS_PER_CALL:
        raise BadInput(f"count: between 1 and {MAX_WINDOWS_PER_CALL} windows, got {count}", field="count")
    return [get_window(entry, k, wm) for k in range(start, min(n_windows, start + count))]


def get_expert_load(entry: TraceEntry, *, expected: bool = False) -> ExpertLoad:
    """Per (MoE layer, expert) share of the token→expert assignments: the trace's own (routing drawn or replayed
    for every micro-batch), or ``expected`` (no routing generated: the Zipf law's shares over the trace's seeded
    per-layer permutations, or a replayed file's shares over the whole file)."""
    if expected:
        layers, load = expected_expert_load(entry.plan)
        return ExpertLoad(trace_id=entry.trace_id, layers=layers, load=load.tolist())
    if entry.serving is not None:
        raise BadInput("a serving trace's micro-batches are formed at run time, so its tokens are not known in "
                       "advance: ask for the routing law's shares (expected=true)", field="expected")
    counts, _ = entry.ensure_routing()
    layers, load = expert_load_from_counts(entry.plan, counts)
    return ExpertLoad(trace_id=entry.trace_id, layers=layers, load=load.tolist())


def microbatch_rows(entry: TraceEntry, batches: list[MicroBatchSpec]) -> MicroBatchRows:
    """The logical events of micro-batches a serving scheduler formed (``services.workload.serving``); a
    fixed-arrival trace has none to give (its micro-batches are its windows')."""
    if entry.serving is None:
        raise BadInput(f"trace {entry.trace_id} has fixed arrivals (no serving section): its micro-batches are in "
                       "its windows", field="trace_id", code="not_serving")
    return entry.serving.rows(batches)
