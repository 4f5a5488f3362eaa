"""The figure of a sweep over cooling and the DTM limit (``POST /v1/plots/sweep/pareto``, `render_sweep_plot`).

Input: the rows of a sweep's table (orchestrator ``GET /v1/sweeps/{id}``): per grid point and scenario, the point's
values by dotted key and the scenario's result row. Three panels, one colour, marker and line style per scenario (the
Okabe-Ito set of `services.metrics.plots`):

- **against cooling**: throughput at the limit against the cold plate's heat transfer coefficient ``h`` (log axis),
  one line per scenario, at one value of the limit (``at_limit``);
- **against the limit**: the same against the DTM hard limit, at one ``h`` (``at_cooling``);
- **Pareto front**: every (point, policy) as energy per completed token against throughput, and the front of the
  ones no other beats on both.

Throughput is the served rate the throttling loss is measured in (`compare.served_metric`): ``goodput_tok_s``
(output tokens/s of the requests within the SLO) when every row has it and one meets its SLO, else ``ips`` for all
rows (one unit on one axis). The two slices shade the throttling loss at each value, ``unthrottled − baseline`` as
`compare.throttling` defines it (from each point's own comparison table), so a policy's line inside the band shows
how much of the loss it recovers; a thin grey line is the offered load (``tokens_offered`` over the run's time)
where the rows have one: a point at it served everything and says nothing of the chip's limit. When the offered load
is more than `OFFERED_OFF_SCALE` times the highest throughput drawn (a flat-out sweep), the line would flatten every
curve to the axis: it is left out and the panel says, in a corner, what was offered and that every point is saturated.
Where several points share a slice's value (another grid key, e.g. seeds), the line is their mean and the title says so.

Why energy per token against throughput for the front, not peak temperature: under a DTM limit the peak temperature
is pinned by the limit (it is a swept parameter, so T_peak against throughput would mostly redraw the grid), while
the energy a token costs is what a lab pays for the throughput it buys. Cooling and the limit move it both ways:
a hotter chip leaks more and refreshes its DRAM twice as often above 85 °C, a throttled one runs longer at its
leakage for the same tokens. The front says which (cooling, limit, policy) choices are worth considering at all: a
point off it is beaten by another on both energy and throughput. The ``unthrottled`` reference is drawn (hollow)
but is not a candidate: it ignores the limit the other runs are held to.

Determinism: drawn and saved as every figure of the metrics service (`plots.render_figure`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from services.metrics.compare import ServedMetric, compare, served_metric, throttling
from services.metrics.plots import DPI, SCENARIO_COLORS, SCENARIO_STYLES, escape_text, render_figure
from shared.contracts.metrics import (
    COOLING_KEY,
    LIMIT_KEY,
    POLICIES,
    SCENARIOS,
    ResultRow,
    SweepPlotRequest,
    SweepRow,
)
from shared.errors import BadInput

SWEEP_KINDS: tuple[str, ...] = ("pareto",)
LOSS_COLOR = "#CC79A7"  # the unthrottled reference's colour: the band reaches up to it
OFFERED_COLOR, OFFERED_STYLE = "#999999", (0, (1, 2))
OFFERED_OFF_SCALE = 2.0  # an offered load above this multiple of the highest throughput is written, not drawn
MAX_FRONT_LISTED = 14  # front points listed beside the panel (all are numbered on it)
_UNITS = {COOLING_KEY: "W/(m²·K)", LIMIT_KEY: "°C"}
_NAMES = {COOLING_KEY: "cooling h", LIMIT_KEY: "DTM limit"}


def sweep_figure_size(kind: str) -> tuple[float, float]:
    """Figure size in inches (pixels = inches × `plots.DPI`)."""
    if kind not in SWEEP_KINDS:
        raise BadInput(f"kind: unknown sweep plot {kind!r}; known: {', '.join(SWEEP_KINDS)}", field="kind")
    return (19.0, 6.0)


def pareto_front(cost: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Which points no other point dominates, lower ``cost`` and higher ``value`` being better: point ``i`` is
    dominated when some ``j`` has ``cost_j <= cost_i`` and ``value_j >= value_i`` with one of them strict. Equal
    points dominate neither each other. A boolean mask (all pairs at once: a sweep has at most ~10^3 points)."""
    c, v = np.asarray(cost, dtype=float), np.asarray(value, dtype=float)
    no_worse = (c[None, :] <= c[:, None]) & (v[None, :] >= v[:, None])  # [i, j]: j is no worse than i on both
    better = (c[None, :] < c[:, None]) | (v[None, :] > v[:, None])
    dominated = np.asarray((no_worse & better).any(axis=1), dtype=bool)
    return ~dominated


