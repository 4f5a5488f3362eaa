"""render_plot: every kind renders a non-empty image of the expected size, deterministically; heat-map content."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from matplotlib.image import imread

from services.metrics.plots import DPI, KINDS, figure_size, heatmap_frames, render_plot
from services.metrics.reduce import reduce_window_metrics
from shared.contracts.metrics import POLICIES, PlotRequest, WindowMetrics
from shared.errors import BadInput

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


@pytest.fixture(scope="module")
def request_data(runs: dict[str, list[WindowMetrics]]) -> PlotRequest:
    rows = [reduce_window_metrics(ws, scenario=s, workload="mixtral_8x7b", thot_c=80.0) for s, ws in runs.items()]
    return PlotRequest(workload="mixtral_8x7b", rows=rows, windows=runs, thot_c=80.0)


@pytest.fixture(scope="module")
def rendered(request_data: PlotRequest) -> dict[tuple[str, str], bytes]:
    """Each kind rendered once per format (rendering is the slow part of this suite)."""
    return {(k, f): render_plot(k, request_data, f) for k in KINDS for f in ("png", "svg")}


@pytest.mark.parametrize("kind", KINDS)
def test_png_is_non_empty_with_expected_size(kind: str, rendered: dict[tuple[str, str], bytes]) -> None:
    data = rendered[kind, "png"]
    w_in, h_in = figure_size(kind, len(POLICIES))
    assert png_size(data) == (round(w_in * DPI), round(h_in * DPI))
    img = imread(io.BytesIO(data), format="png")
    assert img.shape[:2] == (round(h_in * DPI), round(w_in * DPI))
    rgb = (img[..., :3] * 255).astype(np.uint32).reshape(-1, 3)
    packed = (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]
    assert np.unique(packed).size > 50  # a real picture, not a blank canvas


@pytest.mark.parametrize("kind", KINDS)
def test_svg_is_stable(kind: str, request_data: PlotRequest, rendered: dict[tuple[str, str], bytes]) -> None:
    a = rendered[kind, "svg"]
    assert a.lstrip().startswith(b"<?xml") and b"<svg" in a
    w_in, h_in = figure_size(kind, len(POLICIES))
    assert f'width="{w_in * 72:g}pt"'.encode() in a and f'height="{h_in * 72:g}pt"'.encode() in a
    assert b"<dc:date>" not in a
    assert render_plot(kind, request_data, "svg") == a


@pytest.mark.parametrize("kind", KINDS)
def test_plot_depends_on_data(kind: str, request_data: PlotRequest, rendered: dict[tuple[str, str], bytes]) -> None:
    hotter = {s: [w.model_copy(update={"temps_core_c": [t + 3.0 for t in w.temps_core_c],
                                       "T_peak_logic": w.T_peak_logic + 3.0, "T_mean_logic": w.T_mean_logic + 3.0,
                                       "tokens_completed": w.tokens_completed + 5,
                                       "power": w.power.model_copy(update={"noc": w.power.noc + 1.0})
                                       if w.power is not None else None})
                  for w in ws] for s, ws in request_data.windows.items()}
    other = PlotRequest(workload="mixtral_8x7b", windows=hotter, thot_c=80.0)
    again = render_plot(kind, other, "png")
    assert again != rendered[kind, "png"]
    assert png_size(again) == png_size(rendered[kind, "png"])


def test_png_is_deterministic(request_data: PlotRequest, rendered: dict[tuple[str, str], bytes]) -> None:
    assert render_plot("heatmap", request_data, "png") == rendered["heatmap", "png"]


def test_bars_can_come_from_windows_alone(request_data: PlotRequest, rendered: dict[tuple[str, str], bytes]) -> None:
    only_windows = PlotRequest(workload="mixtral_8x7b", windows=request_data.windows, thot_c=80.0)
    assert render_plot("performance", only_windows, "png") == rendered["performance", "png"]


def test_heatmap_frames_pick_hottest_window_and_layer(runs: dict[str, list[WindowMetrics]]) -> None:
    # the DRAM peak in another window than the logic peak: each panel follows its own peak
    hot_l = {s: max(ws, key=lambda w: w.T_peak_logic).window for s, ws in runs.items()}
    target = {s: (k + 1) % len(runs[s]) for s, k in hot_l.items()}
    runs = {s: [w.model_copy(update={"T_peak_dram": w.T_peak_dram + (100.0 if w.window == target[s] else 0.0)})
                for w in ws] for s, ws in runs.items()}
    fr = heatmap_frames(PlotRequest(workload="w", windows=runs))
    hottest = {s: max(ws, key=lambda w: w.T_peak_logic) for s, ws in runs.items()}
    hottest_d = {s: max(ws, key=lambda w: w.T_peak_dram) for s, ws in runs.items()}
    assert all(hottest_d[s].window == target[s] != hottest[s].window for s in runs)
    layer_max = np.max([np.asarray(w.temps_bank_c).max(axis=0) for w in hottest_d.values()], axis=0)
    assert fr.layer == int(np.argmax(layer_max))
    assert fr.mesh == (8, 8)
    for s, w in hottest.items():
        assert fr.window[s].window == w.window
        core = np.asarray(w.temps_core_c)
        # core (x, y) = (c % 8, c // 8) sits at row y, column x
        assert fr.logic[s][3, 5] == core[3 * 8 + 5]
        assert np.array_equal(fr.logic[s].ravel(), core)
        assert fr.window_dram[s].window == target[s]
        assert np.array_equal(fr.dram[s].ravel(), np.asarray(hottest_d[s].temps_bank_c)[:, fr.layer])
    fr2 = heatmap_frames(PlotRequest(workload="w", windows=runs, dram_layer=5))
    assert fr2.layer == 5


def test_plot_errors(request_data: PlotRequest, runs: dict[str, list[WindowMetrics]]) -> None:
    def field(kind: str, data: PlotRequest, fmt: str = "png") -> str | None:
        with pytest.raises(BadInput) as ei:
            render_plot(kind, data, fmt)
        return ei.value.field

    assert field("violin", request_data) == "kind"
    assert field("heatmap", request_data, "jpeg") == "format"
    rows_only = PlotRequest(workload="w", rows=request_data.rows)
    assert field("heatmap", rows_only) == "windows"
    assert field("temperature", rows_only) == "windows"
    assert field("performance", PlotRequest(workload="w")) == "rows"
    assert field("heatmap", PlotRequest(workload="w", windows=runs, dram_layer=8)) == "dram_layer"
    assert field("heatmap", PlotRequest(workload="w", windows=runs, mesh=(4, 8))) == "mesh"
    bad = {s: [w.model_copy(deep=True) for w in ws] for s, ws in runs.items()}
    bad["tas"][2].temps_core_c[3] = float("nan")
    assert field("heatmap", PlotRequest(workload="w", windows=bad)) == "windows.tas[2].temps_core_c[3]"
