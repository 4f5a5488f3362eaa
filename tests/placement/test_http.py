"""HTTP wiring of the placement service (TestClient on create_app): status codes, bodies, 422 naming the field."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from services.placement.app import create_app
from services.placement.geometry import synthetic_diffusion_kernel
from services.placement.inputs import zipf_loads
from services.root_app import embedded
from shared.errors import BadInput
from shared.settings import Settings
from tests.placement.tacs_helpers import placement_from, window

SMALL_ARCH: dict[str, Any] = {
    "mesh": {"cores": [3, 3]},
    "dram": {"banks": [6, 6, 2]},
    "geometry": {"stack": [
        {"name": "logic", "kind": "logic", "thickness_um": 50, "k_wmk": 120},
        {"name": "dram", "kind": "dram", "thickness_um": 50, "k_wmk": 2, "count": 2},
        {"name": "tim", "kind": "tim", "thickness_um": 20, "k_wmk": 5}]},
}


@pytest.fixture()
def client(settings: Settings) -> Iterator[TestClient]:
    """The placement service as it runs: lifespan entered (its MILP pool), peers wired (workload, thermal)."""
    with embedded(settings) as emb:
        yield TestClient(emb.apps["placement"])


def _err(r: Any) -> dict[str, Any]:
    body: dict[str, Any] = r.json()["error"]
    return body


def test_heuristic_placement_is_synchronous(client: TestClient) -> None:
    H = synthetic_diffusion_kernel(8, 8).tolist()
    r = client.post("/v1/placements", json={"method": "heuristic", "expert_load": zipf_loads(4, 8), "H": H})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["experts"]) == 32 and body["meta"]["method"] == "heuristic"
    assert body["meta"]["predicted_peak_c"] == max(body["meta"]["predicted_core_temps_c"])
    assert body["tensors"]["W_L0E0_0"]["dram_bank"].startswith("B(")


def test_default_placement(client: TestClient) -> None:
    r = client.post("/v1/placements", json={"method": "default", "expert_load": [[1.0] * 8] * 2,
                                            "moe_layers": [1, 2]})
    assert r.status_code == 200, r.text
    assert r.json()["experts"]["L2E7"]["cores"] == [15]


def test_default_placement_as_the_orchestrator_asks(client: TestClient) -> None:
    """No expert_load, float expert_bytes: the expert count comes from n_experts or the workload's model."""
    r = client.post("/v1/placements", json={"method": "default", "expert_load": None, "moe_layers": [0, 1, 2],
                                            "expert_flops_per_token": 2.5e9, "expert_bytes": 352321536.0})
    assert r.status_code == 200, r.text
    assert len(r.json()["experts"]) == 24  # mixtral-8x7b: 8 routed experts per layer
    r = client.post("/v1/placements", json={"method": "default", "moe_layers": [1], "n_experts": 5,
                                            "expert_bytes": 1e6})
    assert r.status_code == 200 and len(r.json()["experts"]) == 5
    r = client.post("/v1/placements", json={"method": "default"})
    assert r.status_code == 422 and _err(r)["field"] == "moe_layers"


def test_milp_is_a_job(client: TestClient) -> None:
    H = synthetic_diffusion_kernel(3, 3).tolist()
    r = client.post("/v1/placements", json={"method": "milp", "arch": SMALL_ARCH, "expert_load": zipf_loads(2, 4),
                                            "H": H, "expert_bytes": 1 << 20})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    for _ in range(300):
        st = client.get(f"/v1/placement-jobs/{job_id}").json()
        if st["status"] in {"done", "failed"}:
            break
        time.sleep(0.05)
    assert st["status"] == "done", st
    assert st["result"]["meta"]["method"] == "milp" and st["result"]["meta"]["optimality_gap"] is not None
    assert client.get("/v1/placement-jobs/nope").status_code == 404


