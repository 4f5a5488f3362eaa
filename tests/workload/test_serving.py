"""Serving workloads (services.workload.serving): arrivals from the packaged trace rescaled to a rate, requests in
their windows, the rows of scheduler-formed micro-batches against the IR and the fixed-arrival rows, routing at token
positions, bounds and 422s, the HTTP wiring; and a fixed-arrival workload answering byte for byte as before."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from services.workload import service
from services.workload.app import create_app
from services.workload.arrivals import SERVING_TRACES_DIR, load_arrival_trace, offered_requests
from services.workload.ir import ModelConfig, build_ir
from services.workload.recorded import ReplayStream
from services.workload.routing import RoutingStream
from services.workload.serving import ServingPlan, key_costs, keys_per_query, keys_read_once_per_block
from services.workload.sources import WorkloadSources
from services.workload.traces import ATTN, generate_logical_traces, iter_windows, make_plan, per_token_costs
from shared.configs import ServingConfig, WorkloadConfig, load_workload
from shared.contracts.workload import (
    LogicalCompute,
    LogicalMemory,
    LogicalWindows,
    MicroBatchRows,
    MicroBatchSpec,
    TraceSummary,
)
from shared.errors import BadInput, first_validation_error
from shared.settings import Settings
from tests.workload.golden_fixed import golden

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "workload_fixed_golden.json"
SOURCES = WorkloadSources.packaged()


def serving_cfg(model: str = "mixtral-8x7b", *, routing: dict[str, Any] | None = None,
                sequence: dict[str, Any] | None = None, **serving: Any) -> WorkloadConfig:
    return WorkloadConfig.model_validate({
        "model": model, "routing": {"seed": 5, **(routing or {})},
        "sequence": {"micro_batch": 8, **(sequence or {})},
        "serving": {"duration_ms": 20_000.0, **serving}})


def spec(mb_id: int, token_offset: int, seqs: list[tuple[int, int, int, bool]], t_ns: int = 0) -> MicroBatchSpec:
    """A micro-batch of (request, new tokens, context, emits) rows."""
    return MicroBatchSpec.model_validate({"mb_id": mb_id, "t_ns": t_ns, "token_offset": token_offset, "seqs": {
        "request_id": [s[0] for s in seqs], "new_tokens": [s[1] for s in seqs], "context": [s[2] for s in seqs],
        "emits": [s[3] for s in seqs]}})


def rows_of(r: MicroBatchRows, *, mb: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    c, m = r.compute.to_numpy(), r.memory.to_numpy()
    if mb is not None:
        keep = c["mb_id"] == mb
        ev = set(c["event_id"][keep].tolist())
        c = {k: v[keep] for k, v in c.items()}
        mk = np.isin(m["event_id"], list(ev))
        m = {k: v[mk] for k, v in m.items()}
    return c, m


# --- arrivals -----------------------------------------------------------------------------------------------------
def test_packaged_trace_and_licence() -> None:
    tr = load_arrival_trace("azure_llm_inference_2023_conv")
    assert len(tr.t_ns) == 19_366 and tr.t_ns[0] == 0 and (np.diff(tr.t_ns) > 0).all()
    assert round(tr.t_ns[-1] / 1e9, 1) == 3501.7
    readme = (SERVING_TRACES_DIR / "README.md").read_text(encoding="utf-8")
    assert "Splitwise" in readme and "CC" in readme and (SERVING_TRACES_DIR / "LICENSE-CC-BY-4.0.txt").is_file()
    with pytest.raises(BadInput) as exc:
        load_arrival_trace("no_such_trace")
    assert exc.value.field == "serving.trace" and "azure_llm_inference_2023_conv" in exc.value.message


@pytest.mark.parametrize(("start_s", "rate"), [(0.0, 2.0), (1000.0, 0.7), (250.5, 40.0)])
def test_arrivals_rescaled_to_the_rate(start_s: float, rate: float) -> None:
    sv = ServingConfig(duration_ms=30_000.0, start_s=start_s, rate_rps=rate)
    off = offered_requests(sv)
    tr = load_arrival_trace(sv.trace)
    D = 30_000_000_000
    assert off.n == round(rate * 30) and off.offered_rate_rps == pytest.approx(rate, abs=0.5 / 30)
    i0 = int(np.searchsorted(tr.t_ns, round(start_s * 1e9)))
    # lengths are the trace's, request by request; arrivals are the trace's divided by one factor
    assert np.array_equal(off.prompt_tokens, tr.prompt_tokens[i0:i0 + off.n])
    assert np.array_equal(off.output_tokens, tr.output_tokens[i0:i0 + off.n])
    tau = tr.t_ns[i0:i0 + off.n + 1] - round(start_s * 1e9)
    assert off.rate_factor == pytest.approx(tau[-1] / D)
    assert np.allclose(off.t_arrival_ns, tau[:-1] / off.rate_factor, atol=1.0)
    assert off.t_arrival_ns.min() >= 0 and off.t_arrival_ns.max() < D and (np.diff(off.t_arrival_ns) >= 0).all()
    again = offered_requests(ServingConfig(duration_ms=30_000.0, start_s=start_s, rate_rps=rate))
    assert np.array_equal(again.t_arrival_ns, off.t_arrival_ns)  # the same every time, and nothing is seeded


def test_arrivals_at_the_trace_pace_and_seed_independent() -> None:
    off = offered_requests(ServingConfig(duration_ms=10_000.0, start_s=60.0))
    tr = load_arrival_trace("azure_llm_inference_2023_conv")
    sel = (tr.t_ns >= 60_000_000_000) & (tr.t_ns < 70_000_000_000)
    assert off.rate_factor == 1.0 and np.array_equal(off.t_arrival_ns, tr.t_ns[sel] - 60_000_000_000)
    a = ServingPlan(make_plan(serving_cfg(routing={"seed": 1}, rate_rps=3.0), SOURCES)).offered
    b = ServingPlan(make_plan(serving_cfg(routing={"seed": 99}, rate_rps=3.0), SOURCES)).offered
    assert np.array_equal(a.t_arrival_ns, b.t_arrival_ns)


def test_requests_in_their_windows() -> None:
    cache = service.TraceCache(4)
    s = service.create_trace(cache, SOURCES, serving_cfg(rate_rps=5.0, duration_ms=1_000.0), 7.0)
    assert s.serving and s.n_windows == 143 and s.t_end_ns == 143 * 7_000_000  # ceil(1000 / 7)
    assert s.n_requests == 5 and s.steps == 0 and s.micro_batch == 0 and s.mb_event_stride > 0
    entry = cache.get(s.trace_id)
    off = entry.serving.offered if entry.serving else None
    assert off is not None and s.tokens_total == s.offered_output_tokens == int(off.output_tokens.sum())
    assert s.offered_prompt_tokens == int(off.prompt_tokens.sum()) and s.offered_rate_rps == 5.0
    windows = [w for a in range(0, s.n_windows, 64) for w in service.get_windows(entry, a, 64)]
    assert len(windows) == s.n_windows
    seen: list[int] = []
    for w in windows:
        assert len(w.compute) == 0 and len(w.memory) == 0 and w.tokens_generated == 0
        assert all(w.t0_ns <= t < w.t1_ns for t in w.requests.t_arrival_ns)
        seen += w.requests.request_id
    assert seen == list(range(s.n_requests))
    w = windows[int(off.t_arrival_ns[2] // 7_000_000)]
    i = w.requests.request_id.index(2)
    assert (w.requests.prompt_tokens[i], w.requests.output_tokens[i]) == (off.prompt_tokens[2], off.output_tokens[2])
    # the same windows streamed, and in a wider window on request
    assert [x.model_dump_json() for x in iter_windows(entry.cfg, 7.0, trace_id=s.trace_id)] == \
        [x.model_dump_json() for x in windows]
    assert service.get_window(entry, 0, window_ms=1_000.0).requests.request_id == list(range(5))
    with pytest.raises(BadInput) as exc:
        generate_logical_traces(entry.cfg, "/nonexistent")
    assert exc.value.field == "serving"


def test_a_drain_adds_windows_without_arrivals() -> None:
    """``drain_ms``: the run goes on after the arrivals' span, with no request arriving: the same requests, in the
    same windows, then drain windows."""
    cache = service.TraceCache(4)
    base = service.create_trace(cache, SOURCES, serving_cfg(rate_rps=5.0, duration_ms=1_000.0), 7.0)
    drained = service.create_trace(cache, SOURCES, serving_cfg(rate_rps=5.0, duration_ms=1_000.0, drain_ms=500.0),
                                   7.0)
    assert drained.n_windows == 215 and drained.n_requests == base.n_requests  # ceil(1500 / 7)
    a = [w for k in range(0, base.n_windows, 64) for w in service.get_windows(cache.get(base.trace_id), k, 64)]
    b = [w for k in range(0, drained.n_windows, 64) for w in service.get_windows(cache.get(drained.trace_id), k, 64)]
    assert [w.requests for w in b[:len(a)]] == [w.requests for w in a]
    assert all(not len(w.requests) for w in b[len(a):])


def test_fixed_arrivals_byte_identical_to_before() -> None:
    """The golden file holds the answers of the code before serving mode (`golden_fixed.py` says how it is made)."""
    assert golden() == json.loads(GOLDEN.read_text(encoding="utf-8"))


# --- costs --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["mixtral-8x7b", "deepseek-v2"])
def test_attention_flops_linear_in_keys_match_the_ir(model: str) -> None:
    """The two-context fit gives the IR's attention FLOPs at a third context, layer by layer."""
    cfg = serving_cfg(model)
    plan = make_plan(cfg, SOURCES)
    c = key_costs(cfg, plan.mc, plan)
    for ctx in (3, 1000, 3333):
        ir = per_token_costs(cfg, build_ir(plan.mc, phase="decode", batch=1, seq_len=ctx))
        for li in range(plan.mc.num_hidden_layers):
            want = ir.layer_flops[(li, ATTN)]
            got = c.attn_base[li] + c.attn_per_key[li] * plan.mc.keys_per_query(li, ctx)
            assert got == pytest.approx(want, rel=1e-12)
            assert ir.kv_read[li] == plan.mc.keys_per_query(li, ctx) * c.kv_bytes[li]


