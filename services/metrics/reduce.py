"""Reduce a run's per-window metrics to one row of the unified CSV (seed 001 §3.6, §4.7; ARCHITECTURE §5.5).

Input: the `WindowMetrics` of one scenario run, one per committed window, in window order. Output: a `ResultRow` whose
first columns are exactly ``scenario,workload,T_peak_logic,T_peak_dram,T_avg,ips,lat_ms,bw_util,refresh_mhz,noc_load``
followed by the extras of `EXTRA_COLUMNS`. With ``dt_w`` the length of window ``w`` (ms) and ``T = Σ_w dt_w`` the
simulated time covered by the run:

- ``T_peak_logic`` / ``T_peak_dram`` [°C]: max over the run of the per-window maxima (``max_w T_peak_*_w``).
- ``T_avg`` [°C]: time-weighted mean over all logic and DRAM cells,
  ``Σ_w dt_w · (n_L·T_mean_logic_w + n_D·T_mean_dram_w)/(n_L + n_D) / T`` with ``n_L``, ``n_D`` the thermal-grid
  cells of the logic layer and of all DRAM layers (``cells_logic``/``cells_dram``; when absent, the cores and
  vaults × DRAM layers of the window's arrays, i.e. equal cells per layer).
- ``ips`` [tokens/s]: completed tokens per second of simulated time, ``Σ_w tokens_completed_w / (T/1000)``.
- ``lat_ms`` [ms]: mean token latency (generation to completion) over every latency sample of the run;
  ``lat_p50_ms`` / ``lat_p99_ms`` their 50th / 99th percentiles (linear interpolation). When no token completed
  but tokens are in flight, all three are the age of the oldest one at the end of the run (a lower bound on its
  latency) and ``lat_censored`` is 1 (else 0); ``ips`` is then 0.
- ``bw_util`` [1]: bytes moved / (effective bandwidth × time), ``Σ bytes_w / Σ (bw_eff_w·1e9 · dt_w/1000)``;
  ``bw_util_raw`` the same against the raw bandwidth ``bw_raw_gbps`` when given (else empty).
- ``refresh_mhz`` [MHz]: time-weighted mean DRAM refresh command rate.
- ``noc_load`` [1]: time-weighted mean over windows of the mean link utilisation; ``noc_load_max`` the busiest link
  in any window.
- ``energy_j`` [J] ``Σ power_w·dt_w/1000``; ``power_avg_w`` = energy / time; ``migrations`` the sum over windows;
  ``time_above_thot_ms`` ``Σ dt_w`` over windows with ``T_peak_logic_w > thot_c``; ``T_var_logic`` [°C²] the
  time-weighted mean of the spatial (population) variance of the core temperatures; ``T_mean_logic`` /
  ``T_mean_dram`` / ``freq_avg_ghz`` (mean over cores) / ``queue_delay_ms`` time-weighted means; ``tokens``,
  ``windows``, ``sim_time_ms`` = ``T``.

Serving columns, over the requests that finished in the run (``requests_done`` of the windows; a request still
waiting or running at the end is in none of them, ``tokens_queued`` counts its tokens):

- ``ttft_p50_ms`` / ``ttft_p99_ms``: percentiles (linear interpolation) of the time to first token,
  ``t_first_token - t_arrival``; ``tpot_p50_ms`` / ``tpot_p99_ms``: of the time per output token after the first,
  ``(t_done - t_first_token) / (output_tokens - 1)``, over the requests of at least 2 output tokens (MLPerf
  Inference's TPOT). Empty when no such request finished.
- ``requests_done``: the requests that finished; ``tokens_offered`` / ``tokens_shed``: ``Σ_w`` of the windows'
  (output tokens asked for by the requests that arrived / by those the full queue refused); ``tokens_served``
  ``Σ_w tokens_completed`` (output tokens generated, = ``tokens``); ``tokens_queued`` the last window's (output
  tokens not yet generated of the admitted, unfinished requests at the run's end).
- ``goodput_tok_s``: output tokens per second of simulated time of the finished requests that met both SLO limits
  on their own (TTFT <= ``slo_ttft_p99_ms`` and, with >= 2 output tokens, TPOT <= ``slo_tpot_p99_ms``),
  ``Σ output_tokens / (T/1000)``; ``slo_met``: 1 when the run meets the SLO by the rule of shared/slo.py (the SLO
  capacity search's too): ``tokens_shed`` and ``tokens_queued`` 0, ``ttft_p99_ms <= slo_ttft_p99_ms`` and
  ``tpot_p99_ms <= slo_tpot_p99_ms`` (a run with no multi-token request has no TPOT to exceed), else 0 (also when no
  request finished). Both are empty when the reduction is given no SLO.
- ``tokens_unbalanced``: ``Σ_w |error_w|`` of the token balance of shared/token_balance.py, ``tokens_queued_w =
  tokens_queued_{w-1} + tokens_offered_w - tokens_completed_w - tokens_shed_w``: 0 when every window balances.

Throttling columns, from the thermal snapshots' counts (``cores_throttled_w``, ``cores_emergency_w``: cores that ran
window ``w`` below their top DVFS step, and in the emergency clock modulation of ``arch.dtm``'s hard limit):

- ``time_throttled_ms`` ``Σ dt_w`` over windows with ``cores_throttled_w > 0`` (any core below its top step);
- ``time_emergency_ms`` ``Σ dt_w`` over windows with ``cores_emergency_w > 0``.

A run whose windows report no request at all (fixed arrival: ``requests_done`` empty and every request count 0) has
``requests_done``, the four token counts and ``tokens_unbalanced`` 0, and the percentiles, ``goodput_tok_s`` and
``slo_met`` empty, whatever the SLO: its other columns are those it had before the serving columns existed. The
per-request samples are kept whole in a `ReducePartial` (three integers per finished request), as the token
latency samples are, so a fold gives exactly the one-shot row.

Nothing is silently zero: an empty run, a NaN or infinite value, windows of different shapes (cores, vaults, DRAM
layers, NoC links), a run without any latency sample (and no token in flight) or NoC link, windows out of order or
overlapping in time all raise `BadInput` naming the field (``windows[3].temps_core_c[5]``), which the HTTP layer
answers with 422.

CSV: `row_csv` gives the header and one line, floats with 9 significant digits (``%.9g``) so identical inputs give
byte-identical files on every platform; `write_result_csv` writes ``<results_dir>/<scenario>/<workload>.csv``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from shared.contracts.events import MAX_REQUEST_COUNT
from shared.contracts.metrics import (
    ALL_COLUMNS,
    POWER_COMPONENTS,
    RESULT_COLUMNS,
    SCENARIOS,
    PowerReport,
    PowerStat,
    ReducePartial,
    RequestSamples,
    ResultRow,
    WindowMetrics,
    check_workload_name,
)
from shared.errors import BadInput, first_validation_error
from shared.slo import slo_misses
from shared.token_balance import serving_columns, token_imbalance, windows_report_requests

_SCALARS = ("t_start_ms", "dt_ms", "T_peak_logic", "T_peak_dram", "T_mean_logic", "T_mean_dram", "power_w",
            "refresh_mhz", "bytes_moved", "bw_eff_gbps", "queue_delay_ms")
_TIME_TOL = 1e-9  # relative tolerance on window overlap


def _check_finite(arr: np.ndarray, index_fmt: str) -> None:
    """Raise naming the first non-finite entry of ``arr`` (rows = windows)."""
    bad = np.argwhere(~np.isfinite(arr))
    if bad.size:
        idx = tuple(int(i) for i in bad[0])
        raise BadInput(f"{index_fmt.format(*idx)}: must be a finite number, got {arr[idx]!r}",
                       field=index_fmt.format(*idx))


def _stack(windows: Sequence[WindowMetrics], name: str, *, allow_empty: bool = False) -> np.ndarray:
    """Per-window 1-D lists of field ``name`` as a (windows, n) array; every window must have the same n."""
    lengths = [len(getattr(w, name)) for w in windows]
    n = lengths[0]
    if n == 0 and not allow_empty:
        raise BadInput(f"windows[0].{name}: must not be empty", field=f"windows[0].{name}")
    for i, m in enumerate(lengths):
        if m != n:
            raise BadInput(f"windows[{i}].{name}: has {m} values but windows[0] has {n} (windows of different shapes)",
                           field=f"windows[{i}].{name}")
    arr = np.asarray([getattr(w, name) for w in windows], dtype=np.float64).reshape(len(windows), n)
    _check_finite(arr, f"windows[{{}}].{name}[{{}}]")
    return arr


def _stack_banks(windows: Sequence[WindowMetrics], n_cores: int) -> np.ndarray:
    """temps_bank_c as (windows, vaults, layers); vaults = cores; same layers in every window."""
    first = windows[0].temps_bank_c
    if not first:
        raise BadInput("windows[0].temps_bank_c: must not be empty", field="windows[0].temps_bank_c")
    n_layers = len(first[0])
    for i, w in enumerate(windows):
        tb = w.temps_bank_c
        if len(tb) != n_cores:
            raise BadInput(f"windows[{i}].temps_bank_c: has {len(tb)} vaults but there are {n_cores} cores",
                           field=f"windows[{i}].temps_bank_c")
        for v, row in enumerate(tb):
            if len(row) != n_layers or n_layers == 0:
                raise BadInput(f"windows[{i}].temps_bank_c[{v}]: has {len(row)} DRAM layers, expected {n_layers} "
                               "(windows of different shapes)" if n_layers else
                               f"windows[{i}].temps_bank_c[{v}]: must not be empty",
                               field=f"windows[{i}].temps_bank_c[{v}]")
    arr = np.asarray([w.temps_bank_c for w in windows], dtype=np.float64)
    _check_finite(arr, "windows[{}].temps_bank_c[{}][{}]")
    return arr


def _cells(windows: Sequence[WindowMetrics], n_cores: int, n_dram: int) -> tuple[int, int]:
    """(logic cells, DRAM cells), the same in every window."""
    cl = [w.cells_logic if w.cells_logic is not None else n_cores for w in windows]
    cd = [w.cells_dram if w.cells_dram is not None else n_dram for w in windows]
    for name, vals in (("cells_logic", cl), ("cells_dram", cd)):
        for i, v in enumerate(vals):
            if v != vals[0]:
                raise BadInput(f"windows[{i}].{name}: {v} differs from windows[0] ({vals[0]})",
                               field=f"windows[{i}].{name}")
    return cl[0], cd[0]


def reduce_window_metrics(windows: Sequence[WindowMetrics], *, scenario: str, workload: str, thot_c: float,
                          bw_raw_gbps: float | None = None, partial: ReducePartial | None = None,
                          slo_ttft_p99_ms: float | None = None, slo_tpot_p99_ms: float | None = None) -> ResultRow:
    """One `ResultRow` from a run's windows (definitions in the module docstring), after the windows already folded
    into ``partial`` (a long run is reduced chunk by chunk, `fold_windows`); ``slo_*``: the serving SLO (ms, both or
    neither). Raises `BadInput` on bad input."""
    return reduce_with_power(windows, scenario=scenario, workload=workload, thot_c=thot_c, bw_raw_gbps=bw_raw_gbps,
                             partial=partial, slo_ttft_p99_ms=slo_ttft_p99_ms, slo_tpot_p99_ms=slo_tpot_p99_ms)[0]


def reduce_with_power(windows: Sequence[WindowMetrics], *, scenario: str, workload: str, thot_c: float,
                      bw_raw_gbps: float | None = None, partial: ReducePartial | None = None,
                      slo_ttft_p99_ms: float | None = None, slo_tpot_p99_ms: float | None = None
                      ) -> tuple[ResultRow, PowerReport | None]:
    """`reduce_window_metrics` and the run's `PowerReport` (None unless every window reports its power)."""
    _check_header(scenario=scenario, workload=workload, thot_c=thot_c, bw_raw_gbps=bw_raw_gbps)
    _check_slo(slo_ttft_p99_ms, slo_tpot_p99_ms)
    if not windows and partial is None:
        raise BadInput("windows: a run needs at least one window", field="windows")
    acc = fold_windows(windows, thot_c=thot_c, partial=partial) if windows else partial
    assert acc is not None
    row = finish(acc, scenario=scenario, workload=workload, thot_c=thot_c, bw_raw_gbps=bw_raw_gbps,
                 slo_ttft_p99_ms=slo_ttft_p99_ms, slo_tpot_p99_ms=slo_tpot_p99_ms)
    return row, power_report(acc)


