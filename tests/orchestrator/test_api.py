"""The orchestrator's HTTP API (embedded mode, fake compute services): experiments, idempotency, progress, results,
windows, log, cancel, SSE, sweeps, errors."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.orchestrator.conftest import SMALL_WL


def _wait(api: TestClient, exp_id: str, timeout: float = 60.0) -> dict[str, Any]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        view: dict[str, Any] = api.get(f"/v1/experiments/{exp_id}").json()
        if view["status"] in {"succeeded", "failed", "cancelled"}:
            return view
        time.sleep(0.05)
    raise AssertionError(f"experiment {exp_id} did not finish in {timeout} s")


def test_experiment_end_to_end_over_http(api: TestClient) -> None:
    r = api.post("/v1/experiments", json={"workload": SMALL_WL, "scenarios": ["baseline", "tas"], "seed": 5})
    assert r.status_code == 202, r.text
    body = r.json()
    assert r.headers["Location"] == f"/v1/experiments/{body['id']}" and body["created"] is True
    view = _wait(api, body["id"])
    assert view["status"] == "succeeded", view
    assert [run["scenario"] for run in view["runs"]] == ["baseline", "tas"]
    assert all(run["progress"] == "window 4 of 4" for run in view["runs"])
    # RFC 3339 date-times carry their zone (the database keeps naive UTC)
    stamps = [view["created_at"], view["updated_at"]] + [run[k] for run in view["runs"]
                                                         for k in ("started_at", "finished_at")]
    assert all(datetime.fromisoformat(t).utcoffset() == timedelta(0) for t in stamps), stamps
    res = api.get(f"/v1/experiments/{body['id']}/results").json()
    assert [row["scenario"] for row in res["rows"]] == ["baseline", "tas"]
    csv = api.get(f"/v1/experiments/{body['id']}/results", params={"format": "csv"})
    assert csv.headers["content-type"].startswith("text/csv")
    lines = csv.text.splitlines()
    assert lines[0].startswith("scenario,workload,T_peak_logic") and len(lines) == 3
    wins = api.get(f"/v1/experiments/{body['id']}/windows", params={"scenario": "tas"}).json()
    assert list(wins["scenarios"]) == ["tas"] and [w["window"] for w in wins["scenarios"]["tas"]] == [0, 1, 2, 3]
    page = api.get(f"/v1/experiments/{body['id']}/windows", params={"scenario": "tas", "offset": 1, "limit": 2}).json()
    assert [w["window"] for w in page["scenarios"]["tas"]] == [1, 2] and page["next_offset"] == 3
    power = api.get(f"/v1/experiments/{body['id']}/power").json()["scenarios"]
    assert list(power) == ["baseline", "tas"]
    comp = power["tas"]["components"]
    assert comp["total"]["energy_j"] > 0 and comp["total"]["energy_j"] == pytest.approx(
        sum(comp[k]["energy_j"] for k in comp if k != "total"))
    log = api.get(f"/v1/experiments/{body['id']}/log").text
    assert "seed 5" in log and "==> tas" in log
    page = api.get("/v1/experiments", params={"status": "succeeded"}).json()
    assert page["total"] == 1 and page["items"][0]["id"] == body["id"]
    assert api.get("/v1/experiments", params={"status": "running"}).json()["total"] == 0


def test_same_idempotency_key_gives_one_experiment(api: TestClient) -> None:
    body = {"workload": SMALL_WL, "scenarios": ["baseline"], "windows": 1}
    a = api.post("/v1/experiments", json=body, headers={"Idempotency-Key": "abc"})
    b = api.post("/v1/experiments", json=body, headers={"Idempotency-Key": "abc"})
    assert a.status_code == b.status_code == 202
    assert a.json()["id"] == b.json()["id"] and b.json()["created"] is False
    assert api.get("/v1/experiments").json()["total"] == 1
    c = api.post("/v1/experiments", json={**body, "seed": 9}, headers={"Idempotency-Key": "abc"})
    assert c.status_code == 409 and c.json()["error"]["field"] == "Idempotency-Key"
    _wait(api, a.json()["id"])


def test_bad_inputs_name_the_field(api: TestClient) -> None:
    r = api.post("/v1/experiments", json={"arch": {"mesh": {"cores": [0, 8]}}})
    assert r.status_code == 422 and "mesh.cores" in r.json()["error"]["field"]
    r = api.post("/v1/experiments", json={"arch": "../../etc/passwd"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "arch"
    r = api.post("/v1/experiments", json={"workload": "no_such_workload"})
    assert r.status_code == 422 and "no config file" in r.json()["error"]["message"]
    r = api.post("/v1/experiments", json={"scenarios": ["nope"]})
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("scenarios")
    assert api.get("/v1/experiments/exp-missing").status_code == 404
    assert api.get("/v1/experiments/exp-missing/results").status_code == 404
    assert api.post("/v1/experiments/exp-missing/cancel").status_code == 404
    assert api.get("/v1/experiments/exp-missing/events").status_code == 404
    r = api.post("/v1/sweeps", json={"grid": {"tas.tacs.nope": [1]}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "grid.tas.tacs.nope"


def test_config_files_by_name_and_cancel(api: TestClient) -> None:
    r = api.post("/v1/experiments", json={"arch": "arch_8x8_32x32x8", "workload": "workload_mixtral_8x7b.yaml",
                                          "tas": "tas_params.yaml", "scenarios": ["baseline"]})
    assert r.status_code == 202, r.text
    exp_id = r.json()["id"]
    time.sleep(0.3)
    view = api.post(f"/v1/experiments/{exp_id}/cancel").json()
    # the 9901-window run on the fakes takes a few seconds; had it finished first, the cancel finds nothing to stop
    # (and the experiment reads "running" until its files are written, then "succeeded")
    if view["runs"][0]["status"] != "succeeded":
        assert view["status"] == "cancelled"
        assert _wait(api, exp_id)["status"] == "cancelled"
        run = api.get(f"/v1/experiments/{exp_id}").json()["runs"][0]
        assert run["window"] < 9901
        # no scenario has a result: the CSV is a 409 naming the experiment, not a header that reads as success
        csv = api.get(f"/v1/experiments/{exp_id}/results", params={"format": "csv"})
        assert csv.status_code == 409 and csv.json()["error"]["field"] == "id"
        assert "cancelled" in csv.json()["error"]["message"]


def test_events_stream_progress_until_done(api: TestClient) -> None:
    exp_id = api.post("/v1/experiments", json={"workload": SMALL_WL, "scenarios": ["tacs"]}).json()["id"]
    events = []
    with api.stream("GET", f"/v1/experiments/{exp_id}/events", params={"poll_s": 0.05}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
    assert events[0] == "progress" and events[-1] == "done" and events.count("done") == 1


def test_sweep_collects_one_table(api: TestClient) -> None:
    r = api.post("/v1/sweeps", json={"base": {"workload": SMALL_WL, "scenarios": ["tacs"]},
                                     "grid": {"tas.tacs.thresholds.Thot": [60.0, 85.0], "seed": [1, 2]}})
    assert r.status_code == 202, r.text
    sweep = r.json()
    assert len(sweep["experiments"]) == 4 and len(sweep["points"]) == 4
    for exp_id in sweep["experiments"]:
        assert _wait(api, exp_id)["status"] == "succeeded"
    table = api.get(f"/v1/sweeps/{sweep['id']}").json()
    assert table["status"] == "succeeded" and len(table["table"]) == 4
    assert {row["param:tas.tacs.thresholds.Thot"] for row in table["table"]} == {60.0, 85.0}
    assert all(row["scenario"] == "tacs" for row in table["table"])
