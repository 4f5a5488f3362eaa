"""The SLO capacities on docs/results.md (scripts/results_capacity.py): collected only from probes that ran the
experiment's configs with nothing but the rate, arrivals and drain replaced; kept across a collect without capacity
folders only while the experiment's configs are the same; the throttling sentence bounds the loss by the brackets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scripts import render_results as rr
from scripts import results_capacity as rc


def _expected() -> dict[str, Any]:
    return rr.expected_configs("default")


def _probe(p: dict[str, Any]) -> dict[str, Any]:
    return {"rate_rps": p["rate"], "met": p["met"], "why": "" if p["met"] else "p99 TTFT 4000 > 2000 ms",
            "tokens_offered": 100, "tokens_served": 100, "tokens_queued": 0, "tokens_shed": 0,
            "ttft_p99_ms": 1000.0 if p["met"] else 4000.0, "tpot_p99_ms": 80.0, "goodput_tok_s": 10.0,
            "bw_util": 0.4, "T_peak_logic": 84.0}


def _search(root: Path, scenario: str, rates: list[tuple[float, bool]], expected: dict[str, Any],
            change: dict[str, Any] | None = None, probe_change: dict[float, dict[str, Any]] | None = None) -> None:
    """A `tasmoe capacity` folder: slo_capacity.json and a probe folder with a run log per rate (``probe_change``:
    fields of a rate's probe replaced)."""
    folder = root / rc.CAPACITY_OUT / "default" / scenario
    probes = [{**_probe({"rate": r, "met": m}), **(probe_change or {}).get(r, {})} for r, m in rates]
    for r, _ in rates:
        wl = json.loads(json.dumps(expected["workload"]))
        wl["serving"].update({"rate_rps": r, "duration_ms": 10000.0, "drain_ms": 10000.0})
        config = {**rc.scenario_config(expected, scenario), "workload": wl, "scenarios": [scenario], "seed": 42,
                  **(change or {})}
        log = folder / f"probe-{r:.6g}" / "runs" / scenario / "run.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"2000-01-01 00:00:00,000 INFO tasmoe.runfile run=x config {json.dumps(config)}\n",
                       encoding="utf-8")
    met = [r for r, m in rates if m]
    (folder / "slo_capacity.json").write_text(json.dumps(
        {"rate_rps": max(met) if met else None, "tok_s": 8.0 if met else None, "probes": probes,
         "how": "bisection", "scenario": scenario}), encoding="utf-8")


def _collect(root: Path, data: Path, kept: dict[str, Any] | None = None) -> list[str]:
    said: list[str] = []
    data.mkdir(parents=True, exist_ok=True)
    rc.collect_capacity("default", results_root=root, data=data, scenarios=("baseline", "unthrottled"),
                        expected=_expected(), kept=kept, run_config=rr.run_config, say=said.append)
    return said


def test_collect_takes_each_scenarios_search_and_renders_its_bracket(tmp_path: Path) -> None:
    exp = _expected()
    _search(tmp_path, "unthrottled", [(2.0, True), (2.4, False), (2.2, True), (2.3, False)], exp)
    _search(tmp_path, "baseline", [(2.0, True), (2.4, False), (2.2, False), (2.1, True)], exp)
    data = tmp_path / "data"
    _collect(tmp_path, data)
    found = json.loads((data / rc.CAPACITY_FILE).read_text(encoding="utf-8"))["scenarios"]
    assert (found["unthrottled"]["rate_rps"], found["unthrottled"]["first_missed_rps"]) == (2.2, 2.3)
    assert (found["baseline"]["rate_rps"], found["baseline"]["first_missed_rps"]) == (2.1, 2.2)
    table = rc.capacity_text(data, "", ["baseline", "taps", "unthrottled"])
    assert table.index("| baseline | 2.1 | 2.2 |") < table.index("| unthrottled | 2.2 | 2.3 |")
    said = rc.capacity_text(data, "throttling", [])
    # baseline's lowest (2.1) against the reference's highest (below 2.3): at most 1 - 2.1/2.3; at least 0
    assert f"between 0.0 % and {100 * (1 - 2.1 / 2.3):.1f} %" in said
    assert rc.capacity_text(data, "baseline rate_rps .2f", []) == "2.10"
    assert rc.capacity_text(data, "unthrottled bracket_pct .1f", []) == f"{100 * (1 - 2.2 / 2.3):.1f}"
    with pytest.raises(rc.CapacityError, match="no 'nope'"):
        rc.capacity_text(data, "baseline nope", [])


