"""The thermal service's functions (step, solve, influence) and their HTTP wiring."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from services.thermal.app import create_app
from services.thermal.hotspot_io import parse_temp_file
from services.thermal.influence import influence_matrix, influence_vault_matrix
from services.thermal.model import get_model
from services.thermal.service import decode_field, solve_power_map, thermal_step
from shared.configs import ArchConfig
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.thermal import StepResult, ThermalState
from shared.energy import deposit_of_events
from shared.errors import Conflict
from shared.settings import Settings
from tests.conftest import FIXTURES
from tests.thermal.conftest import small_arch


def _events(hot_core: int, flops: float = 4e9) -> tuple[ComputeEvents, MemoryEvents]:
    c = ComputeEvents.from_columns({"evt_id": [0, 1], "t_start_ns": [0, 0], "core_id": [hot_core, 0],
                                    "duration_cycles": [1, 1], "flops": [flops, 1e8], "op": ["mm", "mm"],
                                    "dvfs_domain": ["all", "all"], "power_hint": [0.0, 0.0],
                                    "energy_j": [flops * 0.75e-12, 1e8 * 0.75e-12]})  # MACs at 1.5 pJ)
    m = MemoryEvents.from_columns({"evt_id": [2], "t_start_ns": [0], "src_core": [0], "dst_bank": ["B(7,7,1)"],
                                   "bytes": [1e6], "rw": ["r"], "hops": [6], "noc_qos": ["normal"]})
    return c, m


def test_step_heats_the_busy_core_and_chains_windows(arch_small: ArchConfig) -> None:
    c, m = _events(5)
    r0 = thermal_step(arch_small, 0, 3.0, None, c, m)
    s = r0.snapshot
    assert len(s.temps_core_c) == 16 and int(np.argmax(s.temps_core_c)) == 5
    assert len(s.temps_bank_c) == 16 and len(s.temps_bank_c[0]) == 2
    assert all(mx >= mean - 1e-9 for mx, mean in zip(s.temps_core_max_c, s.temps_core_c, strict=True))
    assert s.temps_core_max_c[5] > s.temps_core_c[5] + 1e-3
    assert set(s.peak_c) == {"logic", "dram_1", "dram_2", "tim", "spreader", "sink"}
    assert s.power_w.logic_dynamic == pytest.approx((4e9 + 1e8) / 2 * 1.5e-12 / 3e-3)
    assert sum(s.power_core_w) == pytest.approx(s.power_w.logic_dynamic + s.power_w.logic_leakage + s.power_w.noc
                                                + s.power_w.dram_controller)
    assert r0.state.window == 0 and r0.state.t_ns == 3_000_000 and len(r0.state.dvfs_level) == 16
    r1 = thermal_step(arch_small, 1, 3.0, r0.state, c, m)
    assert r1.snapshot.temps_core_c[5] > s.temps_core_c[5]  # still heating up
    with pytest.raises(Conflict):
        thermal_step(arch_small, 3, 3.0, r1.state, c, m)


def test_step_is_idempotent(arch_small: ArchConfig) -> None:
    c, m = _events(9)
    r0 = thermal_step(arch_small, 0, 2.0, None, c, m)
    a = thermal_step(arch_small, 1, 2.0, r0.state, c, m)
    b = thermal_step(arch_small, 1, 2.0, r0.state, c, m)
    assert a.state.model_dump_json() == b.state.model_dump_json()
    assert a.snapshot.model_dump_json() == b.snapshot.model_dump_json()


def test_dvfs_throttles_a_hot_core() -> None:
    arch = small_arch(grid=[8, 8])
    c, m = _events(6, flops=4e11)  # ~100 W on one core for 3 ms
    r = thermal_step(arch, 0, 3.0, None, c, m)
    hot = r.snapshot.temps_core_c[6]
    assert hot > 90.0
    assert r.snapshot.freq_ghz[6] == 1.2 and r.state.dvfs_level[6] == 3
    assert r.snapshot.freq_ghz[0] == 2.0


def test_influence_matrix_predicts_steady_solve(arch_small: ArchConfig) -> None:
    H = influence_matrix(arch_small)
    assert H.shape == (16, 16)
    assert np.allclose(H, H.T, rtol=1e-9, atol=1e-12)  # reciprocity
    assert np.all(np.diag(H) > H.max(axis=1) - 1e-12) and np.all(H > 0)
    p = np.random.default_rng(3).random(16)
    res = solve_power_map(arch_small, p.tolist())
    amb = arch_small.geometry.cooling.ambient_c
    assert np.allclose(np.array(res.temps_core_c), H @ p + amb, atol=1e-8)
    Hv = influence_vault_matrix(arch_small)
    q = np.random.default_rng(4).random(16) * 0.1
    bank_w = np.zeros((2, 64))
    vault = get_model(arch_small).vault_of_bank
    for j in range(16):
        bank_w[:, vault == j] = q[j] / (2 * 4)
    res = solve_power_map(arch_small, [0.0] * 16, bank_w.tolist())
    assert np.allclose(np.array(res.temps_core_c), Hv @ q + amb, atol=1e-8)
    assert np.all(np.argmax(Hv, axis=0) == np.arange(16))  # a vault heats its own core most
    # a vault's watt in given shares per DRAM die: the steady solve of that bank map, linear in the shares, and the
    # shares are normalised (2·w is w); even shares are the default's H_vault
    shares = np.array([0.25, 0.75])
    Hd = influence_vault_matrix(arch_small, (2 * shares).tolist())
    bank_w = np.zeros((2, 64))
    for j in range(16):
        bank_w[:, vault == j] = (q[j] * shares / 4)[:, None]
    res = solve_power_map(arch_small, [0.0] * 16, bank_w.tolist())
    assert np.allclose(np.array(res.temps_core_c), Hd @ q + amb, atol=1e-8)
    per_die = [influence_vault_matrix(arch_small, [1.0 - d, float(d)]) for d in (0, 1)]
    assert np.allclose(Hd, 0.25 * per_die[0] + 0.75 * per_die[1], atol=1e-8)
    assert np.allclose(influence_vault_matrix(arch_small, [1.0, 1.0]), Hv, atol=1e-12)
    assert np.allclose(influence_vault_matrix(arch_small, [1e308, 1e308]), Hv, atol=1e-12)  # no overflow to 0
    assert not np.allclose(per_die[0], per_die[1], atol=1e-6)


def test_die_share_matrices_never_evict_a_models_influence_matrix(arch_small: ArchConfig) -> None:
    """H_vault for given die shares has its own cache: asking for more shares than the cache holds keeps the
    model's H (n steady solves) and its even H_vault."""
    from services.thermal import influence as infl
    from shared.limits import thermal_cache_size

    model = get_model(arch_small)
    influence_matrix(arch_small)
    influence_vault_matrix(arch_small)
    for i in range(2 * thermal_cache_size() + 2):  # more than one shared cache of H and H_vault would hold
        influence_vault_matrix(arch_small, [1.0, float(i + 1)])
    assert infl._H.get(model.key) is not None and infl._H.get(model.key + ":vault") is not None
    assert len(infl._H_DIES) <= thermal_cache_size()


