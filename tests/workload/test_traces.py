"""Logical traces: determinism, window streaming, routing statistics, event bookkeeping, CSV schema."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.workload.ir import build_ir
from services.workload.routing import RoutingStream, expert_counts, zipf_log_inverse, zipf_probabilities
from services.workload.traces import (
    COMPUTE_HEADER,
    MEMORY_HEADER,
    expert_load,
    generate_logical_traces,
    iter_windows,
    make_plan,
    route_counts,
)
from services.workload.zoo import ModelZoo
from shared.configs import WorkloadConfig, load_workload
from shared.contracts.ids import parse_expert_id
from shared.errors import BadInput, NotFound

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def small(model: str = "mixtral-8x7b", **over: Any) -> WorkloadConfig:
    data: dict[str, Any] = {"model": model, "routing": {"topk": 2, "seed": 7, "zipf_s": 1.2},
                            "sequence": {"tokens": 256, "micro_batch": 8, "steps": 12, "step_interval_ms": 1.0}}
    for k, v in over.items():
        if isinstance(v, dict):
            data[k] = {**data.get(k, {}), **v}
        else:
            data[k] = v
    return WorkloadConfig.model_validate(data)


def test_trace_determinism(tmp_path: Path) -> None:
    cfg = small(routing={"locality": 0.3})
    a = generate_logical_traces(cfg, tmp_path / "a")
    b = generate_logical_traces(cfg, tmp_path / "b", window_ms=5.0)  # chunking does not change the content
    for pa, pb in zip(a, b, strict=True):
        assert Path(pa).read_bytes() == Path(pb).read_bytes()
    c = generate_logical_traces(small(routing={"locality": 0.3, "seed": 8}), tmp_path / "c")
    assert Path(a[0]).read_bytes() != Path(c[0]).read_bytes()


def test_csv_columns_are_the_seed_schema(tmp_path: Path) -> None:
    cpath, mpath = generate_logical_traces(small(), tmp_path)
    assert Path(cpath).name == "logical_compute.csv" and Path(mpath).name == "logical_memory.csv"
    with open(cpath, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COMPUTE_HEADER.strip().split(",") == [
        "event_id", "t_gen_ns", "mb_id", "token_id", "experts_json", "flops_json", "op_type"]
    with open(mpath, newline="") as f:
        mrows = list(csv.DictReader(f))
    assert list(mrows[0]) == MEMORY_HEADER.strip().split(",") == [
        "event_id", "tensor_id", "access", "bytes", "locality_hint"]
    fc = [r for r in rows if r["op_type"] == "fc"]
    assert fc and all(len(json.loads(r["experts_json"])) == 1 for r in fc)
    assert all(parse_expert_id(json.loads(r["experts_json"])[0]) for r in fc)
    assert all(json.loads(r["experts_json"]) == [] for r in rows if r["op_type"] != "fc")
    assert all(float(json.loads(r["flops_json"])[0]) > 0 for r in rows)
    assert [int(r["event_id"]) for r in rows] == list(range(len(rows)))
    ids = {int(r["event_id"]) for r in rows}
    assert {int(r["event_id"]) for r in mrows} <= ids
    assert {r["access"] for r in mrows} == {"read", "write"}
    assert all(int(r["token_id"]) == int(r["mb_id"]) * 8 for r in rows)


def test_windows_match_the_csv_and_stream(tmp_path: Path) -> None:
    cfg = small(sequence={"step_interval_ms": 0.7})
    cpath, mpath = generate_logical_traces(cfg, tmp_path)
    windows = list(iter_windows(cfg, 2.0))
    with open(cpath, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(mpath, newline="") as f:
        mrows = list(csv.DictReader(f))
    assert sum(len(w.compute) for w in windows) == len(rows)
    assert sum(len(w.memory) for w in windows) == len(mrows)
    ev = [e for w in windows for e in w.compute.event_id]
    assert ev == list(range(len(rows)))
    for w in windows:
        assert all(w.t0_ns <= t < w.t1_ns for t in w.compute.t_gen_ns)
        assert w.t1_ns - w.t0_ns == 2_000_000
    # micro-batch m arrives at m * 0.7 ms
    assert {int(r["mb_id"]): int(r["t_gen_ns"]) for r in rows}[11] == 7_700_000
    assert sum(w.tokens_generated for w in windows) == 12 * 8
    flat = [(w.memory.tensor_id[i], w.memory.bytes[i]) for w in windows for i in range(len(w.memory))]
    assert flat == [(r["tensor_id"], float(r["bytes"])) for r in mrows]


def test_events_follow_the_ir_and_routing() -> None:
    cfg = small()
    mc = ModelZoo().get_model_config("mixtral-8x7b")
    ir = build_ir(mc, phase="decode", batch=8, seq_len=256)
    attn_pt = sum(op.compute.total for op in ir.layers[1].ops) / 8  # layers.0.attn, context included
    (w,) = list(iter_windows(cfg, 100.0))
    c = w.compute
    ops = np.asarray(c.op_type)
    tokens, flops, mb, layer = (np.asarray(x) for x in (c.tokens, c.flops, c.mb_id, c.layer))
    fc = ops == "fc"
    # every token is routed to top-k experts at each of the 32 MoE layers
    assert tokens[fc].sum() == 12 * 32 * 8 * 2
    for m in range(12):
        assert tokens[fc & (mb == m) & (layer == 5)].sum() == 16
    expert_pt = 2 * 3 * 4096 * 14336 + 5 * 14336 + 2 * 4096  # SwiGLU GEMMs, SiLU·mul, combine's weighted add
    np.testing.assert_allclose(flops[fc], tokens[fc] * expert_pt)
    np.testing.assert_allclose(flops[ops == "attn"], 8 * attn_pt)
    assert set(ops.tolist()) == {"attn", "router", "fc", "head"}
    assert (np.asarray(c.layer)[ops == "head"] == 32).all()
    # memory: 6 shards of a 336 MiB expert (5 x 64 MiB + 16 MiB), KV read of the context
    mem = w.memory
    tid = np.asarray(mem.tensor_id)
    mem_ev = np.asarray(mem.event_id)
    first_fc = int(np.asarray(c.event_id)[fc][0])
    shards = [t for t, e in zip(tid, mem_ev, strict=True) if e == first_fc and t.startswith("W_")]
    assert len(shards) == 6
    sbytes = [b for t, e, b in zip(tid, mem_ev, mem.bytes, strict=True) if e == first_fc and t.startswith("W_")]
    assert sbytes == [64 * 2**20] * 5 + [16 * 2**20]
    kv_read = [b for t, a, b in zip(tid, mem.access, mem.bytes, strict=True) if t == "KV_L0_MB0" and a == "read"]
    assert kv_read == [8 * 256 * (2 * 8 * 128 * 2)]


def test_operator_overrides_from_the_config() -> None:
    data = load_workload(CONFIGS / "workload_mixtral_8x7b.yaml").model_dump()
    data["sequence"]["steps"] = 3
    data["operators"] = {"fc": {"flop_per_token": 2.5e9},
                         "attn": {"flop_per_token": 1.0e9, "kv_bytes_per_token": 4096}}  # the seed's values
    cfg = WorkloadConfig.model_validate(data)
    w = next(iter_windows(cfg, 3.0))
    ops = np.asarray(w.compute.op_type)
    np.testing.assert_allclose(np.asarray(w.compute.flops)[ops == "fc"],
                               np.asarray(w.compute.tokens)[ops == "fc"] * 2.5e9)
    np.testing.assert_allclose(np.asarray(w.compute.flops)[ops == "attn"], 32 * 1.0e9)
    kv_write = [b for t, a, b in zip(w.memory.tensor_id, w.memory.access, w.memory.bytes, strict=True)
                if t == "KV_L0_MB0" and a == "write"]
    assert kv_write == [32 * 4096]


def test_zipf_popularity_and_exact_expert_load() -> None:
    cfg = small(sequence={"steps": 400, "micro_batch": 32}, routing={"topk": 1, "zipf_s": 1.0})
    layers, load = expert_load(cfg)
    assert layers == list(range(32)) and load.shape == (32, 8)
    np.testing.assert_allclose(load.sum(axis=1), 1.0)
    plan = make_plan(cfg)
    probs = plan.routing_stream().probabilities()
    # top-1: each token picks expert e with probability p_e (12,800 draws per layer: within 5 sigma)
    sigma = np.sqrt(probs * (1 - probs) / (400 * 32))
    assert (np.abs(load - probs) < 5 * sigma).all()
    # the permutation differs between layers
    assert len({tuple(np.argsort(-p).tolist()) for p in probs}) > 1
    # exact: the load equals the fc token counts of the trace
    fc_tokens = np.zeros((33, 8))
    for w in iter_windows(cfg, 50.0):
        for op, la, e, t in zip(w.compute.op_type, w.compute.layer, w.compute.expert, w.compute.tokens,
                                strict=True):
            if op == "fc":
                fc_tokens[la, e] += t
    np.testing.assert_allclose(fc_tokens[:32] / (400 * 32), load)


def test_zipf_zero_is_uniform_and_distinct_topk() -> None:
    p = zipf_probabilities(8, 0.0, np.arange(8))
    np.testing.assert_allclose(p, 1 / 8)
    s = RoutingStream(seed=1, n_layers=3, n_experts=8, topk=3, tokens=64, zipf_s=2.0)
    picks = s.take(5)
    assert picks.shape == (5, 3, 64, 3)
    assert (np.diff(picks, axis=-1) > 0).all()  # distinct and sorted
    counts = expert_counts(picks, 8)
    assert (counts.sum(axis=-1) == 64 * 3).all()


@pytest.mark.parametrize("zipf_s, n_group, topk_group", [
    (1050.0, None, None),  # p_r subnormal: 1/p overflows
    (1100.0, 4, 2), (5000.0, None, None), (1e6, 2, 1), (1e308, None, None),  # p_r = 0; s·ln(r+1) beyond the floats
])
def test_a_skew_past_the_floats_still_routes_in_rank_order(zipf_s: float, n_group: int | None,
                                                           topk_group: int | None) -> None:
    """Where 1/p_r leaves the floats (subnormal or underflowed p_r) the race runs in logs: each token's choices are
    the top-ranked experts (the gaps between ranks dwarf the draws), not ties at infinity, with no warning. With
    groups, the eligible groups are the ones holding the top ranks."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = RoutingStream(seed=4, n_layers=3, n_experts=8, topk=3, tokens=32, zipf_s=zipf_s, n_group=n_group,
                          topk_group=topk_group)
        picks = s.take(6)
        two = RoutingStream(seed=4, n_layers=1, n_experts=2, topk=1, tokens=4096, zipf_s=1020.0).take(2)
    for j, perm in enumerate(s.perms):
        if n_group is None or topk_group is None:
            want = np.sort(perm[:3])
        else:  # the best groups hold ranks 0, 1, ...: a group's score is its best expert's; take the top 3 in them
            size = 8 // n_group
            groups = list(dict.fromkeys(int(e) // size for e in perm))[:topk_group]
            want = np.sort([int(e) for e in perm if int(e) // size in groups][:3])
        assert (picks[:, j] == want).all()
    assert np.isfinite(zipf_log_inverse(8, zipf_s, s.perms[0])).all()
    assert (two == s_top(1020.0)).all()


def s_top(zipf_s: float) -> int:
    """The top-ranked of two experts at this skew (seed 4, one layer)."""
    return int(RoutingStream(seed=4, n_layers=1, n_experts=2, topk=1, tokens=1, zipf_s=zipf_s).perms[0][0])


def test_the_race_in_logs_is_the_same_race() -> None:
    """At a skew the floats hold, the log race (used past them) picks exactly what the plain race picks, and ``-ln p``
    matches the probabilities."""
    kw: dict[str, Any] = {"seed": 9, "n_layers": 3, "n_experts": 16, "topk": 4, "tokens": 64, "zipf_s": 1.2,
                          "locality": 0.3, "n_group": 4, "topk_group": 2}
    plain = RoutingStream(**kw)
    logs = RoutingStream(**kw)
    assert plain._log_inv_p is None
    logs._log_inv_p = np.stack([zipf_log_inverse(16, 1.2, perm) for perm in logs.perms])
    np.testing.assert_allclose(logs._log_inv_p, np.log(plain._inv_p), rtol=1e-12)
    np.testing.assert_array_equal(plain.take(25), logs.take(25))


def test_routing_is_chunk_invariant() -> None:
    kw: dict[str, Any] = {"seed": 3, "n_layers": 4, "n_experts": 16, "topk": 4, "tokens": 8, "zipf_s": 1.1,
                          "locality": 0.5, "n_group": 4, "topk_group": 2}
    whole = RoutingStream(**kw).take(20)
    s = RoutingStream(**kw)
    parts = np.concatenate([s.take(3), s.take(1), s.take(16)])
    np.testing.assert_array_equal(whole, parts)


def test_locality_repeats_previous_choice() -> None:
    kw: dict[str, Any] = {"seed": 5, "n_layers": 2, "n_experts": 8, "topk": 2, "tokens": 256, "zipf_s": 0.0}
    same0 = (np.diff(RoutingStream(**kw, locality=0.0).take(30), axis=0) == 0).all(axis=-1).mean()
    same8 = (np.diff(RoutingStream(**kw, locality=0.8).take(30), axis=0) == 0).all(axis=-1).mean()
    assert same0 == pytest.approx(1 / 28, abs=0.01)  # a random pair out of C(8,2) = 28
    assert same8 == pytest.approx(0.8 + 0.2 / 28, abs=0.02)
    always = RoutingStream(**kw, locality=1.0).take(10)
    assert (always == always[0]).all()


def test_group_limited_routing() -> None:
    cfg = small("deepseek-v3", routing={"topk": 8, "n_group": 8, "topk_group": 2}, sequence={"steps": 2})
    plan = make_plan(cfg)
    picks = plan.routing_stream().take(2)
    groups = picks // 32  # 256 experts in 8 groups of 32
    n_groups = np.asarray([[[len(set(t)) for t in layer] for layer in mb] for mb in groups.tolist()])
    assert n_groups.max() <= 2 and n_groups.min() >= 1
    # the model's own grouping applies when the config does not set one (DeepSeek-V3: 8 groups, top-4)
    plan2 = make_plan(small("deepseek-v3", routing={"topk": 8}, sequence={"steps": 2}))
    assert (plan2.n_group, plan2.topk_group) == (8, 4)


def test_dense_first_layers_and_shared_experts() -> None:
    cfg = small("deepseek-v2", routing={"topk": 6}, sequence={"steps": 2})
    w = next(iter_windows(cfg, 10.0))
    ops = np.asarray(w.compute.op_type)
    layer = np.asarray(w.compute.layer)
    assert set(layer[ops == "dense"].tolist()) == {0}
    assert set(layer[ops == "fc"].tolist()) == set(range(1, 60))
    assert set(layer[ops == "shared"].tolist()) == set(range(1, 60))
    mc = ModelZoo().get_model_config("deepseek-v2")
    counts = route_counts(make_plan(cfg))
    assert counts.shape == (2, 59, 160) and (counts.sum(axis=-1) == 8 * 6).all()
    assert mc.moe is not None and mc.moe.first_k_dense_replace == 1


def test_dense_model_has_no_routing() -> None:
    w = next(iter_windows(small("llama-2-7b"), 100.0))
    assert set(w.compute.op_type) == {"attn", "dense", "head"}
    layers, load = expert_load(small("llama-2-7b"))
    assert layers == [] and load.shape[0] == 0


@pytest.mark.parametrize(("over", "field"), [
    ({"routing": {"topk": 9}}, "routing.topk"),
    ({"model": "deepseek-v3", "routing": {"topk": 8, "n_group": 7, "topk_group": 1}}, "routing.n_group"),
    ({"model": "deepseek-v3", "routing": {"topk": 40, "n_group": 8, "topk_group": 1}}, "routing.topk"),
])
def test_bad_routing_names_the_field(over: dict[str, Any], field: str) -> None:
    with pytest.raises(BadInput) as exc:
        make_plan(small(**over))
    assert exc.value.field == field


def test_unknown_model_is_not_found() -> None:
    with pytest.raises(NotFound):
        make_plan(small("nope-1b"))


def test_empty_windows_between_micro_batches(tmp_path: Path) -> None:
    cfg = small("llama-3-8b", sequence={"steps": 3, "step_interval_ms": 5.0})
    windows = list(iter_windows(cfg, 1.0))
    assert len(windows) == 11  # arrivals at 0, 5, 10 ms
    busy = [w.window for w in windows if len(w.compute)]
    assert busy == [0, 5, 10]
    assert all(w.tokens_generated == 0 for w in windows if w.window not in busy)
    cpath, _ = generate_logical_traces(cfg, tmp_path, window_ms=1.0)
    assert len(Path(cpath).read_text().splitlines()) == 1 + 3 * (32 * 2 + 1)
    # an MoE model too: windows without arrivals have no routed-expert counts at all
    moe = small("mixtral-8x7b", sequence={"steps": 2, "step_interval_ms": 12.0})
    moe_windows = list(iter_windows(moe, 3.0))
    assert [w.window for w in moe_windows if len(w.compute)] == [0, 4]
    assert all(len(w.memory) == 0 for w in moe_windows if w.window not in (0, 4))


def test_prefill_uses_the_prefill_ir() -> None:
    cfg = small("llama-2-7b", phase="prefill", sequence={"tokens": 512, "steps": 1})
    ir = build_ir(ModelZoo().get_model_config("llama-2-7b"), phase="prefill", batch=1, seq_len=512)
    attn_pt = sum(op.compute.total for op in ir.layers[1].ops) / 512
    w = next(iter_windows(cfg, 10.0))
    ops = np.asarray(w.compute.op_type)
    np.testing.assert_allclose(np.asarray(w.compute.flops)[ops == "attn"], 8 * attn_pt)
    # a prefill token attends to the 512-token prompt: 2·2·512·d·H score FLOPs per layer on top of the projections
    decode = build_ir(ModelZoo().get_model_config("llama-2-7b"), phase="decode", batch=1, seq_len=512)
    assert attn_pt == pytest.approx(sum(op.compute.total for op in decode.layers[1].ops))


def test_service_windows_without_arrivals_match_the_stream() -> None:
    """Served windows (cached routing, global event ids) equal the streamed ones, empty windows included."""
    from services.workload.service import TraceCache, create_trace, get_window
    from services.workload.sources import WorkloadSources

    cfg = small("mixtral-8x7b", sequence={"steps": 3, "step_interval_ms": 12.0})
    cache = TraceCache()
    summary = create_trace(cache, WorkloadSources.packaged(), cfg, 3.0)
    entry = cache.get(summary.trace_id)
    streamed = list(iter_windows(cfg, 3.0))
    served = [get_window(entry, k) for k in range(summary.n_windows)]
    assert len(served) == len(streamed) and summary.n_windows > 3
    assert [len(w.compute) > 0 for w in served] == [len(w.compute) > 0 for w in streamed]
    assert sum(len(w.compute) == 0 for w in served) >= 2
    for a, b in zip(served, streamed, strict=True):
        assert a.compute == b.compute and a.memory == b.memory


@pytest.mark.parametrize(("interval_ms", "window_ms"), [(0.7, 2.0), (3.0, 3.0), (300.0, 3.0), (1.0, 0.25)])
def test_window_range_is_the_arrivals_in_the_window(interval_ms: float, window_ms: float) -> None:
    """`TracePlan.window_range` (one window at a time) against every window's edges at once: window k holds the
    micro-batches arriving in [k·w, (k+1)·w), the first window from micro-batch 0, empty windows empty, the last one
    up to the last arrival."""
    plan = make_plan(small(sequence={"step_interval_ms": interval_ms, "steps": 9}))
    w_ns = round(window_ms * 1e6)
    n = plan.window_count(window_ms)
    edges = np.searchsorted(plan.mb_t_ns, np.arange(n + 1) * w_ns, side="left")
    got = [plan.window_range(k, w_ns) for k in range(n)]
    assert got == [(int(edges[k]), int(edges[k + 1])) for k in range(n)]
    assert got[0][0] == 0 and got[-1][1] == plan.steps
    for k, (a, b) in enumerate(got):
        assert all(k * w_ns <= t < (k + 1) * w_ns for t in plan.mb_t_ns[a:b])


@pytest.mark.parametrize(("over", "window_ms", "field"), [
    ({"sequence": {"steps": 100_000, "micro_batch": 65536}}, 1e6, "window_ms"),  # every micro-batch in window 0
    ({"sequence": {"steps": 100, "micro_batch": 4096}}, 3.0, "window_ms"),  # 4 micro-batches of 61M routing cells
    ({"sequence": {"steps": 100, "micro_batch": 8192, "step_interval_ms": 100.0}}, 3.0, "sequence.micro_batch"),
])
def test_one_window_is_bounded_before_it_is_built(over: dict[str, Any], window_ms: float, field: str) -> None:
    """Found by a hostile-request probe: a trace was accepted whose first window then ran out of memory or took
    minutes to draw. The plan refuses it, naming the field that makes one window too large."""
    v3 = over["sequence"]["micro_batch"] < 65536  # DeepSeek-V3's 256 experts in 58 MoE layers
    cfg = small("deepseek-v3" if v3 else "mixtral-8x7b", routing={"topk": 8 if v3 else 2}, **over)
    with pytest.raises(BadInput) as err:
        make_plan(cfg).window_count(window_ms)
    assert err.value.field == field
    make_plan(small()).window_count(3.0)  # the usual sizes pass
