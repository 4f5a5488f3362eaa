"""What the dashboard reads (embedded mode, fake compute services): the decimated series, keeping each peak at its
window; window pages of chosen fields; the expert map with TACS's moves; live frames on the event stream; the
Chrome trace (and its 409 when a run kept no events); the config presets; link tokens under TASMOE_AUTH=keys."""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.orchestrator import chrome_trace, series
from services.orchestrator.app import create_app
from shared.auth import KeyStore
from shared.client import ServiceClients
from shared.configs import load_arch
from shared.link_tokens import LinkTokens
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator import fakes
from tests.orchestrator.conftest import SMALL_WL

LONGER_WL: dict[str, Any] = {"model": "mixtral-8x7b", "sequence": {"steps": 40, "micro_batch": 4}}
HOT_TAS: dict[str, Any] = {"tacs": {"thresholds": {"Thot": 46.0, "Temg": 90.0}, "min_residency_ms": 0.0}}


def _wait(api: TestClient, exp_id: str, headers: dict[str, str] | None = None,
          timeout: float = 60.0) -> dict[str, Any]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        view: dict[str, Any] = api.get(f"/v1/experiments/{exp_id}", headers=headers).json()
        if view["status"] in {"succeeded", "failed", "cancelled"}:
            return view
        time.sleep(0.05)
    raise AssertionError(f"experiment {exp_id} did not finish in {timeout} s")


def _events(api: TestClient, url: str, **params: Any) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    event = ""
    with api.stream("GET", url, params=params) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                out.append((event, json.loads(line[6:])))
    return out


