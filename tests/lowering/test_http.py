"""HTTP wiring of the lowering service (the science is tested on the plain functions)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.lowering.app import create_app
from services.lowering.synthetic import default_placement, synthetic_window
from shared.configs.arch import ArchConfig
from shared.settings import Settings


def _client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


def _body(window: int = 0) -> dict[str, object]:
    arch = ArchConfig()
    lw = synthetic_window(window, n_layers=2, micro_batch=8, context=256)
    return {"window": window, "logical": lw.model_dump(), "placement": default_placement(arch, n_layers=2).model_dump(),
            "window_ms": 3.0, "n_layers": 2}


def test_physicalize_roundtrip(settings: Settings) -> None:
    c = _client(settings)
    r = c.post("/v1/physicalize", json=_body())
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"compute", "memory", "deposit", "state", "state_ref", "timing"}
    assert len(out["compute"]["evt_id"]) == len(out["compute"]["core_id"]) > 0
    assert len(out["timing"]["util_core"]) == 64
    # the returned state feeds the next window
    body = _body(1)
    body["state"] = out["state"]
    r2 = c.post("/v1/physicalize", json=body)
    assert r2.status_code == 200, r2.text
    nxt = r2.json()
    ids = nxt["compute"]["evt_id"] + nxt["memory"]["evt_id"]
    assert ids and min(ids) == out["state"]["next_evt_id"]


def test_a_state_named_by_its_ref_gives_the_same_window_as_the_state_sent_whole(settings: Settings) -> None:
    """Issue 21: the service keeps the states it answers; naming one (``state_ref``) is the same as sending it."""
    c = _client(settings)
    out = c.post("/v1/physicalize", json=_body()).json()
    whole = _body(1)
    whole["state"] = out["state"]
    by_ref = {**_body(1), "state_ref": out["state_ref"], "return_state": False, "events": False}
    a, b = c.post("/v1/physicalize", json=whole), c.post("/v1/physicalize", json=by_ref)
    assert a.status_code == b.status_code == 200, b.text
    ja, jb = a.json(), b.json()
    assert set(jb) == {"deposit", "state_ref", "timing"}  # no events, no state: only their names and energy
    assert jb["state_ref"] == ja["state_ref"] and jb["deposit"] == ja["deposit"] and jb["timing"] == ja["timing"]
    # the same state inline and by name: refused, naming the field
    both = {**whole, "state_ref": out["state_ref"]}
    r = c.post("/v1/physicalize", json=both)
    assert r.status_code == 422 and r.json()["error"]["field"] == "state"


def test_a_state_the_service_does_not_keep_is_a_404_naming_state_ref(settings: Settings) -> None:
    c = _client(settings)
    r = c.post("/v1/physicalize", json={**_body(1), "state_ref": "ab" * 32})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "unknown_physical_state" and err["field"] == "state_ref"
    # a restarted service (a new app) does not know the states of the old one
    ref = c.post("/v1/physicalize", json=_body()).json()["state_ref"]
    r = _client(settings).post("/v1/physicalize", json={**_body(1), "state_ref": ref})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_physical_state"


def test_replicas_replace_those_of_the_named_state(settings: Settings) -> None:
    """The window loop names the state and sends only the replica state a TACS step changed."""
    c = _client(settings)
    out = c.post("/v1/physicalize", json=_body()).json()
    placement = _body()["placement"]
    assert isinstance(placement, dict)
    key = sorted(placement["experts"])[0]
    moved = {"experts": {key: {"cores": [63], "ts_created_ns": 0}}}
    whole = {**_body(1), "state": {**out["state"], "replicas": moved}}
    by_ref = {**_body(1), "state_ref": out["state_ref"], "replicas": moved}
    a, b = c.post("/v1/physicalize", json=whole).json(), c.post("/v1/physicalize", json=by_ref).json()
    assert a["state_ref"] == b["state_ref"] and a["state"]["replicas"]["experts"][key]["cores"] == [63]
    plain = c.post("/v1/physicalize", json={**_body(1), "state_ref": out["state_ref"]}).json()
    assert plain["state_ref"] != a["state_ref"]  # the replicas did reach the window


def test_a_migration_the_replicas_do_not_reflect_is_a_422_naming_the_row(settings: Settings) -> None:
    """The replica state is the placement service's: the physicalizer refuses to apply a move by its own rule."""
    c = _client(settings)
    placement = _body()["placement"]
    assert isinstance(placement, dict)
    key = sorted(placement["experts"])[0]
    home = placement["experts"][key]["cores"][0]
    dst = (home + 27) % 64
    migrate = {"t_apply_ns": [0], "obj_type": ["expert"], "obj_id": [key], "src": [str(home)], "dst": [str(dst)],
               "size_bytes": [1000], "cost": [1.0]}
    body = {**_body(), "overlays": {"migrate": migrate}}
    r = c.post("/v1/physicalize", json=body)
    assert r.status_code == 422 and r.json()["error"]["field"] == "overlays.migrate[0].dst"
    moved = {"experts": {key: {"cores": [dst], "ts_created_ns": 0, "prev_cores": [home]}}}
    r = c.post("/v1/physicalize", json={**body, "replicas": moved})
    assert r.status_code == 200
    ent = r.json()["state"]["replicas"]["experts"][key]
    assert ent["cores"] == [dst] and ent["prev_cores"] == [home]  # carried as given