def test_transient_solve_returns_state(arch_small: ArchConfig) -> None:
    res = solve_power_map(arch_small, [1.0] * 16, mode="transient", duration_ms=5.0)
    assert res.state is not None
    T = decode_field(res.state.field_b64, get_model(arch_small))
    steady = solve_power_map(arch_small, [1.0] * 16)
    assert arch_small.geometry.cooling.ambient_c < max(res.temps_core_c) < max(steady.temps_core_c)
    assert T.shape == (get_model(arch_small).net.n_nodes,)


# --- HTTP wiring -------------------------------------------------------------------------------------------------

@pytest.fixture()
def client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


def _step_body(arch: ArchConfig, window: int, state: ThermalState | None) -> dict[str, Any]:
    c, m = _events(5)
    return {"arch": arch.model_dump(mode="json"), "window": window, "window_ms": 3.0,
            "state": state.model_dump(mode="json") if state else None,
            "compute_events": c.model_dump(mode="json"), "memory_events": m.model_dump(mode="json")}


def test_http_models_step_influence(client: TestClient, arch_small: ArchConfig) -> None:
    r = client.post("/v1/models", json={"arch": arch_small.model_dump(mode="json")})
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["model"] == arch_small.content_hash() and info["nodes"] == 6 * 256 + 12
    r = client.post("/v1/step", json=_step_body(arch_small, 0, None))
    assert r.status_code == 200, r.text
    first = StepResult.model_validate(r.json())
    again = client.post("/v1/step", json=_step_body(arch_small, 0, None))
    assert again.json() == r.json()
    r = client.post("/v1/step", json=_step_body(arch_small, 5, first.state))
    assert r.status_code == 409 and r.json()["error"]["field"] == "state.window"
    r = client.get(f"/v1/models/{info['model']}/influence")
    assert r.status_code == 200 and len(r.json()["H"]) == 16 and len(r.json()["H_vault"]) == 16
    assert r.json()["vault_dies"] is None
    r = client.get(f"/v1/models/{info['model']}/influence", params={"vault_dies": ["1", "3"]})
    assert r.status_code == 200 and r.json()["vault_dies"] == [0.25, 0.75]
    assert np.allclose(r.json()["H_vault"], influence_vault_matrix(arch_small, [0.25, 0.75]), atol=1e-12)
    for bad in (["1"], ["1", "-1"], ["0", "0"], ["nan", "1"], ["inf", "1"], ["1"] * 3):
        for path, extra in (("influence", {}), ("pulse-response", {"slot_ms": "5", "lags": "2"})):
            r = client.get(f"/v1/models/{info['model']}/{path}", params={"vault_dies": bad, **extra})
            assert r.status_code == 422 and r.json()["error"]["field"] == "vault_dies", (path, bad, r.text)
    r = client.get(f"/v1/models/{info['model']}/pulse-response",
                   params={"slot_ms": "5", "lags": "2", "vault_dies": ["0", "1"]})
    assert r.status_code == 200 and r.json()["vault_dies"] == [0.0, 1.0] and len(r.json()["vault"]) == 2
    assert client.get("/v1/models/0123456789abcdef/influence").status_code == 404
    r = client.post("/v1/solve", json={"arch": arch_small.model_dump(mode="json"), "core_w": [1.0] * 16})
    assert r.status_code == 200 and len(r.json()["temps_core_c"]) == 16


