"""Continuous batching in the physicalizer (services/lowering/physical/serving.py).

A hand-made trace on a 2 x 2 chip whose micro-batches take no time (tests/lowering/serving_stub.py: one ``dense`` row
of 0 FLOPs) gives every number by hand: a micro-batch completes at the instant it is formed, so a lane runs one
iteration per window and every token time is a window start. Then the rules one by one: FCFS and the token budget,
``max_running``, the queue limit and shedding, formation at window starts for micro-batches that span windows, the
lanes of ``attention: group``; the state's JSON; the workload service's own rows through the HTTP peers; bad input.
Every run keeps the token balance of shared/token_balance.py exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from services.lowering.app import create_app as lowering_app
from services.lowering.physical import physicalize_window
from services.lowering.physical.assign import attention_cores
from services.lowering.synthetic import default_placement
from services.workload import service as wsvc
from services.workload.app import create_app as workload_app
from services.workload.sources import WorkloadSources
from shared.client import ServiceClients
from shared.configs import ArchConfig, ServingConfig, WorkloadConfig
from shared.contracts.events import PhysicalState, WindowTiming
from shared.contracts.workload import LogicalCompute, LogicalMemory, LogicalWindow, Requests
from shared.errors import BadInput
from shared.peers import close_peers, wire_peers
from shared.settings import Settings
from shared.token_balance import token_imbalance
from tests.lowering.serving_stub import StubRows

TINY = ArchConfig.model_validate({"mesh": {"cores": [2, 2]}})
GROUPS = ArchConfig.model_validate({"mesh": {"cores": [2, 2]}, "schedule": {"attention": "group", "group_cores": 2}})
MS = 1_000_000  # one window of 1 ms, in ns
Req = tuple[int, int, int, int]  # (request id, arrival ns, prompt tokens, output tokens)
SLOW = 1.2e8  # FLOPs a token of the stub's rows: ~1.4 ms a micro-batch of a few tokens on TINY at 1 GHz


def window(k: int, reqs: Sequence[Req], w_ns: int = MS, trace_id: str = "t") -> LogicalWindow:
    """Window k of a hand-made trace: the requests arriving in it, no rows."""
    rs = [r for r in reqs if k * w_ns <= r[1] < (k + 1) * w_ns]
    return LogicalWindow(trace_id=trace_id, window=k, t0_ns=k * w_ns, t1_ns=(k + 1) * w_ns,
                         compute=LogicalCompute.empty(), memory=LogicalMemory.empty(),
                         requests=Requests(request_id=[r[0] for r in rs], t_arrival_ns=[r[1] for r in rs],
                                           prompt_tokens=[r[2] for r in rs], output_tokens=[r[3] for r in rs]))


def serve(reqs: Sequence[Req], sv: ServingConfig, n: int, *, arch: ArchConfig = TINY,
          stub: StubRows | None = None, state: PhysicalState | None = None,
          lanes: list[list[int]] | None = None) -> tuple[list[WindowTiming], PhysicalState, StubRows]:
    """Windows 0 .. n-1 of 1 ms window after window, each from the previous one's state sent through JSON;
    ``lanes``: gets each window's lanes at its end."""
    stub = stub or StubRows()
    plc = default_placement(arch, n_layers=1)
    st = state or PhysicalState()
    out: list[WindowTiming] = []
    for k in range(n):
        _, _, st, t = physicalize_window(k, window(k, reqs), plc, None, st, arch, [1.0] * arch.mesh.n_cores, 1.0,
                                         n_layers=1, serving=sv, microbatches=stub)
        st = PhysicalState.model_validate_json(st.model_dump_json())
        out.append(t)
        if lanes is not None and st.serving is not None:
            lanes.append(list(st.serving.lanes))
    return out, st, stub


def balance(ts: Sequence[WindowTiming]) -> int:
    """Σ_w |error_w| of the token balance (0: it holds in every window)."""
    col = {k: np.array([getattr(t, k) for t in ts]) for k in ("tokens_offered", "tokens_completed",
                                                                "tokens_queued", "tokens_shed")}
    return int(np.abs(token_imbalance(col["tokens_offered"], col["tokens_completed"], col["tokens_queued"],
                                      col["tokens_shed"])).sum())


def seqs(stub: StubRows) -> list[tuple[int, int, list[tuple[int, int, int, bool]]]]:
    """(mb_id, t_ns, [(request, new tokens, context, emits)]) of every micro-batch asked for."""
    return [(b.mb_id, b.t_ns, list(zip(b.seqs.request_id, b.seqs.new_tokens, b.seqs.context, b.seqs.emits,
                                       strict=True))) for b in stub.asked]