def _window_components(w: WindowMetrics, i: int) -> dict[str, float]:
    """The power report's components of one window (W): `POWER_COMPONENTS` and their sum ``total``."""
    p = w.power
    assert p is not None
    vals = {"logic_dynamic": p.logic_dynamic, "spm": p.spm, "noc": p.noc, "logic_leakage": p.logic_leakage,
            "dram_access": p.dram_dynamic + p.dram_controller, "dram_refresh": p.dram_refresh,
            "dram_leakage": p.dram_leakage}
    for name, v in vals.items():
        if not (math.isfinite(v) and v >= 0):
            raise BadInput(f"windows[{i}].power.{name}: must be a finite power >= 0 W, got {v!r}",
                           field=f"windows[{i}].power")
    return {**vals, "total": sum(vals.values())}


def _fold_power(windows: Sequence[WindowMetrics], dt: np.ndarray, p: ReducePartial) -> dict[str, Any]:
    """Energy (J) and peak (W) per component and per die of the windows, added to ``p``'s."""
    if not all(w.power is not None for w in windows):
        return {}
    comp = [_window_components(w, i) for i, w in enumerate(windows)]
    keys = list(p.energy_layer) or list(windows[0].power_layer_w)
    for i, w in enumerate(windows):
        if list(w.power_layer_w) != keys:
            raise BadInput(f"windows[{i}].power_layer_w: dies {list(w.power_layer_w)} differ from {keys}",
                           field=f"windows[{i}].power_layer_w")
        bad = [k for k, v in w.power_layer_w.items() if not (math.isfinite(v) and v >= 0)]
        if bad:
            raise BadInput(f"windows[{i}].power_layer_w.{bad[0]}: must be a finite power >= 0 W",
                           field=f"windows[{i}].power_layer_w")
    out: dict[str, Any] = {"power_windows": p.power_windows + len(windows), "energy_by": {}, "peak_by": {},
                           "energy_layer": {}, "peak_layer": {}}
    for name in (*POWER_COMPONENTS, "total"):
        col = np.array([c[name] for c in comp])
        out["energy_by"][name] = p.energy_by.get(name, 0.0) + float(col @ dt) / 1e3
        out["peak_by"][name] = max(p.peak_by.get(name, 0.0), float(col.max()))
    for name in keys:
        col = np.array([w.power_layer_w[name] for w in windows])
        out["energy_layer"][name] = p.energy_layer.get(name, 0.0) + float(col @ dt) / 1e3
        out["peak_layer"][name] = max(p.peak_layer.get(name, 0.0), float(col.max()))
    return out


