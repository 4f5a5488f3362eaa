"""Figures for the four-scenario comparison (seed 001 §10), rendered headless and deterministically.

Kinds (`render_plot(kind, data, fmt) -> bytes`, ``fmt`` png or svg):

- ``temperature``: ``T_peak_logic`` and ``T_peak_dram`` per scenario (bars), and their per-window time series.
- ``performance``: ``ips``, ``lat_ms`` (with the p99 latency as a marker) and ``bw_util`` per scenario (bars).
- ``heatmap``: the logic layer (per core) and one DRAM layer (per vault) at each scenario's hottest window (the window
  with the highest ``T_peak_logic``), scenarios side by side on ONE colour scale with a colour bar in °C. The DRAM
  layer is ``data.dram_layer`` or, by default, the layer with the highest vault temperature over those windows.

Bars come from ``data.rows`` when given, otherwise from reducing ``data.windows`` (services.metrics.reduce, which also
validates the windows; its errors are re-raised with the field prefixed by ``windows.<scenario>``).

Determinism: matplotlib's object API (no pyplot state) on the Agg canvas, a fixed figure size and dpi per kind,
``svg.hashsalt`` fixed, and no date/software metadata, so the same data gives the same bytes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.typing import RcKeyType

from services.metrics.reduce import reduce_window_metrics
from shared.contracts.metrics import SCENARIOS, PlotRequest, ResultRow, WindowMetrics
from shared.errors import BadInput

KINDS: tuple[str, ...] = ("temperature", "performance", "heatmap")
FORMATS: tuple[str, ...] = ("png", "svg")
MEDIA_TYPES: dict[str, str] = {"png": "image/png", "svg": "image/svg+xml"}
DPI = 100
# Okabe-Ito colours (colour-blind safe), one per scenario, used in every figure.
SCENARIO_COLORS: dict[str, str] = {"baseline": "#555555", "taps": "#E69F00", "tacs": "#0072B2", "tas": "#009E73"}
_RC: dict[RcKeyType, Any] = {
    "svg.hashsalt": "tasmoe-metrics",
    "svg.fonttype": "path",
    "font.family": "DejaVu Sans",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "figure.titlesize": 13,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "path.simplify": False,
}
_METADATA: dict[str, dict[str, Any]] = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
}


def figure_size(kind: str, n_scenarios: int) -> tuple[float, float]:
    """Figure size in inches (pixels = inches × DPI): fixed per kind; the heat map grows with the scenarios."""
    if kind == "heatmap":
        return (max(3.3 * n_scenarios + 1.6, 9.0), 7.6)
    return {"temperature": (16.0, 5.0), "performance": (15.0, 4.8)}[kind]


# --- input --------------------------------------------------------------------------------------------------------

def _checked_windows(data: PlotRequest) -> dict[str, list[WindowMetrics]]:
    """Windows per scenario in canonical order, each run validated by the reducer."""
    out: dict[str, list[WindowMetrics]] = {}
    for s in SCENARIOS:
        if s not in data.windows:
            continue
        ws = data.windows[s]
        try:
            reduce_window_metrics(ws, scenario=s, workload="check", thot_c=0.0)
        except BadInput as exc:
            field = f"windows.{s}" + (exc.field[len("windows"):] if exc.field and exc.field.startswith("windows")
                                      else f".{exc.field}" if exc.field else "")
            raise BadInput(f"{field}: {exc.message.split(': ', 1)[-1]}", field=field) from None
        out[s] = ws
    return out


def _rows(data: PlotRequest, windows: dict[str, list[WindowMetrics]]) -> dict[str, ResultRow]:
    """Result rows per scenario: ``data.rows`` if given, otherwise reduced from the windows."""
    if data.rows:
        rows: dict[str, ResultRow] = {}
        for i, r in enumerate(data.rows):
            if r.scenario in rows:
                raise BadInput(f"rows[{i}].scenario: {r.scenario!r} appears twice", field=f"rows[{i}].scenario")
            rows[r.scenario] = r
        return {s: rows[s] for s in SCENARIOS if s in rows}
    if not windows:
        raise BadInput("rows: give result rows or per-window series (windows) for at least one scenario",
                       field="rows")
    thot = data.thot_c if data.thot_c is not None else 0.0
    return {s: reduce_window_metrics(ws, scenario=s, workload="plot", thot_c=thot) for s, ws in windows.items()}


def _need_windows(windows: dict[str, list[WindowMetrics]], kind: str) -> None:
    if not windows:
        raise BadInput(f"windows: the {kind} plot needs per-window series for at least one scenario",
                       field="windows")


# --- drawing helpers ----------------------------------------------------------------------------------------------

def _bar_labels(ax: Axes, bars: Any, fmt: Callable[[float], str]) -> None:
    for b in bars:
        h = b.get_height()
        ax.annotate(fmt(h), (b.get_x() + b.get_width() / 2, h), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=9,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})


def _headroom(ax: Axes, lo: float, hi: float, frac: float = 0.15) -> None:
    ax.set_ylim(lo, hi + (hi - lo) * frac)


def _temp_floor(values: Sequence[float]) -> float:
    """A round lower bound below the coolest value, so temperature differences of a few °C stay visible."""
    return float(5.0 * math.floor((min(values) - 5.0) / 5.0))


# --- figures ------------------------------------------------------------------------------------------------------

def _temperature(data: PlotRequest) -> Figure:
    windows = _checked_windows(data)
    _need_windows(windows, "temperature")
    rows = _rows(data, windows)
    fig = Figure(figsize=figure_size("temperature", len(rows)), dpi=DPI, layout="constrained")
    ax_bar, ax_l, ax_d = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.0, 1.3, 1.3]})
    scn = list(rows)
    x = np.arange(len(scn))
    w = 0.38
    logic = [rows[s].T_peak_logic for s in scn]
    dram = [rows[s].T_peak_dram for s in scn]
    colors = [SCENARIO_COLORS[s] for s in scn]
    b1 = ax_bar.bar(x - w / 2, logic, w, color=colors, edgecolor="black", linewidth=0.6)
    b2 = ax_bar.bar(x + w / 2, dram, w, color=colors, edgecolor="black", linewidth=0.6, hatch="///", alpha=0.55)
    _bar_labels(ax_bar, b1, lambda v: f"{v:.1f}")
    _bar_labels(ax_bar, b2, lambda v: f"{v:.1f}")
    lo = _temp_floor(logic + dram)
    _headroom(ax_bar, lo, max(logic + dram), 0.4)  # room for the legend above the bars
    ax_bar.set_xticks(x, scn)
    ax_bar.set_ylabel("peak temperature [°C]")
    ax_bar.set_title("Peak temperature over the run")
    handles = [Patch(facecolor="white", edgecolor="black", label="logic layer (T_peak_logic)"),
               Patch(facecolor="white", edgecolor="black", hatch="///", label="DRAM (T_peak_dram)")]
    if data.thot_c is not None:
        line = ax_bar.axhline(data.thot_c, color="red", linestyle="--", linewidth=1.0, label=f"Thot {data.thot_c:g} °C")
        handles.append(line)
    ax_bar.legend(handles=handles, loc="upper right", fontsize=8)

    for ax, attr, title in ((ax_l, "T_peak_logic", "Logic layer peak per window"),
                            (ax_d, "T_peak_dram", "DRAM peak per window")):
        for s, ws in windows.items():
            t = [wm.t_start_ms + wm.dt_ms for wm in ws]
            ax.plot(t, [getattr(wm, attr) for wm in ws], marker="o", markersize=3.5, linewidth=1.6,
                    color=SCENARIO_COLORS[s], label=s)
        if data.thot_c is not None and attr == "T_peak_logic":  # Thot is a core threshold (TACS)
            ax.axhline(data.thot_c, color="red", linestyle="--", linewidth=1.0, label=f"Thot {data.thot_c:g} °C")
        ax.set_xlabel("simulated time at window end [ms]")
        ax.set_ylabel(f"{attr} [°C]")
        ax.set_title(title)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{data.workload}: peak temperatures per scenario")
    return fig


def _performance(data: PlotRequest) -> Figure:
    windows = _checked_windows(data)
    rows = _rows(data, windows)
    scn = list(rows)
    x = np.arange(len(scn))
    colors = [SCENARIO_COLORS[s] for s in scn]
    fig = Figure(figsize=figure_size("performance", len(rows)), dpi=DPI, layout="constrained")
    ax_ips, ax_lat, ax_bw = fig.subplots(1, 3)
    base = rows.get("baseline")

    def rel(v: float, b: float | None) -> str:
        if b is None or b == 0:
            return ""
        return "\n(baseline)" if v == b else f"\n({100.0 * (v - b) / b:+.1f} %)"

    ips = [rows[s].ips for s in scn]
    bars = ax_ips.bar(x, ips, color=colors, edgecolor="black", linewidth=0.6)
    for b, s in zip(bars, scn, strict=True):
        b.set_label(s)
    _bar_labels(ax_ips, bars, lambda v: f"{v:,.0f}" + rel(v, base.ips if base else None))
    _headroom(ax_ips, 0.0, max(ips), 0.22)
    ax_ips.set_ylabel("throughput [tokens/s]")
    ax_ips.set_title("Throughput (ips): higher is better")

    lat = [rows[s].lat_ms for s in scn]
    p99 = [rows[s].lat_p99_ms for s in scn]
    bars = ax_lat.bar(x, lat, color=colors, edgecolor="black", linewidth=0.6, label="mean (lat_ms)")
    _bar_labels(ax_lat, bars, lambda v: f"{v:.2f}" + rel(v, base.lat_ms if base else None))
    ax_lat.plot(x, p99, linestyle="none", marker="v", color="black", markersize=7, label="p99 (lat_p99_ms)")
    _headroom(ax_lat, 0.0, max(lat + p99), 0.25)
    ax_lat.set_ylabel("token latency [ms]")
    ax_lat.set_title("Token latency: lower is better")
    ax_lat.legend(loc="upper center", ncols=2, fontsize=8)

    bw = [100.0 * rows[s].bw_util for s in scn]
    bars = ax_bw.bar(x, bw, color=colors, edgecolor="black", linewidth=0.6)
    bw_base = 100.0 * base.bw_util if base else None

    def pp(v: float) -> str:
        if bw_base is None:
            return f"{v:.1f} %"
        return f"{v:.1f} %" + ("\n(baseline)" if v == bw_base else f"\n({v - bw_base:+.1f} pp)")

    _bar_labels(ax_bw, bars, pp)
    _headroom(ax_bw, 0.0, max(max(bw), 1e-9), 0.22)
    ax_bw.set_ylabel("bandwidth utilisation [% of effective BW]")
    ax_bw.set_title("DRAM bandwidth utilisation (bw_util)")
    for ax in (ax_ips, ax_lat, ax_bw):
        ax.set_xticks(x, scn)
        ax.set_xlabel("scenario")
    fig.suptitle(f"{data.workload}: performance per scenario (labels: value and change vs baseline; "
                 "pp = percentage points)")
    return fig


def _mesh(data: PlotRequest, n_cores: int) -> tuple[int, int]:
    if data.mesh is not None:
        X, Y = data.mesh
        if X <= 0 or Y <= 0 or n_cores != X * Y:
            raise BadInput(f"mesh: {X}x{Y} does not match {n_cores} cores", field="mesh")
        return X, Y
    side = math.isqrt(n_cores)
    if side * side != n_cores:
        raise BadInput(f"mesh: {n_cores} cores is not a square mesh; give mesh [X, Y]", field="mesh")
    return side, side


@dataclass(frozen=True)
class HeatmapFrames:
    """What the heat map shows: per scenario, its hottest window and the (Y, X) logic and DRAM-layer grids."""

    layer: int  # DRAM layer shown
    mesh: tuple[int, int]  # (X, Y)
    window: dict[str, WindowMetrics]  # scenario -> hottest window (max T_peak_logic; first one on ties)
    logic: dict[str, np.ndarray]  # scenario -> (Y, X) core temperatures, row y = core // X
    dram: dict[str, np.ndarray]  # scenario -> (Y, X) vault temperatures of ``layer``


def heatmap_frames(data: PlotRequest) -> HeatmapFrames:
    windows = _checked_windows(data)
    _need_windows(windows, "heatmap")
    scn = list(windows)
    n_cores = {s: len(ws[0].temps_core_c) for s, ws in windows.items()}
    n_layers = {s: len(ws[0].temps_bank_c[0]) for s, ws in windows.items()}
    for s in scn[1:]:
        if n_cores[s] != n_cores[scn[0]] or n_layers[s] != n_layers[scn[0]]:
            raise BadInput(f"windows.{s}: {n_cores[s]} cores x {n_layers[s]} DRAM layers, but {scn[0]} has "
                           f"{n_cores[scn[0]]} x {n_layers[scn[0]]}", field=f"windows.{s}")
    X, Y = _mesh(data, n_cores[scn[0]])
    hot = {s: ws[int(np.argmax([w.T_peak_logic for w in ws]))] for s, ws in windows.items()}
    logic = {s: np.asarray(hot[s].temps_core_c).reshape(Y, X) for s in scn}
    banks = {s: np.asarray(hot[s].temps_bank_c) for s in scn}  # (vaults, layers)
    if data.dram_layer is None:
        layer = int(np.argmax(np.max([b.max(axis=0) for b in banks.values()], axis=0)))
    else:
        layer = data.dram_layer
        if layer >= n_layers[scn[0]]:
            raise BadInput(f"dram_layer: {layer} but there are {n_layers[scn[0]]} DRAM layers (0-based)",
                           field="dram_layer")
    dram = {s: banks[s][:, layer].reshape(Y, X) for s in scn}
    return HeatmapFrames(layer=layer, mesh=(X, Y), window=hot, logic=logic, dram=dram)


def _heatmap(data: PlotRequest) -> Figure:
    fr = heatmap_frames(data)
    scn, layer, (X, Y) = list(fr.window), fr.layer, fr.mesh
    logic, dram = fr.logic, fr.dram
    allv = np.concatenate([a.ravel() for a in (*logic.values(), *dram.values())])
    norm = Normalize(vmin=float(np.floor(allv.min())), vmax=float(np.ceil(allv.max())))

    n = len(scn)
    fig = Figure(figsize=figure_size("heatmap", n), dpi=DPI, layout="constrained")
    axes = np.asarray(fig.subplots(2, n, squeeze=False, sharex=True, sharey=True))
    im = None
    for j, s in enumerate(scn):
        wm = fr.window[s]
        for i, (grid, what, cell) in enumerate(((logic[s], "logic layer", "hottest core"),
                                                (dram[s], f"DRAM layer {layer}", "hottest vault"))):
            ax: Axes = axes[i, j]
            im = ax.imshow(grid, origin="lower", cmap="inferno", norm=norm, interpolation="nearest",
                           extent=(-0.5, X - 0.5, -0.5, Y - 0.5))
            yy, xx = np.unravel_index(int(np.argmax(grid)), grid.shape)
            ax.plot([xx], [yy], marker="x", color="cyan", markersize=9, markeredgewidth=2)
            ax.set_title(f"{s}: {what}, window {wm.window} (t = {wm.t_start_ms + wm.dt_ms:g} ms)\n"
                         f"{cell} (x): {grid.max():.1f} °C", fontsize=9.5)
            ax.grid(False)
            ax.set_xticks(range(X))
            ax.set_yticks(range(Y))
            ax.tick_params(labelsize=8)
            if i == 1:
                ax.set_xlabel("core x")
            if j == 0:
                ax.set_ylabel("core y" if i == 0 else "vault y (core below)")
    assert im is not None
    cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.85, pad=0.02)
    cb.set_label("temperature [°C] (one scale for all panels)")
    fig.suptitle(f"{data.workload}: temperatures at each scenario's hottest window\n"
                 f"top: logic layer per core; bottom: DRAM layer {layer} per vault; one colour scale")
    return fig


_BUILDERS: dict[str, Callable[[PlotRequest], Figure]] = {
    "temperature": _temperature, "performance": _performance, "heatmap": _heatmap,
}


def build_figure(kind: str, data: PlotRequest) -> Figure:
    if kind not in _BUILDERS:
        raise BadInput(f"kind: unknown plot {kind!r}; known: {', '.join(KINDS)}", field="kind")
    with matplotlib.rc_context(_RC):
        return _BUILDERS[kind](data)


def render_plot(kind: str, data: PlotRequest, fmt: str = "png") -> bytes:
    """The figure ``kind`` for ``data`` as PNG or SVG bytes (same input, same bytes)."""
    if fmt not in FORMATS:
        raise BadInput(f"format: must be one of {', '.join(FORMATS)}, got {fmt!r}", field="format")
    with matplotlib.rc_context(_RC):
        fig = build_figure(kind, data)
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=_METADATA[fmt])
    return buf.getvalue()


def write_run_plots(results_dir: Path, *, workload: str | None = None, fmt: str = "png",
                    dram_layer: int | None = None) -> list[Path]:
    """Render every kind from a results folder into ``<results_dir>/plots/<workload>_<kind>.<fmt>``.

    Kinds that need per-window series are skipped when the folder has none (``<scenario>/<workload>.windows.jsonl``).
    """
    from services.metrics.series import load_plot_inputs

    wl, rows, windows = load_plot_inputs(Path(results_dir), workload)
    thot = rows[0].thot_c if rows else None
    data = PlotRequest(workload=wl, rows=rows, windows=windows, dram_layer=dram_layer, thot_c=thot)
    out_dir = Path(results_dir) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in KINDS:
        if kind != "performance" and not windows:
            continue
        path = out_dir / f"{wl}_{kind}.{fmt}"
        path.write_bytes(render_plot(kind, data, fmt))
        written.append(path)
    return written