def test_the_series_is_decimated_and_keeps_each_peak_at_its_window(api: TestClient) -> None:
    exp = api.post("/v1/experiments", json={"workload": LONGER_WL, "scenarios": ["baseline", "tacs"],
                                            "tas": HOT_TAS}).json()["id"]
    assert _wait(api, exp)["status"] == "succeeded"
    windows = api.get(f"/v1/experiments/{exp}/windows", params={"scenario": "tacs"}).json()["scenarios"]["tacs"]
    n = len(windows)
    assert n > 8
    got = api.get(f"/v1/experiments/{exp}/series", params={"points": 4}).json()
    assert got["chip"]["mesh"] == [8, 8] and got["chip"]["thot_c"] == 46.0 and got["chip"]["refresh_step_c"] == 85.0
    tacs = got["scenarios"]["tacs"]
    p = tacs["points"]
    assert tacs["n"] == n and tacs["stride"] * 4 >= n and len(p["w0"]) <= 4
    assert p["w0"][0] == 0 and p["w1"][-1] == n - 1  # the buckets cover every window, in order
    assert all(b == a + tacs["stride"] for a, b in itertools.pairwise(p["w0"]))
    peaks = [w["T_peak_logic"] for w in windows]
    best = max(range(n), key=peaks.__getitem__)
    i = max(range(len(p["T_peak_logic"])), key=p["T_peak_logic"].__getitem__)
    assert p["T_peak_logic"][i] == pytest.approx(peaks[best], abs=1e-4) and p["T_peak_logic_w"][i] == best
    row = next(r for r in api.get(f"/v1/experiments/{exp}/results").json()["rows"] if r["scenario"] == "tacs")
    assert row["T_peak_logic"] == pytest.approx(p["T_peak_logic"][i], abs=1e-4)  # the CSV's peak, the series' one
    assert sum(p["tokens"]) == sum(w["tokens_completed"] for w in windows)
    assert sum(p["migrations"]) == sum(w["migrations"] for w in windows) == row["migrations"] > 0
    scale = got["scale"]
    cells = [t for w in windows for t in w["temps_core_c"] + [x for v in w["temps_bank_c"] for x in v]]
    assert scale["lo"] <= min(cells) and max(cells) <= scale["hi"] and scale["hi"] - scale["lo"] >= 10
    one = api.get(f"/v1/experiments/{exp}/series", params={"scenario": "tacs", "points": 1000, "start": 2,
                                                          "stop": 5}).json()["scenarios"]
    assert list(one) == ["tacs"] and one["tacs"]["points"]["w0"] == [2, 3, 4] and one["tacs"]["stride"] == 1
    assert api.get(f"/v1/experiments/{exp}/series", params={"points": 5000}).status_code == 422
    # a replay's heat maps: a page of chosen fields only
    page = api.get(f"/v1/experiments/{exp}/windows", params={"offset": 3, "limit": 1,
                                                             "fields": "temps_core_c,T_peak_logic"}).json()
    assert set(page["scenarios"]["tacs"][0]) == {"window", "temps_core_c", "T_peak_logic"}
    bad = api.get(f"/v1/experiments/{exp}/windows", params={"fields": "temps_core_c,nope"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "fields" and "nope" in bad.text

    # the expert map: TACS's migrations applied up to the window asked, its moves listed with their windows
    moves = series.moves(Path(api.get(f"/v1/experiments/{exp}").json()["out_dir"]) / "runs" / "tacs",
                         load_arch(CONFIGS / "arch_8x8_32x32x8.yaml"), 3.0, n)
    migrations = [m for m in moves if m["kind"] == "migrate"]
    assert migrations
    first = migrations[0]
    before = api.get(f"/v1/experiments/{exp}/map", params={"scenario": "tacs", "window": first["window"] - 1}).json()
    after = api.get(f"/v1/experiments/{exp}/map", params={"scenario": "tacs", "window": first["window"],
                                                           "span": 1}).json()
    assert first["obj"] in before["experts"][first["from"]] and first["obj"] not in before["experts"][first["to"]]
    assert first["obj"] in after["experts"][first["to"]] and first["obj"] not in after["experts"][first["from"]]
    assert first in after["moves"] and all(m["window"] == first["window"] for m in after["moves"])
    assert sum(len(e) for e in after["experts"]) == sum(len(e) for e in before["experts"])


def test_the_stream_sends_frames_that_add_up_to_the_run(api: TestClient) -> None:
    exp = api.post("/v1/experiments", json={"workload": LONGER_WL, "scenarios": ["tacs"], "tas": HOT_TAS}).json()["id"]
    events = _events(api, f"/v1/experiments/{exp}/events", frames=True, since="tacs:0", poll_s=0.05)
    frames = [d for e, d in events if e == "frame"]
    assert events[-1][0] == "done" and frames
    last = frames[-1]
    n = last["committed"]
    assert last["window"] == n - 1 and len(last["temps_core_c"]) == 64 and len(last["temps_bank_c"]) == 64
    buckets = [f["summary"] for f in frames if f["summary"]]
    assert buckets[0]["w0"] == 0 and buckets[-1]["w1"] == n - 1
    assert all(b["w0"] == a["w1"] + 1 for a, b in itertools.pairwise(buckets))  # contiguous, no gap
    windows = api.get(f"/v1/experiments/{exp}/windows").json()["scenarios"]["tacs"]
    assert max(b["T_peak_logic"] for b in buckets) == pytest.approx(max(w["T_peak_logic"] for w in windows), abs=1e-4)
    moved = [m for f in frames for m in f["moves"]]
    assert len([m for m in moved if m["kind"] == "migrate"]) == sum(w["migrations"] for w in windows) > 0
    assert last["temps_core_c"] == [round(t, 2) for t in windows[-1]["temps_core_c"]]
    # without since: the newest maps first, no bucket; a bad cursor names the parameter
    frames = [d for e, d in _events(api, f"/v1/experiments/{exp}/events", frames=True) if e == "frame"]
    assert len(frames) == 1 and frames[0]["summary"] is None and frames[0]["window"] == n - 1
    bad = api.get(f"/v1/experiments/{exp}/events", params={"frames": True, "since": "tacs:x"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "since"


def test_the_trace_needs_the_runs_events(api: TestClient) -> None:
    plain = api.post("/v1/experiments", json={"workload": SMALL_WL, "scenarios": ["tas"]}).json()["id"]
    kept = api.post("/v1/experiments", json={"workload": SMALL_WL, "scenarios": ["tas"], "events": True}).json()["id"]
    assert _wait(api, plain)["status"] == _wait(api, kept)["status"] == "succeeded"
    r = api.get(f"/v1/experiments/{plain}/trace", params={"scenario": "tas"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "no_events"
    assert '"events": true' in r.json()["error"]["message"]
    r = api.get(f"/v1/experiments/{kept}/trace", params={"scenario": "tas", "start": 1, "count": 2})
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    trace = r.json()
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert xs and all(1 * 3000 <= e["ts"] < 3 * 3000 and e["dur"] >= 0 for e in xs)  # µs: windows 1 and 2
    assert {e["pid"] for e in xs} <= {1, 2, 3} and any(e["cat"] == "compute" for e in xs)
    names = {(e["pid"], e.get("tid")) for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in xs} <= names  # every track is named
    assert trace["otherData"]["windows"] == [1, 2] and not trace["otherData"]["truncated"]
    assert api.get(f"/v1/experiments/{kept}/trace", params={"scenario": "tas", "count": 51}).status_code == 422
    assert api.get(f"/v1/experiments/{kept}/trace", params={"scenario": "tas", "start": 99}).status_code == 404
    assert api.get(f"/v1/experiments/{kept}/trace", params={"scenario": "baseline"}).status_code == 404


def _gz_members(path: Path, header: str, windows: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(gzip.compress(t.encode(), mtime=0) for t in [header, *windows]))


def test_chrome_trace_reads_only_the_windows_asked(tmp_path: Path) -> None:
    """Member by member: a window's events come from its own gzip member; durations at the window's clock."""
    arch = load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")
    run = tmp_path / "runs" / "tas"
    ce = "evt_id,t_start_ns,core_id,duration_cycles,flops,op,dvfs_domain,power_hint,energy_j\n"
    me = "evt_id,t_start_ns,src_core,dst_bank,bytes,rw,hops,noc_qos\n"
    _gz_members(run / chrome_trace.COMPUTE_FILE, ce, [
        f"{k},{k * 3_000_000 + 10},{k},2000,1.0,fc,d0,0.1,0.001\n" for k in range(6)])
    _gz_members(run / chrome_trace.MEMORY_FILE, me, [
        f"{100 + k},{k * 3_000_000 + 20},{k},\"B(5,9,2)\",64000,r,1,normal\n"
        f"{200 + k},{k * 3_000_000 + 30},{k},,2048,w,2,dispatch\n" for k in range(6)])
    metrics = [{"window": k, "t_start_ms": 3.0 * k, "dt_ms": 3.0, "T_peak_logic": 50.0 + k, "T_peak_dram": 49.0,
                "power_w": 10.0, "freq_ghz": [1.0 if k == 3 else 2.0] * 64} for k in range(6)]
    (run / "windows.jsonl.gz").write_bytes(b"".join(gzip.compress(json.dumps(m).encode() + b"\n", mtime=0)
                                                    for m in metrics))
    offsets, at = [], 0
    for m in metrics:
        offsets.append(at.to_bytes(8, "little"))
        at += len(gzip.compress(json.dumps(m).encode() + b"\n", mtime=0))
    (run / "windows.idx").write_bytes(b"".join(offsets))
    trace = chrome_trace.chrome_trace(run, arch, 3.0, 2, 2, "x")
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["args"]["evt_id"] for e in xs) == [2, 3, 102, 103, 202, 203]
    compute = {e["args"]["evt_id"]: e for e in xs if e["cat"] == "compute"}
    assert compute[2]["dur"] == pytest.approx(1.0)  # µs: 2000 cycles at 2 GHz
    assert compute[3]["dur"] == pytest.approx(2.0)  # ... and at 1 GHz in window 3
    vault = next(e for e in xs if e["cat"] == "memory")
    bpx, bpy = arch.dram.banks[0] // 8, arch.dram.banks[1] // 8
    assert vault["tid"] == (9 // bpy) * 8 + 5 // bpx  # B(5,9,·): its vault's core
    assert vault["dur"] == pytest.approx(64000 / arch.dram.vault_bw_gbps / 1e3)
    assert next(e for e in xs if e["cat"] == "noc")["pid"] == 3
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert [e["args"]["logic"] for e in counters if "logic" in e["args"]] == [52.0, 53.0]


def test_the_expert_map_follows_migrations_of_experts_and_shards(tmp_path: Path) -> None:
    arch = load_arch(CONFIGS / "arch_seed.yaml")  # 32 x 32 banks: B(x,y,·) lies in the vault of core (y//4)·8 + x//4
    run = tmp_path / "run"
    (run / "mapping").mkdir(parents=True)
    (run / "runtime").mkdir()
    (run / "mapping" / "placement.json").write_text(json.dumps({
        "experts": {"L0E0": {"cores": [27]}, "L0E1": {"cores": [27, 5]}, "L0E2": {"cores": [0]}},
        "tensors": {"W_L0E0_0": {"dram_bank": "B(12,12,0)"}, "W_L0E0_1": {"dram_bank": "B(13,12,1)"}}}))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerows([["t_apply_ns", "obj_type", "obj_id", "src", "dst", "size_bytes", "cost"],
                 [6_000_000, "expert", "L0E0", "27", "63", 0, 1.0],
                 [6_000_000, "weight", "W_L0E0_0", "B(12,12,0)", "B(28,28,0)", 64, 1.0],
                 [9_000_000, "expert", "L0E1", "27", "36", 0, 1.0]])
    (run / "runtime" / "overlay_migrate.csv").write_text(buf.getvalue())
    (run / "runtime" / "overlay_reroute.csv").write_text(
        "t_apply_ns,scope,from_core,to_core,mb_ids_json,reason,expected_gain\n"
        '9000000,expert,1,2,"[""L0E2""]",hot_core,0.5\n')
    at1 = series.expert_map(run, arch, 3.0, 1, 20, committed=10)
    assert at1["experts"][27] == ["L0E0", "L0E1"] and at1["shards"][27] == 2 and at1["moves"] == []
    at2 = series.expert_map(run, arch, 3.0, 2, 20, committed=10)
    assert at2["experts"][63] == ["L0E0"] and at2["experts"][27] == ["L0E1"]
    assert at2["shards"][27] == 1 and at2["shards"][63] == 1
    assert [m["kind"] for m in at2["moves"]] == ["migrate", "shard"] and at2["moves"][1]["to"] == 63
    at3 = series.expert_map(run, arch, 3.0, 3, 1, committed=10)
    assert at3["experts"][36] == ["L0E1"] and at3["experts"][5] == ["L0E1"]  # a replica's copy moved, the other kept
    assert [(m["kind"], m["from"], m["to"]) for m in at3["moves"]] == [("migrate", 27, 36), ("reroute", 1, 2)]
    assert at3["moves_total"] == 4
    assert series.expert_map(run, arch, 3.0, 3, 20, committed=3)["moves_total"] == 2  # window 3 not committed


def test_config_presets(api: TestClient) -> None:
    got = api.get("/v1/configs").json()
    assert "workload_quick.yaml" in got["configs"]["workload"] and "arch_seed.yaml" in got["configs"]["arch"]
    assert got["configs"]["tas"] == ["tas_params.yaml", "tas_params_hbm_on_logic.yaml"]
    assert got["models"] == [] and "workload" in got["models_error"]  # the fake workload service lists none
    one = api.get("/v1/configs/workload_quick.yaml").json()
    assert one["kind"] == "workload" and one["config"]["sequence"]["steps"] == 2
    assert api.get("/v1/configs/nope.yaml").json()["error"]["field"] == "name"
    # a preset's content posted back inline is the same experiment as its name
    a = api.post("/v1/experiments", json={"workload": "workload_quick.yaml", "tas": "tas_params.yaml",
                                          "scenarios": ["baseline"], "windows": 1}, headers={"Idempotency-Key": "p"})
    b = api.post("/v1/experiments", json={"workload": one["config"], "scenarios": ["baseline"], "windows": 1,
                                          "tas": api.get("/v1/configs/tas_params.yaml").json()["config"]},
                 headers={"Idempotency-Key": "p"})
    assert a.status_code == b.status_code == 202 and a.json()["id"] == b.json()["id"], b.text
    _wait(api, a.json()["id"])


# ------------------------------------------------------------------------------------------------- link tokens


@pytest.fixture()
def keyed(tmp_path: Path) -> Any:
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS, auth="keys",
                        keys_file=tmp_path / "keys.json")
    store = KeyStore(tmp_path / "keys.json")
    settings = settings.model_copy(update={"service_key": store.create("service", "admin")})
    keys = {"alice": store.create("alice", "submit"), "bob": store.create("bob", "submit"),
            "reader": store.create("alice", "read")}
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    with TestClient(create_app(settings, clients=clients)) as tc:
        yield tc, {k: {"Authorization": f"Bearer {v}"} for k, v in keys.items()}, store
    clients.close()


def test_a_link_token_opens_one_experiment_of_its_principal(keyed: Any) -> None:
    api, h, store = keyed
    mine = api.post("/v1/experiments", json={"workload": SMALL_WL, "scenarios": ["tas"]}, headers=h["alice"]).json()
    theirs = api.post("/v1/experiments", json={"workload": SMALL_WL, "scenarios": ["tas"]}, headers=h["bob"]).json()
    _wait(api, mine["id"], h["alice"])
    _wait(api, theirs["id"], h["bob"])
    # the page lists only the caller's experiments, and another's is a 404, token or not
    assert [e["id"] for e in api.get("/v1/experiments", headers=h["alice"]).json()["items"]] == [mine["id"]]
    assert api.get(f"/v1/experiments/{theirs['id']}/token", headers=h["alice"]).status_code == 404
    got = api.get(f"/v1/experiments/{mine['id']}/token", headers=h["reader"])  # a read key may ask
    assert got.status_code == 200 and got.headers["cache-control"] == "no-store"
    token = got.json()["token"]
    assert got.json()["experiment"] == mine["id"] and got.json()["ttl_s"] == 600
    q = {"token": token}
    for path in ("", "/windows", "/series", "/results", "/files", "/files/summary.csv", "/archive"):
        assert api.get(f"/v1/experiments/{mine['id']}{path}", params=q).status_code == 200, path
    events = _events(api, f"/v1/experiments/{mine['id']}/events", token=token, frames=True)
    assert events[-1][0] == "done" and any(e == "frame" for e, _ in events)
    # ... and nothing else: another experiment, the list, a token for more, a write, a tampered or foreign token
    for path in (f"/v1/experiments/{theirs['id']}", f"/v1/experiments/{theirs['id']}/events", "/v1/experiments",
                 f"/v1/experiments/{mine['id']}/token", "/v1/configs"):
        r = api.get(path, params=q)
        assert r.status_code == 401 and r.json()["error"]["field"] == "token", path
    assert api.post(f"/v1/experiments/{mine['id']}/cancel", params=q).status_code == 401
    bad = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    assert api.get(f"/v1/experiments/{mine['id']}", params={"token": bad}).status_code == 401
    bobs = api.get(f"/v1/experiments/{theirs['id']}/token", headers=h["bob"]).json()["token"]
    assert api.get(f"/v1/experiments/{mine['id']}", params={"token": bobs}).status_code == 401
    # a revoked key's tokens end with it
    store.revoke(next(r["id"] for r in store.records() if r["principal"] == "alice" and r["scope"] == "read"))
    assert api.get(f"/v1/experiments/{mine['id']}", params=q).status_code == 401


def test_link_tokens_expire_and_name_their_experiment() -> None:
    from shared.auth import Principal

    tokens = LinkTokens(b"0123456789abcdef0123", ttl_s=60)
    alice = Principal("alice", "read", "abcd1234")
    t = tokens.issue(alice, "exp-1", now=1000.0)
    grant = tokens.verify(t.token, "/v1/experiments/exp-1/events", "GET", now=1059.0)
    assert grant is not None and grant.principal == alice and grant.expires_at == 1060
    assert tokens.verify(t.token, "/v1/experiments/exp-1/events", "GET", now=1060.0) is None
    assert tokens.verify(t.token, "/v1/experiments/exp-2/events", "GET", now=1001.0) is None
    assert tokens.verify(t.token, "/v1/experiments/exp-1/token", "GET", now=1001.0) is None
    assert tokens.verify(t.token, "/v1/experiments/exp-1/cancel", "POST", now=1001.0) is None
    assert tokens.verify(t.token, "/v1/experiments/exp-1/files/a/b.png", "GET", now=1001.0) is not None
    other = LinkTokens(b"another secret of 20b", ttl_s=60)
    assert other.verify(t.token, "/v1/experiments/exp-1", "GET", now=1001.0) is None
    derived = [LinkTokens.from_settings("", "tsk_00000000_" + "x" * 43, 60) for _ in range(2)]
    t2 = derived[0].issue(alice, "exp-1")
    assert derived[1].verify(t2.token, "/v1/experiments/exp-1", "GET") is not None  # replicas share the secret
    assert LinkTokens.from_settings("", "", 60).verify(t2.token, "/v1/experiments/exp-1", "GET") is None


def test_a_30_s_run_is_drawn_from_a_bounded_timeline() -> None:
    """10^4 windows (a 30 s run) in at most 600 buckets: the peak kept exactly at its window, the tokens all counted,
    the power a time-weighted mean; one frame's bucket of the windows since the last frame."""
    run = series.RunSummary()
    n = 10_000
    for k in range(n):
        row = {"t_ms": 3.0 * k, "dt_ms": 3.0, "T_peak_logic": 60.0 + (k % 97) / 10 + (10.0 if k == 7321 else 0.0),
               "T_peak_dram": 55.0, "T_map_min": 50.0, "T_map_max": 65.0, "tokens": float(k % 3), "lat_sum_ms": 2.0,
               "lat_n": 1.0, "power_w": 20.0 + (k % 2), "freq_mean_ghz": 2.0, "freq_min_ghz": 1.8,
               "refresh_mhz": 260.0, "migrations": 0.0, "cores_throttled": 0.0}
        for c in run.cols:
            run.cols[c].append(row.get(c, 1.0))
    got = series.decimate(run, 0, None, 600)
    p = got["points"]
    assert got["stride"] == 17 and len(p["w0"]) == 589 <= 600
    i = max(range(len(p["T_peak_logic"])), key=p["T_peak_logic"].__getitem__)
    assert p["T_peak_logic_w"][i] == 7321 and p["T_peak_logic"][i] == pytest.approx(60.0 + (7321 % 97) / 10 + 10)
    assert sum(p["tokens"]) == sum(k % 3 for k in range(n))
    assert all(x == pytest.approx(20.5, abs=0.03) for x in p["power_w"][:-1])
    assert len(json.dumps(got)) < 150_000  # one timeline answer of a 30 s run
    b = series.bucket(run.cols, 9000, 9010)
    assert (b["w0"], b["w1"], b["t0_ms"], b["t1_ms"]) == (9000, 9009, 27000.0, 27030.0)