@pytest.mark.parametrize(("body", "field"), [
    ({"expert_load": [[1.0, 2.0], [1.0]]}, "expert_load[1]"),
    ({"expert_load": [[1.0, -2.0]]}, "expert_load[0][1]"),
    ({"expert_load": [[1.0, 2.0]], "H": [[1.0]]}, "H"),
    ({"expert_load": [[1.0, 2.0]], "method": "simplex"}, "method"),
    ({}, "expert_load"),
])
def test_placement_bad_input_is_422_naming_the_field(client: TestClient, body: dict[str, Any], field: str) -> None:
    r = client.post("/v1/placements", json=body)
    assert r.status_code == 422, r.text
    assert _err(r)["field"] == field


def test_tacs_step_round_trip(client: TestClient) -> None:
    from services.placement.geometry import ChipGeometry
    from shared.configs import ArchConfig

    arch = ArchConfig()
    cores = {f"L0E{e}": [27] for e in range(8)}
    watts = {eid: 3.0 for eid in cores}
    plc = placement_from(arch, cores)
    H = synthetic_diffusion_kernel(8, 8)
    p = np.zeros(64)
    p[27] = 24.0
    T = (H @ p + 45.0).tolist()
    req = {"telemetry": {"temps_core": T, "util_core": [0.5] * 64, "noc_load": 0.1},
           "placement": plc.model_dump(mode="json"), "H": H.tolist(),
           "pending": window(6, watts).model_dump(mode="json"), "now_ns": 18_000_000}
    r = client.post("/v1/tacs/step", json=req)
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["smoothed"]) == 64
    assert "expert" in body["overlays"]["migrate"]["obj_type"]
    moved = next(iter(body["state"]["experts"]))
    assert body["state"]["experts"][moved]["prev_cores"] == [27]
    assert ChipGeometry.of(arch).n_cores == 64


def _hot_core_27() -> tuple[Any, dict[str, list[int]], dict[str, Any], np.ndarray, dict[str, Any]]:
    """(arch, cores, placement JSON, H, telemetry) of eight experts of layer 0 on core 27, dissipating 24 W there."""
    from shared.configs import ArchConfig

    arch = ArchConfig()
    cores = {f"L0E{e}": [27] for e in range(8)}
    H = synthetic_diffusion_kernel(8, 8)
    p = np.zeros(64)
    p[27] = 24.0
    hot = {"temps_core": (H @ p + 45.0).tolist(), "util_core": [0.5] * 64, "noc_load": 0.1}
    return arch, cores, placement_from(arch, cores).model_dump(mode="json"), H, hot


def test_tacs_step_by_hash_is_the_inline_answer(client: TestClient) -> None:
    """Placement, params, arch and H registered once and named by hash: the very bytes of the inline request; an
    unknown hash is a 404 ``unknown_<kind>`` naming its field; an object and its hash together a 422."""
    from shared.configs.tas import TacsParams

    arch, cores, plc, H, hot = _hot_core_27()
    params = TacsParams.model_validate({"q_target": 0.6}).model_dump(mode="json")
    window_part = {"telemetry": hot,
                   "pending": window(6, {eid: 3.0 for eid in cores}).model_dump(mode="json"), "now_ns": 18_000_000}
    inline = client.post("/v1/tacs/step", json={**window_part, "placement": plc, "H": H.tolist(), "params": params,
                                                "arch": arch.model_dump(mode="json")})
    assert inline.status_code == 200, inline.text
    keys = {field: client.post(f"/v1/registry/{path}", json=body).json()["hash"]
            for field, path, body in (("placement_hash", "placements", plc), ("H_hash", "influence", {"H": H.tolist()}),
                                      ("params_hash", "tacs-params", params),
                                      ("arch_hash", "archs", arch.model_dump(mode="json")))}
    by_hash = client.post("/v1/tacs/step", json={**window_part, **keys})
    assert by_hash.status_code == 200, by_hash.text
    assert by_hash.content == inline.content
    data = client.app.state.run_data  # type: ignore[attr-defined]
    for store, field in ((data.influence, "H_hash"), (data.params, "params_hash"), (data.placements, "placement_hash")):
        store.clear()
        r = client.post("/v1/tacs/step", json={**window_part, **keys})
        assert r.status_code == 404 and _err(r)["code"] == f"unknown_{store.kind}" and _err(r)["field"] == field
    r = client.post("/v1/tacs/step", json={**window_part, "placement": plc, "H": H.tolist(), "H_hash": keys["H_hash"]})
    assert r.status_code == 422 and _err(r)["field"] == "H"
    r = client.post("/v1/registry/influence", json={"H": []})
    assert r.status_code == 422 and _err(r)["field"] == "H"