def power_report(p: ReducePartial) -> PowerReport | None:
    """The run's `PowerReport` from its folded windows: energy ``Σ P·dt``, mean = energy / run time, peak = the
    highest window mean; None unless every window reported its power."""
    if p.windows == 0 or p.power_windows != p.windows or p.first_start_ms is None or p.last_end_ms is None:
        return None
    t_s = p.t_ms * 1e-3

    def stat(e: dict[str, float], pk: dict[str, float], name: str) -> PowerStat:
        return PowerStat(energy_j=e[name], mean_w=e[name] / t_s, peak_w=pk[name])

    return PowerReport(interval_ms=(p.first_start_ms, p.last_end_ms),
                       components={k: stat(p.energy_by, p.peak_by, k) for k in p.energy_by},
                       layers={k: stat(p.energy_layer, p.peak_layer, k) for k in p.energy_layer})


def power_report_markdown(reports: Mapping[str, PowerReport]) -> str:
    """Markdown table, one row per component then per die, per scenario ``mean / peak W (energy J)``."""
    scen = list(reports)
    if not scen:
        return ""
    first = reports[scen[0]]
    head = "| | " + " | ".join(f"{s} mean / peak W (energy J)" for s in scen) + " |\n"
    head += "|---|" + "---:|" * len(scen) + "\n"
    lines = []
    for part, names in (("components", list(first.components)), ("layers", list(first.layers))):
        for name in names:
            cells = []
            for s in scen:
                st = getattr(reports[s], part).get(name)
                cells.append("" if st is None else f"{st.mean_w:.3g} / {st.peak_w:.3g} ({st.energy_j:.4g})")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def _check_header(*, scenario: str, workload: str, thot_c: float, bw_raw_gbps: float | None) -> None:
    if scenario not in SCENARIOS:
        raise BadInput(f"scenario: unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}", field="scenario")
    try:
        check_workload_name(workload)
    except ValueError as exc:
        raise BadInput(f"workload: {exc}", field="workload") from None
    if not math.isfinite(thot_c):
        raise BadInput("thot_c: must be a finite number", field="thot_c")
    if bw_raw_gbps is not None and not (math.isfinite(bw_raw_gbps) and bw_raw_gbps > 0):
        raise BadInput("bw_raw_gbps: must be a finite number > 0", field="bw_raw_gbps")