def done_of(ts: Sequence[WindowTiming]) -> dict[int, tuple[int, int, int, int]]:
    """Per finished request: (arrival, first token, last token, output tokens), ns."""
    return {r[0]: r[1:] for t in ts for r in t.requests_done.rows()}


# ---- by hand ----------------------------------------------------------------------------------------------------

HAND: list[Req] = [(0, 200_000, 6, 3), (1, 500_000, 2, 2), (2, 1_300_000, 3, 1)]


def test_a_hand_made_trace_by_hand() -> None:
    """Budget 8, chunks of 4, two requests running at most. Window 0: r0, r1 arrive. 1 ms: r0's first chunk (4 of 6)
    and r1's whole prompt (2: its first token). 2 ms: r1's decode (context 2 + 1 - 1 = 2: its last token, it is done)
    and r0's last chunk (its first token); r2 (arrived at 1.3 ms) waits, two run. 3 ms: r0's decode (context 6) and
    r2's prompt (its only token: done). 4 ms: r0's last decode (context 7). Tokens complete at their micro-batch's
    start (no time on the chip)."""
    sv = ServingConfig(duration_ms=10.0, max_batch_tokens=8, prefill_chunk=4, max_running=2, queue_limit=8)
    ts, st, stub = serve(HAND, sv, 6)
    assert seqs(stub) == [
        (0, 1 * MS, [(0, 4, 0, False), (1, 2, 0, True)]),
        (1, 2 * MS, [(1, 1, 2, True), (0, 2, 4, True)]),
        (2, 3 * MS, [(0, 1, 6, True), (2, 3, 0, True)]),
        (3, 4 * MS, [(0, 1, 7, True)]),
    ]
    assert [b.token_offset for b in stub.asked] == [0, 6, 9, 13] and stub.calls == 4
    assert [t.tokens_completed for t in ts] == [0, 1, 2, 2, 1, 0]
    # one sample per token: since the request's previous token, or since its arrival for the first
    assert [t.latencies_ms for t in ts] == [[], [0.5], [1.0, 1.8], [1.0, 1.7], [1.0], []]
    assert done_of(ts) == {1: (500_000, 1 * MS, 2 * MS, 2), 2: (1_300_000, 3 * MS, 3 * MS, 1),
                           0: (200_000, 2 * MS, 4 * MS, 3)}
    ttft = {r: (d[1] - d[0]) / 1e6 for r, d in done_of(ts).items()}
    tpot = {r: (d[2] - d[1]) / 1e6 / (d[3] - 1) for r, d in done_of(ts).items() if d[3] > 1}
    assert ttft == {0: 1.8, 1: 0.5, 2: 1.7} and tpot == {0: 1.0, 1: 1.0}
    assert [(t.requests_arrived, t.tokens_offered) for t in ts] == [(2, 5), (1, 1), (0, 0), (0, 0), (0, 0), (0, 0)]
    assert [(t.requests_waiting, t.requests_running, t.tokens_queued) for t in ts] == [
        (2, 0, 5), (1, 2, 5), (1, 1, 3), (0, 1, 1), (0, 0, 0), (0, 0, 0)]
    assert [t.oldest_inflight_ms for t in ts] == [0.8, 1.8, 1.7, 1.0, 0.0, 0.0]  # r0 at 2 ms, r2 at 3 ms
    assert balance(ts) == 0 and sum(t.tokens_shed for t in ts) == 0 and sum(t.tokens_dropped for t in ts) == 0
    assert st.serving is not None and st.serving.lanes == [-1] and st.serving.next_mb_id == 4
    assert st.serving.token_offset == 14 and not len(st.serving.running) and not len(st.serving.waiting)


# ---- the rules --------------------------------------------------------------------------------------------------

def _trace(n: int, seed: int, per_window: float, w_ns: int = MS, prompt: tuple[int, int] = (1, 40),
           output: tuple[int, int] = (1, 8)) -> list[Req]:
    rng = np.random.default_rng(seed)
    m = int(n * per_window)
    t = np.sort(rng.integers(0, n * w_ns, m))
    p, o = rng.integers(*prompt, m), rng.integers(*output, m)
    return [(i, int(t[i]), int(p[i]), int(o[i])) for i in range(m)]


