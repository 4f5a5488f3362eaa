"""docs/sweep.md's note on the default capacity search's drain holds in the committed data: the search's probes
(docs/results/default/capacity.json) and the unthrottled 2.4 requests/s probe run again with the drain that judges
every request (docs/results/capacity-judge/unthrottled/). A re-run that changes them fails here until the page is
rewritten."""

from __future__ import annotations

import csv
import json
import math
from typing import Any

import pytest

from tests.conftest import CONFIGS, REPO

DATA = REPO / "docs" / "results"


def _page() -> str:
    return " ".join((REPO / "docs" / "sweep.md").read_text(encoding="utf-8").split())


def test_the_default_searchs_verdicts_and_the_probe_run_again_are_as_the_page_says() -> None:
    from services.orchestrator.local import drain_to_judge_ms
    from shared.configs import load_workload

    page = _page()
    found = json.loads((DATA / "default" / "capacity.json").read_text(encoding="utf-8"))["scenarios"]
    probes = [(sc, p) for sc, v in found.items() for p in v["probes"]]
    assert all(p["tokens_queued"] == 0 for _, p in probes if p["met"])  # "a met probe finished every request"
    queued = [(sc, p["rate_rps"], p["tokens_queued"]) for sc, p in probes if not p["met"] and p["tokens_queued"]]
    assert queued == [("unthrottled", pytest.approx(2.4), 38)] and "left 38 tokens queued" in page
    assert all("p99 TTFT" in p["why"] for _, p in probes if not p["met"])

    with (DATA / "capacity-judge" / "unthrottled" / "slo_capacity.csv").open(encoding="utf-8") as fh:
        (again,) = list(csv.DictReader(fh))
    assert float(again["rate_rps"]) == pytest.approx(2.4) and again["met"] == "False"
    assert again["tokens_served"] == again["tokens_offered"] and again["tokens_queued"] == "0"
    assert f"TTFT, {float(again['ttft_p99_ms']):.0f} ms" in page
    drain = float(again["drain_ms"])
    assert drain == float(again["drain_needed_ms"]) and f"{drain / 1e3:.1f} s" in page
    wl = load_workload(CONFIGS / "workload_serving.yaml")
    assert wl.serving is not None
    at = wl.model_copy(update={"serving": wl.serving.model_copy(update={"rate_rps": 2.4, "duration_ms": 10_000.0})})
    assert drain_to_judge_ms(at) == drain  # the workload service's drain for the default at 2.4 requests/s


def test_the_query_block_128_capacity_is_as_docs_sweep_says() -> None:
    """docs/sweep.md's capacity with a query block of 128 (docs/results/capacity-qb128/): each probe drained until
    every request was judged, every rate tried met in both scenarios (so the capacity is a bound), the numbers of
    the prose are the probes'."""
    page = _page()
    top: dict[str, dict[str, str]] = {}
    for sc in ("baseline", "unthrottled"):
        found = json.loads((DATA / "capacity-qb128" / sc / "slo_capacity.json").read_text(encoding="utf-8"))
        assert found["set"] == {"workload.operators.attn.query_block": 128} and found["drain_ms"] is None
        assert found["scenario"] == sc and found["duration_ms"] == 10_000.0
        assert all(p["met"] and p["drain_ms"] == p["drain_needed_ms"] for p in found["probes"])
        assert [p["rate_rps"] for p in found["probes"]] == pytest.approx([2.6, 3.0])
        assert found["rate_rps"] == pytest.approx(3.0) and "(a bound)" in found["how"]
        for p in found["probes"]:
            assert f"{p['drain_ms'] / 1e3:.1f} s at {p['rate_rps']:g}" in page
        with (DATA / "capacity-qb128" / sc / "probe-3.csv").open(encoding="utf-8") as fh:
            top[sc] = next(csv.DictReader(fh))
        best = found["probes"][-1]
        assert top[sc]["ttft_p99_ms"] and float(top[sc]["ttft_p99_ms"]) == pytest.approx(best["ttft_p99_ms"])
        assert int(float(top[sc]["tokens_served"])) == best["tokens_offered"] == 2826
    b, u = top["baseline"], top["unthrottled"]
    assert f"p99 TTFT {float(b['ttft_p99_ms']):.0f} ms (baseline) and {float(u['ttft_p99_ms']):.0f} ms" in page
    assert f"p99 TPOT {float(b['tpot_p99_ms']):.0f} ms and {float(u['tpot_p99_ms']):.0f} ms" in page
    throttled, peak = float(b["time_throttled_ms"]), float(b["T_peak_logic"])
    assert f"throttles for {throttled:.0f} ms and peaks at {peak:.1f} °C" in page
    assert float(u["time_throttled_ms"]) == 0 and f"reference peaks at {float(u['T_peak_logic']):.1f} °C" in page