def _check_slo(slo_ttft_p99_ms: float | None, slo_tpot_p99_ms: float | None) -> None:
    """The SLO comes whole (both limits, each a finite number > 0 ms) or not at all."""
    given = {"slo_ttft_p99_ms": slo_ttft_p99_ms, "slo_tpot_p99_ms": slo_tpot_p99_ms}
    for name, v in given.items():
        if v is None and any(x is not None for x in given.values()):
            raise BadInput(f"{name}: an SLO needs both limits, slo_ttft_p99_ms and slo_tpot_p99_ms", field=name)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise BadInput(f"{name}: must be a finite number > 0 (ms)", field=name)


def _request_samples(windows: Sequence[WindowMetrics], sc: Mapping[str, np.ndarray]) -> RequestSamples:
    """The finished requests of the windows as `RequestSamples`, after checking each: ``t_arrival_ns <=
    t_first_token_ns <= t_done_ns``, ``t_done_ns`` within its window, no request twice in a window (the contract
    bounds the integers and asks for at least one output token)."""
    counts = np.array([len(w.requests_done) for w in windows], dtype=np.int64)
    if not counts.any():
        return RequestSamples.empty()
    cols = {name: np.concatenate([np.asarray(getattr(w.requests_done, name), dtype=np.int64) for w in windows])
            for name in ("request_id", "t_arrival_ns", "t_first_token_ns", "t_done_ns", "output_tokens")}
    win = np.repeat(np.arange(len(windows)), counts)
    pos = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)  # index within its window
    end_ns = (sc["t_start_ms"] + sc["dt_ms"]) * 1e6
    tol_ns = 1.0 + _TIME_TOL * np.abs(end_ns)  # the window's bounds are ms floats
    lo_ns, hi_ns = sc["t_start_ms"] * 1e6 - tol_ns, end_ns + tol_ns
    order = np.lexsort((cols["request_id"], win))
    repeat = np.zeros(win.size, dtype=bool)
    repeat[order[1:]] = (win[order[1:]] == win[order[:-1]]) & (cols["request_id"][order[1:]]
                                                                == cols["request_id"][order[:-1]])
    checks = (
        ("t_first_token_ns", cols["t_first_token_ns"] < cols["t_arrival_ns"], "is before its t_arrival_ns"),
        ("t_done_ns", cols["t_done_ns"] < cols["t_first_token_ns"], "is before its t_first_token_ns"),
        ("t_done_ns", (cols["t_done_ns"] < lo_ns[win]) | (cols["t_done_ns"] > hi_ns[win]),
         "is outside its window (a request is reported in the window its last token is generated in)"),
        ("request_id", repeat, "is reported twice in the window"),
    )
    for name, bad, what in checks:
        hit = np.flatnonzero(bad)
        if hit.size:
            i, j = int(win[hit[0]]), int(pos[hit[0]])
            field = f"windows[{i}].requests_done.{name}[{j}]"
            raise BadInput(f"{field}: {int(cols[name][hit[0]])} {what}", field=field)
    return RequestSamples(ttft_ns=(cols["t_first_token_ns"] - cols["t_arrival_ns"]).tolist(),
                          decode_ns=(cols["t_done_ns"] - cols["t_first_token_ns"]).tolist(),
                          output_tokens=cols["output_tokens"].tolist())


