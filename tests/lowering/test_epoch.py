"""Control epochs (``POST /v1/physicalize/epoch``): N windows in one call answer, byte for byte, what ``physicalize``
called window after window answers (each call with the previous answer's state sent back as JSON, the overlays only
at the first window), whatever N: every window's events, deposit and timing, and the last state.

The windows are the workload service's (its trace of the shipped Mixtral workloads: one micro-batch every 300 ms, and
the saturated one where admission sheds and queues build), on the default chip and placement, with a TACS step's
migrate and reroute overlay at the first window (scripts/lowering_epoch_check.py builds them: the same script
compares a checkout's windows with another's). The serving references (``serving``, and ``serving-groups`` with
four pipeline lanes under ``attention: group``) serve a seeded request trace with the continuous-batching scheduler:
micro-batches formed from requests, their rows from the workload service's function, a full queue shedding,
requests finishing; their state carries the scheduler's queue, running requests, lanes and micro-batches in flight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from scripts.lowering_epoch_check import ROOT as REPO
from scripts.lowering_epoch_check import scenario, tacs_overlays
from services.lowering import service
from services.lowering.app import create_app
from services.lowering.epoch import physicalize_epoch
from services.lowering.synthetic import default_placement, synthetic_window
from services.workload import service as wsvc
from services.workload.sources import WorkloadSources
from shared.configs import WorkloadConfig, load_arch
from shared.configs.arch import ArchConfig
from shared.contracts.events import (
    PhysicalizeEpochRequest,
    PhysicalizeEpochResponse,
    PhysicalizeRequest,
    PhysicalState,
)
from shared.contracts.placement import Overlays
from shared.contracts.workload import LogicalCompute, LogicalMemory, LogicalWindow, Requests
from shared.errors import BadInput
from shared.limits import MAX_EPOCH_WINDOWS
from shared.settings import Settings

SIZES = (1, 2, 5, 64)
# a mid-run start, a micro-batch in flight: its epoch of 64 completes it
MID = {"default": 40, "saturated": 30, "serving": 40, "serving-groups": 40, "serving-striped": 42}
W_NS = 3_000_000
# a small Mixtral-shaped model: its micro-batches take about one window on the 8 x 8 chip, so many of them form,
# span window boundaries and complete within a reference run
SMALL_MOE = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 2048,
             "intermediate_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
             "head_dim": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 1000,
             "max_position_embeddings": 4096, "tie_word_embeddings": False}


def serving_scenario(name: str, n_windows: int) -> dict[str, Any]:
    """``scenario``'s keys for a served run of ``n_windows`` windows: one request a window on average (seeded
    arrivals, prompts of 8-299 tokens, 1-23 output tokens), a budget of 256 tokens in chunks of 128, 8 running and
    6 waiting at most; ``serving-groups``: attention on groups of 16 cores, four lanes; ``serving-striped``: every
    routed expert striped over 2 cores (its pieces do not depend on the queues, so an epoch takes a waiting
    micro-batch's lowering from the rows lowered in an earlier window while the queues move)."""
    from services.placement.default import default_placement as plc_of
    from shared.dvfs import top_freqs

    cfg = WorkloadConfig.model_validate({
        "model": {"config": SMALL_MOE, "name": "small-moe"}, "sequence": {"micro_batch": 8},
        "serving": {"duration_ms": 3.0 * n_windows, "max_batch_tokens": 256, "max_running": 8, "queue_limit": 6,
                    "prefill_chunk": 128}})
    arch = load_arch(REPO / "configs" / "arch_8x8_32x32x8.yaml")
    if name == "serving-groups":
        arch = arch.model_copy(update={"schedule": arch.schedule.model_copy(update={"attention": "group",
                                                                                    "group_cores": 16})})
    if name == "serving-striped":
        arch = arch.model_copy(update={"schedule": arch.schedule.model_copy(update={"expert_stripe": 2})})
    cache = wsvc.TraceCache(2)
    summary = wsvc.create_trace(cache, WorkloadSources.packaged(), cfg, 3.0)
    placement = plc_of(arch, summary.moe_layers, summary.n_experts, cfg.tensors.weight_shard_mb, summary.expert_bytes)
    rng = np.random.default_rng(7)
    t = np.sort(rng.integers(0, n_windows * W_NS, n_windows))
    prompt, output = rng.integers(8, 300, n_windows), rng.integers(1, 24, n_windows)
    windows = []
    for k in range(n_windows):
        i = np.flatnonzero((t >= k * W_NS) & (t < (k + 1) * W_NS))
        windows.append(LogicalWindow(
            trace_id=summary.trace_id, window=k, t0_ns=k * W_NS, t1_ns=(k + 1) * W_NS,
            compute=LogicalCompute.empty(), memory=LogicalMemory.empty(),
            requests=Requests(request_id=i.tolist(), t_arrival_ns=t[i].tolist(), prompt_tokens=prompt[i].tolist(),
                              output_tokens=output[i].tolist())))
    overlays, replicas = tacs_overlays(placement, arch, 0)
    return {"arch": arch, "placement": placement, "windows": windows, "n_layers": summary.n_layers,
            "freq": top_freqs(arch), "overlays": overlays, "replicas": replicas, "serving": cfg.serving,
            "microbatches": lambda tid, b: wsvc.microbatch_rows(cache.get(tid), list(b))}


@dataclass
class Reference:
    """``physicalize`` window after window from a fresh state (TACS's overlays at window 0): per window, the JSON of
    its events, deposit and timing, and of the state after it."""

    name: str
    sc: dict[str, Any]
    windows: list[tuple[str, str, str, str]]
    states: list[str]


def _sequential(name: str, sc: dict[str, Any], n: int) -> Reference:
    windows: list[tuple[str, str, str, str]] = []
    states: list[str] = []
    state_json: str | None = None
    for k, lw in enumerate(sc["windows"][:n]):
        req = PhysicalizeRequest(
            window=lw.window, logical=lw, placement=sc["placement"], arch=sc["arch"],
            overlays=sc["overlays"] if k == 0 else Overlays(), replicas=sc["replicas"] if k == 0 else None,
            state=PhysicalState.model_validate_json(state_json) if state_json is not None else None,
            freq_ghz=sc["freq"], window_ms=3.0, bw_eff_factor=1.0, n_layers=sc["n_layers"],
            serving=sc.get("serving"))
        r = service.physicalize(req, microbatches=sc.get("microbatches"))
        assert r.compute is not None and r.memory is not None and r.deposit is not None and r.state is not None
        windows.append((r.compute.model_dump_json(), r.memory.model_dump_json(), r.deposit.model_dump_json(),
                        r.timing.model_dump_json()))
        state_json = r.state.model_dump_json()
        states.append(state_json)
    return Reference(name=name, sc=sc, windows=windows, states=states)


@pytest.fixture(scope="module", params=["default", "saturated", "serving", "serving-groups", "serving-striped"])
def ref(request: pytest.FixtureRequest) -> Reference:
    name = request.param
    n = MID[name] + max(SIZES)
    sc = serving_scenario(name, n) if name.startswith("serving") else scenario(name, n)
    return _sequential(name, sc, MID[name] + max(SIZES))


def _epoch(ref: Reference, start: int, size: int, **kw: Any) -> PhysicalizeEpochResponse:
    sc = ref.sc
    fresh = start == 0
    req = PhysicalizeEpochRequest(
        window=start, logical=sc["windows"][start:start + size], placement=sc["placement"], arch=sc["arch"],
        overlays=sc["overlays"] if fresh else Overlays(), replicas=sc["replicas"] if fresh else None,
        state=None if fresh else PhysicalState.model_validate_json(ref.states[start - 1]),
        freq_ghz=sc["freq"], window_ms=3.0, bw_eff_factor=1.0, n_layers=sc["n_layers"], serving=sc.get("serving"),
        **kw)
    return physicalize_epoch(req, microbatches=sc.get("microbatches"))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("where", ["fresh", "mid-run"])
def test_an_epoch_is_the_windows_one_by_one_byte_for_byte(ref: Reference, where: str, size: int) -> None:
    start = 0 if where == "fresh" else MID[ref.name]
    out = _epoch(ref, start, size)
    assert len(out.windows) == size
    for i, w in enumerate(out.windows):
        assert w.compute is not None and w.memory is not None
        got = (w.compute.model_dump_json(), w.memory.model_dump_json(), w.deposit.model_dump_json(),
               w.timing.model_dump_json())
        assert got == ref.windows[start + i], f"window {start + i}"
    assert out.state is not None
    assert out.state.model_dump_json() == ref.states[start + size - 1]


def test_the_references_cover_what_they_claim(ref: Reference) -> None:
    """The runs above migrate at the first window, carry running and open work across windows, complete
    micro-batches, and (saturated) shed arrivals."""
    import json

    timings = [json.loads(w[3]) for w in ref.windows]
    assert timings[0]["migrations"] == 1
    assert any(t["tokens_completed"] for t in timings)
    states = [json.loads(s) for s in ref.states]
    if not ref.name.startswith("serving"):
        assert all(s["queue"]["running_memory"]["bank"] for s in states[:10])
        assert states[0]["queue"]["reroutes"]  # the reroute rules outlive their window
    assert any(s["queue"]["open_compute"]["event_id"] for s in states)
    if ref.name == "saturated":
        assert sum(t["tokens_dropped"] for t in timings) > 0
    if ref.name.startswith("serving"):
        sv = [s["serving"] for s in states]
        mid = sv[MID[ref.name] - 1]
        assert any(x >= 0 for x in mid["lanes"]) and mid["batches"]["mb_id"] and mid["waiting"]["request_id"]
        if ref.name == "serving-striped":
            assert {ep.policy for ep in ref.sc["placement"].experts.values()} == {"stripe"}
        lanes = 4 if ref.name == "serving-groups" else 1
        assert all(len(s["lanes"]) == lanes for s in sv)
        assert lanes == 1 or max(sum(x >= 0 for x in s["lanes"]) for s in sv) >= 2
        assert sum(len(t["requests_done"]["request_id"]) for t in timings) >= 5
        assert sum(t["requests_shed"] for t in timings) > 0 and not sum(t["tokens_dropped"] for t in timings)
        queued = np.array([t["tokens_queued"] for t in timings])
        flow = np.cumsum([t["tokens_offered"] - t["tokens_completed"] - t["tokens_shed"] for t in timings])
        assert np.array_equal(queued, flow)  # the token balance, window by window


def test_a_striped_epoch_reuses_expert_rows_lowered_under_other_queues(ref: Reference,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The striped reference's mid-run epoch takes expert rows from a base lowered in an earlier window, under other
    queues (the test above checks it gives the bytes of window after window)."""
    if ref.name != "serving-striped":
        pytest.skip("the striped reference's claim")
    import services.lowering.physical.lookahead as la

    mapped_with: dict[int, np.ndarray] = {}  # id of a lowering -> the queues it was lowered under
    reused: list[bool] = []
    lower_rows, from_base = la._lower_rows, la.LookaheadCache.from_base

    def lowering(*args: Any) -> la.LoweredRows:
        out = lower_rows(*args)
        mapped_with[id(out)] = args[8].copy()  # its backlog
        return out

    def taking(cache: la.LookaheadCache, event_ids: np.ndarray, backlog: np.ndarray) -> la.LoweredRows | None:
        got = from_base(cache, event_ids, backlog)
        if got is not None and cache.base is not None and got.rows.is_expert.any():
            reused.append(not np.array_equal(mapped_with[id(cache.base)], backlog))
        return got

    monkeypatch.setattr(la, "_lower_rows", lowering)
    monkeypatch.setattr(la.LookaheadCache, "from_base", taking)
    _epoch(ref, MID[ref.name], max(SIZES))
    assert any(reused)


def test_an_epoch_without_events_or_state_answers_the_same_deposits(ref: Reference) -> None:
    out = _epoch(ref, 0, 5, events=False, return_state=False)
    assert out.state is None
    for i, w in enumerate(out.windows):
        assert w.compute is None and w.memory is None
        assert (w.deposit.model_dump_json(), w.timing.model_dump_json()) == ref.windows[i][2:]


def test_a_bad_field_is_named_with_its_window() -> None:
    arch = ArchConfig()
    plc = default_placement(arch, n_layers=2)
    wins = [synthetic_window(k, n_layers=2, micro_batch=8, context=256) for k in range(5)]
    bad = wins[3].model_copy(deep=True)
    bad.compute.tokens[0] = -1
    req = PhysicalizeEpochRequest(window=0, logical=[*wins[:3], bad, wins[4]], placement=plc, window_ms=3.0,
                                  n_layers=2)
    with pytest.raises(BadInput) as ei:
        physicalize_epoch(req)
    assert ei.value.field == "logical[3].compute.tokens[0]"
    req = PhysicalizeEpochRequest(window=0, logical=wins, placement=plc, window_ms=3.0, freq_ghz=[1.0])
    with pytest.raises(BadInput) as ei:
        physicalize_epoch(req)
    assert ei.value.field == "freq_ghz"


def _client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


def test_the_endpoint_answers_the_windows_of_physicalize(settings: Settings) -> None:
    """Through the HTTP app: the epoch's windows and state are the answers of ``/v1/physicalize`` window after window
    (the previous answer's state sent back), with the placement by its registered hash."""
    c = _client(settings)
    arch = ArchConfig()
    plc = default_placement(arch, n_layers=2).model_dump(mode="json")
    wins = [synthetic_window(k, n_layers=2, micro_batch=8, context=256, window_ms=0.5).model_dump(mode="json")
            for k in range(6)]
    key = c.post("/v1/registry/placements", json=plc).json()["hash"]
    common = {"placement_hash": key, "window_ms": 0.5, "n_layers": 2}
    seq: list[dict[str, Any]] = []
    state = None
    for k, lw in enumerate(wins):
        r = c.post("/v1/physicalize", json={**common, "window": k, "logical": lw, "state": state})
        assert r.status_code == 200, r.text
        seq.append(r.json())
        state = seq[-1]["state"]
    r = c.post("/v1/physicalize/epoch", json={**common, "window": 0, "logical": wins})
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"windows", "state"} and len(out["windows"]) == len(wins)
    for got, want in zip(out["windows"], seq, strict=True):
        assert set(got) == {"compute", "memory", "deposit", "timing"}
        assert all(got[k] == want[k] for k in got)
    assert out["state"] == seq[-1]["state"]
    assert any(len(w["memory"]["evt_id"]) for w in out["windows"][1:])  # work carried across windows
    # deposit only, no state: only those keys
    r = c.post("/v1/physicalize/epoch", json={**common, "window": 0, "logical": wins[:2], "events": False,
                                              "return_state": False})
    assert r.status_code == 200 and set(r.json()) == {"windows"}
    assert [set(w) for w in r.json()["windows"]] == [{"deposit", "timing"}] * 2


def test_the_endpoint_names_bad_fields_and_bounds(settings: Settings) -> None:
    c = _client(settings)
    plc = default_placement(ArchConfig(), n_layers=2).model_dump(mode="json")
    wins = [synthetic_window(k, n_layers=2, micro_batch=8, context=256).model_dump(mode="json") for k in range(3)]
    wins[2]["compute"]["flops"][1] = -1.0
    r = c.post("/v1/physicalize/epoch", json={"window": 0, "logical": wins, "placement": plc, "window_ms": 3.0})
    assert r.status_code == 422 and r.json()["error"]["field"] == "logical[2].compute.flops[1]", r.text
    r = c.post("/v1/physicalize/epoch", json={"window": 0, "logical": wins, "placement_hash": "0" * 64,
                                              "window_ms": 3.0})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_placement"
    empty = {"trace_id": "t", "window": 0, "t0_ns": 0, "t1_ns": 1,
             "compute": {k: [] for k in wins[0]["compute"]}, "memory": {k: [] for k in wins[0]["memory"]}}
    for n in (0, MAX_EPOCH_WINDOWS + 1):
        r = c.post("/v1/physicalize/epoch", json={"window": 0, "logical": [empty] * n, "placement": plc,
                                                  "window_ms": 3.0})
        assert r.status_code == 422 and r.json()["error"]["field"].startswith("logical"), r.text