def test_tacs_step_names_the_replica_state_it_owns(client: TestClient) -> None:
    """Issue 21: placement owns the replica state. A step keeps the state it answers and names it (``state_ref``);
    the next step may name it instead of sending it (the same answer); ``return_state: false`` answers the state
    only when the step changed it; a name this replica does not keep is a 404 ``unknown_replica_state``."""
    _, cores, plc, H, hot = _hot_core_27()
    base = {"placement": plc, "H": H.tolist(), "now_ns": 18_000_000,
            "pending": window(6, {eid: 3.0 for eid in cores}).model_dump(mode="json")}
    first = client.post("/v1/tacs/step", json={**base, "telemetry": hot, "return_state": False})
    assert first.status_code == 200, first.text
    moved = first.json()
    assert moved["state"]["experts"] and moved["state_ref"]  # it moved an expert: the state comes back
    cool = {**base, "telemetry": {"temps_core": [45.0] * 64, "util_core": [0.1] * 64, "noc_load": 0.0},
            "now_ns": 21_000_000}
    whole = client.post("/v1/tacs/step", json={**cool, "state": moved["state"]}).json()
    named = client.post("/v1/tacs/step", json={**cool, "state_ref": moved["state_ref"], "return_state": False})
    assert named.status_code == 200, named.text
    assert "state" not in named.json()  # nothing changed: only its name, the same as the whole answer's
    assert named.json()["state_ref"] == whole["state_ref"] == moved["state_ref"]
    assert named.json()["overlays"] == whole["overlays"]
    r = client.post("/v1/tacs/step", json={**cool, "state_ref": "ef" * 32})
    assert r.status_code == 404 and _err(r)["code"] == "unknown_replica_state" and _err(r)["field"] == "state_ref"
    r = client.post("/v1/tacs/step", json={**cool, "state": moved["state"], "state_ref": moved["state_ref"]})
    assert r.status_code == 422 and _err(r)["field"] == "state"