def test_physicalize_bad_input_names_the_field(settings: Settings) -> None:
    c = _client(settings)
    body = _body()
    body["freq_ghz"] = [2.0, 2.0]
    r = c.post("/v1/physicalize", json=body)
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "freq_ghz"
    body = _body()
    body["window_ms"] = 0
    r = c.post("/v1/physicalize", json=body)
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "window_ms"
    body = _body()
    logical = body["logical"]
    assert isinstance(logical, dict)
    logical["compute"]["tokens"] = logical["compute"]["tokens"][:-1]
    r = c.post("/v1/physicalize", json=body)
    assert r.status_code == 422
    assert r.json()["error"]["field"].startswith("logical.compute")


def test_lower_ops_stages_graph(settings: Settings) -> None:
    c = _client(settings)
    r = c.post("/v1/lower/ops", json={"ops": [{"kind": "matmul", "M": 8, "K": 256, "N": 128},
                                              {"kind": "softmax", "M": 4, "N": 512}]})
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [x["kind"] for x in res] == ["matmul", "softmax"]
    assert res[0]["violations"] == [] and res[0]["instructions"][0][0] == "DMA_LOAD_TILE"
    r = c.post("/v1/lower/stages", json={"blocks": [{"layer": 2, "tokens": 4}]})
    assert r.status_code == 200, r.text
    assert r.json()["host_dma_bytes"]["kv_cache"] > 0
    r = c.post("/v1/lower/graph", json={"ops": [{"kind": "SwiGLU", "tokens": 2}]})
    assert r.status_code == 200, r.text
    assert r.json()["plans"][0]["nodes"][0]["kind"] == "MatMul"