def test_keys_per_query_vectorised() -> None:
    mc = SOURCES.zoo.resolve_model("mixtral-8x7b")
    n = mc.num_hidden_layers
    mixed = ModelConfig.model_validate({**mc.model_dump(), "sliding_window": 5, "attention_chunk_size": 3,
                                        "mixers": (["full_attention", "sliding_attention", "chunked_attention"]
                                                   * n)[:n]})
    pos = np.arange(0, 20, dtype=np.int64)
    for li in range(3):
        assert keys_per_query(mixed, li, pos).tolist() == [mixed.keys_per_query(li, int(p)) for p in pos]


@pytest.mark.parametrize(("model", "n", "ctx", "m"), [("mixtral-8x7b", 8, 777, 3), ("deepseek-v2", 4, 300, 2)])
def test_decode_batch_equals_fixed_micro_batch(model: str, n: int, ctx: int, m: int) -> None:
    """n requests decoding at context ctx = the fixed-arrival micro-batch m of n sequences at context ctx: the same
    routing (the same token stream at the same positions), FLOPs, bytes and tensor ids; only the event ids differ."""
    fixed = WorkloadConfig.model_validate({"model": model, "routing": {"seed": 11},
                                           "sequence": {"tokens": ctx, "micro_batch": n, "steps": m + 1,
                                                        "step_interval_ms": 100.0}})
    window = next(w for w in iter_windows(fixed, 100.0) if w.window == m)
    fc = window.compute.to_numpy()
    fm = window.memory.to_numpy()
    sp = ServingPlan(make_plan(WorkloadConfig.model_validate(
        {**fixed.model_dump(), "serving": {"duration_ms": 1000.0}}), SOURCES))
    t_m = m * 100_000_000
    got = sp.rows([spec(m, m * n, [(r, 1, ctx, True) for r in range(n)], t_ns=t_m)])
    sc, sm = got.compute.to_numpy(), got.memory.to_numpy()
    for col in ("t_gen_ns", "mb_id", "layer", "op_type", "expert", "tokens"):
        assert np.array_equal(sc[col], fc[col]), col
    assert np.allclose(sc["flops"], fc["flops"], rtol=1e-12, atol=0)
    for col in ("tensor_id", "access", "locality_hint"):
        assert np.array_equal(sm[col], fm[col]), col
    assert np.allclose(sm["bytes"], fm["bytes"], rtol=1e-12, atol=0)
    # event ids: mb x stride + slot, in the fixed rows' order
    assert (np.diff(sc["event_id"]) > 0).all() and sc["event_id"][0] >= m * sp.stride
    remap = dict(zip(fc["event_id"].tolist(), sc["event_id"].tolist(), strict=True))
    assert [remap[e] for e in fm["event_id"].tolist()] == sm["event_id"].tolist()