def test_a_step_that_moves_nothing_names_its_state_without_hashing_it(client: TestClient,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A step named by ``state_ref`` that moves nothing answers that name (the very state kept under it) without
    serialising and hashing the state again; one that moves hashes its new state."""
    from shared.content import ContentStore

    _, cores, plc, H, hot = _hot_core_27()
    base = {"placement": plc, "H": H.tolist(), "now_ns": 18_000_000, "return_state": False,
            "pending": window(6, {eid: 3.0 for eid in cores}).model_dump(mode="json")}
    moved = client.post("/v1/tacs/step", json={**base, "telemetry": hot}).json()
    kinds: list[str] = []
    put = ContentStore.put

    def counting(self: ContentStore[Any], obj: Any) -> tuple[str, int]:
        kinds.append(self.kind)
        return put(self, obj)

    monkeypatch.setattr(ContentStore, "put", counting)
    cool = {"temps_core": [45.0] * 64, "util_core": [0.1] * 64, "noc_load": 0.0}
    named = client.post("/v1/tacs/step", json={**base, "telemetry": cool, "state_ref": moved["state_ref"],
                                               "now_ns": 21_000_000})
    assert named.status_code == 200, named.text
    assert named.json()["state_ref"] == moved["state_ref"] and "state" not in named.json()
    assert "replica_state" not in kinds
    again = client.post("/v1/tacs/step", json={**base, "telemetry": hot, "state_ref": moved["state_ref"],
                                               "now_ns": 40_000_000}).json()
    assert again.get("state") is not None  # still hot: it moved another expert, a new state, hashed
    assert again["state_ref"] != moved["state_ref"] and "replica_state" in kinds


def test_tacs_epoch_is_each_windows_step_and_stops_where_one_acts(client: TestClient) -> None:
    """``/tacs/epoch``: each step's decision is what ``/tacs/step`` answers for that window alone (the smoothed
    temperatures carried from step to step); the call stops at the first decision that acts and answers its
    overlays and state; without one it answers only the smoothed temperatures. A bad step's field names its index."""
    _, cores, plc, H, hot = _hot_core_27()
    cool = {"temps_core": [45.0 + c / 100 for c in range(64)], "util_core": [0.1] * 64, "noc_load": 0.0}
    fixed = {"placement": plc, "H": H.tolist()}
    steps = [{"telemetry": t, "pending": window(6 + i, {eid: 3.0 for eid in cores}).model_dump(mode="json"),
              "now_ns": 18_000_000 + 3_000_000 * i} for i, t in enumerate((cool, hot, hot, hot))]
    r = client.post("/v1/tacs/epoch", json={**fixed, "steps": steps})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["acted"] == 2 and len(got["smoothed"]) == 3 and "expert" in got["overlays"]["migrate"]["obj_type"]
    smoothed = None
    for i, step in enumerate(steps[:3]):  # the same decisions, one window a call
        one = client.post("/v1/tacs/step", json={**fixed, **step, "smoothed": smoothed}).json()
        smoothed = one["smoothed"]
        assert one["smoothed"] == got["smoothed"][i]
    assert one["overlays"] == got["overlays"] and one["state"] == got["state"]
    quiet = client.post("/v1/tacs/epoch", json={**fixed, "steps": [steps[0], steps[1]]}).json()
    assert quiet["smoothed"] == got["smoothed"][:2] and "acted" not in quiet and "state" not in quiet
    bad = client.post("/v1/tacs/epoch", json={**fixed, "steps": [steps[0], {**steps[1], "telemetry": {
        "temps_core": [50.0] * 5}}]})
    assert bad.status_code == 422 and _err(bad)["field"] == "steps[1].telemetry.temps_core"


def test_tacs_step_bad_core_is_422(client: TestClient) -> None:
    from shared.configs import ArchConfig

    plc = placement_from(ArchConfig(), {"L0E0": [0]}).model_dump(mode="json")
    plc["experts"]["L0E0"]["cores"] = [64]
    r = client.post("/v1/tacs/step", json={"telemetry": {"temps_core": [50.0] * 64}, "placement": plc})
    assert r.status_code == 422
    assert _err(r)["field"] == "placement.experts.L0E0.cores"
    r = client.post("/v1/tacs/step", json={"telemetry": {"temps_core": [50.0] * 5},
                                           "placement": placement_from(ArchConfig(), {"L0E0": [0]}).model_dump()})
    assert r.status_code == 422 and _err(r)["field"] == "telemetry.temps_core"


def test_balance_endpoint(client: TestClient) -> None:
    r = client.post("/v1/balance", json={"loads": [[3.0, 1.0, 1.0, 1.0]], "cores": 2, "slots": 4})
    assert r.status_code == 200, r.text
    lay = r.json()["layers"][0]
    assert lay["max_over_mean"] == pytest.approx(1.0) and lay["gap"] == pytest.approx(0.0)
    for body, field in (({"loads": [[1.0, 2.0, 3.0]], "slots": 2}, "slots"),
                        ({"loads": [[1.0, -1.0]], "slots": 2}, "loads[0][1]"),
                        ({"loads": [[1.0, 1.0], [1.0]], "slots": 2}, "loads[1]")):
        r = client.post("/v1/balance", json=body)
        assert r.status_code == 422 and _err(r)["field"] == field, r.text


