"""Requests that would make the thermal service work without end, overflow its integers or answer non-finite
temperatures are 422s naming the field (found by a hostile-request probe), never a 500, a hang or a NaN."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.thermal.app import create_app
from shared.configs import ArchConfig
from shared.configs.arch import MAX_TRANSIENT_SUBSTEPS
from shared.contracts.thermal import ThermalState
from shared.errors import BadInput
from shared.settings import Settings
from tests.conftest import FIXTURES
from tests.thermal.test_api import _step_body

TINY_ARGS = ["-c", "tiny.config", "-grid_layer_file", "tiny.lcf", "-p", "tiny.ptrace", "-steady_file", "o.steady"]


@pytest.fixture()
def client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


def _files() -> dict[str, str]:
    return {f.name: f.read_text() for f in (FIXTURES / "thermal").iterdir()}


def _error(r: Any) -> dict[str, Any]:
    assert r.status_code == 422, (r.status_code, r.text[:300])
    err: dict[str, Any] = r.json()["error"]
    return err


@pytest.mark.parametrize(("extra", "field"), [
    (["-grid_rows", "100000", "-grid_cols", "100000"], "grid_rows"),
    (["-grid_rows", "1e300"], "grid_rows"),
    (["-grid_cols", "513"], "grid_cols"),
    (["-o", "t.ttrace", "-sampling_intvl", "1e6"], "sampling_intvl"),
])
def test_hotspot_import_work_is_bounded(client: TestClient, extra: list[str], field: str) -> None:
    assert _error(client.post("/v1/hotspot/import", json={"files": _files(), "args": [*TINY_ARGS, *extra]})
                  )["field"] == field


def test_hotspot_import_refuses_non_finite_temperatures(client: TestClient) -> None:
    files = _files()
    head = files["tiny.ptrace"].splitlines()[0]
    files["tiny.ptrace"] = head + "\n" + "\t".join(["1e308"] * len(head.split())) + "\n"
    err = _error(client.post("/v1/hotspot/import", json={"files": files, "args": TINY_ARGS}))
    assert err["field"] == "p" and "not finite" in err["message"]


def test_hotspot_import_errors_never_name_the_scratch_directory(client: TestClient) -> None:
    files = _files()
    flp = next(n for n in files if n.endswith(".flp"))
    files[flp] = ""
    r = client.post("/v1/hotspot/import", json={"files": files, "args": TINY_ARGS})
    assert r.status_code == 422 and "tasmoe-hotspot" not in r.text, r.text
    assert r.json()["error"]["field"] == flp


def test_a_step_or_solve_of_too_many_trbdf2_substeps_is_refused(client: TestClient, arch_small: ArchConfig) -> None:
    arch = arch_small.model_copy(update={"thermal": arch_small.thermal.model_copy(
        update={"integrator": "trbdf2", "max_substep_ms": 1e-4})})
    body = {**_step_body(arch, 0, None), "window_ms": 1e6}
    err = _error(client.post("/v1/step", json=body))
    assert err["field"] == "window_ms" and str(MAX_TRANSIENT_SUBSTEPS) in err["message"]
    solve = {"arch": arch.model_dump(mode="json"), "core_w": [1.0] * 16, "mode": "transient", "duration_ms": 1e9}
    assert _error(client.post("/v1/solve", json=solve))["field"] == "duration_ms"
    assert client.post("/v1/step", json={**body, "window_ms": 3.0}).status_code == 200  # 30 000 sub-steps: in bounds


@pytest.mark.parametrize(("state", "field"), [
    ({"dvfs_level": [2 ** 70] * 16, "window": 0}, "state.dvfs_level[0]"),
    ({"t_ns": 2 ** 80, "window": 0}, "state.t_ns"),
    ({"window": 2 ** 80 - 1}, "state.window"),
])
def test_state_integers_past_int64_are_422(client: TestClient, arch_small: ArchConfig, state: dict[str, Any],
                                           field: str) -> None:
    body = {**_step_body(arch_small, 1, None), "state": ThermalState(window=0).model_dump(mode="json") | state}
    assert _error(client.post("/v1/step", json=body))["field"] == field


def test_huge_bank_coordinates_and_no_dvfs_domain_are_422(client: TestClient, arch_small: ArchConfig) -> None:
    body = _step_body(arch_small, 0, None)
    body["memory_events"]["dst_bank"] = ["B(99999999999999999999999,0,0)"]
    assert _error(client.post("/v1/step", json=body))["field"].startswith("memory_events")
    arch = arch_small.model_dump(mode="json")
    arch["dvfs"] = {"domains": []}
    assert "dvfs" in _error(client.post("/v1/step", json=_step_body(arch_small, 0, None) | {"arch": arch}))["field"]


def test_powers_past_what_a_float_holds_are_422_not_nan(client: TestClient, arch_small: ArchConfig) -> None:
    body = _step_body(arch_small, 0, None)
    body["compute_events"]["energy_j"] = [1e308, 1e308]
    assert _error(client.post("/v1/step", json=body))["field"] == "compute_events"
    solve = {"arch": arch_small.model_dump(mode="json"), "core_w": [1e308] * 16}
    assert _error(client.post("/v1/solve", json=solve))["field"] == "core_w"


def test_the_local_hotspot_command_is_not_held_to_a_requests_bound(tmp_path: Any) -> None:
    """The sub-step bound is the service's (a request's CPU: the file mode passes it, tested above); `hotspot.run`,
    which `tasmoe hotspot` calls on a user's own machine, applies it only when given one."""
    from services.thermal import hotspot

    for name, text in _files().items():
        (tmp_path / name).write_text(text)
    head = (tmp_path / "tiny.ptrace").read_text().splitlines()[0]
    n = MAX_TRANSIENT_SUBSTEPS // 10 + 1  # lines of 1 ms: 10 sub-steps each, just past the bound
    (tmp_path / "long.ptrace").write_text(head + "\n" + ("\t".join(["0.1"] * len(head.split())) + "\n") * n)
    args = [str(tmp_path / a) if a.startswith("tiny") else a for a in TINY_ARGS]
    args[args.index(str(tmp_path / "tiny.ptrace"))] = str(tmp_path / "long.ptrace")
    opts = hotspot.parse_options([*args, "-o", str(tmp_path / "t.ttrace"), "-sampling_intvl", "1e-3"])
    with pytest.raises(BadInput) as err:
        hotspot.run(opts, max_substeps=MAX_TRANSIENT_SUBSTEPS)
    assert err.value.field == "sampling_intvl"
    short = [*args[:-1], str(tmp_path / "o.steady")]
    (tmp_path / "short.ptrace").write_text(head + "\n" + ("\t".join(["0.1"] * len(head.split())) + "\n") * 3)
    short[short.index(str(tmp_path / "long.ptrace"))] = str(tmp_path / "short.ptrace")
    res = hotspot.run(hotspot.parse_options([*short, "-o", str(tmp_path / "t.ttrace"), "-sampling_intvl", "1e-3"]))
    assert res.transient is not None and res.transient.shape[0] == 3