@pytest.fixture(scope="module")
def mixtral() -> ServingPlan:
    return ServingPlan(make_plan(serving_cfg(), SOURCES))


def test_head_only_for_emitting_requests(mixtral: ServingPlan) -> None:
    c, m = rows_of(mixtral.rows([spec(0, 0, [(0, 64, 0, False), (1, 1, 40, True), (2, 1, 9, False)])]))
    head = c["op_type"] == "head"
    assert c["tokens"][head].tolist() == [1]
    assert c["tokens"][c["op_type"] == "attn"].tolist() == [66] * 32  # every other op: every token
    assert c["tokens"][c["op_type"] == "router"].tolist() == [66] * 32
    hm = m["event_id"] == c["event_id"][head][0]
    assert m["bytes"][hm].tolist() == [4096 * 2]  # one token's activations read by the head
    c2, _ = rows_of(mixtral.rows([spec(0, 0, [(0, 64, 0, False), (2, 1, 9, False)])]))
    assert "head" not in c2["op_type"].tolist()


def test_kv_bytes_and_attention_grow_with_context(mixtral: ServingPlan) -> None:
    def kv(ctx: int) -> tuple[float, float, float, float]:
        c, m = rows_of(mixtral.rows([spec(0, 0, [(0, 1, ctx, True), (1, 16, ctx, False)])]))
        read = m["bytes"][(m["locality_hint"] == "kv") & (m["access"] == "read")].sum()
        write = m["bytes"][(m["locality_hint"] == "kv") & (m["access"] == "write")].sum()
        return read, write, c["flops"][c["op_type"] == "attn"].sum(), c["flops"][c["op_type"] == "fc"].sum()

    small, large = kv(100), kv(5000)
    assert large[0] > small[0] and large[2] > small[2]
    assert large[1] == small[1] == 17 * 32 * mixtral.costs.kv_bytes[0]  # one token's KV written per layer
    assert large[3] == small[3]  # the same tokens of the stream: the same experts
    # the keys read: a token at position p reads p keys (the prompt chunk's tokens read the ones before them)
    keys = 100 + sum(100 + i for i in range(16))
    assert small[0] == 32 * keys * mixtral.costs.kv_bytes[0]