def _fold_serving(windows: Sequence[WindowMetrics], sc: Mapping[str, np.ndarray], p: ReducePartial
                  ) -> dict[str, Any]:
    """The serving part of the partial: the finished requests' samples, the token counts, the balance error.

    Nothing is added while no window has reported a request (a fixed-arrival run). The windows before the first
    that does each break the balance by their ``tokens_completed`` (tokens generated, none offered): they are added
    to ``tokens_unbalanced`` then, so the error does not depend on how the run is chunked."""
    if not p.serving and not windows_report_requests(windows):
        return {}
    big = next((i for i, w in enumerate(windows) if w.tokens_completed > MAX_REQUEST_COUNT), None)
    if big is not None:
        raise BadInput(f"windows[{big}].tokens_completed: more than {MAX_REQUEST_COUNT} in a window",
                       field=f"windows[{big}].tokens_completed")
    cols = serving_columns(windows)
    err = token_imbalance(cols["tokens_offered"], cols["tokens_completed"], cols["tokens_queued"],
                          cols["tokens_shed"], queued_before=p.tokens_queued)
    new = _request_samples(windows, sc)
    return {"serving": True,
            "requests": RequestSamples.concat([p.requests, new]) if len(new) else p.requests,
            "tokens_offered": p.tokens_offered + int(cols["tokens_offered"].sum()),
            "tokens_shed": p.tokens_shed + int(cols["tokens_shed"].sum()),
            "tokens_queued": int(cols["tokens_queued"][-1]),
            "tokens_unbalanced": p.tokens_unbalanced + (0 if p.serving else p.tokens) + int(np.abs(err).sum())}


def _serving_columns(p: ReducePartial, *, t_s: float, slo_ttft_p99_ms: float | None,
                     slo_tpot_p99_ms: float | None) -> dict[str, Any]:
    """The result row's serving columns (module docstring) from the folded windows."""
    if not p.serving:
        return {}  # the ResultRow defaults: counts 0, the rest empty
    ttft_ms = np.asarray(p.requests.ttft_ns, dtype=np.int64) / 1e6
    decode_ns = np.asarray(p.requests.decode_ns, dtype=np.int64)
    out_tok = np.asarray(p.requests.output_tokens, dtype=np.int64)
    multi = out_tok >= 2
    tpot_all_ms = decode_ns / np.maximum(out_tok - 1, 1) / 1e6  # a single-token request's is never read
    tpot_ms = tpot_all_ms[multi]
    ttft_p = np.percentile(ttft_ms, [50.0, 99.0]) if ttft_ms.size else None
    tpot_p = np.percentile(tpot_ms, [50.0, 99.0]) if tpot_ms.size else None
    out: dict[str, Any] = {
        "ttft_p50_ms": None if ttft_p is None else float(ttft_p[0]),
        "ttft_p99_ms": None if ttft_p is None else float(ttft_p[1]),
        "tpot_p50_ms": None if tpot_p is None else float(tpot_p[0]),
        "tpot_p99_ms": None if tpot_p is None else float(tpot_p[1]),
        "requests_done": int(out_tok.size), "tokens_offered": p.tokens_offered, "tokens_served": p.tokens,
        "tokens_queued": p.tokens_queued, "tokens_shed": p.tokens_shed, "tokens_unbalanced": p.tokens_unbalanced,
    }
    if slo_ttft_p99_ms is not None and slo_tpot_p99_ms is not None:
        met = (ttft_ms <= slo_ttft_p99_ms) & (~multi | (tpot_all_ms <= slo_tpot_p99_ms))
        out["goodput_tok_s"] = float(out_tok[met].sum()) / t_s
        out["slo_met"] = int(not slo_misses(
            tokens_shed=p.tokens_shed, tokens_queued=p.tokens_queued, ttft_p99_ms=out["ttft_p99_ms"],
            tpot_p99_ms=out["tpot_p99_ms"], slo_ttft_ms=slo_ttft_p99_ms, slo_tpot_ms=slo_tpot_p99_ms))
    return out


def _same(partial_value: int | None, value: int, field: str, what: str) -> int:
    if partial_value is not None and partial_value != value:
        raise BadInput(f"{field}: {what} {value}, but the windows folded before have {partial_value} (windows of "
                       "different shapes)", field=field)
    return value