def _verdicts(folder: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((DATA / "capacity-qb128" / folder / "slo_capacity.json").read_text(
        encoding="utf-8"))
    assert found["set"] == {"workload.operators.attn.query_block": 128} and found["drain_ms"] is None
    assert all(p["drain_ms"] == p["drain_needed_ms"] for p in found["probes"])  # each drained until judged
    assert all(p["tokens_served"] == p["tokens_offered"] for p in found["probes"])  # "every probe served every token"
    assert all("p99 TPOT" in p["why"] and "TTFT" not in p["why"] for p in found["probes"] if not p["met"])
    return found


def _row(path: str) -> dict[str, str]:
    """The one result row of a CSV under docs/results/capacity-qb128/."""
    with (DATA / "capacity-qb128" / path).open(encoding="utf-8") as fh:
        return next(csv.DictReader(fh))


def test_where_the_query_block_128_capacity_ends_is_as_docs_sweep_says() -> None:
    """docs/sweep.md's searches upward with a query block of 128: the table is the probes' (and the two baseline
    runs' rows), the brackets are theirs, and throttling costs no capacity the probes resolve."""
    page = _page()
    unthr, base = _verdicts("unthrottled-6.1to12"), _verdicts("baseline-6.1to12")
    assert (unthr["scenario"], base["scenario"]) == ("unthrottled", "baseline")
    at72 = _row("baseline-at-7.2/summary.csv")
    assert at72["scenario"] == "baseline" and at72["slo_met"] == "1"
    assert at72["tokens_served"] == at72["tokens_offered"] and at72["tokens_queued"] == "0"
    by_rate: dict[float, dict[str, tuple[bool, float, float, float]]] = {}
    for sc, found in (("unthrottled", unthr), ("baseline", base)):
        for p in found["probes"]:
            by_rate.setdefault(round(p["rate_rps"], 6), {})[sc] = (
                p["met"], p["ttft_p99_ms"], p["tpot_p99_ms"], p["T_peak_logic"])
    by_rate[7.2]["baseline"] = (True, float(at72["ttft_p99_ms"]), float(at72["tpot_p99_ms"]),
                                float(at72["T_peak_logic"]))

    def cells(v: tuple[bool, float, float, float] | None) -> str:
        if v is None:
            return "– | | | |"
        return f"{'met' if v[0] else 'missed'} | {v[1]:.0f} | {v[2]:.0f} | {v[3]:.1f} |"

    for rate in sorted(by_rate):
        line = f"| {rate:g} | {cells(by_rate[rate].get('unthrottled'))} {cells(by_rate[rate].get('baseline'))}"
        assert line in page, line
    met_u = max(r for r, v in by_rate.items() if v.get("unthrottled", (False,))[0])
    miss_u = min(r for r, v in by_rate.items() if "unthrottled" in v and not v["unthrottled"][0])
    met_b = max(r for r, v in by_rate.items() if v.get("baseline", (False,))[0])
    miss_b = min(r for r, v in by_rate.items() if "baseline" in v and not v["baseline"][0])
    assert f"between {met_u:g} and {miss_u:g} requests/s unthrottled, between {met_b:g} and {miss_b:g} in" in page
    assert met_b >= miss_u  # "baseline meets ... at 8.6 requests/s, where the unthrottled chip misses"
    b86, u86 = (_row(f"{sc}-6.1to12/probe-8.6.summary.csv") for sc in ("baseline", "unthrottled"))
    assert float(b86["tpot_p50_ms"]) > float(u86["tpot_p50_ms"])  # "not a faster throttled chip"
    assert (f"median TPOT is {float(b86['tpot_p50_ms']):.0f} ms against the unthrottled chip's "
            f"{float(u86['tpot_p50_ms']):.0f}") in page
    assert f"DRAM peaks at {float(u86['T_peak_dram']):.1f} °C" in page
    assert f"baseline's peaks at {float(b86['T_peak_dram']):.1f} °C" in page
    assert float(b86["T_peak_dram"]) <= 85.0 < float(u86["T_peak_dram"])  # refresh doubles above 85 °C
    peaks = [p["T_peak_logic"] for p in base["probes"]] + [float(at72["T_peak_logic"])]
    assert f"baseline peaks at {min(peaks):.1f} to {max(peaks):.1f} °C, under the 89 °C limit" in page
    assert max(peaks) <= 89.0
    drains = [p["drain_ms"] for f in (unthr, base) for p in f["probes"]]
    assert f"({min(drains) / 1e3:.1f} to {max(drains) / 1e3:.1f} s)" in page
    six = _row("baseline-at-6/summary.csv")
    assert six["slo_met"] == "1" and f"met, throttled for {float(six['time_throttled_ms']):.0f} ms" in page
    assert all(p["met"] for p in _verdicts("unthrottled-3.1to6")["probes"])


def test_the_seed_and_refresh_runs_at_8_6_are_as_docs_sweep_says() -> None:
    """docs/sweep.md: the unthrottled probe at 8.6 requests/s and its arrivals run again with routing seed 43 and
    with refresh held at 1x: the table is their rows, each on the probe's own workload (its rate, its judged drain,
    the query block of 128), every token served; holding refresh lowers the median TPOT under both seeds, and the
    verdict at 8.6 turns on the seed."""
    page = _page()
    probe = next(p for p in _verdicts("unthrottled-6.1to12")["probes"] if round(p["rate_rps"], 6) == 8.6)
    runs = {(42, "2× above 85 °C"): _row("unthrottled-6.1to12/probe-8.6.summary.csv"),
            (42, "1×"): _row("unthrottled-8.6-seeds/seed42-refresh1x.summary.csv"),
            (43, "2× above 85 °C"): _row("unthrottled-8.6-seeds/seed43.summary.csv"),
            (43, "1×"): _row("unthrottled-8.6-seeds/seed43-refresh1x.summary.csv")}
    assert not probe["met"]
    for (seed, refresh), r in runs.items():
        assert r["scenario"] == "unthrottled" and r["tokens_queued"] == "0"
        assert r["tokens_served"] == r["tokens_offered"] == str(probe["tokens_offered"])
        line = (f"| {seed} | {refresh} | {'met' if r['slo_met'] == '1' else 'missed'} | "
                f"{float(r['ttft_p99_ms']):.0f} | {float(r['tpot_p50_ms']):.1f} | {float(r['tpot_p99_ms']):.1f} | "
                f"{float(r['T_peak_dram']):.1f} |")
        assert line in page, line
    for seed in (42, 43):
        full, flat = runs[(seed, "2× above 85 °C")], runs[(seed, "1×")]
        assert float(flat["tpot_p50_ms"]) < float(full["tpot_p50_ms"])  # "a little in every request"
        assert f"{1 - float(flat['tpot_p50_ms']) / float(full['tpot_p50_ms']):.1%}" in page.replace(" %", "%")
    assert (runs[(42, "2× above 85 °C")]["slo_met"], runs[(43, "2× above 85 °C")]["slo_met"]) == ("0", "1")
    work = json.loads((DATA / "capacity-qb128" / "unthrottled-8.6-seeds" / "workload_qb128_8.6rps.json")
                      .read_text(encoding="utf-8"))
    assert (work["serving"]["rate_rps"], work["serving"]["drain_ms"], work["routing"]["seed"]) == (
        8.6, probe["drain_ms"], 42)
    assert work["operators"]["attn"]["query_block"] == 128
    assert "[95, 2.0]]" in (CONFIGS / "arch_hbm_on_logic.yaml").read_text(encoding="utf-8")  # the page's sed


def test_the_readme_says_the_capacity_more_than_triples_with_a_query_block_of_128() -> None:
    """README: with a query block of 128 "the default arrivals' SLO capacity more than triples, throttled or not":
    the lowest highest-met rate of the searches upward against the default experiment's capacities."""
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert "the default arrivals' SLO capacity more than triples, throttled or not" in readme
    default = json.loads((DATA / "default" / "capacity.json").read_text(encoding="utf-8"))["scenarios"]
    for sc in ("baseline", "unthrottled"):
        tiled = _verdicts(f"{sc}-6.1to12")["rate_rps"]
        assert tiled > 3 * default[sc]["rate_rps"], sc


def _sustained(folder: str) -> dict[str, Any]:
    """A two-minute search's verdicts (docs/results/capacity-qb128/sustained-120s/<folder>/)."""
    found = _verdicts(f"sustained-120s/{folder}")
    assert found["duration_ms"] == 120_000.0
    return found


def _sustained_row(folder: str, rate: float) -> dict[str, str]:
    return _row(f"sustained-120s/{folder}/probe-{rate:g}.summary.csv")


SUSTAINED = {"baseline": "baseline", "unthrottled": "unthrottled", "unthrottled-1.7to2": "unthrottled",
             "baseline-2.0to2.4": "baseline", "unthrottled-2.2to2.4": "unthrottled",
             "unthrottled-2.4to3.0": "unthrottled"}


def _sustained_runs() -> dict[str, dict[float, tuple[str, dict[str, Any]]]]:
    """Every probe of the two-minute searches by scenario and rate: (its folder, its verdict)."""
    runs: dict[str, dict[float, tuple[str, dict[str, Any]]]] = {}
    for folder, scenario in SUSTAINED.items():
        found = _sustained(folder)
        assert found["scenario"] == scenario
        for p in found["probes"]:
            seen = runs.setdefault(scenario, {}).setdefault(round(p["rate_rps"], 6), (folder, p))
            assert seen[1] == p, (folder, p["rate_rps"])  # a probe copied into another search is the same probe
    return runs


def _highest_met_lowest_missed(probes: dict[float, tuple[str, dict[str, Any]]]) -> tuple[float, float | None]:
    met = [r for r, (_, p) in probes.items() if p["met"]]
    missed = [r for r, (_, p) in probes.items() if not p["met"]]
    assert met and (not missed or max(met) < min(missed))  # one bracket: no rate met above a miss
    return max(met), (min(missed) if missed else None)


def test_two_minutes_of_arrivals_with_a_query_block_of_128_are_as_docs_sweep_says() -> None:
    """docs/sweep.md's searches over 120 s of arrivals: the table is the probes' (and their result rows'), the
    brackets and the throttling loss they leave are the verdicts', and the prose's numbers are the data's."""
    page = _page()
    runs = _sustained_runs()

    def cells(sc: str, rate: float) -> str:
        if rate not in runs[sc]:
            return "– |  |  |  |  |" + ("  |" if sc == "baseline" else "")
        folder, p = runs[sc][rate]
        row = _sustained_row(folder, rate)
        out = (f"{'met' if p['met'] else 'missed'} | {p['ttft_p99_ms']:.0f} | {float(row['tpot_p50_ms']):.1f} | "
               f"{p['tpot_p99_ms']:.1f} | {p['T_peak_logic']:.1f} |")
        return out + (f" {float(row['time_throttled_ms']) / 1e3:.1f} |" if sc == "baseline" else "")

    for rate in sorted(set(runs["unthrottled"]) | set(runs["baseline"])):
        line = " ".join(f"| {rate:g} | {round(120 * rate)} | {cells('unthrottled', rate)} {cells('baseline', rate)}"
                        .split())
        assert line in page, line
    assert all("p99 TPOT" in p["why"] for sc in runs.values() for _, p in sc.values() if not p["met"])
    b_met, b_missed = _highest_met_lowest_missed(runs["baseline"])
    u_met, u_missed = _highest_met_lowest_missed(runs["unthrottled"])
    assert b_missed is not None and u_missed is not None and b_missed <= u_met  # "throttling costs capacity"
    assert (f"baseline's capacity is at least {b_met:g} and below {b_missed:.1f} requests/s, the unthrottled chip's "
            f"at least {u_met:.1f} and below {u_missed:.1f}") in page
    step = 1 / 120  # one request over the arrivals
    loss_hi, u_top = (u_missed - step) - b_met, u_missed - step
    lo_req, hi_req = round((u_met - (b_missed - step)) * 120), round(loss_hi * 120)
    assert (f"between {lo_req} and {hi_req} requests over the arrivals (at most {loss_hi:.2f} requests/s, "
            f"{loss_hi / u_top:.0%} of the unthrottled chip's highest rate not yet missed, {round(u_top * 120)} "
            f"requests or {u_top:.2f} requests/s)").replace("%", " %") in page
    b20, u20 = runs["baseline"][2.0][1], runs["unthrottled"][2.0][1]
    assert not b20["met"] and u20["met"]
    assert (f"misses it at 2.0, on p99 TPOT ({b20['tpot_p99_ms']:.1f} ms against the 200 ms limit), where the "
            f"unthrottled chip meets it ({u20['tpot_p99_ms']:.1f} ms)") in page
    for rate in (2.2, 2.4):
        assert f"{rate} ({runs['unthrottled'][rate][1]['tpot_p99_ms']:.1f} ms)" in page
    b20_row, u20_row = _sustained_row("baseline-2.0to2.4", 2.0), _sustained_row("unthrottled-1.7to2", 2.0)
    assert abs(float(b20_row["tpot_p50_ms"]) - float(u20_row["tpot_p50_ms"])) < 0.5  # "the median ... is the same"
    assert f"({float(b20_row['tpot_p50_ms']):.1f} against {float(u20_row['tpot_p50_ms']):.1f} ms)" in page
    assert f"p99 TTFT is {b20['ttft_p99_ms']:.0f} ms, half the limit" in page and b20["ttft_p99_ms"] < 1100
    assert f"its p99 TPOT is {b20['tpot_p99_ms'] - u20['tpot_p99_ms']:.1f} ms higher" in page
    assert f"{b20['tpot_p99_ms'] - 200:.1f} ms over the limit" in page
    assert f"and this one is {b20['tpot_p99_ms'] - 200:.1f} ms" in page
    assert f"the p99's {b20['tpot_p99_ms'] / u20['tpot_p99_ms'] - 1:.1%}".replace("%", " %") in page
    throttled, span = float(b20_row["time_throttled_ms"]) / 1e3, float(b20_row["sim_time_ms"]) / 1e3
    assert f"throttled for {throttled:.1f} s of its {span:.0f} s" in page
    assert f"mean clock over the run is {float(b20_row['freq_avg_ghz']):.3f} GHz" in page
    e_b = float(b20_row["energy_j"]) / float(b20_row["tokens_served"])
    e_u = float(u20_row["energy_j"]) / float(u20_row["tokens_served"])
    assert e_b < e_u and f"{1 - e_b / e_u:.1%} less energy per token".replace("%", " %") in page

    for rate in (0.6, 1.2):  # "baseline's p99 TPOT is above the unthrottled chip's"
        b, u = runs["baseline"][rate][1], runs["unthrottled"][rate][1]
        assert b["tpot_p99_ms"] > u["tpot_p99_ms"] and f"{b['tpot_p99_ms']:.1f} against {u['tpot_p99_ms']:.1f}" in page
    for rate in (0.6, 1.2, 1.7):  # "and its median TPOT at 0.6 to 1.7"
        b_row, u_row = _sustained_row("baseline", rate), _sustained_row("unthrottled", rate)
        assert float(b_row["tpot_p50_ms"]) > float(u_row["tpot_p50_ms"]), rate
    b03, u03 = (float(_sustained_row(sc, 0.3)["tpot_p50_ms"]) for sc in ("baseline", "unthrottled"))
    assert b03 < u03 and f"at 0.3 its median is lower ({b03:.1f} against {u03:.1f} ms)" in page
    b17, u17 = runs["baseline"][1.7][1], runs["unthrottled"][1.7][1]
    assert abs(b17["tpot_p99_ms"] - u17["tpot_p99_ms"]) < 1 and round(200 - b17["tpot_p99_ms"]) == 7
    row = _sustained_row("baseline", 1.7)
    throttled, span = float(row["time_throttled_ms"]) / 1e3, float(row["sim_time_ms"]) / 1e3
    assert f"Throttled for {throttled:.1f} s of the {span:.0f} s" in page
    assert f"mean clock is {float(row['freq_avg_ghz']):.3f} GHz" in page
    peaks = [p["T_peak_logic"] for _, p in runs["baseline"].values()]
    assert f"baseline peaks at {min(peaks):.1f} to {max(peaks):.1f} °C, under the 89 °C limit" in page
    assert max(peaks) <= 89.0
    top_u = max(runs["unthrottled"])
    hot = _sustained_row(runs["unthrottled"][top_u][0], top_u)
    assert f"reaches {float(hot['T_peak_logic']):.1f} °C at {top_u:.1f} requests/s, and its DRAM " \
        f"{float(hot['T_peak_dram']):.1f} °C" in page
    assert max(p["ttft_p99_ms"] for sc in runs.values() for _, p in sc.values()) < 1100  # "under 1.1 s at every rate"
    burst = {sc: _verdicts(f"{sc}-6.1to12")["rate_rps"] for sc in ("baseline", "unthrottled")}  # ten seconds, met
    assert b_missed < burst["baseline"] / 3 and u_missed < burst["unthrottled"] / 3  # "less than a third"
    assert f"both capacities are below {u_missed:.1f} requests/s" in page


def test_throttling_falls_in_the_busy_spells_as_docs_sweep_says() -> None:
    """docs/sweep.md: baseline at 2.0 requests/s over two minutes runs throttled a larger share of the time, at a
    lower mean clock, the more requests are running (three groups of the table's bins), and never while idle; the
    table's time is the result row's."""
    page = _page()
    with (DATA / "capacity-qb128" / "sustained-120s" / "baseline-2.0to2.4" / "probe-2.clock_by_load.csv").open(
            encoding="utf-8") as fh:
        bins = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]
    row = _sustained_row("baseline-2.0to2.4", 2.0)
    assert sum(b["ms"] for b in bins) == pytest.approx(float(row["sim_time_ms"]))
    assert sum(b["throttled_ms"] for b in bins) == pytest.approx(float(row["time_throttled_ms"]))
    assert sum(b["throttled_ms"] for b in bins if b["running_to"] == 0) == 0  # "never while idle"
    assert all(b["running_to"] - b["running_from"] == 9 for b in bins if b["running_to"] > 0)  # "bins of ten"

    def group(lo: int, hi: float) -> tuple[float, float]:
        g = [b for b in bins if b["running_from"] >= lo and b["running_to"] <= hi]
        ms = sum(b["ms"] for b in g)
        return sum(b["throttled_ms"] for b in g) / ms, sum(b["clock_ghz"] * b["ms"] for b in g) / ms

    (s1, c1), (s2, c2), (s3, c3) = group(1, 20), group(21, 50), group(51, math.inf)
    assert s1 < s2 < s3 and c1 > c2 > c3
    words = (f"it runs throttled {s1:.0%} of the time with 1 to 20 requests running (a mean clock of {c1:.3f} GHz), "
             f"{s2:.0%} with 21 to 50 ({c2:.3f} GHz), {s3:.0%} with more than 50 ({c3:.3f} GHz), and never while idle")
    assert words.replace("%", " %") in page
    assert f"a {1 - c3 / 1.83:.1%} lower clock in the busy spells".replace("%", " %") in page
    assert "1.83" in (CONFIGS / "arch_hbm_on_logic.yaml").read_text(encoding="utf-8")  # the top step the page names


