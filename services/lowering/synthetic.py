"""A small, deterministic Mixtral-like logical window and default placement, for tests and benchmarks.

Used only when the workload service's traces are not at hand. Shapes are Mixtral-8x7B's (hidden 4096, FFN 14336,
32 layers, 8 experts, top-2, GQA 32/8 heads of 128); routing is a seeded Zipf draw. FLOPs: ``2·M·N·K`` per GEMM.
"""

from __future__ import annotations

import numpy as np

from shared.configs.arch import ArchConfig
from shared.contracts.ids import expert_id
from shared.contracts.placement import ExpertPlacement, Placement
from shared.contracts.workload import LogicalCompute, LogicalMemory, LogicalWindow

HIDDEN, FFN, N_LAYERS, N_EXPERTS, TOPK = 4096, 14336, 32, 8, 2
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
SHARD_BYTES = 64 * 2**20
BYTES = 2  # bf16


def default_placement(arch: ArchConfig, n_layers: int = N_LAYERS, n_experts: int = N_EXPERTS) -> Placement:
    """ARCHITECTURE §5.2 baseline: expert instances in index order, round-robin over cores (row-major)."""
    n = arch.mesh.n_cores
    experts = {expert_id(lv, e): ExpertPlacement(cores=[(lv * n_experts + e) % n])
               for lv in range(n_layers) for e in range(n_experts)}
    return Placement(experts=experts)


def synthetic_window(window: int = 0, *, window_ms: float = 3.0, step_ms: float = 1.0, micro_batch: int = 32,
                     context: int = 2048, n_layers: int = N_LAYERS, seed: int = 42, zipf_s: float = 1.2,
                     layer_gap_ns: int = 20_000) -> LogicalWindow:
    rng = np.random.default_rng(seed + 7919 * window)
    t0 = int(window * window_ms * 1e6)
    t1 = int((window + 1) * window_ms * 1e6)
    n_mb = max(1, round(window_ms / step_ms))
    pop = 1.0 / np.arange(1, N_EXPERTS + 1) ** zipf_s
    pop /= pop.sum()
    attn_w = HIDDEN * (2 * HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM) * BYTES
    kv_tok = 2 * KV_HEADS * HEAD_DIM * BYTES
    exp_w = 3 * HIDDEN * FFN * BYTES
    n_shards = int(np.ceil(exp_w / SHARD_BYTES))
    c: dict[str, list[object]] = {k: [] for k in LogicalCompute.model_fields}
    m: dict[str, list[object]] = {k: [] for k in LogicalMemory.model_fields}
    eid = window * 1_000_000

    def add(t: int, mb: int, lv: int, op: str, e: int, tok: int, fl: float) -> int:
        nonlocal eid
        eid += 1
        for k, v in zip(("event_id", "t_gen_ns", "mb_id", "layer", "op_type", "expert", "tokens", "flops"),
                        (eid, t, mb, lv, op, e, tok, fl), strict=True):
            c[k].append(v)
        return eid

    def mem(ev: int, tid: str, acc: str, nbytes: float, hint: str) -> None:
        for k, v in zip(("event_id", "tensor_id", "access", "bytes", "locality_hint"),
                        (ev, tid, acc, nbytes, hint), strict=True):
            m[k].append(v)

    for j in range(n_mb):
        mb = window * n_mb + j
        t_mb = t0 + int(j * step_ms * 1e6)
        perm = rng.permutation(N_EXPERTS)
        for lv in range(n_layers):
            t = t_mb + lv * layer_gap_ns
            T = micro_batch
            fl_attn = 2.0 * T * HIDDEN * (2 * HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM) \
                + 4.0 * T * context * HEADS * HEAD_DIM
            ev = add(t, mb, lv, "attn", -1, T, fl_attn)
            mem(ev, f"W_L{lv}ATTN_0", "read", attn_w, "shard0")
            mem(ev, f"KV_L{lv}_MB{mb}", "read", float(T * context * kv_tok), "kv")
            mem(ev, f"KV_L{lv}_MB{mb}", "write", float(T * kv_tok), "kv")
            mem(ev, f"ACT_L{lv}_MB{mb}", "write", float(T * HIDDEN * BYTES), "act")
            ev = add(t, mb, lv, "router", -1, T, 2.0 * T * HIDDEN * N_EXPERTS)
            mem(ev, f"W_L{lv}R_0", "read", float(HIDDEN * N_EXPERTS * BYTES), "shard0")
            choice = np.array([rng.choice(N_EXPERTS, size=TOPK, replace=False, p=pop) for _ in range(T)])
            counts = np.bincount(perm[choice.ravel()], minlength=N_EXPERTS)
            for e in np.flatnonzero(counts).tolist():
                tok = int(counts[e])
                ev = add(t, mb, lv, "fc", e, tok, 2.0 * tok * 3 * HIDDEN * FFN)
                for s in range(n_shards):
                    mem(ev, f"W_L{lv}E{e}_{s}", "read", float(min(SHARD_BYTES, exp_w - s * SHARD_BYTES)),
                        f"shard{s}")
                mem(ev, f"ACT_L{lv}_MB{mb}", "read", float(tok * HIDDEN * BYTES), "act")
    return LogicalWindow(trace_id="synthetic", window=window, t0_ns=t0, t1_ns=t1,
                         compute=LogicalCompute.model_validate(c), memory=LogicalMemory.model_validate(m),
                         tokens_generated=n_mb * micro_batch)