@dataclass(frozen=True)
class Slice:
    """Throughput against one grid key (``key``), the other (``at_key``) held at ``at``: per scenario the mean over
    the points at each swept value (NaN where a scenario has none), the throttling band, the offered load."""

    key: str
    at_key: str | None  # None: the other key is not swept
    at: float | None
    x: np.ndarray  # the swept values, ascending
    y: dict[str, np.ndarray]  # scenario -> throughput per x
    unthrottled: np.ndarray  # per x: the loss band's top (`compare.throttling`), NaN where no point has one
    baseline: np.ndarray  # per x: the band's bottom
    offered: np.ndarray | None  # per x: offered output tokens/s; None where a row offers none (fixed arrival)
    points_per_x: int  # most points averaged at one x


@dataclass(frozen=True)
class ParetoPoints:
    """Every (point, policy) with completed tokens, and the unthrottled reference's points apart."""

    scenario: list[str]
    energy_mj: np.ndarray  # energy per completed token, mJ (energy_j / tokens)
    throughput: np.ndarray
    cooling: np.ndarray  # the point's h (NaN: not swept)
    limit: np.ndarray  # the point's limit (NaN: not swept)
    front: np.ndarray  # bool: on the Pareto front of the policies
    ref_energy_mj: np.ndarray  # the unthrottled points
    ref_throughput: np.ndarray


@dataclass(frozen=True)
class SweepFigure:
    metric: ServedMetric
    cooling: Slice | None  # None: h was not swept
    limit: Slice | None
    pareto: ParetoPoints
    scenarios: tuple[str, ...]  # canonical order


# --- input --------------------------------------------------------------------------------------------------------

def _axis_values(rows: Sequence[SweepRow], key: str) -> np.ndarray | None:
    """Each row's value of grid key ``key`` (None: no row has it); a key in some rows only, or not a finite number,
    is an error naming the row."""
    have = [key in r.params for r in rows]
    if not any(have):
        return None
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        field = f"rows[{i}].params.{key}"
        if key not in r.params:
            raise BadInput(f"{field}: missing, but other rows of the sweep have it", field=field)
        v = r.params[key]
        if isinstance(v, bool) or not isinstance(v, float | int) or not math.isfinite(v):
            raise BadInput(f"{field}: {v!r} is not a finite number", field=field)
        out[i] = float(v)
    return out


def _point_keys(rows: Sequence[SweepRow]) -> list[str]:
    """A key per row naming its grid point (its params, canonically); a scenario twice at one point is an error."""
    keys = [json.dumps(r.params, sort_keys=True) for r in rows]
    seen: set[tuple[str, str]] = set()
    for i, (k, r) in enumerate(zip(keys, rows, strict=True)):
        if (k, r.row.scenario) in seen:
            field = f"rows[{i}].row.scenario"
            raise BadInput(f"{field}: {r.row.scenario!r} appears twice at the grid point {r.params}", field=field)
        seen.add((k, r.row.scenario))
    return keys


def _finite(rows: Sequence[SweepRow], values: np.ndarray, column: str) -> None:
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        field = f"rows[{int(bad[0])}].row.{column}"
        raise BadInput(f"{field}: not a finite number (or what the figure computes from it, a rate or an energy "
                       "per token, overflows)", field=field)


