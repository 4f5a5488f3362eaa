"""Figures for the four-scenario comparison (seed 001 §10), rendered headless and deterministically.

Kinds (`render_plot(kind, data, fmt) -> bytes`, ``fmt`` png or svg):

- ``temperature``: ``T_peak_logic`` and ``T_peak_dram`` per scenario (bars), and their per-window time series.
- ``performance``: ``ips`` (with the token counts), ``lat_ms`` (with the p99 latency as a marker), ``bw_util`` and the
  energy per completed token per scenario (bars).
- ``heatmap``: the logic layer (per core) at the window of each scenario's logic peak (highest ``T_peak_logic``) and
  one DRAM layer (per vault) at the window of its DRAM peak (highest ``T_peak_dram``), scenarios side by side on ONE
  colour scale with a colour bar in °C; each title gives the peak the results CSV reports (a thermal-grid cell) and
  the hottest drawn mean. The DRAM layer is ``data.dram_layer`` or, by default, the layer with the highest vault
  temperature over those windows.
- ``power``: mean chip power by component (the windows' `PowerBreakdown`, time-weighted) per scenario, stacked.

Series that repeat another scenario's values exactly say so in the legend (drawn with open markers over it); bar
labels carry the change against baseline; bar axes of rates start at 0 and the temperature axis says where it starts;
titles say which interval the metrics cover (``data.warmup_ms``).

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
from shared.contracts.thermal import PowerBreakdown
from shared.errors import BadInput

KINDS: tuple[str, ...] = ("temperature", "performance", "heatmap", "power")
FORMATS: tuple[str, ...] = ("png", "svg")
MEDIA_TYPES: dict[str, str] = {"png": "image/png", "svg": "image/svg+xml"}
DPI = 100
# Okabe-Ito colours (colour-blind safe), one per scenario, used in every figure.
SCENARIO_COLORS: dict[str, str] = {"baseline": "#555555", "taps": "#E69F00", "tacs": "#0072B2", "tas": "#009E73",
                                   "unthrottled": "#CC79A7"}
# marker and line style per scenario, so series that lie on each other stay distinguishable
SCENARIO_STYLES: dict[str, tuple[str, str]] = {"baseline": ("o", "-"), "taps": ("s", "--"), "tacs": ("^", ":"),
                                               "tas": ("D", "-."), "unthrottled": ("v", "-")}
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
        return (max(3.3 * n_scenarios + 1.6, 9.0), 9.4)
    return {"temperature": (16.0, 5.0), "performance": (18.0, 4.8), "power": (9.0, 5.0)}[kind]


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

def _headroom(ax: Axes, lo: float, hi: float, frac: float = 0.15) -> None:
    ax.set_ylim(lo, hi + (hi - lo) * frac)


def _temp_floor(values: Sequence[float]) -> float:
    """A round lower bound below the coolest value, so temperature differences of a few °C stay visible."""
    return float(5.0 * math.floor((min(values) - 5.0) / 5.0))


# --- figures ------------------------------------------------------------------------------------------------------

def _same_series(windows: dict[str, list[WindowMetrics]], attrs: Sequence[str]) -> dict[str, str]:
    """scenario -> the earlier scenario whose per-window ``attrs`` it repeats exactly (drawn on top of each other)."""
    out: dict[str, str] = {}
    scn = list(windows)
    for j, s in enumerate(scn):
        key = [tuple(getattr(w, a) for a in attrs) for w in windows[s]]
        for r in scn[:j]:
            if r not in out and key == [tuple(getattr(w, a) for a in attrs) for w in windows[r]]:
                out[s] = r
                break
    return out


def _interval_note(data: PlotRequest) -> str:
    if data.warmup_ms:
        return f"t = 0 is the end of a {data.warmup_ms:g} ms warm-up, which the metrics exclude"
    return "the metrics cover every window from t = 0"


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
    base = rows.get("baseline")
    colors = [SCENARIO_COLORS[s] for s in scn]
    b1 = ax_bar.bar(x - w / 2, logic, w, color=colors, edgecolor="black", linewidth=0.6)
    b2 = ax_bar.bar(x + w / 2, dram, w, color=colors, edgecolor="black", linewidth=0.6, hatch="///", alpha=0.55)

    def labels(bars: Any, attr: str) -> None:
        for bar, s in zip(bars, scn, strict=True):
            v = getattr(rows[s], attr)
            d = "" if base is None or s == "baseline" else f" ({v - getattr(base, attr):+.2f} K)"
            ax_bar.annotate(f"{v:.2f}{d}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 3),
                            textcoords="offset points", ha="center", va="bottom", fontsize=8, rotation=90,
                            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none",
                                  "alpha": 0.8})

    labels(b1, "T_peak_logic")
    labels(b2, "T_peak_dram")
    lo = _temp_floor(logic + dram)
    _headroom(ax_bar, lo, max(logic + dram), 1.1)  # room for the vertical labels and the legend above the bars
    ax_bar.set_xticks(x, scn)
    ax_bar.set_ylabel(f"peak temperature [°C] (axis from {lo:g} °C)")
    ax_bar.set_title("Peak over the run (labels: °C, K vs baseline)")
    handles = [Patch(facecolor="white", edgecolor="black", label="logic layer (T_peak_logic)"),
               Patch(facecolor="white", edgecolor="black", hatch="///", label="DRAM (T_peak_dram)")]
    if data.thot_c is not None:
        line = ax_bar.axhline(data.thot_c, color="red", linestyle="--", linewidth=1.0, label=f"Thot {data.thot_c:g} °C")
        handles.append(line)
    ax_bar.legend(handles=handles, loc="upper right", fontsize=8)

    for ax, attr, title in ((ax_l, "T_peak_logic", "Logic layer peak per window"),
                            (ax_d, "T_peak_dram", "DRAM peak per window")):
        same = _same_series(windows, (attr,))
        for s, ws in windows.items():
            t = [wm.t_start_ms + wm.dt_ms for wm in ws]
            marker, style = SCENARIO_STYLES[s]
            label = s if s not in same else f"{s} (= {same[s]}: same values, drawn over it)"
            ax.plot(t, [getattr(wm, attr) for wm in ws], marker=marker, markersize=4, linewidth=1.4,
                    linestyle=style, color=SCENARIO_COLORS[s], label=label, markevery=max(1, len(ws) // 40),
                    fillstyle="none" if s in same else "full")
        if data.thot_c is not None and attr == "T_peak_logic":  # Thot is a core threshold (TACS)
            vals = [getattr(wm, attr) for ws in windows.values() for wm in ws]
            span = max(vals) - min(vals)
            if data.thot_c <= max(vals) + max(span, 1.0):  # near enough to draw without flattening the series
                ax.axhline(data.thot_c, color="red", linestyle="--", linewidth=1.0,
                           label=f"Thot {data.thot_c:g} °C")
            else:
                ax.plot([], [], color="red", linestyle="--", linewidth=1.0,
                        label=f"Thot {data.thot_c:g} °C (above this axis)")
        ax.set_xlabel("simulated time at window end [ms]")
        ax.set_ylabel(f"{attr} [°C]")
        ax.set_title(title)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{data.workload}: peak temperatures per scenario ({_interval_note(data)})")
    return fig


def _performance(data: PlotRequest) -> Figure:
    windows = _checked_windows(data)
    rows = _rows(data, windows)
    scn = list(rows)
    x = np.arange(len(scn))
    colors = [SCENARIO_COLORS[s] for s in scn]
    fig = Figure(figsize=figure_size("performance", len(rows)), dpi=DPI, layout="constrained")
    ax_ips, ax_lat, ax_bw, ax_e = fig.subplots(1, 4)
    base = rows.get("baseline")

    def rel(s: str, v: float, b: float | None) -> str:
        if s == "baseline" or b is None or b == 0 or not math.isfinite(v):
            return ""
        if v == b:
            return "\n(= baseline)"
        pct = 100.0 * (v - b) / b
        return f"\n({pct:+.1f} %)" if abs(pct) >= 0.1 else f"\n({pct:+.2f} %)"

    def labels(ax: Axes, bars: Any, fmt: Callable[[str, float], str]) -> None:
        for bar, s in zip(bars, scn, strict=True):
            ax.annotate(fmt(s, bar.get_height()), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8.5,
                        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none",
                              "alpha": 0.8})

    ips = [rows[s].ips for s in scn]
    bars = ax_ips.bar(x, ips, color=colors, edgecolor="black", linewidth=0.6)
    labels(ax_ips, bars, lambda s, v: f"{v:,.1f}\n{rows[s].tokens:,} tokens" + rel(s, v, base.ips if base else None))
    _headroom(ax_ips, 0.0, max(max(ips), 1e-9), 0.3)
    ax_ips.set_ylabel("throughput [tokens/s]")
    ax_ips.set_title("Throughput (ips): higher is better")

    lat = [rows[s].lat_ms for s in scn]
    p99 = [rows[s].lat_p99_ms for s in scn]
    bars = ax_lat.bar(x, lat, color=colors, edgecolor="black", linewidth=0.6, label="mean (lat_ms)")
    labels(ax_lat, bars, lambda s, v: f"{v:.2f}" + rel(s, v, base.lat_ms if base else None))
    ax_lat.plot(x, p99, linestyle="none", marker="v", color="black", markersize=7, label="p99 (lat_p99_ms)")
    _headroom(ax_lat, 0.0, max(max(lat + p99), 1e-9), 0.25)
    ax_lat.set_ylabel("token latency [ms]")
    ax_lat.set_title("Token latency: lower is better")
    ax_lat.legend(loc="upper center", ncols=2, fontsize=8)

    bw = [100.0 * rows[s].bw_util for s in scn]
    bars = ax_bw.bar(x, bw, color=colors, edgecolor="black", linewidth=0.6)
    bw_base = 100.0 * base.bw_util if base else None

    def pp(s: str, v: float) -> str:
        if bw_base is None or s == "baseline":
            return f"{v:.1f} %"
        return f"{v:.1f} %" + ("\n(= baseline)" if v == bw_base else f"\n({v - bw_base:+.1f} pp)")

    labels(ax_bw, bars, pp)
    _headroom(ax_bw, 0.0, max(max(bw), 1e-9), 0.22)
    ax_bw.set_ylabel("bandwidth utilisation [% of effective BW]")
    ax_bw.set_title("DRAM bandwidth utilisation (bw_util)")

    # energy per completed token (mJ): the run's energy over its tokens; a run with no token has none (not drawn)
    ept = [1e3 * rows[s].energy_j / rows[s].tokens if rows[s].tokens else float("nan") for s in scn]
    ept_base = ept[scn.index("baseline")] if "baseline" in scn else None
    bars = ax_e.bar(x, [0.0 if math.isnan(v) else v for v in ept], color=colors, edgecolor="black", linewidth=0.6)
    labels(ax_e, bars, lambda s, v: ("no token" if math.isnan(ept[scn.index(s)]) else f"{v:.1f} mJ")
           + rel(s, ept[scn.index(s)], ept_base if ept_base is not None and math.isfinite(ept_base) else None))
    finite = [v for v in ept if math.isfinite(v)]
    _headroom(ax_e, 0.0, max(finite) if finite else 1.0, 0.22)
    ax_e.set_ylabel("energy per token [mJ] (energy_j / tokens)")
    ax_e.set_title("Energy per completed token: lower is better")
    for ax in (ax_ips, ax_lat, ax_bw, ax_e):
        ax.set_xticks(x, scn)
        ax.set_xlabel("scenario")
    fig.suptitle(f"{data.workload}: performance per scenario (labels: value and change vs baseline; "
                 f"pp = percentage points; axes from 0; {_interval_note(data)})")
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
    """What the heat map shows, per scenario: the logic layer at the window of the run's logic peak and one DRAM layer
    at the window of the run's DRAM peak, as (Y, X) grids of per-core / per-vault mean temperatures."""

    layer: int  # DRAM layer shown
    mesh: tuple[int, int]  # (X, Y)
    window: dict[str, WindowMetrics]  # scenario -> the window of its logic peak (max T_peak_logic; first on ties)
    window_dram: dict[str, WindowMetrics]  # scenario -> the window of its DRAM peak (max T_peak_dram; first on ties)
    logic: dict[str, np.ndarray]  # scenario -> (Y, X) core temperatures, row y = core // X
    dram: dict[str, np.ndarray]  # scenario -> (Y, X) vault temperatures of ``layer``