def test_lower_bad_input_is_422_with_field(settings: Settings) -> None:
    c = _client(settings)
    r = c.post("/v1/lower/ops", json={"ops": [{"kind": "matmul", "M": 8, "K": 0, "N": 128}]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "ops[0].matmul.K"
    r = c.post("/v1/lower/ops", json={"ops": [{"kind": "matmul", "M": 8, "K": 8, "N": 8}], "dtype": "fp4"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "dtype"
    tiny = {"core": {"spm_kb": 1}}
    r = c.post("/v1/lower/ops", json={"ops": [{"kind": "softmax", "M": 4, "N": 4096}], "arch": tiny})
    assert r.status_code == 422 and r.json()["error"]["field"] == "ops[0].N"
    assert "SPM" in r.json()["error"]["message"]
    r = c.post("/v1/lower/ops", json={"ops": [{"kind": "conv3d", "M": 1}]})
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("ops[0]")
    r = c.post("/v1/lower/stages", json={"blocks": [{"heads": 6, "kv_heads": 4}]})
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("blocks[0]")
    r = c.post("/v1/lower/graph", json={"ops": [{"kind": "Bogus"}]})
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("ops[0].kind")


def test_physicalize_by_hash_is_the_inline_answer(settings: Settings) -> None:
    """The placement and the arch registered once (``POST /v1/registry/...``) and named by hash give the very bytes
    of the inline request; a hash this replica does not know is a 404 ``unknown_<kind>``."""
    app = create_app(settings)
    c = TestClient(app)
    body = _body()
    inline = c.post("/v1/physicalize", json={**body, "arch": ArchConfig().model_dump(mode="json")})
    assert inline.status_code == 200, inline.text
    reg = c.post("/v1/registry/placements", json=body["placement"]).json()
    assert reg["kind"] == "placement" and len(reg["hash"]) == 64 and reg["bytes"] > 0
    arch = c.post("/v1/registry/archs", json=ArchConfig().model_dump(mode="json")).json()
    assert arch["hash"] == ArchConfig().content_hash(64)
    assert c.post("/v1/registry/placements", json=body["placement"]).json() == reg  # content-addressed: same name
    named = {**{k: v for k, v in body.items() if k != "placement"}, "placement_hash": reg["hash"],
             "arch_hash": arch["hash"]}
    by_hash = c.post("/v1/physicalize", json=named)
    assert by_hash.status_code == 200, by_hash.text
    assert by_hash.content == inline.content
    app.state.run_data.placements.clear()  # an eviction, a restart, another replica
    r = c.post("/v1/physicalize", json=named)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_placement" and r.json()["error"]["field"] == "placement_hash"
    app.state.run_data.clear()
    r = c.post("/v1/physicalize", json={**body, "arch_hash": arch["hash"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_arch"


def test_physicalize_wants_the_placement_or_its_hash(settings: Settings) -> None:
    c = _client(settings)
    body = _body()
    placement = body.pop("placement")
    r = c.post("/v1/physicalize", json=body)  # neither
    assert r.status_code == 422 and r.json()["error"]["field"] == "placement"
    key = c.post("/v1/registry/placements", json=placement).json()["hash"]
    r = c.post("/v1/physicalize", json={**body, "placement": placement, "placement_hash": key})  # both
    assert r.status_code == 422 and r.json()["error"]["field"] == "placement"
    assert "placement_hash" in r.json()["error"]["message"]
    r = c.post("/v1/physicalize", json={**body, "placement_hash": "not-a-hash"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "placement_hash"
    r = c.post("/v1/physicalize", json={**body, "placement": placement, "arch": {}, "arch_hash": "0" * 64})
    assert r.status_code == 422 and r.json()["error"]["field"] == "arch"


def test_a_bad_replica_state_sent_as_replicas_is_named_replicas(settings: Settings) -> None:
    c = _client(settings)
    out = c.post("/v1/physicalize", json=_body()).json()
    placement = _body()["placement"]
    assert isinstance(placement, dict)
    key = sorted(placement["experts"])[0]
    bad = {"experts": {key: {"cores": [70], "ts_created_ns": 0}}}  # a core outside the 8 x 8 mesh
    r = c.post("/v1/physicalize", json={**_body(1), "state_ref": out["state_ref"], "replicas": bad})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"].startswith("replicas"), r.json()


def test_lower_ops_work_is_bounded_per_request(settings: Settings) -> None:
    """A hostile-request probe: 4096 large GEMMs in one request ran for minutes (the instruction bound was per op),
    and a conv2d pad of 2**62 overflowed (a 500). Both are 422s naming the op."""
    c = _client(settings)
    many = {"ops": [{"kind": "matmul", "M": 4096, "K": 4096, "N": 4096}] * 4096, "include_instructions": False}
    r = c.post("/v1/lower/ops", json=many)
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("ops[")
    assert "several requests" in r.json()["error"]["message"]
    pad = {"ops": [{"kind": "conv2d", "cin": 1, "h": 1, "w": 1, "cout": 1, "kh": 1, "kw": 1, "pad": 2 ** 62}]}
    r = c.post("/v1/lower/ops", json=pad)
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("ops[0]")
    r = c.post("/v1/lower/ops", json={"ops": [{"kind": "matmul", "M": 64, "K": 64, "N": 64}] * 3})
    assert r.status_code == 200 and len(r.json()["results"]) == 3