def test_http_step_and_warm_start_by_model_hash(client: TestClient, arch_small: ArchConfig) -> None:
    """``model`` (the hash of ``POST /v1/models``) instead of the arch: the same answer; a model this replica does
    not have is a 404 ``unknown_model`` (post the arch again); arch and model together, or neither, a 422."""
    from services.thermal import model as model_cache

    key = client.post("/v1/models", json={"arch": arch_small.model_dump(mode="json")}).json()["model"]
    inline = client.post("/v1/step", json=_step_body(arch_small, 0, None))
    named = {**_step_body(arch_small, 0, None), "model": key}
    del named["arch"]
    by_hash = client.post("/v1/step", json=named)
    assert by_hash.status_code == 200, by_hash.text
    assert by_hash.content == inline.content
    n = get_model(arch_small).n_cores + int(np.prod(arch_small.dram.banks))
    energy = base64.b64encode(np.full(n, 1e-3, dtype="<f8").tobytes()).decode()
    state = {**by_hash.json()["state"], "warm_energy_b64": energy, "warm_s": 0.003}
    warm = client.post("/v1/warm_start", json={"model": key, "state": state})
    assert warm.status_code == 200 and warm.content == client.post(
        "/v1/warm_start", json={"arch": arch_small.model_dump(mode="json"), "state": state}).content
    r = client.post("/v1/step", json={**named, "arch": arch_small.model_dump(mode="json")})
    assert r.status_code == 422 and r.json()["error"]["field"] == "arch"
    r = client.post("/v1/warm_start", json={"state": state})
    assert r.status_code == 422 and r.json()["error"]["field"] == "arch"
    assert model_cache.MODELS.pop(key) is not None  # evicted (or another replica, a restart)
    r = client.post("/v1/step", json=named)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_model" and r.json()["error"]["field"] == "model"


