"""The metrics HTTP layer: wiring of /v1/reduce, /v1/compare, /v1/plots/{kind} and their 422s naming the field."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.metrics.app import create_app
from services.metrics.compare import compare_all, compare_csv, compare_markdown
from services.metrics.reduce import reduce_window_metrics, row_csv
from shared.contracts.metrics import RESULT_COLUMNS, WindowMetrics
from shared.settings import Settings


@pytest.fixture()
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def _body(ws: list[WindowMetrics], scenario: str = "baseline") -> dict[str, Any]:
    return {"scenario": scenario, "workload": "mixtral_8x7b", "thot_c": 80.0,
            "windows": [w.model_dump(mode="json") for w in ws]}


def _field(resp: Any) -> str:
    assert resp.status_code == 422, resp.text
    err = resp.json()["error"]
    assert err["field"] and err["field"] in err["message"]
    return str(err["field"])


def test_reduce(client: TestClient, runs: dict[str, list[WindowMetrics]]) -> None:
    r = client.post("/v1/reduce", json=_body(runs["tas"], "tas"))
    assert r.status_code == 200, r.text
    want = reduce_window_metrics(runs["tas"], scenario="tas", workload="mixtral_8x7b", thot_c=80.0)
    assert r.json()["row"] == want.model_dump(mode="json")
    assert r.json()["csv"] == row_csv(want)
    assert r.json()["csv"].startswith(",".join(RESULT_COLUMNS) + ",")


def test_reduce_bad_input(client: TestClient, windows: list[WindowMetrics]) -> None:
    assert _field(client.post("/v1/reduce", json=_body(windows, "fastest"))) == "scenario"
    body = _body(windows)
    del body["windows"][1]["dt_ms"]
    assert _field(client.post("/v1/reduce", json=body)) == "windows[1].dt_ms"
    body = _body(windows)
    body["windows"][3]["temps_core_c"] = body["windows"][3]["temps_core_c"][:32]
    assert _field(client.post("/v1/reduce", json=body)) == "windows[3].temps_core_c"
    body = _body(windows)
    body["windows"][2]["power_w"] = float("nan")  # Python's json writes NaN; the service must refuse it
    r = client.post("/v1/reduce", content=json.dumps(body), headers={"content-type": "application/json"})
    assert _field(r) == "windows[2].power_w"
    assert _field(client.post("/v1/reduce", json={**_body(windows), "windows": []})) == "windows"


def test_compare(client: TestClient, runs: dict[str, list[WindowMetrics]]) -> None:
    rows = [reduce_window_metrics(ws, scenario=s, workload="mixtral_8x7b", thot_c=80.0) for s, ws in runs.items()]
    r = client.post("/v1/compare", json={"rows": [x.model_dump(mode="json") for x in rows]})
    assert r.status_code == 200, r.text
    assert r.json() == {"csv": compare_csv(compare_all(rows)), "markdown": compare_markdown(compare_all(rows))}
    bad = [x.model_dump(mode="json") for x in rows]
    bad[2]["scenario"] = "fastest"
    assert _field(client.post("/v1/compare", json={"rows": bad})) == "rows[2].scenario"
    no_base = [x.model_dump(mode="json") for x in rows[1:]]
    assert _field(client.post("/v1/compare", json={"rows": no_base})) == "rows"


def test_plots(client: TestClient, runs: dict[str, list[WindowMetrics]]) -> None:
    body = {"workload": "mixtral_8x7b", "thot_c": 80.0,
            "windows": {s: [w.model_dump(mode="json") for w in ws] for s, ws in runs.items()}}
    r = client.post("/v1/plots/heatmap", params={"format": "png"}, json=body)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png"
    assert r.content[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", r.content[16:24])[0] > 0
    r = client.post("/v1/plots/temperature?format=svg", json=body)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("image/svg+xml") and b"<svg" in r.content
    assert _field(client.post("/v1/plots/violin", json=body)) == "kind"
    assert _field(client.post("/v1/plots/heatmap?format=gif", json=body)) == "format"
    assert _field(client.post("/v1/plots/heatmap", json={**body, "dram_layer": 99})) == "dram_layer"
    assert _field(client.post("/v1/plots/performance", json={"workload": "w"})) == "rows"


def test_a_plot_title_is_bounded(client: TestClient) -> None:
    """A 300 kB workload label took 28 s to draw (found by a hostile-request probe): 422 naming it."""
    assert _field(client.post("/v1/plots/temperature", json={"workload": "x" * 300_000})) == "workload"
