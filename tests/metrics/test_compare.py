"""compare(): deltas against baseline recomputed independently; CSV/Markdown output; results-folder scanning."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from services.metrics.compare import (
    COMPARE_CSV_COLUMNS,
    COMPARE_METRICS,
    collect_result_rows,
    compare,
    compare_all,
    compare_csv,
    compare_markdown,
    throttling,
    write_compare,
)
from services.metrics.reduce import reduce_window_metrics, write_result_csv
from shared.contracts.metrics import POLICIES, ResultRow, WindowMetrics
from shared.errors import BadInput, NotFound


@pytest.fixture(scope="module")
def rows(runs: dict[str, list[WindowMetrics]]) -> list[ResultRow]:
    return [reduce_window_metrics(ws, scenario=s, workload="mixtral_8x7b", thot_c=80.0) for s, ws in runs.items()]


def test_deltas_against_baseline(rows: list[ResultRow]) -> None:
    t = compare(list(reversed(rows)))  # input order does not matter
    assert t.scenarios == POLICIES  # the unthrottled reference: test_throttling_*
    base = next(r for r in rows if r.scenario == "baseline")
    for r in rows:
        for m, _, kind in COMPARE_METRICS:
            if getattr(base, m) is None:  # a serving column of these fixed-arrival runs: empty, no delta
                assert t.values[r.scenario][m] is None and t.deltas[r.scenario][m] is None
                continue
            x, b = float(getattr(r, m)), float(getattr(base, m))
            assert t.values[r.scenario][m] == pytest.approx(x, rel=1e-8)
            d = t.deltas[r.scenario][m]
            if kind == "pct":
                assert d == pytest.approx(100.0 * (x - b) / b, rel=1e-6, abs=1e-9)
            else:
                assert d == pytest.approx(x - b, rel=1e-6, abs=1e-6)
    assert all(v in (0, None) for v in t.deltas["baseline"].values())
    # the fixture's TAS run is cooler than baseline: a negative °C delta
    assert t.deltas["tas"]["T_peak_logic"] is not None and t.deltas["tas"]["T_peak_logic"] < 0


def test_zero_baseline_percentage_is_undefined(rows: list[ResultRow]) -> None:
    base = next(r for r in rows if r.scenario == "baseline").model_copy(update={"energy_j": 0.0})
    tas = next(r for r in rows if r.scenario == "tas")
    t = compare([base, tas])
    assert t.deltas["tas"]["energy_j"] is None
    assert t.scenarios == ("baseline", "tas")
    md = compare_markdown([t])
    assert "n/a" in md
    line = compare_csv([t]).splitlines()[2].split(",")
    assert line[COMPARE_CSV_COLUMNS.index("energy_j_delta_pct")] == ""


def test_csv_and_markdown(rows: list[ResultRow], tmp_path: Path) -> None:
    tables = compare_all(rows)
    text = compare_csv(tables)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert [p["scenario"] for p in parsed] == list(POLICIES)
    assert tuple(parsed[0]) == COMPARE_CSV_COLUMNS
    tacs = next(p for p in parsed if p["scenario"] == "tacs")
    by = {r.scenario: r for r in rows}
    assert float(tacs["T_peak_logic_delta_c"]) == pytest.approx(by["tacs"].T_peak_logic - by["baseline"].T_peak_logic,
                                                                abs=1e-6)
    assert float(tacs["ips_delta_pct"]) == pytest.approx(100 * (by["tacs"].ips / by["baseline"].ips - 1), rel=1e-6)
    md = compare_markdown(tables)
    lines = md.splitlines()
    header = next(ln for ln in lines if ln.startswith("| metric"))
    assert header == "| metric | unit | baseline | taps | tacs | tas |"
    peak = next(ln for ln in lines if ln.startswith("| T_peak_logic |"))
    assert "°C)" in peak and peak.count("|") == 7
    ips = next(ln for ln in lines if ln.startswith("| ips |"))
    assert "%)" in ips
    c, m = write_compare(tables, tmp_path)
    assert c.read_text() == text and m.read_text() == md
    assert compare_csv(compare_all(rows)) == text  # deterministic


def test_compare_errors(rows: list[ResultRow]) -> None:
    no_base = [r for r in rows if r.scenario != "baseline"]
    with pytest.raises(BadInput) as ei:
        compare(no_base)
    assert ei.value.field == "rows"
    with pytest.raises(BadInput) as ei:
        compare([*rows, rows[1]])
    assert ei.value.field == "rows[4].scenario"
    other = rows[2].model_copy(update={"workload": "llama"})
    with pytest.raises(BadInput) as ei:
        compare([rows[0], rows[1], other])
    assert ei.value.field == "rows[2].workload"
    with pytest.raises(BadInput):
        compare([])
    # several workloads: one table each; error positions refer to the caller's list
    llama = [r.model_copy(update={"workload": "llama"}) for r in rows[1:]]
    with pytest.raises(BadInput) as ei:
        compare_all([*rows, *llama])
    assert ei.value.field == "rows"  # llama has no baseline
    tables = compare_all([*rows, *[r.model_copy(update={"workload": "llama"}) for r in rows]])
    assert [t.workload for t in tables] == ["llama", "mixtral_8x7b"]


def test_collect_from_results_folder(rows: list[ResultRow], tmp_path: Path) -> None:
    for r in rows:
        write_result_csv(r, tmp_path)
    (tmp_path / "plots").mkdir()
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "logical_compute.csv").write_text("a,b\n1,2\n")  # not a scenario folder: skipped
    got = collect_result_rows(tmp_path)
    assert sorted(r.scenario for r in got) == sorted(POLICIES)
    assert compare_csv(compare_all(got)) == compare_csv(compare_all(rows))
    with pytest.raises(BadInput) as ei:
        collect_result_rows(tmp_path, scenarios=["baseline", "fastest"])
    assert ei.value.field == "scenarios"
    with pytest.raises(NotFound):
        collect_result_rows(tmp_path, workload="nothing")
    # a file whose scenario column disagrees with its folder
    (tmp_path / "tas" / "mixtral_8x7b.csv").write_text((tmp_path / "taps" / "mixtral_8x7b.csv").read_text())
    with pytest.raises(BadInput) as ei:
        collect_result_rows(tmp_path)
    assert "tas/" in ei.value.message


def _with_rate(row: ResultRow, scenario: str, ips: float, goodput: float | None = None,
               slo_met: int | None = None) -> ResultRow:
    return row.model_copy(update={"scenario": scenario, "ips": ips, "goodput_tok_s": goodput, "slo_met": slo_met})


def test_throttling_loss_and_what_each_policy_recovers(rows: list[ResultRow]) -> None:
    base = next(r for r in rows if r.scenario == "baseline")
    table = [_with_rate(base, "baseline", 60.0), _with_rate(base, "taps", 70.0), _with_rate(base, "tas", 55.0),
             _with_rate(base, "unthrottled", 100.0)]
    t = compare(table)
    assert t.scenarios == ("baseline", "taps", "tas", "unthrottled")
    th = throttling(t)
    assert th is not None and th.metric == "ips" and th.loss == pytest.approx(40.0)
    assert th.recovered == {"taps": pytest.approx(0.25), "tas": pytest.approx(-0.125)}
    md = compare_markdown([t])
    assert "cost 40.00 (40.0 % of unthrottled)" in md and "taps 25 %, tas -12 %" in md
    # served within the SLO, when both rows have it and one of them meets the SLO
    served = [_with_rate(base, "baseline", 60.0, 30.0, 0), _with_rate(base, "tacs", 60.0, 35.0, 0),
              _with_rate(base, "unthrottled", 100.0, 40.0, 1)]
    th = throttling(compare(served))
    assert th is not None and th.metric == "goodput_tok_s" and th.recovered == {"tacs": pytest.approx(0.5)}
    # overloaded, a request or two within the limits: both rows miss their SLO, so the loss is in what they served
    few = [_with_rate(base, "baseline", 77.0, 0.0, 0), _with_rate(base, "taps", 83.0, 5.33, 0),
           _with_rate(base, "unthrottled", 100.3, 5.33, 0)]
    th = throttling(compare(few))
    assert th is not None and th.metric == "ips" and th.loss == pytest.approx(23.3)
    # overloaded: no request met the SLO anywhere, so the loss is in what the chip served
    flat = [_with_rate(base, "baseline", 41.7, 0.0), _with_rate(base, "tacs", 37.0, 0.0),
            _with_rate(base, "unthrottled", 44.3, 0.0)]
    th = throttling(compare(flat))
    assert th is not None and th.metric == "ips" and th.loss == pytest.approx(2.6)
    assert th.recovered == {"tacs": pytest.approx((37.0 - 41.7) / 2.6)}
    # no reference, or no loss to recover
    assert throttling(compare(table[:3])) is None
    same = [_with_rate(base, "baseline", 60.0), _with_rate(base, "tas", 61.0), _with_rate(base, "unthrottled", 60.1)]
    th = throttling(compare(same))
    assert th is not None and th.recovered == {"tas": None}
    assert "nothing to recover" in compare_markdown([compare(same)])
