"""The sweep figure (services/metrics/sweep_plots.py): size and stable bytes, one series per scenario at the values of
a hand-made table, the throttling band as compare.throttling defines it, the Pareto front, errors naming the field,
and its HTTP route."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from matplotlib.colors import to_hex
from matplotlib.image import imread

from services.metrics.app import create_app
from services.metrics.compare import compare, throttling
from services.metrics.plots import DPI, SCENARIO_COLORS
from services.metrics.sweep_plots import (
    pareto_figure,
    pareto_front,
    render_sweep_plot,
    sweep_figure_data,
    sweep_figure_size,
)
from shared.contracts.metrics import COOLING_KEY, LIMIT_KEY, SCENARIOS, ResultRow, SweepPlotRequest, SweepRow
from shared.errors import BadInput
from shared.settings import Settings
from tests.metrics.test_plots import png_size

# (h, limit) -> scenario -> (goodput tok/s, mJ per token); worked out by hand in test_pareto_front_of_the_table
TABLE: dict[tuple[float, float], dict[str, tuple[float, float]]] = {
    (5000.0, 85.0): {"baseline": (100, 10), "taps": (110, 12), "tacs": (120, 11), "tas": (130, 13),
                     "unthrottled": (200, 9)},
    (5000.0, 95.0): {"baseline": (150, 10), "taps": (155, 11), "tacs": (160, 12), "tas": (170, 14),
                     "unthrottled": (200, 9)},
    (10000.0, 85.0): {"baseline": (140, 9), "taps": (145, 9.5), "tacs": (150, 10), "tas": (165, 10.5),
                      "unthrottled": (210, 8)},
    (10000.0, 95.0): {"baseline": (180, 9), "taps": (185, 9.5), "tacs": (190, 9.2), "tas": (195, 12),
                      "unthrottled": (210, 8)},
}
TOKENS = 1000
COMMON: dict[str, Any] = dict(
    workload="serving", T_peak_dram=80.0, T_avg=70.0, lat_ms=5.0, bw_util=0.5, refresh_mhz=1.0, noc_load=0.1,
    lat_p50_ms=4.0, lat_p99_ms=9.0, power_avg_w=500.0, migrations=0, time_above_thot_ms=0.0, thot_c=80.0,
    T_var_logic=1.0, T_mean_logic=70.0, T_mean_dram=70.0, freq_avg_ghz=1.5, queue_delay_ms=0.0, noc_load_max=0.2,
    windows=100, tokens=TOKENS, sim_time_ms=1000.0, tokens_offered=250)


def sweep_rows(*, goodput: bool = True, scenarios: tuple[str, ...] = SCENARIOS) -> list[SweepRow]:
    rows = []
    for (h, lim), by in TABLE.items():
        for s in scenarios:
            rate, mj = by[s]
            row = ResultRow(scenario=s, T_peak_logic=lim, ips=1.1 * rate, energy_j=mj * TOKENS / 1e3,
                            goodput_tok_s=float(rate) if goodput else None, slo_met=1 if goodput else None,
                            **COMMON)
            rows.append(SweepRow(experiment=f"exp-{h:g}-{lim:g}", params={COOLING_KEY: h, LIMIT_KEY: lim}, row=row))
    return rows


@pytest.fixture(scope="module")
def req() -> SweepPlotRequest:
    return SweepPlotRequest(label="cooling x limit", rows=sweep_rows())


@pytest.fixture(scope="module")
def rendered(req: SweepPlotRequest) -> dict[str, bytes]:
    return {fmt: render_sweep_plot("pareto", req, fmt) for fmt in ("png", "svg")}


def test_png_has_the_size_and_is_a_picture(rendered: dict[str, bytes]) -> None:
    w_in, h_in = sweep_figure_size("pareto")
    assert png_size(rendered["png"]) == (round(w_in * DPI), round(h_in * DPI))
    img = imread(io.BytesIO(rendered["png"]), format="png")
    rgb = (img[..., :3] * 255).astype(np.uint32).reshape(-1, 3)
    assert np.unique((rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]).size > 50


def test_svg_is_stable(req: SweepPlotRequest, rendered: dict[str, bytes]) -> None:
    svg = rendered["svg"]
    w_in, h_in = sweep_figure_size("pareto")
    assert svg.lstrip().startswith(b"<?xml") and f'width="{w_in * 72:g}pt"'.encode() in svg
    assert f'height="{h_in * 72:g}pt"'.encode() in svg and b"<dc:date>" not in svg
    assert render_sweep_plot("pareto", req, "svg") == svg
    assert render_sweep_plot("pareto", req, "png") == rendered["png"]
    other = req.model_copy(update={"rows": sweep_rows(goodput=False)})
    assert render_sweep_plot("pareto", other, "svg") != svg


def test_one_series_per_scenario_at_the_tables_values(req: SweepPlotRequest) -> None:
    data = sweep_figure_data(req)
    assert data.metric == "goodput_tok_s" and data.scenarios == SCENARIOS
    assert data.cooling is not None and data.limit is not None
    # the slices default to the upper median of the swept values: limit 95 against h, h 10000 against the limit
    assert data.cooling.at == 95.0 and data.limit.at == 10000.0
    assert list(data.cooling.x) == [5000.0, 10000.0] and list(data.limit.x) == [85.0, 95.0]
    for s in SCENARIOS:
        assert list(data.cooling.y[s]) == [TABLE[5000.0, 95.0][s][0], TABLE[10000.0, 95.0][s][0]]
        assert list(data.limit.y[s]) == [TABLE[10000.0, 85.0][s][0], TABLE[10000.0, 95.0][s][0]]
    assert data.cooling.offered is not None and list(data.cooling.offered) == [250.0, 250.0]
    assert data.cooling.points_per_x == 1
    # the drawn figure: in each slice one line per scenario, in the scenario's colour
    fig = pareto_figure(req)
    for ax in fig.axes[:2]:
        colours = [to_hex(str(line.get_color())).upper() for line in ax.get_lines()]
        scn_lines = [c for c in colours if c in {v.upper() for v in SCENARIO_COLORS.values()}]
        assert sorted(scn_lines) == sorted(v.upper() for v in SCENARIO_COLORS.values())
    at_85 = sweep_figure_data(req.model_copy(update={"at_limit": 85.0}))
    assert at_85.cooling is not None and list(at_85.cooling.y["tas"]) == [130.0, 165.0]


def test_the_band_is_compare_throttling(req: SweepPlotRequest) -> None:
    data = sweep_figure_data(req)
    assert data.cooling is not None
    for j, h in enumerate((5000.0, 10000.0)):
        rows = [r.row for r in req.rows if r.params[COOLING_KEY] == h and r.params[LIMIT_KEY] == 95.0]
        th = throttling(compare(rows))
        assert th is not None and th.metric == "goodput_tok_s"
        assert data.cooling.unthrottled[j] == th.unthrottled and data.cooling.baseline[j] == th.baseline
    # without the reference there is no band
    no_ref = sweep_figure_data(SweepPlotRequest(rows=sweep_rows(scenarios=("baseline", "tas"))))
    assert no_ref.cooling is not None and np.isnan(no_ref.cooling.unthrottled).all()


def test_throughput_falls_back_to_ips_when_a_row_has_no_goodput(req: SweepPlotRequest) -> None:
    rows = sweep_rows()
    rows[3] = rows[3].model_copy(update={"row": rows[3].row.model_copy(update={"goodput_tok_s": None})})
    data = sweep_figure_data(SweepPlotRequest(rows=rows))
    assert data.metric == "ips"
    assert data.limit is not None and list(data.limit.y["tas"]) == [1.1 * 165, 1.1 * 195]


def test_pareto_front_mask() -> None:
    # ties: equal points dominate neither; a point equal on one axis and worse on the other is dominated
    assert pareto_front(np.array([1.0, 1.0, 2.0, 1.0]), np.array([5.0, 5.0, 4.0, 3.0])).tolist() == [
        True, True, False, False]
    assert pareto_front(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0])).tolist() == [True, True, True]
    assert pareto_front(np.array([3.0, 2.0, 1.0]), np.array([1.0, 2.0, 3.0])).tolist() == [False, False, True]


def test_pareto_front_of_the_table(req: SweepPlotRequest) -> None:
    """By hand: at 10000 / 95 °C baseline (9 mJ, 180) beats everything at 9 mJ or more that serves less, tacs
    (9.2 mJ, 190) and tas (12 mJ, 195) buy more throughput for more energy; every other policy point is beaten on
    both by one of those three. unthrottled (8 mJ, 210) would beat them all but is not a candidate."""
    p = sweep_figure_data(req).pareto
    front = {(p.scenario[i], float(p.cooling[i]), float(p.limit[i])) for i in np.flatnonzero(p.front)}
    assert front == {("baseline", 10000.0, 95.0), ("tacs", 10000.0, 95.0), ("tas", 10000.0, 95.0)}
    assert len(p.scenario) == 16 and "unthrottled" not in p.scenario
    assert sorted(p.ref_energy_mj.tolist()) == [8.0, 8.0, 9.0, 9.0]


def test_errors_name_the_field(req: SweepPlotRequest) -> None:
    def field(r: SweepPlotRequest, kind: str = "pareto", fmt: str = "svg") -> str | None:
        with pytest.raises(BadInput) as ei:
            render_sweep_plot(kind, r, fmt)
        return ei.value.field

    assert field(req, kind="violin") == "kind"
    assert field(req, fmt="gif") == "format"
    assert field(req.model_copy(update={"at_limit": 90.0})) == "at_limit"
    assert field(req.model_copy(update={"at_cooling": 7000.0})) == "at_cooling"
    rows = sweep_rows()
    rows[2] = rows[2].model_copy(update={"params": {COOLING_KEY: 5000.0}})
    assert field(SweepPlotRequest(rows=rows)) == f"rows[2].params.{LIMIT_KEY}"
    rows = sweep_rows()
    rows[4] = rows[4].model_copy(update={"params": {COOLING_KEY: "air", LIMIT_KEY: 85.0}})
    assert field(SweepPlotRequest(rows=rows)) == f"rows[4].params.{COOLING_KEY}"
    rows = sweep_rows()
    rows[1] = rows[1].model_copy(update={"row": rows[0].row})
    assert field(SweepPlotRequest(rows=rows)) == "rows[1].row.scenario"
    rows = sweep_rows()
    rows[0] = rows[0].model_copy(update={"params": {COOLING_KEY: 0.0, LIMIT_KEY: 85.0}})
    assert field(SweepPlotRequest(rows=rows)) == f"rows[0].params.{COOLING_KEY}"


def test_a_grid_without_one_key_draws_the_other() -> None:
    rows = [r.model_copy(update={"params": {COOLING_KEY: r.params[COOLING_KEY]}}) for r in sweep_rows()
            if r.params[LIMIT_KEY] == 85.0]
    data = sweep_figure_data(SweepPlotRequest(rows=rows))
    assert data.limit is None and data.cooling is not None and data.cooling.at is None
    assert render_sweep_plot("pareto", SweepPlotRequest(rows=rows), "png")[:4] == b"\x89PNG"


@pytest.fixture()
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def test_http(client: TestClient, req: SweepPlotRequest, rendered: dict[str, bytes]) -> None:
    body = req.model_dump(mode="json")
    r = client.post("/v1/plots/sweep/pareto", params={"format": "svg"}, json=body)
    assert r.status_code == 200 and r.headers["content-type"] == "image/svg+xml"
    assert r.content == rendered["svg"]
    r = client.post("/v1/plots/sweep/pareto", json=body)
    assert r.status_code == 200 and r.content == rendered["png"]
    for resp, fld in ((client.post("/v1/plots/sweep/violin", json=body), "kind"),
                      (client.post("/v1/plots/sweep/pareto", json={**body, "at_limit": 90}), "at_limit"),
                      (client.post("/v1/plots/sweep/pareto", json={**body, "rows": []}), "rows")):
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["field"] == fld


def test_an_offered_load_far_above_every_point_is_written_not_drawn(req: SweepPlotRequest) -> None:
    """A flat-out sweep offers far more than any point serves: its offered-load line would press every curve onto the
    axis, so each slice writes the offered load in a corner instead, the y axis is the throughputs', and the legend
    names no line that is not drawn. At the table's own offered load (within OFFERED_OFF_SCALE times the throughput)
    the line is drawn."""
    from services.metrics.sweep_plots import OFFERED_COLOR, OFFERED_OFF_SCALE

    top = max(rate for by in TABLE.values() for rate, _ in by.values())
    flooded = [r.model_copy(update={"row": r.row.model_copy(update={"tokens_offered": 100 * top})})
               for r in sweep_rows()]
    assert 100 * top > OFFERED_OFF_SCALE * top
    for request, drawn in ((req, True), (req.model_copy(update={"rows": flooded}), False)):
        fig = pareto_figure(request)
        for ax in fig.axes[:2]:
            grey = [line for line in ax.get_lines() if to_hex(str(line.get_color())) == to_hex(OFFERED_COLOR)]
            assert bool(grey) == drawn
            written = [t.get_text() for t in ax.texts if t.get_text().startswith("offered load")]
            assert bool(written) != drawn and ax.get_ylim()[1] < (1e9 if drawn else 2 * top)
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert ("offered load" in labels) == drawn