def test_the_same_bracket_says_no_loss_is_resolved(tmp_path: Path) -> None:
    exp = _expected()
    for sc in ("unthrottled", "baseline"):
        _search(tmp_path, sc, [(2.0, True), (2.4, False)], exp)
    _collect(tmp_path, tmp_path / "data")
    said = rc.capacity_text(tmp_path / "data", "throttling", [])
    assert "The same bracket" in said and f"less than {100 * (1 - 2.0 / 2.4):.1f} %" in said


@pytest.mark.parametrize("change, match", [
    ({"scenarios": ["taps"]}, "ran the scenarios"),
    ({"tas": {"other": 1}}, "another tas config"),
])
def test_a_probe_that_ran_something_else_is_refused(tmp_path: Path, change: dict[str, Any], match: str) -> None:
    _search(tmp_path, "baseline", [(2.0, True), (2.4, False)], _expected(), change=change)
    with pytest.raises(rc.CapacityError, match=match):
        _collect(tmp_path, tmp_path / "data")


def test_a_probe_with_another_workload_is_refused(tmp_path: Path) -> None:
    exp = _expected()
    other = json.loads(json.dumps(exp))
    other["workload"]["serving"]["prefill_chunk"] = 256  # not one of the search's knobs
    _search(tmp_path, "baseline", [(2.0, True)], other)
    with pytest.raises(rc.CapacityError, match="another workload"):
        _collect(tmp_path, tmp_path / "data")


def test_committed_capacities_are_kept_only_for_the_same_configs(tmp_path: Path) -> None:
    _search(tmp_path / "a", "baseline", [(2.0, True), (2.4, False)], _expected())
    _collect(tmp_path / "a", tmp_path / "first")
    kept = json.loads((tmp_path / "first" / rc.CAPACITY_FILE).read_text(encoding="utf-8"))
    said = _collect(tmp_path / "empty", tmp_path / "again", kept=kept)
    assert (tmp_path / "again" / rc.CAPACITY_FILE).is_file() and "kept" in said[-1]
    stale = {**kept, "configs_sha256": "0" * 64}
    said = _collect(tmp_path / "empty", tmp_path / "third", kept=stale)
    assert not (tmp_path / "third" / rc.CAPACITY_FILE).exists() and "dropped" in said[-1]


def test_rates_are_reported_as_the_requests_the_runs_offered(tmp_path: Path) -> None:
    """2.2776 and 2.3274 requests/s over 10 s both offer 23 requests: one probe, reported at 2.3 requests/s."""
    _search(tmp_path, "baseline", [(2.0, True), (2.378414, False), (2.181015, True), (2.277577, True),
                                   (2.327450, True)], _expected())
    _collect(tmp_path, tmp_path / "data")
    v = json.loads((tmp_path / "data" / rc.CAPACITY_FILE).read_text(encoding="utf-8"))["scenarios"]["baseline"]
    assert [p["requests"] for p in v["probes"]] == [20, 22, 23, 24] and v["runs"] == 5
    assert (v["rate_rps"], v["first_missed_rps"]) == (pytest.approx(2.3), pytest.approx(2.4))


def test_a_miss_the_drain_left_undecided_is_not_the_lowest_missed(tmp_path: Path) -> None:
    """2.4 requests/s left tokens queued, none shed, after 10 s of drain where 32 s judge its requests: undecided, so
    the lowest rate missed is 2.6 (shed); a miss with the judging drain, or a shed one, decides."""
    queued = {"why": "38 tokens still queued", "tokens_queued": 38, "tokens_served": 62, "ttft_p99_ms": 1500.0}
    _search(tmp_path, "baseline", [(2.0, True), (2.4, False), (2.6, False), (2.8, False)], _expected(),
            probe_change={2.4: {**queued, "drain_ms": 10000.0, "drain_needed_ms": 32000.0},
                          2.6: {**queued, "tokens_queued": 0, "tokens_shed": 38, "drain_ms": 10000.0,
                                "drain_needed_ms": 33000.0},
                          2.8: {**queued, "drain_ms": 40000.0, "drain_needed_ms": 34000.0}})
    _collect(tmp_path, tmp_path / "data")
    v = json.loads((tmp_path / "data" / rc.CAPACITY_FILE).read_text(encoding="utf-8"))["scenarios"]["baseline"]
    assert (v["rate_rps"], v["first_missed_rps"], v["undecided_rps"]) == (2.0, 2.6, [2.4])
    table = rc.capacity_text(tmp_path / "data", "", ["baseline"])
    assert "| baseline | 2 | 2.6 |" in table and "Missed but not decided" in table
    assert "baseline at 2.4 requests/s" in table