def test_the_policies_at_two_requests_per_second_are_as_docs_sweep_says() -> None:
    """docs/sweep.md: at 2.0 requests/s over two minutes, the four scenarios' rows (the same arrivals and drain), the
    verdicts the page reads from them (TACS met, TAPS missed by more than baseline), and the prose's numbers."""
    page = _page()
    folders = {"baseline": "baseline-2.0to2.4", "taps": "taps-2.0to2.4", "tacs": "tacs-at-2.0",
               "unthrottled": "unthrottled-1.7to2"}
    rows = {sc: _sustained_row(f, 2.0) for sc, f in folders.items()}
    assert {r["scenario"] for r in rows.values()} == set(rows) and {sc: r["scenario"] for sc, r in rows.items()} == {
        sc: sc for sc in rows}
    assert len({(r["tokens_offered"], r["sim_time_ms"]) for r in rows.values()}) == 1  # same arrivals and drain
    assert all(r["tokens_served"] == r["tokens_offered"] and r["tokens_queued"] == "0" for r in rows.values())
    for sc, r in rows.items():
        e = float(r["energy_j"]) / float(r["tokens_served"]) * 1e3
        line = (f"| {sc} | {'met' if r['slo_met'] == '1' else 'missed'} | {float(r['ttft_p99_ms']):.0f} | "
                f"{float(r['tpot_p50_ms']):.1f} | {float(r['tpot_p99_ms']):.1f} | {float(r['T_peak_logic']):.1f} | "
                f"{float(r['time_throttled_ms']) / 1e3:.1f} | {float(r['freq_avg_ghz']):.4f} | {e:.0f} |")
        assert line in page, line
    taps = _sustained("taps-2.0to2.4")["probes"][0]
    assert taps["met"] is False and rows["taps"]["slo_met"] == "0"  # the search's verdict is the row's slo_met
    work = json.loads((DATA / "capacity-qb128" / "sustained-120s" / "tacs-at-2.0" / "probe-2.workload.json")
                      .read_text(encoding="utf-8"))  # the TACS probe, whose search wrote no verdict: its configs
    sv = work["serving"]
    assert (sv["rate_rps"], sv["duration_ms"], sv["drain_ms"], work["routing"]["seed"]) == (
        2.0, 120_000.0, taps["drain_ms"], 42)
    assert work["operators"]["attn"]["query_block"] == 128
    for r in rows.values():  # "judged by the row's slo_met, the capacity verdict's rule"
        within = (float(r["ttft_p99_ms"]) <= sv["slo"]["ttft_p99_ms"] and float(r["tpot_p99_ms"]) <= sv["slo"][
            "tpot_p99_ms"] and r["tokens_shed"] == r["tokens_queued"] == "0")
        assert r["slo_met"] == ("1" if within else "0"), r["scenario"]
    tpot = {sc: float(r["tpot_p99_ms"]) for sc, r in rows.items()}
    assert tpot["tacs"] <= 200 < tpot["baseline"] < tpot["taps"]
    assert (f"TACS's p99 TPOT is {tpot['tacs']:.1f} ms against baseline's {tpot['baseline']:.1f}, TAPS's "
            f"{tpot['taps']:.1f}") in page
    assert f"A margin of {200 - tpot['tacs']:.1f} ms with one seed" in page
    b, t = rows["baseline"], rows["tacs"]
    assert t["migrations"] == "0" and any(t[k] != b[k] for k in ("tpot_p50_ms", "tpot_p99_ms", "energy_j"))
    assert (f"as long as baseline ({float(t['time_throttled_ms']) / 1e3:.1f} s against "
            f"{float(b['time_throttled_ms']) / 1e3:.1f})") in page
    assert abs(float(t["freq_avg_ghz"]) - float(b["freq_avg_ghz"])) < 1e-4  # "the same mean clock, to 0.1 MHz"
    assert f"at the same mean clock ({float(t['freq_avg_ghz']):.4f} GHz, to 0.1 MHz)" in page
    assert float(t["noc_load_max"]) > float(b["noc_load_max"])
    assert f"peak NoC load is {float(t['noc_load_max']):.2f} against baseline's {float(b['noc_load_max']):.2f}" in page
    assert float(t["tpot_p50_ms"]) > float(b["tpot_p50_ms"])
    assert f"median TPOT is higher ({float(t['tpot_p50_ms']):.1f} against {float(b['tpot_p50_ms']):.1f} ms)" in page
    throttled = {sc: float(r["time_throttled_ms"]) for sc, r in rows.items() if sc != "unthrottled"}
    ttft = {sc: float(r["ttft_p99_ms"]) for sc, r in rows.items()}
    assert min(throttled, key=lambda sc: throttled[sc]) == "taps" and min(ttft, key=lambda sc: ttft[sc]) == "taps"
    assert max(tpot, key=lambda sc: tpot[sc]) == "taps"
    assert (f"the three throttled scenarios ({throttled['taps'] / 1e3:.1f} s), its p99 TTFT is the lowest of the "
            f"four ({ttft['taps']:.0f} ms)") in page
    per_token = {sc: float(r["energy_j"]) / float(r["tokens_served"]) for sc, r in rows.items()}
    throttled_e = [per_token[sc] for sc in ("baseline", "taps", "tacs")]
    assert "within 0.2 % of each other" in page and max(throttled_e) / min(throttled_e) - 1 < 0.002
    assert all(x < per_token["unthrottled"] for x in throttled_e)
    saved = sorted(1 - x / per_token["unthrottled"] for x in throttled_e)
    assert f"{saved[0] * 100:.1f} to {saved[-1] * 100:.1f} % under" in page


def test_the_long_prompts_of_the_two_minute_probes_are_the_traces() -> None:
    """docs/sweep.md: the trace's prompts of 4,000 tokens and more come from its 24th request on, 11 of them by the
    240th and 12 by the 288th (the requests the two-minute probes offer)."""
    with (REPO / "services" / "workload" / "serving_traces" / "azure_llm_inference_2023_conv.csv").open(
            encoding="utf-8") as fh:
        prompts = [int(r["ContextTokens"]) for r in csv.DictReader(fh)]
    long_at = [k + 1 for k, n in enumerate(prompts) if n >= 4000]
    assert long_at[0] == 24
    counts = {n: sum(1 for k in long_at if k <= n) for n in (240, 288)}
    assert (f"from its 24th request on, the trace's prompts of 4,000 tokens and more among them, {counts[240]} of "
            f"them by the 240th and {counts[288]} by the 288th") in _page()