def test_milp_job_is_idempotent_and_celery_shaped(client: TestClient) -> None:
    from services.placement.jobs import run_placement_job

    body = {"method": "milp", "arch": SMALL_ARCH, "expert_load": zipf_loads(1, 3), "expert_bytes": 1 << 20,
            "H": synthetic_diffusion_kernel(3, 3).tolist()}
    a = client.post("/v1/placements", json=body).json()["job_id"]
    b = client.post("/v1/placements", json=body).json()["job_id"]
    assert a == b
    with pytest.raises(BadInput) as err:  # the job carries its facts: the app resolved top-k before submitting
        run_placement_job(body)
    assert err.value.field == "workload.routing.topk"
    out = run_placement_job({**body, "workload": {"routing": {"topk": 2}}})  # the plain JSON-in/JSON-out function a
    # Celery task wraps
    assert set(out["experts"]) == {"L0E0", "L0E1", "L0E2"} and out["meta"]["method"] == "milp"


def test_milp_jobs_are_capped_per_principal_cancellable_and_time_limited(tmp_path: Any) -> None:
    """Issue 17: a principal's queued + running MILP jobs are capped (429 + Retry-After), a queued job can be
    cancelled (it never runs), another principal's job is a 404, and the HiGHS time limit is capped by settings."""
    import threading

    from services.placement import jobs
    from shared.auth import KeyStore
    from shared.settings import Settings

    store = KeyStore(tmp_path / "keys.json")
    alice, bob = store.create("alice", "submit"), store.create("bob", "submit")
    settings = Settings(results_dir=tmp_path, auth="keys", keys_file=tmp_path / "keys.json", quota_milp_jobs=2,
                        milp_time_limit_max_s=5.0)
    gate = threading.Event()
    seen_limits: list[float] = []
    real = jobs.run_placement_job

    def slow(payload: dict[str, Any]) -> dict[str, Any]:
        seen_limits.append(payload["tas"]["taps"]["milp_time_limit_s"])
        gate.wait(30)
        return real(payload)

    jobs.run_placement_job = slow
    try:
        with TestClient(create_app(settings)) as c:
            def submit(who: str, seed: int) -> Any:
                body = {"method": "milp", "arch": SMALL_ARCH, "expert_load": zipf_loads(2, 4), "expert_bytes": 1 << 20,
                        "H": synthetic_diffusion_kernel(3, 3).tolist(), "workload": {"routing": {"topk": 2}},
                        "tas": {"taps": {"milp_time_limit_s": 60 + seed}}}
                return c.post("/v1/placements", json=body, headers={"Authorization": f"Bearer {who}"})

            first, second = submit(alice, 1), submit(alice, 2)
            assert first.status_code == second.status_code == 202
            third = submit(alice, 3)
            assert third.status_code == 429 and int(third.headers["Retry-After"]) > 0
            assert submit(bob, 1).status_code == 202  # per principal
            jid = second.json()["job_id"]
            assert c.get(f"/v1/placement-jobs/{jid}", headers={"Authorization": f"Bearer {bob}"}).status_code == 404
            r = c.delete(f"/v1/placement-jobs/{jid}", headers={"Authorization": f"Bearer {alice}"})
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
            gate.set()
            for _ in range(400):
                st = c.get(f"/v1/placement-jobs/{first.json()['job_id']}",
                           headers={"Authorization": f"Bearer {alice}"}).json()
                if st["status"] in {"done", "failed"}:
                    break
                time.sleep(0.05)
            assert st["status"] == "done", st
            assert c.get(f"/v1/placement-jobs/{jid}", headers={"Authorization": f"Bearer {alice}"}
                         ).json()["status"] == "cancelled"
    finally:
        gate.set()
        jobs.run_placement_job = real
    assert seen_limits and all(v == 5.0 for v in seen_limits)  # 60+ s asked, 5 s allowed


