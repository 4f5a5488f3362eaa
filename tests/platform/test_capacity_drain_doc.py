"""docs/sweep.md's note on the default capacity search's drain holds in the committed data: the search's probes
(docs/results/default/capacity.json) and the unthrottled 2.4 requests/s probe run again with the drain that judges
every request (docs/results/capacity-judge/unthrottled/). A re-run that changes them fails here until the page is
rewritten."""

from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import CONFIGS, REPO

DATA = REPO / "docs" / "results"


def _page() -> str:
    return " ".join((REPO / "docs" / "sweep.md").read_text(encoding="utf-8").split())


def test_the_default_searchs_verdicts_and_the_probe_run_again_are_as_the_page_says() -> None:
    from services.orchestrator.slo_capacity import drain_to_judge_ms
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


def _sweep_page() -> str:
    return " ".join((REPO / "docs" / "sweep.md").read_text(encoding="utf-8").split())


def test_the_query_block_128_capacity_is_as_docs_sweep_says() -> None:
    """docs/sweep.md's capacity with a query block of 128 (docs/results/capacity-qb128/): each probe drained until
    every request was judged, every rate tried met in both scenarios (so the capacity is a bound), the numbers of
    the prose are the probes'."""
    page = _sweep_page()
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