def _at(values: np.ndarray, at: float | None, field: str) -> float:
    """The value a slice is drawn at: ``at`` if it is one of the swept ``values``, default their upper median."""
    swept = np.unique(values)
    if at is None:
        return float(swept[len(swept) // 2])
    hit = np.flatnonzero(np.isclose(swept, at, rtol=1e-9, atol=0.0))
    if not hit.size:
        raise BadInput(f"{field}: {at:g} is not one of the swept values ({', '.join(f'{v:g}' for v in swept)})",
                       field=field)
    return float(swept[hit[0]])


def _throttling_by_point(rows: Sequence[SweepRow], point: np.ndarray, n_points: int,
                         metric: ServedMetric) -> tuple[np.ndarray, np.ndarray]:
    """Per grid point (``point``: each row's point index): the unthrottled and baseline rates in ``metric`` as
    `compare.throttling` reads them from the point's comparison table; NaN at a point without both rows."""
    by_point: dict[int, list[ResultRow]] = {}
    for k, r in zip(point.tolist(), rows, strict=True):
        by_point.setdefault(k, []).append(r.row)
    top, bottom = np.full(n_points, np.nan), np.full(n_points, np.nan)
    for k, point_rows in by_point.items():
        names = {r.scenario for r in point_rows}
        if not {"baseline", "unthrottled"} <= names or len({r.workload for r in point_rows}) != 1:
            continue
        th = throttling(compare(point_rows), metric=metric)
        if th is not None:
            top[k], bottom[k] = th.unthrottled, th.baseline
    return top, bottom


def _slice(*, key: str, xs: np.ndarray, at_key: str | None, others: np.ndarray | None, at: float | None,
           scenario: np.ndarray, y: np.ndarray, offered: np.ndarray, point: np.ndarray, band_top: np.ndarray,
           band_bottom: np.ndarray) -> Slice:
    """The rows whose other key is ``at`` (all of them when it is not swept), by swept value and scenario."""
    sel = np.ones(len(xs), dtype=bool) if others is None or at is None else np.isclose(others, at, rtol=1e-9,
                                                                                       atol=0.0)
    idx = np.flatnonzero(sel)
    grid, xi = np.unique(xs[idx], return_inverse=True)
    names = set(scenario[idx].tolist())
    order = [s for s in SCENARIOS if s in names]
    si = np.array([order.index(s) for s in scenario[idx].tolist()], dtype=np.intp)
    shape = (len(order), len(grid))
    sums, counts = np.zeros(shape), np.zeros(shape)
    np.add.at(sums, (si, xi), y[idx])
    np.add.at(counts, (si, xi), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / counts
    # the loss band and the number of points: once per grid point, whatever its scenarios
    pts, first = np.unique(point[idx], return_index=True)
    px = xi[first]
    has = np.isfinite(band_top[pts])
    n_band = np.bincount(px[has], minlength=len(grid))
    with np.errstate(invalid="ignore", divide="ignore"):
        top = np.bincount(px[has], weights=band_top[pts][has], minlength=len(grid)) / n_band
        bottom = np.bincount(px[has], weights=band_bottom[pts][has], minlength=len(grid)) / n_band
        off = np.bincount(xi, weights=offered[idx], minlength=len(grid)) / np.bincount(xi, minlength=len(grid))
    n_pts = np.bincount(px, minlength=len(grid))
    return Slice(key=key, at_key=at_key, at=at, x=grid, y={s: means[k] for k, s in enumerate(order)},
                 unthrottled=np.where(n_band > 0, top, np.nan), baseline=np.where(n_band > 0, bottom, np.nan),
                 offered=off if np.all(offered[idx] > 0) else None, points_per_x=int(n_pts.max()))


def sweep_figure_data(req: SweepPlotRequest) -> SweepFigure:
    """What the Pareto figure draws, computed and checked (errors name the field, e.g. ``rows[3].params.<key>``)."""
    rows = req.rows
    keys = _point_keys(rows)
    metric = served_metric({"goodput_tok_s": r.row.goodput_tok_s, "slo_met": r.row.slo_met} for r in rows)
    y = np.array([getattr(r.row, metric) for r in rows], dtype=float)
    _finite(rows, y, metric)
    tokens = np.array([r.row.tokens for r in rows], dtype=float)
    energy = np.array([r.row.energy_j for r in rows], dtype=float)
    _finite(rows, energy, "energy_j")
    sim_s = np.array([r.row.sim_time_ms for r in rows], dtype=float) * 1e-3
    offered_tok = np.array([r.row.tokens_offered for r in rows], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ept = np.where(tokens > 0, 1e3 * energy / np.where(tokens > 0, tokens, 1.0), np.nan)
        offered = np.where(sim_s > 0, offered_tok / np.where(sim_s > 0, sim_s, 1.0), 0.0)
    _finite(rows, np.where(np.isnan(ept), 0.0, ept), "energy_j")
    _finite(rows, offered, "sim_time_ms")

    h = _axis_values(rows, req.cooling_key)
    lim = _axis_values(rows, req.limit_key)
    if h is not None and np.any(h <= 0):
        i = int(np.flatnonzero(h <= 0)[0])
        field = f"rows[{i}].params.{req.cooling_key}"
        raise BadInput(f"{field}: a heat transfer coefficient is > 0 (a log axis), got {h[i]:g}", field=field)
    at_h = _at(h, req.at_cooling, "at_cooling") if h is not None else None
    at_l = _at(lim, req.at_limit, "at_limit") if lim is not None else None
    _, point = np.unique(np.array(keys), return_inverse=True)
    n_points = int(point.max()) + 1
    band_top, band_bottom = _throttling_by_point(rows, point, n_points, metric)
    scn = np.array([r.row.scenario for r in rows])
    common = {"scenario": scn, "y": y, "offered": offered, "point": point, "band_top": band_top,
              "band_bottom": band_bottom}
    cooling = None if h is None else _slice(key=req.cooling_key, xs=h, at_key=req.limit_key if lim is not None
                                            else None, others=lim, at=at_l, **common)
    limit = None if lim is None else _slice(key=req.limit_key, xs=lim, at_key=req.cooling_key if h is not None
                                            else None, others=h, at=at_h, **common)

    cand = np.isin(scn, POLICIES) & (tokens > 0)
    ref = (scn == "unthrottled") & (tokens > 0)
    nan = np.full(len(rows), np.nan)
    pareto = ParetoPoints(scenario=[str(s) for s in scn[cand]], energy_mj=ept[cand], throughput=y[cand],
                          cooling=(h if h is not None else nan)[cand], limit=(lim if lim is not None else nan)[cand],
                          front=pareto_front(ept[cand], y[cand]), ref_energy_mj=ept[ref], ref_throughput=y[ref])
    present = {r.row.scenario for r in rows}
    return SweepFigure(metric=metric, cooling=cooling, limit=limit, pareto=pareto,
                       scenarios=tuple(s for s in SCENARIOS if s in present))


# --- drawing ------------------------------------------------------------------------------------------------------

def _metric_label(metric: ServedMetric) -> str:
    if metric == "goodput_tok_s":
        return "goodput [output tokens/s within the SLO]"
    return "throughput ips [tokens/s] (no run meets its SLO, or none has one)"


def _name(key: str) -> str:
    return _NAMES.get(key, key)


def _value(key: str | None, v: float | None) -> str:
    if key is None or v is None:
        return ""
    return f"{v:g} {_UNITS.get(key, '')}".strip()


def _draw_slice(ax: Axes, sl: Slice | None, *, key: str, metric: ServedMetric, log: bool) -> None:
    if sl is None:
        ax.text(0.5, 0.5, f"{key}\nnot swept: every point at the base config's value", ha="center", va="center",
                transform=ax.transAxes, fontsize=10)
        ax.set_xticks([])
        ax.set_title(f"Against {_name(key)}")
        return
    if np.any(np.isfinite(sl.unthrottled)):
        ok = np.isfinite(sl.unthrottled)
        ax.fill_between(sl.x[ok], sl.baseline[ok], sl.unthrottled[ok], color=LOSS_COLOR, alpha=0.15, linewidth=0)
    if _offered_on_scale(sl):
        assert sl.offered is not None
        ax.plot(sl.x, sl.offered, color=OFFERED_COLOR, linewidth=1.0, linestyle=OFFERED_STYLE)
    elif sl.offered is not None:
        text = f"offered load {float(np.max(sl.offered)):,.0f} tok/s, off the scale: every point saturated"
        ax.text(0.02, 0.02, text, ha="left", va="bottom", transform=ax.transAxes, fontsize=8, color=OFFERED_COLOR)
    for s, ys in sl.y.items():
        marker, style = SCENARIO_STYLES[s]
        ax.plot(sl.x, ys, marker=marker, linestyle=style, color=SCENARIO_COLORS[s], linewidth=1.6, markersize=6,
                fillstyle="none" if s == "unthrottled" else "full")
    if log:
        ax.set_xscale("log")
        ax.minorticks_off()
    ax.set_xticks(sl.x, [f"{v:g}" for v in sl.x], rotation=30 if len(sl.x) > 5 else 0)
    ax.set_ylim(bottom=0.0)
    unit = _UNITS.get(sl.key)
    ax.set_xlabel(f"{_name(sl.key)}: {sl.key}" + (f" [{unit}]" if unit else "") + (" (log axis)" if log else ""))
    ax.set_ylabel(_metric_label(metric))
    at = f" at {_name(sl.at_key)} {_value(sl.at_key, sl.at)}" if sl.at_key is not None else ""
    mean = f"\n(mean of {sl.points_per_x} points per value: other grid keys)" if sl.points_per_x > 1 else ""
    ax.set_title(f"Against {_name(sl.key)}{at}{mean}")


def _offered_on_scale(sl: Slice | None) -> bool:
    """Whether a slice's offered load is drawn: it has one, within `OFFERED_OFF_SCALE` times its highest throughput
    (every scenario's and the unthrottled band's top)."""
    if sl is None or sl.offered is None:
        return False
    drawn = [ys for ys in sl.y.values()] + [sl.unthrottled]
    finite = np.concatenate([np.asarray(ys, dtype=float).ravel() for ys in drawn])
    finite = finite[np.isfinite(finite)]
    top = float(finite.max()) if finite.size else 0.0
    return top > 0 and float(np.max(sl.offered)) <= OFFERED_OFF_SCALE * top


def _front_label(p: ParetoPoints, i: int) -> str:
    parts = [p.scenario[i]]
    if math.isfinite(p.cooling[i]):
        parts.append(f"h {p.cooling[i]:g}")
    if math.isfinite(p.limit[i]):
        parts.append(f"{p.limit[i]:g} °C")
    return ", ".join(parts) + f": {p.throughput[i]:,.0f} tok/s, {p.energy_mj[i]:.3g} mJ"


def _draw_pareto(ax: Axes, p: ParetoPoints, metric: ServedMetric) -> None:
    ax.set_title("Pareto front of the policies (numbered):\nhigher and further left is better")
    if not p.scenario and not p.ref_energy_mj.size:
        ax.text(0.5, 0.5, "no row with completed tokens:\nno energy per token", ha="center", va="center",
                transform=ax.transAxes)
        return
    scn = np.array(p.scenario)
    for s in POLICIES:
        m = scn == s
        marker, _ = SCENARIO_STYLES[s]
        ax.scatter(p.energy_mj[m & ~p.front], p.throughput[m & ~p.front], marker=marker, s=28,
                   color=SCENARIO_COLORS[s], alpha=0.45, linewidths=0)
        ax.scatter(p.energy_mj[m & p.front], p.throughput[m & p.front], marker=marker, s=70,
                   color=SCENARIO_COLORS[s], edgecolors="black", linewidths=0.9, zorder=3)
    if p.ref_energy_mj.size:
        marker, _ = SCENARIO_STYLES["unthrottled"]
        ax.scatter(p.ref_energy_mj, p.ref_throughput, marker=marker, s=40, facecolors="none",
                   edgecolors=SCENARIO_COLORS["unthrottled"], linewidths=1.2)
    handles: list[Line2D] = []
    if p.front.any():
        order = np.flatnonzero(p.front)[np.argsort(p.energy_mj[p.front], kind="stable")]
        ax.plot(p.energy_mj[order], p.throughput[order], color="black", linewidth=1.0, linestyle="--", zorder=2)
        for k, i in enumerate(order):
            ax.annotate(str(k + 1), (p.energy_mj[i], p.throughput[i]), xytext=(5, 5), textcoords="offset points",
                        fontsize=8, fontweight="bold")
        shown = order[:MAX_FRONT_LISTED]
        handles = [Line2D([], [], linestyle="none", label=f"{k + 1}  {_front_label(p, int(i))}")
                   for k, i in enumerate(shown)]
        if len(order) > len(shown):
            handles.append(Line2D([], [], linestyle="none", label=f"... {len(order) - len(shown)} more"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, handlelength=0,
                  handletextpad=0, title=f"front: {len(order)} of {len(scn)} (point, policy)",
                  title_fontsize=8)
    top = np.concatenate([p.throughput, p.ref_throughput])
    hi = 1.08 * float(top.max()) if top.size else 0.0
    ax.set_ylim(0.0, hi if 0 < hi < math.inf else None)
    ax.set_xlabel("energy per completed token [mJ] (energy_j / tokens): lower is better")
    ax.set_ylabel(_metric_label(metric))


def _legend_handles(data: SweepFigure) -> list[Artist]:
    """One legend for the three panels: each scenario's line and marker, the band, the offered load, the front."""
    handles: list[Artist] = []
    for s in data.scenarios:
        marker, style = SCENARIO_STYLES[s]
        label = "unthrottled (reference: no DVFS, no limit; not a Pareto candidate)" if s == "unthrottled" else s
        line = Line2D([], [], marker=marker, color=SCENARIO_COLORS[s], label=label,
                      markerfacecolor="none" if s == "unthrottled" else SCENARIO_COLORS[s])
        line.set(linestyle=style)
        handles.append(line)
    handles.append(Patch(facecolor=LOSS_COLOR, alpha=0.15, label="throttling loss (unthrottled − baseline)"))
    if any(_offered_on_scale(sl) for sl in (data.cooling, data.limit)):
        handles.append(Line2D([], [], color=OFFERED_COLOR, linestyle=OFFERED_STYLE, label="offered load"))
    handles.append(Line2D([], [], color="black", linestyle="--", marker="o", markerfacecolor="white",
                          markeredgecolor="black", label="Pareto front (black-edged markers)"))
    return handles


def pareto_figure(req: SweepPlotRequest) -> Figure:
    data = sweep_figure_data(req)
    fig = Figure(figsize=sweep_figure_size("pareto"), dpi=DPI, layout="constrained")
    ax_h, ax_l, ax_p = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.0, 1.0, 1.3]})
    ax_l.sharey(ax_h)
    _draw_slice(ax_h, data.cooling, key=req.cooling_key, metric=data.metric, log=True)
    _draw_slice(ax_l, data.limit, key=req.limit_key, metric=data.metric, log=False)
    _draw_pareto(ax_p, data.pareto, data.metric)
    fig.legend(handles=_legend_handles(data), loc="outside lower center", ncols=8, fontsize=8.5)
    n_points = len({json.dumps(r.params, sort_keys=True) for r in req.rows})
    missing = n_points * len(data.scenarios) - len(req.rows)
    gaps = f"; {missing} (point, scenario) without a row: gaps in the lines" if missing else ""
    fig.suptitle(f"{escape_text(req.label)}: throughput at the DTM limit against cooling and against the limit, per "
                 f"policy ({n_points} grid points, {len(data.scenarios)} scenarios{gaps})")
    return fig


def render_sweep_plot(kind: str, req: SweepPlotRequest, fmt: str = "png") -> bytes:
    """The sweep figure ``kind`` (``pareto``) as PNG or SVG bytes (same input, same bytes)."""
    sweep_figure_size(kind)  # the kind's check
    return render_figure(lambda: pareto_figure(req), fmt)