def test_taps_without_h_asks_the_thermal_service(client: TestClient, settings: Settings) -> None:
    """Issue 21: H comes from the thermal service over HTTP (its peers), not from importing thermal's code: the
    placement equals the one made with thermal's H sent explicitly; without peers the request must carry H."""
    from services.placement.service import placement_for
    from services.thermal.influence import influence_matrix
    from shared.configs import ArchConfig
    from shared.contracts.placement_api import PlacementRequest

    body = {"method": "heuristic", "arch": SMALL_ARCH, "expert_load": zipf_loads(2, 4), "expert_bytes": 1 << 20}
    r = client.post("/v1/placements", json=body)
    assert r.status_code == 200, r.text
    assert not any("analytic" in n for n in r.json()["meta"]["notes"])
    H = influence_matrix(ArchConfig.model_validate(SMALL_ARCH)).tolist()
    explicit = client.post("/v1/placements", json={**body, "H": H}).json()
    assert explicit["experts"] == r.json()["experts"]
    with pytest.raises(BadInput) as exc:
        placement_for(PlacementRequest.model_validate(body), None)
    assert exc.value.field == "H"


def test_a_workload_without_top_k_takes_its_models_from_the_workload_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """``workload.routing.topk`` left out: the model's experts per token, asked of the workload service (the
    heuristic's and the MILP job's tokens per step); given: kept; not to be had: a 422 naming it."""
    from services.placement import service
    from shared.contracts.placement_api import PlacementRequest

    asked: list[object] = []

    def activated(_peers: object, model: object) -> int:
        asked.append(model)
        return 8

    monkeypatch.setattr(service, "activated_experts", activated)
    peers: Any = object()
    req = PlacementRequest.model_validate({"workload": {"model": "olmoe-1b-7b"}})
    assert service.with_model_topk(req, peers).workload.routing.topk == 8 and asked == ["olmoe-1b-7b"]
    given = PlacementRequest.model_validate({"workload": {"model": "olmoe-1b-7b", "routing": {"topk": 2}}})
    assert service.with_model_topk(given, peers) is given and len(asked) == 1
    for peers_, answer in ((None, 8), (peers, 0)):
        monkeypatch.setattr(service, "activated_experts", lambda _p, _m, a=answer: a)
        with pytest.raises(BadInput) as err:
            service.with_model_topk(req, peers_)
        assert err.value.field == "workload.routing.topk"


@pytest.mark.parametrize(("patch", "field"), [
    ({"method": "default", "moe_layers": [0, 1], "n_experts": 10 ** 6}, "n_experts"),
    ({"method": "default", "moe_layers": list(range(100_000)), "n_experts": 8}, "moe_layers"),
    ({"method": "default", "moe_layers": [0, 1], "n_experts": 8, "expert_bytes": 1e15}, "expert_bytes"),
    ({"method": "default", "moe_layers": [0, 1], "n_experts": 8, "expert_bytes": 1e13}, "expert_bytes"),
    ({"expert_load": [[1.0] * 8], "expert_flops_per_token": 1e308}, "expert_flops_per_token"),
    ({"expert_load": [[1e308] * 8]}, "expert_load[0][0]"),
])
def test_requests_past_the_placers_bounds_are_422(client: TestClient, patch: dict[str, Any], field: str) -> None:
    """Found by a hostile-request probe: each of these ran out of memory, divided by zero or overflowed (500s and
    timeouts); the bounds name the field."""
    body = {"arch": SMALL_ARCH, "H": synthetic_diffusion_kernel(3, 3).tolist(), "workload": {"routing": {"topk": 2}},
            **patch}
    r = client.post("/v1/placements", json=body)
    assert r.status_code == 422, r.text[:300]
    assert _err(r)["field"].startswith(field)


def test_balance_work_is_bounded(client: TestClient) -> None:
    r = client.post("/v1/balance", json={"loads": [[1.0] * 64] * 2000, "cores": 64, "slots": 4096})
    assert r.status_code == 422 and _err(r)["field"] == "slots"
    r = client.post("/v1/balance", json={"loads": [[1e308] * 4], "cores": 4, "slots": 4})
    assert r.status_code == 422 and _err(r)["field"] == "loads[0][0]"
    assert client.post("/v1/balance", json={"loads": [[1.0, 2.0, 3.0, 4.0]], "cores": 2, "slots": 6}).status_code == 200