def fold_windows(windows: Sequence[WindowMetrics], *, thot_c: float,
                 partial: ReducePartial | None = None) -> ReducePartial:
    """Fold ``windows`` (the next windows of a run, in order) into ``partial``: every check of the module docstring
    on these windows, and against the windows folded before (order, overlap in time, shapes, cells)."""
    if not math.isfinite(thot_c):
        raise BadInput("thot_c: must be a finite number", field="thot_c")
    if not windows:
        raise BadInput("windows: a run needs at least one window", field="windows")
    p = partial or ReducePartial(thot_c=thot_c)
    if p.thot_c != thot_c:
        raise BadInput(f"thot_c: {thot_c} differs from the {p.thot_c} the windows before were folded with",
                       field="thot_c")

    # --- per-window scalars, shapes, finiteness -------------------------------------------------------------------
    sc = {name: np.array([getattr(w, name) for w in windows], dtype=np.float64) for name in _SCALARS}
    for name, arr in sc.items():
        _check_finite(arr, f"windows[{{}}].{name}")
    idx = np.array([w.window for w in windows])
    _check_order(idx, sc, p)
    for kind in ("logic", "dram"):
        bad = np.flatnonzero(sc[f"T_peak_{kind}"] < sc[f"T_mean_{kind}"] - 1e-9)
        if bad.size:
            i = int(bad[0])
            raise BadInput(f"windows[{i}].T_peak_{kind}: peak {sc[f'T_peak_{kind}'][i]} is below the mean "
                           f"{sc[f'T_mean_{kind}'][i]}", field=f"windows[{i}].T_peak_{kind}")

    st = _Stacked.of(windows, p)
    core, freq, links = st.core, st.freq, st.links
    n_l, n_d = st.cells_logic, st.cells_dram
    serving = _fold_serving(windows, sc, p)

    # --- sums (ms, °C, W, bytes; the reductions follow in `finish`) -----------------------------------------------
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is caught on the result in `finish`
        dt = sc["dt_ms"]
        t_avg_w = (n_l * sc["T_mean_logic"] + n_d * sc["T_mean_dram"]) / (n_l + n_d)
        return ReducePartial(
            windows=p.windows + len(windows), last_window=int(idx[-1]),
            last_end_ms=float(sc["t_start_ms"][-1] + dt[-1]),
            first_start_ms=p.first_start_ms if p.first_start_ms is not None else float(sc["t_start_ms"][0]),
            thot_c=thot_c, n_cores=st.n_cores,
            n_vault_layers=st.n_vault_layers, n_links=st.n_links, cells_logic=n_l, cells_dram=n_d,
            t_ms=p.t_ms + float(dt.sum()),
            peak_logic=max(float(sc["T_peak_logic"].max()), p.peak_logic if p.peak_logic is not None else -math.inf),
            peak_dram=max(float(sc["T_peak_dram"].max()), p.peak_dram if p.peak_dram is not None else -math.inf),
            s_t_avg=p.s_t_avg + float(dt @ t_avg_w),
            s_refresh=p.s_refresh + float(dt @ sc["refresh_mhz"]),
            s_noc=p.s_noc + float(dt @ links.mean(axis=1)),
            noc_max=max(float(links.max()), p.noc_max if p.noc_max is not None else -math.inf),
            s_var_logic=p.s_var_logic + float(dt @ core.var(axis=1)),
            s_mean_logic=p.s_mean_logic + float(dt @ sc["T_mean_logic"]),
            s_mean_dram=p.s_mean_dram + float(dt @ sc["T_mean_dram"]),
            s_freq=p.s_freq + float(dt @ freq.mean(axis=1)),
            s_queue=p.s_queue + float(dt @ sc["queue_delay_ms"]),
            energy_j=p.energy_j + float(sc["power_w"] @ dt) / 1e3,
            bytes_moved=p.bytes_moved + float(sc["bytes_moved"].sum()),
            cap_eff_bytes=p.cap_eff_bytes + float((sc["bw_eff_gbps"] * 1e9) @ (dt * 1e-3)),
            tokens=p.tokens + int(sum(w.tokens_completed for w in windows)),
            migrations=p.migrations + int(sum(w.migrations for w in windows)),
            above_thot_ms=p.above_thot_ms + float(dt[sc["T_peak_logic"] > thot_c].sum()),
            throttled_ms=p.throttled_ms + float(dt[np.array([w.cores_throttled > 0 for w in windows])].sum()),
            emergency_ms=p.emergency_ms + float(dt[np.array([w.cores_emergency > 0 for w in windows])].sum()),
            oldest_inflight_ms=max(p.oldest_inflight_ms, max(w.oldest_inflight_ms for w in windows)),
            latencies_ms=[*p.latencies_ms, *(x for w in windows for x in w.latencies_ms)],
            **_fold_power(windows, dt, p),
            **serving,
        )