def test_http_bad_input_names_field(client: TestClient, arch_small: ArchConfig) -> None:
    body = _step_body(arch_small, 0, None)
    body["memory_events"]["dst_bank"] = ["nonsense"]
    r = client.post("/v1/step", json=body)
    assert r.status_code == 422 and r.json()["error"]["field"] == "memory_events.dst_bank[0]"
    r = client.post("/v1/solve", json={"arch": arch_small.model_dump(mode="json"), "core_w": [1.0] * 15 + [-1.0]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "core_w[15]"
    body = _step_body(arch_small, 0, None)
    body["window_ms"] = 0
    r = client.post("/v1/step", json=body)
    assert r.status_code == 422 and r.json()["error"]["field"] == "window_ms"
    body = _step_body(arch_small, 1, ThermalState(window=0, field_b64="AAAA"))
    r = client.post("/v1/step", json=body)
    assert r.status_code == 422 and r.json()["error"]["field"] == "state.field_b64"


def test_hotspot_export_import_round_trip(client: TestClient) -> None:
    """Exported files, solved through the `tasmoe hotspot` path, give the hotspot variant of our own model."""
    arch = small_arch(variant="hotspot")
    rng = np.random.default_rng(11)
    core_w = (rng.random(16) * 2).tolist()
    bank_w = (rng.random((2, 64)) * 0.01).tolist()
    r = client.post("/v1/hotspot/export", json={"arch": arch.model_dump(mode="json"), "core_w": core_w,
                                                "bank_w": bank_w})
    assert r.status_code == 200, r.text
    files = r.json()["files"]
    assert {"logic.flp", "dram_0.flp", "dram_1.flp", "tim.flp", "stack.lcf", "power.ptrace",
            "hotspot.config"} <= set(files)
    args = ["-c", "hotspot.config", "-f", "logic.flp", "-p", "power.ptrace", "-grid_layer_file", "stack.lcf",
            "-model_type", "grid", "-steady_file", "out.steady"]
    r = client.post("/v1/hotspot/import", json={"files": files, "args": args})
    assert r.status_code == 200, r.text
    temps = parse_temp_file(r.json()["files"]["out.steady"])
    ours = solve_power_map(arch, core_w, bank_w)
    theirs = [temps[f"layer_0_C_{c // 4}_{c % 4}"] - 273.15 for c in range(16)]
    assert np.abs(np.array(theirs) - np.array(ours.temps_core_c)).max() < 0.006  # files print 2 decimals
    # an input outside the upload is refused
    bad = client.post("/v1/hotspot/import", json={"files": files, "args": [*args[:-2], "-init_file", "/etc/hosts"]})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "init_file"


def test_hotspot_import_bad_trace_is_422(client: TestClient) -> None:
    files = {f.name: f.read_text() for f in (FIXTURES / "thermal").iterdir()}
    files["tiny.ptrace"] = "A\tB\n1.0\t-2.0\n"
    args = ["-c", "tiny.config", "-grid_layer_file", "tiny.lcf", "-p", "tiny.ptrace", "-steady_file", "o.steady"]
    r = client.post("/v1/hotspot/import", json={"files": files, "args": args})
    err = r.json()["error"]
    assert r.status_code == 422 and err["field"] == "B" and "tiny.ptrace:2" in err["message"]


def test_export_runs_a_hotspot_binary_when_asked(client: TestClient, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"arch": small_arch(variant="hotspot").model_dump(mode="json"), "core_w": [1.0] * 16,
            "run_hotspot": True}
    monkeypatch.setenv("PATH", str(tmp_path))
    r = client.post("/v1/hotspot/export", json=body)
    assert r.status_code == 502 and "hotspot" in r.json()["error"]["message"]
    fake = tmp_path / "hotspot"  # stands in for HotSpot: checks its inputs are there, writes a steady file
    fake.write_text("#!/bin/sh\ntest -f stack.lcf && test -f power.ptrace && "
                    "printf 'layer_0_C_0_0\\t330.50\\ninode_0\\t320.00\\n' > out.steady\n")
    fake.chmod(0o755)
    r = client.post("/v1/hotspot/export", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["hotspot_steady_k"] == {"layer_0_C_0_0": 330.5, "inode_0": 320.0}


def test_influence_matrix_is_exactly_symmetric_and_the_same_from_both_solvers() -> None:
    from services.thermal.influence import influence_for_model

    H = influence_for_model(get_model(small_arch()))  # square die, 4 x 4 cores, symmetric package
    idx = np.arange(16).reshape(4, 4)
    for perm in (idx[:, ::-1].ravel(), idx[::-1, :].ravel(), idx.T.ravel()):  # mirrors and the diagonal
        assert np.array_equal(H, H[np.ix_(perm, perm)])
    assert np.array_equal(H, H.T)
    assert np.array_equal(H, influence_for_model(get_model(small_arch(solver="sparse"))))


def _exported_files(client: TestClient) -> tuple[dict[str, str], list[str]]:
    body = {"arch": small_arch(variant="hotspot").model_dump(mode="json"), "core_w": [1.0] * 16}
    files = client.post("/v1/hotspot/export", json=body).json()["files"]
    args = ["-c", "hotspot.config", "-f", "logic.flp", "-p", "power.ptrace", "-grid_layer_file", "stack.lcf",
            "-model_type", "grid", "-steady_file", "out.steady"]
    return files, args


def test_hotspot_import_file_options_are_confined_after_resolution(client: TestClient, tmp_path: Path) -> None:
    """The escape: a second ``-c`` whose config file carries ``-steady_file /abs/path`` wrote outside the scratch
    directory, and ``-init_file`` from a config file echoed a server file's first word. Every file option is now
    checked after the options are resolved, wherever it came from."""
    files, args = _exported_files(client)
    target = tmp_path / "escaped.steady"
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRETWORD 1\n")
    files["evil.config"] = f"-steady_file {target}\n"
    r = client.post("/v1/hotspot/import", json={"files": files, "args": [*args, "-c", "evil.config"]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "c" and "twice" in r.json()["error"]["message"]
    # the only -c is the evil one: its file option is refused after resolution
    evil_args = ["-c", "evil.config", *args[2:-2]]
    r = client.post("/v1/hotspot/import", json={"files": files, "args": evil_args})
    assert r.status_code == 422 and r.json()["error"]["field"] == "steady_file"
    files["evil.config"] = files["hotspot.config"] + f"-init_file {secret}\n"
    r = client.post("/v1/hotspot/import", json={"files": files, "args": ["-c", "evil.config", *args[2:], "-o", "t"]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "init_file"
    assert "TOPSECRETWORD" not in r.text
    for bad in ("../escaped.steady", "/tmp/x.steady", ".hidden", "a/b"):
        r = client.post("/v1/hotspot/import", json={"files": files, "args": [*args[:-1], bad]})
        assert r.status_code == 422 and r.json()["error"]["field"] == "steady_file", bad
    # an output may not overwrite an uploaded input
    r = client.post("/v1/hotspot/import", json={"files": files, "args": [*args[:-1], "logic.flp"]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "steady_file"
    # a floorplan in the layer file that points outside the upload
    lcf = files["stack.lcf"].replace("logic.flp", str(tmp_path / "logic.flp"))
    (tmp_path / "logic.flp").write_text(files["logic.flp"])
    r = client.post("/v1/hotspot/import", json={"files": {**files, "stack.lcf": lcf}, "args": args})
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("layer ")
    assert not target.exists()
    # a config file may name its files, as long as they are uploaded names and outputs stay in the scratch dir
    files["named.config"] = files["hotspot.config"] + "-steady_file from_cfg.steady\n"
    r = client.post("/v1/hotspot/import", json={"files": files, "args": ["-c", "named.config", *args[2:-2]]})
    assert r.status_code == 200, r.text
    assert set(r.json()["files"]) == {"from_cfg.steady"}


def test_hotspot_import_errors_do_not_show_server_paths(client: TestClient) -> None:
    files, args = _exported_files(client)
    files["bad.config"] = "-t_chip\n"
    r = client.post("/v1/hotspot/import", json={"files": files, "args": ["-c", "bad.config", *args[2:]]})
    assert r.status_code == 422 and "bad.config" in r.json()["error"]["message"]
    assert "tasmoe-hotspot-" not in r.text and "/tmp" not in r.text


def test_steady_init_starts_at_the_steady_state_of_the_first_window(arch_small: ArchConfig) -> None:
    """thermal.init: steady: window 0 starts from the steady state of its own power spread evenly over each layer,
    checked against a steady solve of that spread power evaluated at the starting field (leakage included)."""
    from services.thermal.model import KELVIN, get_model
    from services.thermal.power import WindowPower, compute_power_from_events
    from services.thermal.service import warm_start

    warm = arch_small.model_copy(update={"thermal": arch_small.thermal.model_copy(update={"init": "steady"})})
    c, m = _events(5)
    model = get_model(warm)

    def power_at(T: np.ndarray) -> WindowPower:
        return compute_power_from_events(c, m, warm, core_temp_c=model.core_temps(T) - KELVIN,
                                         bank_temp_c=model.bank_temps(T) - KELVIN, freq_ghz=np.full(16, 2.0),
                                         window_s=3e-3)

    T0 = warm_start(model, power_at)
    p0 = power_at(T0)
    core_w = np.full(16, p0.core_w.mean())
    bank_w = np.repeat(p0.bank_w.mean(axis=1, keepdims=True), p0.bank_w.shape[1], axis=1)
    solved = solve_power_map(warm, core_w.tolist(), bank_w.tolist())
    np.testing.assert_allclose(model.core_temps(T0) - KELVIN, solved.temps_core_c, atol=0.02)
    # the spread start is (nearly) uniform over the logic die although the power is on core 5 and core 0
    assert np.ptp(model.core_temps(T0)) < 0.5
    r0 = thermal_step(warm, 0, 3.0, None, c, m)
    cold = thermal_step(arch_small, 0, 3.0, None, c, m)
    assert min(r0.snapshot.temps_core_c) > min(cold.snapshot.temps_core_c) + 0.5  # warm everywhere
    # the local hot spot still develops within the run: core 5 heats above the spread start
    assert r0.snapshot.temps_core_c[5] > float(np.max(model.core_temps(T0) - KELVIN)) + 1e-3


@pytest.mark.parametrize("window_ms", [1e308, 0.0, -1.0])
def test_http_step_refuses_an_extreme_window_naming_the_field(window_ms: float, settings: Settings) -> None:
    c, m = _events(5)
    client = TestClient(create_app(settings))
    body = {"arch": small_arch().model_dump(mode="json"), "window": 0, "window_ms": window_ms,
            "compute_events": c.model_dump(), "memory_events": m.model_dump()}
    r = client.post("/v1/step", json=body)
    assert r.status_code == 422 and r.json()["error"]["field"] == "window_ms"


def test_http_step_from_the_events_deposit_and_by_state_ref_gives_the_same_bytes(
        client: TestClient, arch_small: ArchConfig) -> None:
    """Issue 21: the energy deposit of the events (what the physicalizer answers beside them) gives the very same
    window; a state named by the ``state_ref`` its step answered is the same as the state sent whole."""
    c, m = _events(5)
    deposit = deposit_of_events(c, m, arch_small).to_contract().model_dump(mode="json")
    events = client.post("/v1/step", json=_step_body(arch_small, 0, None))
    body = {**_step_body(arch_small, 0, None), "deposit": deposit}
    del body["compute_events"], body["memory_events"]
    dep = client.post("/v1/step", json=body)
    assert events.status_code == dep.status_code == 200, dep.text
    assert dep.content == events.content
    first = events.json()
    whole = client.post("/v1/step", json={**body, "window": 1, "state": first["state"]})
    named = client.post("/v1/step", json={**body, "window": 1, "state": None, "state_ref": first["state_ref"],
                                          "return_state": False})
    assert named.status_code == 200, named.text
    assert "state" not in named.json() and named.json()["state_ref"] == whole.json()["state_ref"]
    assert named.json()["snapshot"] == whole.json()["snapshot"]
    # events and deposit together, or neither: a 422 naming the field
    r = client.post("/v1/step", json={**_step_body(arch_small, 0, None), "deposit": deposit})
    assert r.status_code == 422 and r.json()["error"]["field"] == "deposit"
    r = client.post("/v1/step", json={k: v for k, v in body.items() if k != "deposit"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "compute_events"


@pytest.mark.parametrize(("key", "value", "field"), [
    ("core_compute_j", [1.0] * 3, "deposit.core_compute_j"),
    ("core_mac_j", [-1.0] * 16, "deposit.core_mac_j"),
    ("bank_ids", [10**6], "deposit.bank_ids[0]"),
    ("bank_ids", [2**63], "deposit.bank_ids[0]"),  # past int64: was a 500 (OverflowError)
    ("bank_array_j", [-1.0], "deposit.bank_array_j[0]"),
    ("tsv_io_vault_j", [[0.0] * 16], "deposit.tsv_io_vault_j"),
    ("tsv_io_vault_j", [[0.0] * 16, [0.0] * 3 + [-1.0] + [0.0] * 12], "deposit.tsv_io_vault_j[1][3]"),
    ("tsv_io_vault_j", [[0.0] * 16, [0.0] * 15], "deposit.tsv_io_vault_j[1]"),
    ("bank_ids", [-1], "deposit.bank_ids[0]"),
])
def test_http_a_bad_deposit_is_a_422_naming_the_field(client: TestClient, arch_small: ArchConfig, key: str,
                                                      value: Any, field: str) -> None:
    c, m = _events(5)
    deposit = deposit_of_events(c, m, arch_small).to_contract().model_dump(mode="json")
    if key == "bank_ids":
        deposit["bank_array_j"] = [1e-9]
    if key == "bank_array_j":
        deposit["bank_ids"] = [0]
    body = {**_step_body(arch_small, 0, None), "deposit": {**deposit, key: value}}
    del body["compute_events"], body["memory_events"]
    r = client.post("/v1/step", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"].startswith(field)


def test_http_a_state_the_replica_does_not_keep_is_a_404_and_warm_start_takes_a_ref(
        settings: Settings, arch_small: ArchConfig) -> None:
    client = TestClient(create_app(settings))
    r = client.post("/v1/step", json={**_step_body(arch_small, 1, None), "state_ref": "cd" * 32})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_thermal_state" and r.json()["error"]["field"] == "state_ref"
    arch = arch_small.model_copy(update={"thermal": arch_small.thermal.model_copy(
        update={"init": "steady", "warmup_ms": 3.0})})
    first = client.post("/v1/step", json=_step_body(arch, 0, None)).json()
    assert first["state"]["warm_energy_b64"]
    body = {"arch": arch.model_dump(mode="json")}
    whole = client.post("/v1/warm_start", json={**body, "state": first["state"]})
    named = client.post("/v1/warm_start", json={**body, "state_ref": first["state_ref"]})
    assert whole.status_code == named.status_code == 200 and whole.content == named.content
    r = TestClient(create_app(settings)).post("/v1/warm_start", json={**body, "state_ref": first["state_ref"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_thermal_state"
    r = client.post("/v1/warm_start", json=body)
    assert r.status_code == 422 and r.json()["error"]["field"] == "state"