def heatmap_frames(data: PlotRequest) -> HeatmapFrames:
    windows = _checked_windows(data)
    _need_windows(windows, "heatmap")
    scn = list(windows)
    n_cores = {s: len(ws[0].temps_core_c) for s, ws in windows.items()}
    n_layers = {s: len(ws[0].temps_bank_c[0]) if ws[0].temps_bank_c else 0 for s, ws in windows.items()}
    for s in scn:
        if n_layers[s] == 0:
            raise BadInput(f"windows.{s}: the heat map needs per-vault DRAM temperatures (temps_bank_c)",
                           field=f"windows.{s}")
    for s in scn[1:]:
        if n_cores[s] != n_cores[scn[0]] or n_layers[s] != n_layers[scn[0]]:
            raise BadInput(f"windows.{s}: {n_cores[s]} cores x {n_layers[s]} DRAM layers, but {scn[0]} has "
                           f"{n_cores[scn[0]]} x {n_layers[scn[0]]}", field=f"windows.{s}")
    X, Y = _mesh(data, n_cores[scn[0]])
    hot = {s: ws[int(np.argmax([w.T_peak_logic for w in ws]))] for s, ws in windows.items()}
    hot_d = {s: ws[int(np.argmax([w.T_peak_dram for w in ws]))] for s, ws in windows.items()}
    logic = {s: np.asarray(hot[s].temps_core_c).reshape(Y, X) for s in scn}
    banks = {s: np.asarray(hot_d[s].temps_bank_c) for s in scn}  # (vaults, layers)
    if data.dram_layer is None:
        layer = int(np.argmax(np.max([b.max(axis=0) for b in banks.values()], axis=0)))
    else:
        layer = data.dram_layer
        if layer >= n_layers[scn[0]]:
            raise BadInput(f"dram_layer: {layer} but there are {n_layers[scn[0]]} DRAM layers (0-based)",
                           field="dram_layer")
    dram = {s: banks[s][:, layer].reshape(Y, X) for s in scn}
    return HeatmapFrames(layer=layer, mesh=(X, Y), window=hot, window_dram=hot_d, logic=logic, dram=dram)


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
        # each panel at the window of the peak its title reports: the run's peak (the CSV's T_peak_logic /
        # T_peak_dram, the hottest thermal-grid cell) and the hottest drawn cell (a per-core / per-vault mean)
        panels = ((logic[s], fr.window[s], "logic", fr.window[s].T_peak_logic, "hottest core"),
                  (dram[s], fr.window_dram[s], f"DRAM layer {layer}", fr.window_dram[s].T_peak_dram,
                   "hottest vault"))
        for i, (grid, wm, what, peak, cell) in enumerate(panels):
            ax: Axes = axes[i, j]
            im = ax.imshow(grid, origin="lower", cmap="inferno", norm=norm, interpolation="nearest",
                           extent=(-0.5, X - 0.5, -0.5, Y - 0.5))
            yy, xx = np.unravel_index(int(np.argmax(grid)), grid.shape)
            ax.plot([xx], [yy], marker="x", color="cyan", markersize=9, markeredgewidth=2)
            ax.set_title(f"{s}: {what}\nwindow {wm.window} (t = {wm.t_start_ms + wm.dt_ms:g} ms): run peak "
                         f"{peak:.2f} °C\n(hottest grid cell); {cell} (x) {grid.max():.2f} °C", fontsize=9)
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
    fig.suptitle(f"{data.workload}: each scenario at the window of its peak (the peak of the results CSV)\n"
                 f"top: logic layer, per-core means; bottom: DRAM layer {layer}, per-vault means; one colour scale")
    return fig