def _kv_and_attn(sp: ServingPlan, seqs: list[tuple[int, int, int, bool]]) -> tuple[float, float, float]:
    """KV bytes read, KV bytes written and attention FLOPs of one micro-batch of ``seqs``."""
    c, m = rows_of(sp.rows([spec(0, 0, seqs)]))
    kv = m["locality_hint"] == "kv"
    return (m["bytes"][kv & (m["access"] == "read")].sum(), m["bytes"][kv & (m["access"] == "write")].sum(),
            c["flops"][c["op_type"] == "attn"].sum())


def test_a_query_block_reads_its_keys_once_and_changes_nothing_else() -> None:
    """``operators.attn.query_block`` Q: a request's new tokens read the KV cache once per block of Q of them (the
    block's first token its keys, each later one only its own new key); FLOPs, KV writes and decode unchanged."""
    cfg = serving_cfg()
    blocked = cfg.model_copy(update={"operators": cfg.operators.model_copy(update={
        "attn": cfg.operators.attn.model_copy(update={"query_block": 128})})})
    one, q128 = ServingPlan(make_plan(cfg, SOURCES)), ServingPlan(make_plan(blocked, SOURCES))
    decode = [(0, 1, 900, True), (1, 1, 40, True)]
    assert _kv_and_attn(one, decode) == _kv_and_attn(q128, decode)  # one query a request: nothing to share
    chunk = [(0, 300, 1000, False), (1, 1, 40, True)]  # a 300-token chunk on 1000 cached tokens, and a decode step
    r1, w1, f1 = _kv_and_attn(one, chunk)
    r128, w128, f128 = _kv_and_attn(q128, chunk)
    assert (w1, f1) == (w128, f128)
    # full attention: blocks of 128, 128 and 44 tokens from positions 1000, 1128, 1256 read the keys before their
    # first token and then one new key per later token; the decode step its 40 keys
    keys = (1000 + 127) + (1128 + 127) + (1256 + 43) + 40
    assert r128 == 32 * keys * one.costs.kv_bytes[0]
    assert r1 == 32 * (sum(range(1000, 1300)) + 40) * one.costs.kv_bytes[0]
    bad = serving_cfg().model_dump(mode="json")
    bad.pop("serving")
    bad["operators"] = {"attn": {"query_block": 128}}
    with pytest.raises(ValidationError) as exc:
        WorkloadConfig.model_validate(bad)
    assert first_validation_error(exc.value)[0] == "operators.attn.query_block"  # fixed arrivals: no blocks
    assert "query_block" not in json.dumps(cfg.model_dump(mode="json"))  # the default: every config's hash as before


