"""reduce_window_metrics: every column against an independent numpy recomputation; CSV determinism; bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.metrics.reduce import read_result_csv, reduce_window_metrics, row_csv, write_result_csv
from services.metrics.synthetic import synthetic_windows
from shared.contracts.metrics import ALL_COLUMNS, EXTRA_COLUMNS, RESULT_COLUMNS, ResultRow, WindowMetrics
from shared.errors import BadInput

THOT = 80.0


def _reduce(ws: list[WindowMetrics], **kw: object) -> ResultRow:
    return reduce_window_metrics(ws, scenario="baseline", workload="mixtral_8x7b", thot_c=THOT, **kw)  # type: ignore[arg-type]


def test_columns_in_seed_order() -> None:
    assert list(ResultRow.model_fields)[: len(RESULT_COLUMNS)] == list(RESULT_COLUMNS)
    assert list(ResultRow.model_fields) == list(ALL_COLUMNS)
    assert RESULT_COLUMNS == ("scenario", "workload", "T_peak_logic", "T_peak_dram", "T_avg", "ips", "lat_ms",
                              "bw_util", "refresh_mhz", "noc_load")
    for extra in ("lat_p99_ms", "energy_j", "migrations", "time_above_thot_ms", "T_var_logic"):
        assert extra in EXTRA_COLUMNS


def test_definitions_match_numpy(windows: list[WindowMetrics]) -> None:
    # make windows unequal in length so time weighting matters
    for i, w in enumerate(windows):
        w.dt_ms = 1.0 + i
        w.t_start_ms = sum(1.0 + j for j in range(i))
    row = _reduce(windows, bw_raw_gbps=5000.0)
    dt = np.array([w.dt_ms for w in windows])
    T = dt.sum()
    core = np.array([w.temps_core_c for w in windows])
    banks = np.array([w.temps_bank_c for w in windows])
    n_l, n_d = core.shape[1], banks.shape[1] * banks.shape[2]
    lat = np.concatenate([w.latencies_ms for w in windows])
    tl = np.array([w.T_mean_logic for w in windows])
    td = np.array([w.T_mean_dram for w in windows])
    assert row.T_peak_logic == max(w.T_peak_logic for w in windows)
    assert row.T_peak_dram == max(w.T_peak_dram for w in windows)
    assert row.T_avg == pytest.approx(np.sum(dt * (n_l * tl + n_d * td)) / (n_l + n_d) / T, rel=1e-12)
    assert row.ips == pytest.approx(sum(w.tokens_completed for w in windows) / (T / 1000.0), rel=1e-12)
    assert row.lat_ms == pytest.approx(lat.mean(), rel=1e-12)
    assert row.lat_p99_ms == pytest.approx(np.quantile(lat, 0.99), rel=1e-12)
    assert row.lat_p50_ms == pytest.approx(np.median(lat), rel=1e-12)
    cap = sum(w.bw_eff_gbps * 1e9 * w.dt_ms / 1000.0 for w in windows)
    assert row.bw_util == pytest.approx(sum(w.bytes_moved for w in windows) / cap, rel=1e-12)
    assert row.bw_util_raw == pytest.approx(sum(w.bytes_moved for w in windows) / (5000e9 * T / 1000.0), rel=1e-12)
    assert row.refresh_mhz == pytest.approx(np.average([w.refresh_mhz for w in windows], weights=dt), rel=1e-12)
    assert row.noc_load == pytest.approx(np.average([np.mean(w.noc_link_util) for w in windows], weights=dt),
                                         rel=1e-12)
    assert row.noc_load_max == max(max(w.noc_link_util) for w in windows)
    assert row.energy_j == pytest.approx(sum(w.power_w * w.dt_ms / 1000.0 for w in windows), rel=1e-12)
    assert row.power_avg_w == pytest.approx(row.energy_j / (T / 1000.0), rel=1e-12)
    assert row.migrations == sum(w.migrations for w in windows)
    assert row.time_above_thot_ms == pytest.approx(sum(w.dt_ms for w in windows if w.T_peak_logic > THOT))
    assert row.T_var_logic == pytest.approx(np.average(core.var(axis=1), weights=dt), rel=1e-12)
    assert row.freq_avg_ghz == pytest.approx(np.average([np.mean(w.freq_ghz) for w in windows], weights=dt))
    assert row.sim_time_ms == T and row.windows == len(windows)
    assert row.tokens == sum(w.tokens_completed for w in windows)


def test_t_avg_uses_given_cell_counts(windows: list[WindowMetrics]) -> None:
    for w in windows:
        w.cells_logic, w.cells_dram = 4096, 8 * 4096
    row = _reduce(windows)
    dt = np.array([w.dt_ms for w in windows])
    per_w = np.array([(w.T_mean_logic + 8 * w.T_mean_dram) / 9 for w in windows])
    assert row.T_avg == pytest.approx(np.average(per_w, weights=dt), rel=1e-12)
    windows[2].cells_dram = 100
    with pytest.raises(BadInput) as ei:
        _reduce(windows)
    assert ei.value.field == "windows[2].cells_dram"


def test_time_above_thot_counts_hot_windows(windows: list[WindowMetrics]) -> None:
    peaks = sorted(w.T_peak_logic for w in windows)
    thot = (peaks[2] + peaks[3]) / 2  # exactly three windows above
    row = reduce_window_metrics(windows, scenario="tas", workload="w", thot_c=thot)
    assert row.time_above_thot_ms == pytest.approx(3 * windows[0].dt_ms)
    assert row.thot_c == thot


def test_csv_is_byte_identical_and_round_trips(runs: dict[str, list[WindowMetrics]], tmp_path: Path) -> None:
    row = reduce_window_metrics(runs["tacs"], scenario="tacs", workload="mixtral_8x7b", thot_c=THOT)
    p1 = write_result_csv(row, tmp_path / "a")
    row2 = reduce_window_metrics([w.model_copy(deep=True) for w in runs["tacs"]], scenario="tacs",
                                 workload="mixtral_8x7b", thot_c=THOT)
    p2 = write_result_csv(row2, tmp_path / "b")
    assert p1 == tmp_path / "a" / "tacs" / "mixtral_8x7b.csv"
    assert p1.read_bytes() == p2.read_bytes()
    lines = p1.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == ",".join(ALL_COLUMNS)
    assert lines[0].startswith(",".join(RESULT_COLUMNS) + ",")
    back = read_result_csv(p1)
    assert len(back) == 1
    for c in ALL_COLUMNS:
        a, b = getattr(back[0], c), getattr(row, c)
        if isinstance(b, float):
            assert a == pytest.approx(b, rel=1e-8)
        else:
            assert a == b
    assert row_csv(back[0]) == p1.read_text()  # re-writing the parsed row gives the same bytes


def test_different_input_gives_different_csv(runs: dict[str, list[WindowMetrics]]) -> None:
    a = row_csv(reduce_window_metrics(runs["taps"], scenario="taps", workload="m", thot_c=THOT))
    ws = synthetic_windows(6, "taps", seed=8)
    b = row_csv(reduce_window_metrics(ws, scenario="taps", workload="m", thot_c=THOT))
    assert a != b


# --- bad input ---------------------------------------------------------------------------------------------------

def _err(ws: list[WindowMetrics], **kw: object) -> BadInput:
    with pytest.raises(BadInput) as ei:
        _reduce(ws, **kw)
    assert ei.value.status == 422
    assert ei.value.field and ei.value.field in ei.value.message
    return ei.value


def test_empty_run_is_an_error() -> None:
    assert _err([]).field == "windows"


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda ws: ws[2].temps_core_c.__setitem__(5, float("nan")), "windows[2].temps_core_c[5]"),
    (lambda ws: setattr(ws[1], "power_w", float("inf")), "windows[1].power_w"),
    (lambda ws: setattr(ws[3], "T_mean_dram", float("nan")), "windows[3].T_mean_dram"),
    (lambda ws: ws[4].temps_bank_c[10].__setitem__(7, float("-inf")), "windows[4].temps_bank_c[10][7]"),
    (lambda ws: ws[0].latencies_ms.__setitem__(3, float("nan")), "windows[0].latencies_ms[3]"),
    (lambda ws: ws[5].noc_link_util.__setitem__(0, float("nan")), "windows[5].noc_link_util[0]"),
])
def test_non_finite_values_name_the_field(windows: list[WindowMetrics], mutate: object, field: str) -> None:
    mutate(windows)  # type: ignore[operator]
    assert _err(windows).field == field


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda ws: ws[3].temps_core_c.pop(), "windows[3].temps_core_c"),
    (lambda ws: ws[2].temps_bank_c[6].pop(), "windows[2].temps_bank_c[6]"),
    (lambda ws: ws[1].temps_bank_c.pop(), "windows[1].temps_bank_c"),
    (lambda ws: ws[4].noc_link_util.append(0.1), "windows[4].noc_link_util"),
    (lambda ws: ws[2].freq_ghz.pop(), "windows[2].freq_ghz"),
    (lambda ws: setattr(ws[0], "temps_bank_c", []), "windows[0].temps_bank_c"),
])
def test_windows_of_different_shapes_are_refused(windows: list[WindowMetrics], mutate: object, field: str) -> None:
    mutate(windows)  # type: ignore[operator]
    assert _err(windows).field == field


def test_more_shape_and_order_errors(windows: list[WindowMetrics]) -> None:
    ws = [w.model_copy(deep=True) for w in windows]
    for w in ws:
        w.latencies_ms = []
    err = _err(ws)
    assert err.field == "windows[*].latencies_ms"
    assert f"no token completed in the {len(ws)} windows" in err.message and "run more windows" in err.message
    ws = [w.model_copy(deep=True) for w in windows]
    ws[3].window = 2
    assert _err(ws).field == "windows[3].window"
    ws = [w.model_copy(deep=True) for w in windows]
    ws[4].t_start_ms -= 1.0
    assert _err(ws).field == "windows[4].t_start_ms"
    ws = [w.model_copy(deep=True) for w in windows]
    ws[1].T_peak_logic = ws[1].T_mean_logic - 1.0
    assert _err(ws).field == "windows[1].T_peak_logic"
    ws = [w.model_copy(deep=True) for w in windows]
    for w in ws:
        w.noc_link_util = []
    assert _err(ws).field == "windows[0].noc_link_util"


def test_bad_arguments(windows: list[WindowMetrics]) -> None:
    with pytest.raises(BadInput) as ei:
        reduce_window_metrics(windows, scenario="fastest", workload="w", thot_c=THOT)
    assert ei.value.field == "scenario"
    with pytest.raises(BadInput) as ei:
        reduce_window_metrics(windows, scenario="tas", workload="../etc", thot_c=THOT)
    assert ei.value.field == "workload"
    assert _err(windows, bw_raw_gbps=0.0).field == "bw_raw_gbps"
    with pytest.raises(BadInput) as ei:
        reduce_window_metrics(windows, scenario="tas", workload="w", thot_c=float("nan"))
    assert ei.value.field == "thot_c"


def test_overflowing_result_is_refused(windows: list[WindowMetrics]) -> None:
    for w in windows:
        w.bytes_moved = 1.5e308  # finite per window, the run's sum is not
    assert _err(windows).field == "bw_util"