def _power(data: PlotRequest) -> Figure:
    """Mean power by component per scenario (stacked bars), time-weighted over the windows' breakdowns."""
    windows = _checked_windows(data)
    _need_windows(windows, "power")
    comps = list(PowerBreakdown.model_fields)
    means: dict[str, dict[str, float]] = {}
    for s, ws in windows.items():
        if not all(w.power is not None for w in ws):
            raise BadInput(f"windows.{s}: the power plot needs each window's power breakdown (power)",
                           field=f"windows.{s}")
        dt = np.array([w.dt_ms for w in ws])
        means[s] = {c: float(dt @ np.array([getattr(w.power, c) for w in ws]) / dt.sum()) for c in comps}
    scn = list(means)
    fig = Figure(figsize=figure_size("power", len(scn)), dpi=DPI, layout="constrained")
    ax = fig.subplots(1, 1)
    x = np.arange(len(scn))
    bottom = np.zeros(len(scn))
    cmap = matplotlib.colormaps["tab10"]
    for k, c in enumerate(comps):
        v = np.array([means[s][c] for s in scn])
        ax.bar(x, v, 0.6, bottom=bottom, color=cmap(k % 10), edgecolor="black", linewidth=0.4, label=c)
        bottom += v
    base = bottom[scn.index("baseline")] if "baseline" in scn else None
    for xi, tot, s in zip(x, bottom, scn, strict=True):
        delta = "" if base is None or s == "baseline" else f"\n({100.0 * (tot - base) / base:+.1f} %)"
        ax.annotate(f"{tot:.2f} W{delta}", (xi, tot), xytext=(0, 3), textcoords="offset points", ha="center",
                    va="bottom", fontsize=9)
    _headroom(ax, 0.0, float(bottom.max()), 0.2)
    ax.set_xticks(x, scn)
    ax.set_ylabel("mean power [W] (axis from 0)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, title="component")
    fig.suptitle(f"{data.workload}: mean chip power by component (time-weighted over the measured windows)")
    return fig


_BUILDERS: dict[str, Callable[[PlotRequest], Figure]] = {
    "temperature": _temperature, "performance": _performance, "heatmap": _heatmap, "power": _power,
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
    # the workload name is the one free text on a figure (escape_text)
    data = data.model_copy(update={"workload": escape_text(data.workload)})
    return render_figure(lambda: build_figure(kind, data), fmt)


def escape_text(text: str) -> str:
    """Free text drawn on a figure as written: its "$" would start matplotlib math text (a user's "$\\foo$" was a
    422 carrying the parser's output, nested roots a 500)."""
    return text.replace("$", r"\$")


def render_figure(build: Callable[[], Figure], fmt: str) -> bytes:
    """The figure ``build`` draws, as PNG or SVG bytes, in this module's style (`_RC`, `DPI`) and without metadata
    that changes between runs: the same figure, the same bytes. Every kind of the metrics service is saved here."""
    if fmt not in FORMATS:
        raise BadInput(f"format: must be one of {', '.join(FORMATS)}, got {fmt!r}", field="format")
    with matplotlib.rc_context(_RC):
        fig = build()
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=_METADATA[fmt])
    return buf.getvalue()


def write_run_plots(results_dir: Path, *, workload: str | None = None, fmt: str = "png",
                    dram_layer: int | None = None) -> list[Path]:
    """Render every kind from a results folder into ``<results_dir>/plots/<workload>_<kind>.<fmt>``.

    Kinds that need per-window series are skipped when the folder has none (``<scenario>/<workload>.windows.jsonl.gz``).
    """
    from services.metrics.series import load_plot_request

    data = load_plot_request(Path(results_dir), workload, dram_layer=dram_layer)
    out_dir = Path(results_dir) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in KINDS:
        if kind != "performance" and not data.windows:
            continue
        if kind == "power" and not all(w.power is not None for ws in data.windows.values() for w in ws):
            continue
        path = out_dir / f"{data.workload}_{kind}.{fmt}"
        path.write_bytes(render_plot(kind, data, fmt))
        written.append(path)
    return written