@pytest.mark.parametrize("block", [1, 3, 7, 64])
def test_keys_read_once_per_block_is_the_union_of_the_blocks_keys(block: int) -> None:
    """Against a brute force: the keys a block reads are the union of the intervals ``[p - keys, p)`` its queries
    attend to, at full, sliding and chunked attention layers, for runs of positions from a nonzero context."""
    mc = SOURCES.zoo.resolve_model("mixtral-8x7b")
    n = mc.num_hidden_layers
    mixed = ModelConfig.model_validate({**mc.model_dump(), "sliding_window": 5, "attention_chunk_size": 6,
                                        "mixers": (["full_attention", "sliding_attention", "chunked_attention"]
                                                   * n)[:n]})
    for ctx, new in ((0, 20), (3, 17), (11, 40)):
        pos = np.arange(ctx, ctx + new, dtype=np.int64)
        starts = np.arange(new) % block == 0
        for li in range(3):
            kq = keys_per_query(mixed, li, pos)
            union = 0
            for b0 in range(0, new, block):
                union += len(set().union(*(range(int(p - k), int(p)) for p, k in
                                           zip(pos[b0:b0 + block], kq[b0:b0 + block], strict=True))))
            assert keys_read_once_per_block(kq, starts) == union, (ctx, new, li)