@dataclass(frozen=True)
class _Stacked:
    """The windows' per-core, per-link and per-cell fields stacked (one row per window), their shapes checked
    against each other and against the windows folded before."""

    core: np.ndarray  # (W, cores) °C
    freq: np.ndarray  # (W, cores) GHz
    links: np.ndarray  # (W, links) utilisation
    n_cores: int
    n_vault_layers: int
    n_links: int
    cells_logic: int
    cells_dram: int

    @classmethod
    def of(cls, windows: Sequence[WindowMetrics], p: ReducePartial) -> _Stacked:
        core = _stack(windows, "temps_core_c")  # (W, cores)
        n_cores = _same(p.n_cores, core.shape[1], "windows[0].temps_core_c", "has cores:")
        banks = _stack_banks(windows, n_cores)  # (W, vaults, layers)
        n_vl = _same(p.n_vault_layers, banks.shape[2], "windows[0].temps_bank_c[0]", "has DRAM layers:")
        freq = _stack(windows, "freq_ghz")
        if freq.shape[1] != n_cores:
            raise BadInput(f"windows[0].freq_ghz: has {freq.shape[1]} values but there are {n_cores} cores",
                           field="windows[0].freq_ghz")
        links = _stack(windows, "noc_link_util")
        n_links = _same(p.n_links, links.shape[1], "windows[0].noc_link_util", "has links:")
        if (links < 0).any():
            i, j = (int(v) for v in np.argwhere(links < 0)[0])
            raise BadInput(f"windows[{i}].noc_link_util[{j}]: must be >= 0",
                           field=f"windows[{i}].noc_link_util[{j}]")
        for i, w in enumerate(windows):
            lat = np.asarray(w.latencies_ms, dtype=np.float64)
            _check_finite(lat[None, :], f"windows[{i}].latencies_ms[{{1}}]")
            if (lat < 0).any():
                j = int(np.flatnonzero(lat < 0)[0])
                raise BadInput(f"windows[{i}].latencies_ms[{j}]: must be >= 0",
                               field=f"windows[{i}].latencies_ms[{j}]")
        n_l, n_d = _cells(windows, n_cores, banks.shape[1] * banks.shape[2])
        n_l = _same(p.cells_logic, n_l, "windows[0].cells_logic", "has")
        n_d = _same(p.cells_dram, n_d, "windows[0].cells_dram", "has")
        return cls(core=core, freq=freq, links=links, n_cores=n_cores, n_vault_layers=n_vl, n_links=n_links,
                   cells_logic=n_l, cells_dram=n_d)


def _check_order(idx: np.ndarray, sc: dict[str, np.ndarray], p: ReducePartial) -> None:
    """The windows follow the ones folded before and each other: increasing indices, no repeats, none starting
    before the one before ends (ms, within a relative ``_TIME_TOL``)."""
    if idx[0] <= p.last_window:
        raise BadInput(f"windows[0].window: {int(idx[0])} does not follow {p.last_window} (windows must be in "
                       "increasing order, no repeats)", field="windows[0].window")
    if p.last_end_ms is not None and sc["t_start_ms"][0] < p.last_end_ms - _TIME_TOL * max(1.0, abs(p.last_end_ms)):
        raise BadInput(f"windows[0].t_start_ms: {sc['t_start_ms'][0]} starts before the window before ends "
                       f"({p.last_end_ms})", field="windows[0].t_start_ms")
    if idx.size > 1:
        bad = np.flatnonzero(np.diff(idx) <= 0)
        if bad.size:
            i = int(bad[0]) + 1
            raise BadInput(f"windows[{i}].window: {int(idx[i])} does not follow {int(idx[i - 1])} (windows must be in "
                           "increasing order, no repeats)", field=f"windows[{i}].window")
        ends = sc["t_start_ms"][:-1] + sc["dt_ms"][:-1]
        tol = _TIME_TOL * np.maximum(1.0, np.abs(ends))
        bad = np.flatnonzero(sc["t_start_ms"][1:] < ends - tol)
        if bad.size:
            i = int(bad[0]) + 1
            raise BadInput(f"windows[{i}].t_start_ms: {sc['t_start_ms'][i]} starts before window {i - 1} ends "
                           f"({ends[i - 1]})", field=f"windows[{i}].t_start_ms")