def test_fcfs_and_the_token_budget() -> None:
    """Micro-batches that take ~2.5 windows: every one within the budget, every chunk within prefill_chunk, decode
    tokens first with context prompt + generated - 1, requests started in arrival order, and the balance holds."""
    reqs = _trace(60, 1, 0.5)
    sv = ServingConfig(duration_ms=60.0, max_batch_tokens=24, prefill_chunk=10, max_running=6, queue_limit=1000)
    ts, _, stub = serve(reqs, sv, 60, stub=StubRows(flops_per_token=1.7e8))
    prompt = {r[0]: r[2] for r in reqs}
    prefilled: dict[int, int] = {}
    generated: dict[int, int] = {}
    for _, _, rows in seqs(stub):
        assert sum(r[1] for r in rows) <= 24 and all(r[1] <= 10 for r in rows)
        kinds = [prefilled.get(r[0], 0) >= prompt[r[0]] for r in rows]
        assert kinds == sorted(kinds, reverse=True)  # decode tokens first
        for rid, new, ctx, emits in rows:
            if prefilled.get(rid, 0) >= prompt[rid]:
                assert (new, ctx, emits) == (1, prompt[rid] + generated[rid] - 1, True)
                generated[rid] += 1
            else:
                assert ctx == prefilled.get(rid, 0) and emits == (ctx + new == prompt[rid])
                prefilled[rid] = ctx + new
                generated[rid] = generated.get(rid, 0) + int(emits)
    started = list(dict.fromkeys(r[0] for _, _, rows in seqs(stub) for r in rows))
    assert started == sorted(started) and len(started) >= 15  # FCFS: request ids are arrival ranks
    assert max(t.requests_running for t in ts) <= 6 and balance(ts) == 0
    assert len(done_of(ts)) >= 10 and max(t.requests_waiting for t in ts) > 0


def test_max_running_bounds_the_requests_started() -> None:
    """With two running at most, a third request waits until one finishes, however much budget is left."""
    reqs: list[Req] = [(0, 0, 3, 4), (1, 10, 3, 4), (2, 20, 3, 1)]
    sv = ServingConfig(duration_ms=10.0, max_batch_tokens=64, prefill_chunk=64, max_running=2, queue_limit=8)
    ts, _, stub = serve(reqs, sv, 8)
    first_seen = {r[0]: t_ns for _, t_ns, rows in reversed(seqs(stub)) for r in rows}
    assert first_seen[0] == first_seen[1] == 1 * MS
    assert first_seen[2] == 5 * MS  # r0 and r1 emit their 4 tokens at 1, 2, 3, 4 ms
    assert [t.requests_running for t in ts[:6]] == [0, 2, 2, 2, 0, 0]
    assert [t.requests_waiting for t in ts[:6]] == [3, 1, 1, 1, 1, 0]
    assert done_of(ts)[2] == (20, 5 * MS, 5 * MS, 1) and balance(ts) == 0


def test_the_queue_limit_sheds_arrivals_and_says_so() -> None:
    """Two may wait: of five arrivals in one window the first two join and three are shed with their tokens; once
    the queue drains (at the next window start) arrivals join again."""
    reqs: list[Req] = [(i, 100 * i, 4, 2 + i) for i in range(5)] + [(5, 1_500_000, 4, 3)]
    sv = ServingConfig(duration_ms=10.0, max_batch_tokens=64, prefill_chunk=64, max_running=64, queue_limit=2)
    ts, _, _ = serve(reqs, sv, 6)
    assert (ts[0].requests_arrived, ts[0].requests_shed, ts[0].tokens_offered, ts[0].tokens_shed) == (5, 3, 20, 15)
    assert (ts[0].requests_waiting, ts[0].tokens_queued) == (2, 5)
    assert (ts[1].requests_arrived, ts[1].requests_shed, ts[1].requests_waiting) == (1, 0, 1)
    assert set(done_of(ts)) == {0, 1, 5} and balance(ts) == 0
    assert sum(t.tokens_completed for t in ts) + sum(t.tokens_shed for t in ts) == sum(r[3] for r in reqs)
    ts0, _, _ = serve(reqs, sv.model_copy(update={"queue_limit": 0}), 3)
    assert [t.requests_shed for t in ts0] == [5, 1, 0] and not sum(t.tokens_completed for t in ts0)