def test_event_ids_unique_deterministic_and_grouping_independent(mixtral: ServingPlan) -> None:
    batches = [spec(7, 1000, [(0, 300, 0, False), (3, 1, 50, True)], t_ns=5),
               spec(8, 1301, [(0, 212, 300, True), (3, 1, 51, True)], t_ns=9),
               spec(9, 1515, [(0, 1, 512, True), (3, 1, 52, True), (4, 1, 0, False)], t_ns=12)]
    together = mixtral.rows(batches)
    apart = [mixtral.rows([b]) for b in batches]
    assert together.compute == LogicalCompute.concat([p.compute for p in apart])
    assert together.memory == LogicalMemory.concat([p.memory for p in apart])
    ev = np.asarray(together.compute.event_id)
    assert len(np.unique(ev)) == len(ev)
    mb = np.asarray(together.compute.mb_id)
    assert ((ev // mixtral.stride) == mb).all() and set(together.memory.event_id) <= set(ev.tolist())
    # asked again (a recomputed micro-batch, alone or in another call): the same ids and rows
    assert mixtral.rows([batches[1]]).model_dump_json() == apart[1].model_dump_json()
    assert ServingPlan(make_plan(serving_cfg(), SOURCES)).rows(batches).model_dump_json() == \
        together.model_dump_json()
    assert set(together.compute.t_gen_ns) == {5, 9, 12}
    assert {t for t, m in zip(together.memory.tensor_id, together.memory.event_id, strict=True)
            if t.startswith("KV_L0_")} == {"KV_L0_MB7", "KV_L0_MB8", "KV_L0_MB9"}


@pytest.mark.parametrize("model", ["mixtral-8x7b", "deepseek-v2"])
def test_routing_counts_sum_to_tokens_times_topk(model: str) -> None:
    sp = ServingPlan(make_plan(serving_cfg(model), SOURCES))
    c, _ = rows_of(sp.rows([spec(0, 12_345, [(0, 37, 0, False), (1, 1, 99, True), (2, 5, 12, True)])]))
    fc = c["op_type"] == "fc"
    per_layer: Counter[int] = Counter()
    for layer, tok in zip(c["layer"][fc].tolist(), c["tokens"][fc].tolist(), strict=True):
        per_layer[layer] += tok
    assert set(per_layer) == set(sp.plan.moe_layers)
    assert set(per_layer.values()) == {43 * sp.plan.topk}


@pytest.mark.parametrize(("E", "k", "zipf_s", "n_group", "topk_group"),
                         [(16, 4, 0.8, 4, 2), (8, 2, 2000.0, None, None)])
def test_routing_is_the_fixed_stream_at_token_positions(E: int, k: int, zipf_s: float, n_group: int | None,
                                                        topk_group: int | None) -> None:
    """Random access into the stream equals generating it, with groups and in the log race too."""
    def stream() -> RoutingStream:
        return RoutingStream(seed=3, n_layers=2, n_experts=E, topk=k, tokens=6, zipf_s=zipf_s, n_group=n_group,
                             topk_group=topk_group)

    flat = stream().take(20).transpose(1, 0, 2, 3).reshape(2, 120, -1)
    fresh = stream()
    for off, n in ((0, 120), (5, 1), (13, 40), (119, 1)):
        assert np.array_equal(fresh.tokens_at(off, n), flat[:, off:off + n])
    assert fresh.position == 0
    with pytest.raises(ValueError, match="locality"):
        RoutingStream(seed=3, n_layers=1, n_experts=8, topk=2, tokens=4, zipf_s=1.0, locality=0.5).tokens_at(0, 1)


def test_recorded_routing_replays_at_token_positions() -> None:
    sp = ServingPlan(make_plan(serving_cfg(routing={"trace": "mixtral-8x7b-synthetic.csv", "topk": 2}), SOURCES))
    assert isinstance(sp.stream, ReplayStream)
    rec = SOURCES.recorded.load("mixtral-8x7b-synthetic.csv", None)
    off, n = 1000, 50  # wraps past the file's 1024 tokens
    idx = (off + np.arange(n)) % rec.n_tokens
    want = np.stack([np.bincount(rec.experts[idx, j].ravel(), minlength=8) for j in range(rec.n_layers)])
    assert np.array_equal(sp.expert_counts(off, n), want)
    c, _ = rows_of(sp.rows([spec(0, off, [(0, n, 0, True)])]))
    fc = c["op_type"] == "fc"
    assert c["tokens"][fc & (c["layer"] == 0)].tolist() == [int(x) for x in want[0] if x]


# --- bounds and errors --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "field"), [
    ({"serving": {"duration_ms": 1.0, "max_running": 4096}}, "serving.max_running"),
    ({"serving": {"duration_ms": 1.0, "prefill_chunk": 4096}}, "serving.prefill_chunk"),
    ({"phase": "prefill", "serving": {"duration_ms": 1.0}}, "phase"),
    ({"routing": {"locality": 0.3}, "serving": {"duration_ms": 1.0}}, "routing.locality"),
    ({"serving": {"duration_ms": 1.0, "trace": "../../etc/passwd"}}, "serving.trace"),
    ({"serving": {"duration_ms": 0.0}}, "serving.duration_ms"),
    ({"serving": {"duration_ms": 1.0, "rate_rps": -1}}, "serving.rate_rps"),
    ({"serving": {"duration_ms": 1.0, "slo": {"ttft_p99_ms": 0}}}, "serving.slo.ttft_p99_ms"),
    ({"serving": {"duration_ms": 1.0, "queue": 3}}, "serving.queue"),
])
def test_config_errors_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        WorkloadConfig.model_validate(raw)
    assert first_validation_error(exc.value)[0] == field