def finish(p: ReducePartial, *, scenario: str, workload: str, thot_c: float,
           bw_raw_gbps: float | None = None, slo_ttft_p99_ms: float | None = None,
           slo_tpot_p99_ms: float | None = None) -> ResultRow:
    """The `ResultRow` of a run whose windows are all folded into ``p``."""
    _check_header(scenario=scenario, workload=workload, thot_c=thot_c, bw_raw_gbps=bw_raw_gbps)
    _check_slo(slo_ttft_p99_ms, slo_tpot_p99_ms)
    if p.windows == 0 or p.peak_logic is None or p.peak_dram is None or p.noc_max is None:
        raise BadInput("windows: a run needs at least one window", field="windows")
    if p.thot_c != thot_c:
        raise BadInput(f"thot_c: {thot_c} differs from the {p.thot_c} the windows were folded with", field="thot_c")
    lat_all = np.asarray(p.latencies_ms, dtype=np.float64)
    censored = lat_all.size == 0 and p.oldest_inflight_ms > 0
    if censored:  # nothing completed, but tokens are in flight: their age is a lower bound on their latency
        lat_all = np.array([p.oldest_inflight_ms])
    if lat_all.size == 0:
        raise BadInput(
            f"windows[*].latencies_ms: no token completed in the {p.windows} windows "
            f"({p.t_ms:g} ms simulated), so lat_ms is undefined: the chip's queue is longer "
            "than the run; run more windows or lower the arrival rate (sequence.step_interval_ms)",
            field="windows[*].latencies_ms")
    t_ms = p.t_ms
    if not (t_ms * 1e-3 > 0.0 and p.cap_eff_bytes > 0.0):  # positive per window but underflowing in total
        raise BadInput("windows[*].dt_ms: the run's simulated time or bandwidth rounds to zero",
                       field="windows[*].dt_ms")
    with np.errstate(over="ignore", invalid="ignore"):
        p50, p99 = np.percentile(lat_all, [50.0, 99.0])
        row = ResultRow(
            scenario=scenario,  # checked against SCENARIOS above
            workload=workload,
            T_peak_logic=p.peak_logic,
            T_peak_dram=p.peak_dram,
            T_avg=p.s_t_avg / t_ms,
            ips=p.tokens / (t_ms * 1e-3),
            lat_ms=float(lat_all.mean()),
            bw_util=p.bytes_moved / p.cap_eff_bytes,
            refresh_mhz=p.s_refresh / t_ms,
            noc_load=p.s_noc / t_ms,
            lat_p50_ms=float(p50),
            lat_p99_ms=float(p99),
            energy_j=p.energy_j,
            power_avg_w=p.energy_j / (t_ms * 1e-3),
            migrations=p.migrations,
            time_above_thot_ms=p.above_thot_ms,
            thot_c=float(thot_c),
            T_var_logic=p.s_var_logic / t_ms,
            T_mean_logic=p.s_mean_logic / t_ms,
            T_mean_dram=p.s_mean_dram / t_ms,
            freq_avg_ghz=p.s_freq / t_ms,
            queue_delay_ms=p.s_queue / t_ms,
            noc_load_max=p.noc_max,
            bw_util_raw=None if bw_raw_gbps is None else p.bytes_moved / (bw_raw_gbps * 1e9 * t_ms * 1e-3),
            tokens=p.tokens,
            windows=p.windows,
            sim_time_ms=t_ms,
            lat_censored=int(censored),
            **_serving_columns(p, t_s=t_ms * 1e-3, slo_ttft_p99_ms=slo_ttft_p99_ms, slo_tpot_p99_ms=slo_tpot_p99_ms),
            time_throttled_ms=p.throttled_ms,
            time_emergency_ms=p.emergency_ms,
        )
    for name, value in row.model_dump().items():  # e.g. sums that overflow float64
        if isinstance(value, float) and not math.isfinite(value):
            raise BadInput(f"{name}: the result is not finite ({value}); check the windows' magnitudes", field=name)
    return row


# --- CSV ------------------------------------------------------------------------------------------------------------

def format_value(v: Any) -> str:
    """Deterministic CSV text: ints as ints, floats with 9 significant digits (no ``-0``), None as empty."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        s = f"{v:.9g}"
        return "0" if s == "-0" else s
    return str(v)


def row_values(row: ResultRow) -> list[str]:
    data = row.model_dump()
    return [format_value(data[c]) for c in ALL_COLUMNS]


def rows_csv(rows: Sequence[ResultRow]) -> str:
    """Header (ALL_COLUMNS) and one line per row, ``\\n`` line ends."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(ALL_COLUMNS)
    for r in rows:
        w.writerow(row_values(r))
    return buf.getvalue()


def row_csv(row: ResultRow) -> str:
    return rows_csv([row])


def result_csv_path(results_dir: Path, scenario: str, workload: str) -> Path:
    return Path(results_dir) / scenario / f"{workload}.csv"


def write_result_csv(row: ResultRow, results_dir: Path) -> Path:
    """Write ``<results_dir>/<scenario>/<workload>.csv`` (header + one row) and return its path."""
    path = result_csv_path(results_dir, row.scenario, row.workload)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    tmp.write_bytes(row_csv(row).encode("utf-8"))
    tmp.replace(path)
    return path


def parse_result_csv(text: str, *, source: str = "csv") -> list[ResultRow]:
    """Rows of a unified CSV; the ten seed columns must come first, in order. Errors name the file and column."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise BadInput(f"{source}: empty file", field=source)
    if tuple(header[: len(RESULT_COLUMNS)]) != RESULT_COLUMNS:
        raise BadInput(f"{source}: header must start with {','.join(RESULT_COLUMNS)}", field=source)
    rows = []
    for k, values in enumerate(reader, start=1):
        if not values:
            continue
        if len(values) != len(header):
            raise BadInput(f"{source} line {k + 1}: {len(values)} values for {len(header)} columns", field=source)
        data = {c: (v if v != "" else None) for c, v in zip(header, values, strict=True)}
        try:
            rows.append(ResultRow.model_validate(data))
        except ValidationError as exc:
            fld, msg = first_validation_error(exc)
            raise BadInput(f"{source} line {k + 1}, column {fld}: {msg}", field=fld) from None
    if not rows:
        raise BadInput(f"{source}: no data row", field=source)
    return rows


def read_result_csv(path: Path) -> list[ResultRow]:
    return parse_result_csv(Path(path).read_text(encoding="utf-8"), source=str(path))