def test_a_lane_freed_inside_a_window_forms_at_the_next_window_start() -> None:
    """Micro-batches of ~1.4 windows: each one is formed at the first window start at or after the one before it
    on its lane completed (its requests' token times), never inside a window."""
    reqs: list[Req] = [(0, 0, 8, 6)]
    sv = ServingConfig(duration_ms=20.0, max_batch_tokens=16, prefill_chunk=16, max_running=4, queue_limit=8)
    ts, _, stub = serve(reqs, sv, 14, stub=StubRows(flops_per_token=SLOW))
    done = done_of(ts)[0]
    starts = [t_ns for _, t_ns, _ in seqs(stub)]
    assert starts[0] == 1 * MS and all(s % MS == 0 for s in starts)
    # each micro-batch emits one token of r0: its finish is that token's time
    gaps = [round(x * 1e6) for w in ts for x in w.latencies_ms][1:]
    finishes = (done[1] + np.cumsum([0, *gaps])).tolist()
    assert len(finishes) == len(starts) == 6 and finishes[-1] == done[2]
    for prev_finish, nxt in zip(finishes[:-1], starts[1:], strict=True):
        assert nxt == -(-prev_finish // MS) * MS  # the first window start >= the finish
        assert nxt - prev_finish < MS
    assert all(f - s > MS for s, f in zip(starts, finishes, strict=True))  # each spans a window boundary
    assert balance(ts) == 0


def test_lanes_with_attention_groups() -> None:
    """Two groups of two cores: two lanes, each with a micro-batch in flight at once; lane l's micro-batches have
    ids = l (mod 2), so they run their attention on group l; a request stays on its lane."""
    reqs = _trace(40, 3, 0.4, output=(2, 6))
    sv = ServingConfig(duration_ms=60.0, max_batch_tokens=16, prefill_chunk=8, max_running=8, queue_limit=64)
    in_flight: list[list[int]] = []
    ts, _, stub = serve(reqs, sv, 60, arch=GROUPS, stub=StubRows(flops_per_token=SLOW), lanes=in_flight)
    lane_of: dict[int, int] = {}
    by_start: dict[int, list[int]] = {}
    for mb, t_ns, rows in seqs(stub):
        lane = mb % 2
        by_start.setdefault(t_ns, []).append(lane)
        for r in rows:
            assert lane_of.setdefault(r[0], lane) == lane
    att, _ = attention_cores(np.array([0, 1]), GROUPS)
    assert att.tolist() == [[0, 1], [2, 3]]
    assert all(lane < 0 or lane % 2 == i for lanes in in_flight for i, lane in enumerate(lanes))
    assert sum(min(lanes) >= 0 for lanes in in_flight) > 5  # both lanes busy at a window's end
    assert all(len(v) == len(set(v)) for v in by_start.values())  # a lane forms one micro-batch at a time
    assert set(lane_of.values()) == {0, 1} and max(t.open_mbs for t in ts) <= 2
    assert balance(ts) == 0 and len(done_of(ts)) > 5 and sum(t.tokens_dropped for t in ts) == 0


def test_the_state_is_columns_that_round_trip_exactly() -> None:
    """Mid-run (requests waiting, running and in flight), the state through JSON gives the same next windows as the
    state kept in memory, and a fixed-arrival state has no serving key at all."""
    sv = ServingConfig(duration_ms=10.0, max_batch_tokens=8, prefill_chunk=4, max_running=2, queue_limit=8)
    plc = default_placement(TINY, n_layers=1)
    stub = StubRows(flops_per_token=SLOW)
    st = PhysicalState()
    for k in range(4):
        _, _, st, _ = physicalize_window(k, window(k, HAND), plc, None, st, TINY, [1.0] * 4, 1.0, n_layers=1,
                                         serving=sv, microbatches=stub)
    assert st.serving is not None and any(st.serving.running.in_flight) and len(st.serving.batches)
    again = PhysicalState.model_validate_json(st.model_dump_json())
    assert again.model_dump_json() == st.model_dump_json()
    a = physicalize_window(4, window(4, HAND), plc, None, st, TINY, [1.0] * 4, 1.0, n_layers=1, serving=sv,
                           microbatches=StubRows(flops_per_token=SLOW))
    b = physicalize_window(4, window(4, HAND), plc, None, again, TINY, [1.0] * 4, 1.0, n_layers=1, serving=sv,
                           microbatches=StubRows(flops_per_token=SLOW))
    assert [x.model_dump_json() for x in a] == [x.model_dump_json() for x in b]
    assert "serving" not in PhysicalState().model_dump_json()


def test_bad_input_is_named() -> None:
    sv = ServingConfig(duration_ms=10.0)
    plc = default_placement(TINY, n_layers=1)
    f = [1.0] * 4

    def run(lw: LogicalWindow, **kw: Any) -> None:
        args: dict[str, Any] = {"n_layers": 1, "serving": sv, "microbatches": StubRows(), **kw}
        physicalize_window(lw.window, lw, plc, None, kw.pop("state", PhysicalState()), TINY, f, 1.0,
                           **{k: v for k, v in args.items() if k != "state"})

    with pytest.raises(BadInput) as ei:
        run(window(0, HAND), n_layers=None)
    assert ei.value.field == "n_layers"
    rows = window(0, HAND).model_copy(update={"compute": LogicalCompute(
        event_id=[0], t_gen_ns=[0], mb_id=[0], layer=[0], op_type=["dense"], expert=[-1], tokens=[1], flops=[0.0])})
    with pytest.raises(BadInput) as ei:
        run(rows)
    assert ei.value.field == "logical.compute"
    late = window(0, [(0, 1_200_000, 4, 2)])
    late = late.model_copy(update={"requests": Requests(request_id=[0], t_arrival_ns=[1_200_000], prompt_tokens=[4],
                                                        output_tokens=[2])})
    with pytest.raises(BadInput) as ei:
        run(late)
    assert ei.value.field == "logical.requests.t_arrival_ns[0]"
    twice = window(0, [(7, 10, 4, 2), (7, 20, 4, 2)])
    with pytest.raises(BadInput) as ei:
        run(twice)
    assert ei.value.field == "logical.requests.request_id[1]"
    _, st, _ = serve(HAND, sv, 1)
    with pytest.raises(BadInput) as ei:  # a serving state without serving
        physicalize_window(1, window(1, HAND), plc, None, st, TINY, f, 1.0, n_layers=1)
    assert ei.value.field == "state.serving"
    bad = st.model_copy(deep=True)
    assert bad.serving is not None
    bad.serving.lanes = [-1, -1]
    with pytest.raises(BadInput) as ei:
        run(window(1, HAND), state=bad)
    assert ei.value.field == "state.serving.lanes"


# ---- the workload service's rows, over HTTP -----------------------------------------------------------------------

def test_the_endpoint_serves_with_the_workload_services_rows(settings: Settings) -> None:
    """``POST /v1/physicalize/epoch`` with ``serving``: the lowering app asks its workload peer for the rows (the
    same answer as the workload function passed directly), and the windows balance."""
    cfg = WorkloadConfig.model_validate({"model": "mixtral-8x7b", "sequence": {"micro_batch": 8}, "serving": {
        "duration_ms": 60.0, "rate_rps": 400.0, "max_batch_tokens": 64, "prefill_chunk": 32, "max_running": 8,
        "queue_limit": 4}})
    apps = {"workload": workload_app(settings), "lowering": lowering_app(settings)}
    clients = ServiceClients(settings, asgi_apps=apps)
    wire_peers(apps, clients)
    try:
        wl, low = TestClient(apps["workload"]), TestClient(apps["lowering"])
        summary = wl.post("/v1/traces", json={"workload": cfg.model_dump(mode="json"), "window_ms": 3.0}).json()
        wins = wl.get(f"/v1/traces/{summary['trace_id']}/windows", params={"start": 0, "count": 20}).json()["windows"]
        plc = default_placement(ArchConfig(), n_layers=summary["n_layers"], n_experts=summary["n_experts"])
        body = {"window": 0, "logical": wins, "placement": plc.model_dump(mode="json"), "window_ms": 3.0,
                "n_layers": summary["n_layers"], "serving": cfg.serving.model_dump(mode="json") if cfg.serving
                else None, "events": False}
        r = low.post("/v1/physicalize/epoch", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        ts = [WindowTiming.model_validate(w["timing"]) for w in out["windows"]]
        assert sum(t.requests_arrived for t in ts) > 4 and sum(t.requests_shed for t in ts) > 0
        assert out["state"]["serving"]["next_mb_id"] >= 1 and balance(ts) == 0
        # the same windows with the workload function passed directly
        from services.lowering.epoch import physicalize_epoch
        from shared.contracts.events import PhysicalizeEpochRequest

        cache = wsvc.TraceCache(2)
        wsvc.create_trace(cache, WorkloadSources.packaged(), cfg, 3.0)
        direct = physicalize_epoch(PhysicalizeEpochRequest.model_validate(body),
                                   microbatches=lambda tid, b: wsvc.microbatch_rows(cache.get(tid), list(b)))
        assert [w.timing.model_dump(mode="json") for w in direct.windows] == [w["timing"] for w in out["windows"]]
        body["logical"] = [{**w, "trace_id": "0" * 64} for w in wins]  # a trace the workload service does not know
        r = low.post("/v1/physicalize/epoch", json=body)
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_trace", r.text
    finally:
        close_peers(apps)