@pytest.mark.parametrize(("serving", "field"), [
    ({"trace": "no_such_trace"}, "workload.serving.trace"),
    ({"start_s": 9999.0}, "workload.serving.start_s"),
    ({"start_s": 3490.0}, "workload.serving.duration_ms"),
    ({"rate_rps": 10_000.0}, "workload.serving.rate_rps"),
    ({"rate_rps": 0.01, "duration_ms": 10.0}, "workload.serving.rate_rps"),
])
def test_trace_errors_name_the_field(serving: dict[str, Any], field: str) -> None:
    with pytest.raises(BadInput) as exc:
        service.create_trace(service.TraceCache(2), SOURCES, serving_cfg(**serving), 3.0)
    assert exc.value.field == field, exc.value.message


def test_routing_budget_of_one_micro_batch() -> None:
    """DeepSeek-V3 (58 MoE layers x 256 experts) at the default budget fits one call; four times it does not."""
    ServingPlan(make_plan(serving_cfg("deepseek-v3"), SOURCES))
    with pytest.raises(BadInput) as exc:
        ServingPlan(make_plan(serving_cfg("deepseek-v3", max_batch_tokens=8192, prefill_chunk=2048), SOURCES))
    assert exc.value.field == "serving.max_batch_tokens"


@pytest.mark.parametrize(("batches", "field"), [
    ([spec(0, 0, [(0, 2000, 0, False), (1, 2000, 0, False), (2, 97, 0, False)])], "batches[0].seqs.new_tokens"),
    ([spec(0, 0, [(0, 1, 5, True)]), spec(1, 1, [(0, 1, 6, True), (1, 2049, 0, True)])],
     "batches[1].seqs.new_tokens[1]"),
    ([spec(0, 0, [(0, 1, 5, True)]), spec(0, 1, [(0, 1, 6, True)])], "batches[1].mb_id"),
    ([spec(0, 0, [(0, 1, 5, True), (0, 3, 0, False)])], "batches[0].seqs.request_id"),
])
def test_micro_batch_errors_name_the_field(batches: list[MicroBatchSpec], field: str) -> None:
    sp = ServingPlan(make_plan(serving_cfg(max_batch_tokens=4096, prefill_chunk=2048), SOURCES))
    with pytest.raises(BadInput) as exc:
        sp.rows(batches)
    assert exc.value.field == field, exc.value.message


# --- HTTP ---------------------------------------------------------------------------------------------------------
def test_http_wiring(settings: Settings) -> None:
    client = TestClient(create_app(settings))
    wl = serving_cfg(rate_rps=4.0, duration_ms=2_000.0).model_dump(mode="json")
    r = client.post("/v1/traces", json={"workload": wl, "window_ms": 250})
    assert r.status_code == 200, r.text
    s = TraceSummary.model_validate(r.json())
    assert s.serving and s.n_requests == 8 and s.n_windows == 8
    ws = LogicalWindows.model_validate(client.get(f"/v1/traces/{s.trace_id}/windows", params={"count": 8}).json())
    assert sum(len(w.requests) for w in ws.windows) == 8
    body = {"batches": [spec(4, 10, [(0, 30, 0, True), (1, 1, 3, True)], t_ns=77).model_dump(mode="json")]}
    r = client.post(f"/v1/traces/{s.trace_id}/microbatches", json=body)
    assert r.status_code == 200, r.text
    got = MicroBatchRows.model_validate(r.json())
    sp = ServingPlan(make_plan(WorkloadConfig.model_validate(wl), SOURCES))
    assert got == sp.rows([MicroBatchSpec.model_validate(b) for b in body["batches"]])
    # errors: the body's bounds (FastAPI), the config's knobs (the service), a fixed-arrival trace, the expert load
    for bad, field in [({"batches": []}, "batches"),
                       ({"batches": [{**body["batches"][0], "seqs": {"request_id": [], "new_tokens": [],
                                                                    "context": [], "emits": []}}]},
                        "batches[0].seqs"),
                       ({"batches": [{**body["batches"][0], "mb_id": -1}]}, "batches[0].mb_id"),
                       ({"batches": [body["batches"][0]] * 65}, "batches"),
                       ({"batches": [spec(0, 0, [(0, 2049, 0, True)]).model_dump(mode="json")]},
                        "batches[0].seqs.new_tokens")]:
        r = client.post(f"/v1/traces/{s.trace_id}/microbatches", json=bad)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["error"]["field"] == field
    fixed = client.post("/v1/traces", json={"workload": {"model": "mixtral-8x7b", "sequence": {"steps": 3}}}).json()
    r = client.post(f"/v1/traces/{fixed['trace_id']}/microbatches", json=body)
    assert r.status_code == 422 and r.json()["error"]["code"] == "not_serving"
    assert client.post("/v1/traces/nope/microbatches", json=body).status_code == 404
    r = client.get(f"/v1/traces/{s.trace_id}/expert-load")
    assert r.status_code == 422 and r.json()["error"]["field"] == "expected"
    assert client.get(f"/v1/traces/{s.trace_id}/expert-load", params={"expected": True}).status_code == 200
    r = client.post("/v1/traces", json={"workload": {**wl, "serving": {**wl["serving"], "start_s": 5000}}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "workload.serving.start_s"


def test_sample_config() -> None:
    cfg = load_workload(REPO / "configs" / "workload_serving.yaml")
    assert cfg.serving is not None and cfg.model_name == "mixtral-8x7b"
    assert cfg.serving.trace == "azure_llm_inference_2023_conv"
    assert (cfg.serving.duration_ms, cfg.serving.drain_ms) == (10_000.0, 10_000.0)
    assert cfg.serving.rate_rps == 2.3  # the unthrottled chip's measured SLO capacity (the config says how)
    assert (cfg.serving.slo.ttft_p99_ms, cfg.serving.slo.tpot_p99_ms) == (2000.0, 200.0)
    s = service.create_trace(service.TraceCache(2), SOURCES, cfg, 3.0)
    assert s.n_requests == 23 and s.n_windows == 6667  # 2.3 requests/s over 10 s; (10 s + 10 s) / 3 ms


def test_a_trace_already_kept_is_answered_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its id is a content hash, and the cache keeps the first entry of an id: a second POST builds nothing."""
    cache = service.TraceCache(4)
    cfg = serving_cfg(rate_rps=5.0, duration_ms=1_000.0)
    first = service.create_trace(cache, SOURCES, cfg, 7.0)
    built: list[WorkloadConfig] = []

    def counted(c: WorkloadConfig, s: WorkloadSources | None = None) -> Any:
        built.append(c)
        return make_plan(c, s)

    monkeypatch.setattr(service, "make_plan", counted)
    assert service.create_trace(cache, SOURCES, cfg, 7.0) == first and not built
    other = service.create_trace(cache, SOURCES, cfg, 3.0)  # another window: another trace, built
    assert other.trace_id != first.trace_id and len(built) == 1
