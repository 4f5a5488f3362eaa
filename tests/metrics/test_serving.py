"""The serving columns of a result row (TTFT/TPOT percentiles, token counts, goodput, slo_met, the token balance):
exact numbers from a hand-made run of known requests, folds that give the one-shot row, fixed-arrival rows whose
earlier columns keep their bytes, the balance check, and the HTTP wiring of the SLO."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.metrics.app import create_app
from services.metrics.compare import compare, compare_csv, compare_markdown
from services.metrics.reduce import fold_windows, reduce_window_metrics, rows_csv
from services.metrics.synthetic import synthetic_runs, synthetic_windows
from services.orchestrator.acceptance import check_results
from shared.contracts.events import RequestsDone
from shared.contracts.metrics import ALL_COLUMNS, EXTRA_COLUMNS, ReducePartial, ResultRow, WindowMetrics
from shared.errors import BadInput
from shared.series_table import read_series_table, series_path, write_series_table
from shared.settings import Settings
from shared.token_balance import check_token_balance, serving_columns, token_imbalance
from shared.window_series import coarsen

SERVING_COLUMNS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "requests_done", "tokens_offered",
                   "tokens_served", "tokens_queued", "tokens_shed", "goodput_tok_s", "slo_met", "tokens_unbalanced")
MS = 1_000_000  # ns

# --- a hand-made run: four 2 ms windows, six requests --------------------------------------------------------------
# request: (arrival, first token, done) ns, output tokens; r4 is refused by the full queue, r5 is still generating at
# the end (2 of its 6 tokens generated). Token times: r1 0.5 1.5 | 2.5 3.5; r2 1.2; r3 | 3.0 | 5.0 | 7.0;
# r5 | | 4.5 | 6.5; r6 | | 4.6 5.6 (ms, windows separated by |).
R1 = (0, MS // 2, 3 * MS + MS // 2, 4)  # TTFT 0.5 ms, TPOT 3 ms / 3 = 1.0 ms
R2 = (MS // 5, 6 * MS // 5, 6 * MS // 5, 1)  # TTFT 1.0 ms, no TPOT (one token)
R3 = (MS, 3 * MS, 7 * MS, 3)  # TTFT 2.0 ms, TPOT 4 ms / 2 = 2.0 ms
R6 = (41 * MS // 10, 46 * MS // 10, 56 * MS // 10, 2)  # TTFT 0.5 ms, TPOT 1.0 ms
HAND: dict[int, dict[str, Any]] = {  # per window: finished requests (id, request), counts
    0: {"done": [(2, R2)], "requests_arrived": 4, "requests_shed": 1, "tokens_offered": 4 + 1 + 3 + 5,
        "tokens_shed": 5, "tokens_completed": 3, "tokens_queued": 5, "requests_waiting": 1, "requests_running": 1},
    1: {"done": [(1, R1)], "requests_arrived": 1, "tokens_offered": 6, "tokens_completed": 3, "tokens_queued": 8,
        "requests_waiting": 1, "requests_running": 1},
    2: {"done": [(6, R6)], "requests_arrived": 1, "tokens_offered": 2, "tokens_completed": 4, "tokens_queued": 6,
        "requests_running": 2},
    3: {"done": [(3, R3)], "tokens_completed": 2, "tokens_queued": 4, "requests_running": 1},
}


def _done(reqs: Sequence[tuple[int, tuple[int, int, int, int]]]) -> RequestsDone:
    return RequestsDone(request_id=[i for i, _ in reqs], t_arrival_ns=[r[0] for _, r in reqs],
                        t_first_token_ns=[r[1] for _, r in reqs], t_done_ns=[r[2] for _, r in reqs],
                        output_tokens=[r[3] for _, r in reqs])


# the same run without r4 and r5 (none shed, none left at the end): the same finished requests, the queue drained
DRAINED: dict[int, dict[str, Any]] = {
    0: {**HAND[0], "requests_arrived": 3, "requests_shed": 0, "tokens_offered": 4 + 1 + 3, "tokens_shed": 0},
    1: {**HAND[1], "requests_arrived": 0, "tokens_offered": 0, "tokens_queued": 2, "requests_waiting": 0},
    2: {**HAND[2], "tokens_completed": 3, "tokens_queued": 1},
    3: {**HAND[3], "tokens_completed": 1, "tokens_queued": 0, "requests_running": 0},
}


def hand_made_run(hand: dict[int, dict[str, Any]] = HAND) -> list[WindowMetrics]:
    out = []
    for w in synthetic_windows(4, "baseline", seed=1, dt_ms=2.0):
        spec = dict(hand[w.window])
        done = _done(spec.pop("done"))
        out.append(w.model_copy(update={**spec, "requests_done": done,
                                        "latencies_ms": [1.0] * int(spec["tokens_completed"])}))
    return out


def _reduce(ws: list[WindowMetrics], **kw: Any) -> ResultRow:
    return reduce_window_metrics(ws, scenario="tas", workload="w", thot_c=80.0, **kw)


def test_serving_columns_follow_the_csv_columns_in_order() -> None:
    throttling = ("time_throttled_ms", "time_emergency_ms")  # appended after them
    assert EXTRA_COLUMNS[-len(throttling):] == throttling
    before = EXTRA_COLUMNS[:-len(throttling)]
    assert before[-len(SERVING_COLUMNS):] == SERVING_COLUMNS
    assert before[:-len(SERVING_COLUMNS)][-1] == "lat_censored"


def test_a_hand_made_run_without_slo() -> None:
    row = _reduce(hand_made_run())
    assert row.requests_done == 4
    assert row.ttft_p50_ms == 0.75  # TTFT 0.5 0.5 1.0 2.0
    assert row.ttft_p99_ms == pytest.approx(1.0 + 0.97 * 1.0, rel=1e-12)
    assert row.tpot_p50_ms == 1.0  # TPOT 1.0 1.0 2.0 (r2 has one token)
    assert row.tpot_p99_ms == pytest.approx(1.0 + 0.98 * 1.0, rel=1e-12)
    assert (row.tokens_offered, row.tokens_served, row.tokens_queued, row.tokens_shed) == (21, 12, 4, 5)
    assert row.tokens_offered == row.tokens_served + row.tokens_queued + row.tokens_shed
    assert row.tokens_unbalanced == 0 and row.tokens == row.tokens_served
    assert row.goodput_tok_s is None and row.slo_met is None  # no SLO given


@pytest.mark.parametrize(("ttft", "tpot", "goodput", "met"), [
    (1.5, 1.5, (4 + 1 + 2) / 8e-3, 0),  # r3 misses TTFT; the run's p99 TTFT 1.97 ms is over the limit
    (2.0, 2.0, (4 + 1 + 3 + 2) / 8e-3, 1),  # every request within both limits, p99s 1.97 and 1.98 ms
    (1.0, 1.0, (4 + 1 + 2) / 8e-3, 0),  # a limit is inclusive: r1, r2 and r6 sit on it
    (2.0, 1.5, (4 + 1 + 2) / 8e-3, 0),  # r3 misses TPOT only
    (1.99, 1.99, (4 + 1 + 2) / 8e-3, 1),  # the p99s are within, r3 is not: slo_met is on percentiles
])
def test_goodput_and_slo_met(ttft: float, tpot: float, goodput: float, met: int) -> None:
    drained = _reduce(hand_made_run(DRAINED), slo_ttft_p99_ms=ttft, slo_tpot_p99_ms=tpot)
    assert (drained.tokens_shed, drained.tokens_queued, drained.tokens_unbalanced) == (0, 0, 0)
    assert drained.goodput_tok_s == goodput
    assert drained.slo_met == met
    row = _reduce(hand_made_run(), slo_ttft_p99_ms=ttft, slo_tpot_p99_ms=tpot)
    assert (row.ttft_p99_ms, row.tpot_p99_ms, row.goodput_tok_s) == (
        drained.ttft_p99_ms, drained.tpot_p99_ms, drained.goodput_tok_s)  # the same finished requests
    assert row.slo_met == 0  # r4 shed and r5 unfinished: a run that left requests unanswered misses its SLO


@pytest.mark.parametrize(("change", "met"), [({}, 1), ({"tokens_shed": 1}, 0), ({"tokens_queued": 1}, 0),
                                             ({"ttft_p99_ms": None}, 0), ({"tpot_p99_ms": None}, 1)])
def test_the_summary_and_the_capacity_search_judge_a_run_alike(change: dict[str, Any], met: int) -> None:
    """One rule for "SLO met" (shared/slo.py): the result row's ``slo_met`` and `tasmoe capacity`'s verdict."""
    from services.orchestrator.slo_capacity import judge

    row = _reduce(hand_made_run(DRAINED), slo_ttft_p99_ms=2.0, slo_tpot_p99_ms=2.0).model_dump()
    row.update(change)
    csv_row = {k: "" if v is None else str(v) for k, v in row.items()}
    verdict = judge(1.0, csv_row, 2.0, 2.0)
    assert int(verdict.met) == met, verdict.why
    if not change:
        assert row["slo_met"] == 1


def test_no_request_finished_in_a_served_run() -> None:
    ws = hand_made_run()
    ws = [w.model_copy(update={"requests_done": RequestsDone.empty()}) for w in ws]
    row = _reduce(ws, slo_ttft_p99_ms=1.0, slo_tpot_p99_ms=1.0)
    assert row.requests_done == 0 and row.ttft_p99_ms is None and row.tpot_p99_ms is None
    assert row.goodput_tok_s == 0.0 and row.slo_met == 0  # nothing finished: nothing met the SLO
    idle = {"done": [], "tokens_completed": 0, "tokens_queued": 0}
    only_r2 = {0: {"done": [(2, R2)], "requests_arrived": 1, "tokens_offered": 1, "tokens_completed": 1,
                   "tokens_queued": 0}, 1: idle, 2: idle, 3: idle}
    row = _reduce(hand_made_run(only_r2), slo_ttft_p99_ms=1.0, slo_tpot_p99_ms=0.1)
    assert row.tokens_unbalanced == 0 and row.tokens_queued == 0
    assert row.tpot_p99_ms is None and row.slo_met == 1  # only r2, of one token: no TPOT to exceed


# --- fixed arrival -------------------------------------------------------------------------------------------------

# rows_csv of the metrics tests' fixture runs (synthetic_runs(6, seed=7), thot_c 80, bw_raw_gbps 5000) before the
# serving columns existed
OLD_ROWS_CSV = """\
scenario,workload,T_peak_logic,T_peak_dram,T_avg,ips,lat_ms,bw_util,refresh_mhz,noc_load,lat_p50_ms,lat_p99_ms,\
energy_j,power_avg_w,migrations,time_above_thot_ms,thot_c,T_var_logic,T_mean_logic,T_mean_dram,freq_avg_ghz,\
queue_delay_ms,noc_load_max,bw_util_raw,tokens,windows,sim_time_ms,lat_censored
baseline,mixtral_8x7b,83.5225297,75.6166962,48.9537127,28250,9.67320328,0.435812746,116.974578,0.22252434,\
8.65470825,22.5434176,0.515189917,42.9324931,0,4,80,33.1010567,53.4240886,48.3949157,2,0.620375427,0.39963861,\
0.345669503,339,6,12,0
taps,mixtral_8x7b,77.016772,71.1555299,51.3557934,29583.3333,9.9738769,0.430221235,128.662834,0.225195566,\
9.07048801,25.3180304,0.516959454,43.0799545,0,0,80,31.8648223,56.3416065,50.7325668,2,0.526054459,0.398856893,\
0.341234536,355,6,12,0
tacs,mixtral_8x7b,78.2052179,71.3573498,50.7675132,27083.3333,10.3345031,0.449455354,125.797347,0.250731321,\
9.54985928,27.1763909,0.522136007,43.5113339,4,0,80,32.7413243,55.6318638,50.1594694,2,0.454571177,0.449483974,\
0.356490282,325,6,12,0
tas,mixtral_8x7b,73.9985496,68.62649,52.5087131,27583.3333,10.1380969,0.52468394,134.271964,0.245332559,\
9.25155556,24.6418389,0.534154588,44.5128823,7,0,80,22.2889309,57.743275,51.8543929,2,0.552854481,0.448843312,\
0.416158633,331,6,12,0
"""
FIXED_ARRIVAL_TAIL = ",,,,,0,0,0,0,0,,,0"  # percentiles empty, counts 0, goodput and slo_met empty, balanced


@pytest.mark.parametrize("slo", [{}, {"slo_ttft_p99_ms": 100.0, "slo_tpot_p99_ms": 10.0}])
def test_fixed_arrival_rows_keep_their_bytes(runs: dict[str, list[WindowMetrics]], slo: dict[str, Any]) -> None:
    rows = [reduce_window_metrics(ws, scenario=s, workload="mixtral_8x7b", thot_c=80.0, bw_raw_gbps=5000.0, **slo)
            for s, ws in runs.items()]
    new, old = rows_csv(rows).splitlines(), OLD_ROWS_CSV.splitlines()
    # the serving columns, then the throttling ones (0: the synthetic windows report no throttling)
    assert new[0] == old[0] + "," + ",".join(SERVING_COLUMNS) + ",time_throttled_ms,time_emergency_ms"
    assert new[1:] == [line + FIXED_ARRIVAL_TAIL + ",0,0" for line in old[1:]]
    assert check_token_balance(runs["tas"]) == []


def test_fixed_arrival_comparison_markdown_has_no_serving_line(runs: dict[str, list[WindowMetrics]]) -> None:
    rows = [reduce_window_metrics(ws, scenario=s, workload="m", thot_c=80.0) for s, ws in runs.items()]
    md = compare_markdown([compare(rows)])
    assert "ttft" not in md and "goodput" not in md
    line = compare_csv([compare(rows)]).splitlines()[1]
    assert line.endswith(",,," + ",".join(["0"] * 13) + ",,,")  # values and deltas of the three empty


# --- folding -------------------------------------------------------------------------------------------------------

def served_run(n_windows: int, seed: int, *, capacity: int = 5, budget: int = 9) -> list[WindowMetrics]:
    """A served run drawn from a toy queue (tests only): requests of 1-8 output tokens arrive in a window's first
    half, a queue of ``capacity`` requests refuses the rest, and ``budget`` tokens a window are generated in its
    second half, one per admitted request in turn."""
    rng = np.random.default_rng(seed)
    dt_ns = 2 * MS
    queue: list[dict[str, Any]] = []
    out, nid = [], 0
    for w in synthetic_windows(n_windows, "tas", seed=seed, dt_ms=2.0):
        t0 = w.window * dt_ns
        c = {"requests_arrived": 0, "requests_shed": 0, "tokens_offered": 0, "tokens_shed": 0}
        for _ in range(int(rng.integers(0, 5))):
            tok = int(rng.integers(1, 9))
            c["requests_arrived"] += 1
            c["tokens_offered"] += tok
            if len(queue) >= capacity:
                c["requests_shed"] += 1
                c["tokens_shed"] += tok
            else:
                queue.append({"id": nid, "arrival": t0 + int(rng.integers(0, dt_ns // 2)), "tokens": tok,
                              "left": tok, "first": None})
            nid += 1
        done, made = [], 0
        for i in range(budget):
            live = [r for r in queue if r["left"]]
            if not live:
                break
            r = live[i % len(live)]
            t = t0 + dt_ns // 2 + i * (dt_ns // 2 // budget)
            r["first"] = t if r["first"] is None else r["first"]
            r["left"] -= 1
            made += 1
            if not r["left"]:
                done.append((r["id"], (r["arrival"], r["first"], t, r["tokens"])))
        queue = [r for r in queue if r["left"]]
        out.append(w.model_copy(update={
            **c, "requests_done": _done(done), "tokens_completed": made, "latencies_ms": [1.0] * made,
            "tokens_queued": sum(r["left"] for r in queue),
            "requests_waiting": sum(r["first"] is None for r in queue),
            "requests_running": sum(r["first"] is not None for r in queue)}))
    return out


SERVED = served_run(16, seed=5)
SLO = {"slo_ttft_p99_ms": 1.2, "slo_tpot_p99_ms": 0.15}


def test_the_toy_served_run_is_a_served_run() -> None:
    row = _reduce(SERVED, **SLO)
    assert check_token_balance(SERVED) == [] and row.tokens_unbalanced == 0
    assert row.requests_done > 10 and row.tokens_shed > 0 and max(w.tokens_queued for w in SERVED) > 0
    assert row.goodput_tok_s is not None and 0 < row.goodput_tok_s < row.ips


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.sets(st.integers(min_value=1, max_value=len(SERVED) - 1), max_size=len(SERVED) - 1),
       first_fixed=st.integers(min_value=0, max_value=3))
def test_any_chunking_gives_the_one_shot_row(cuts: set[int], first_fixed: int) -> None:
    """Folds at any cut points give the one-shot row: the serving columns exactly; the run may open with windows
    that report no request (their tokens, generated but not offered, are unbalanced whatever the chunking)."""
    ws = [w.model_copy(update={"requests_arrived": 0, "requests_shed": 0, "tokens_offered": 0, "tokens_shed": 0,
                               "tokens_queued": 0, "requests_waiting": 0, "requests_running": 0,
                               "requests_done": RequestsDone.empty()}) if w.window < first_fixed else w
          for w in served_run(len(SERVED), seed=5)]
    whole = _reduce(ws, **SLO)
    bounds = [0, *sorted(cuts), len(ws)]
    parts = [ws[a:b] for a, b in itertools.pairwise(bounds)]
    partial: ReducePartial | None = None
    for part in parts[:-1]:
        partial = fold_windows(part, thot_c=80.0, partial=ReducePartial.model_validate_json(
            partial.model_dump_json()) if partial else None)  # through JSON, as /v1/reduce/fold passes it on
    row = _reduce(parts[-1], partial=partial, **SLO)
    for name in SERVING_COLUMNS:
        assert getattr(row, name) == getattr(whole, name), name
    for name, value in whole.model_dump().items():
        assert getattr(row, name) == pytest.approx(value, rel=1e-12, abs=1e-12), name
    cols = serving_columns(ws)
    err = token_imbalance(cols["tokens_offered"], cols["tokens_completed"], cols["tokens_queued"], cols["tokens_shed"])
    assert whole.tokens_unbalanced == int(np.abs(err).sum())
    assert (whole.tokens_unbalanced > 0) == (sum(w.tokens_completed for w in ws[:first_fixed]) > 0)


def test_merged_windows_keep_the_serving_columns() -> None:
    dumps = [w.model_dump(mode="json") for w in SERVED]
    merged = [WindowMetrics.model_validate(m) for m in coarsen([dumps], n_windows=len(dumps), max_windows=5)]
    a, b = _reduce(merged, **SLO), _reduce(SERVED, **SLO)
    for name in SERVING_COLUMNS:
        assert getattr(a, name) == getattr(b, name), name


# --- the token balance ---------------------------------------------------------------------------------------------

def test_the_balance_check_catches_a_missing_token() -> None:
    ws = hand_made_run()
    assert check_token_balance(ws) == []
    lost = [w.model_copy(deep=True) for w in ws]
    lost[1].tokens_queued -= 1  # window 1 loses a token that window 2 finds again
    problems = check_token_balance(lost)
    assert problems == [
        "windows[1] (window 1): tokens_queued 7, but 5 queued before + 6 offered - 3 served - 0 shed = 8 "
        "(1 tokens lost)",
        "windows[2] (window 2): tokens_queued 6, but 7 queued before + 2 offered - 4 served - 0 shed = 5 "
        "(1 tokens appeared)"]
    assert _reduce(lost).tokens_unbalanced == 2
    never = [w.model_copy(deep=True) for w in ws]
    never[2].tokens_offered -= 1  # a request asked for a token no count has
    problems = check_token_balance(never)
    assert len(problems) == 2 and problems[0].startswith("windows[2] (window 2)")
    assert problems[1] == "run: 20 tokens offered != 12 served + 4 queued at the end + 5 shed (1 tokens appeared)"
    assert _reduce(never).tokens_unbalanced == 1


def test_acceptance_names_the_windows_that_do_not_balance(tmp_path: Path) -> None:
    ws = hand_made_run()
    ws[1].tokens_queued -= 1
    for sc in ("baseline", "taps", "tacs", "tas"):
        row = reduce_window_metrics(ws if sc == "tacs" else hand_made_run(), scenario=sc, workload="w",
                                    thot_c=80.0)
        (tmp_path / sc).mkdir()
        (tmp_path / sc / "w.csv").write_text(rows_csv([row]))
    assert check_results(tmp_path, workload="w", ambient_c=20.0) == [
        "tacs: tokens_unbalanced = 2: offered tokens != served + queued + shed"]
    write_series_table(series_path(tmp_path, "tacs", "w"), [[w.model_dump(mode="json") for w in ws]])
    problems = check_results(tmp_path, workload="w", ambient_c=20.0)
    assert len(problems) == 3 and problems[1].startswith("tacs: w.series.csv.gz: windows[1] (window 1)")


# --- per-window series and comparison ------------------------------------------------------------------------------

def test_series_table_has_the_requests(tmp_path: Path) -> None:
    p = tmp_path / "x.series.csv.gz"
    write_series_table(p, [[w.model_dump(mode="json") for w in hand_made_run()]])
    t = read_series_table(p)
    assert t["requests_done"].tolist() == [1, 1, 1, 1]
    assert t["ttft_p99_ms"].tolist() == [1.0, 0.5, 0.5, 2.0]
    assert np.isnan(t["tpot_p99_ms"][0]) and t["tpot_p99_ms"][1:].tolist() == [1.0, 1.0, 2.0]
    assert t["tokens_offered"].tolist() == [13, 6, 2, 0] and t["tokens_queued"].tolist() == [5, 8, 6, 4]
    assert t["requests_running"].tolist() == [1, 1, 2, 1] and t["requests_shed"].tolist() == [1, 0, 0, 0]
    fixed = tmp_path / "f.series.csv.gz"
    write_series_table(fixed, [[w.model_dump(mode="json") for w in synthetic_runs(2, seed=1)["tas"]]])
    t = read_series_table(fixed)
    assert t["tokens_offered"].tolist() == [0, 0] and np.isnan(t["ttft_p99_ms"]).all()


def test_comparison_of_served_runs() -> None:
    base = _reduce(hand_made_run(), slo_ttft_p99_ms=1.5, slo_tpot_p99_ms=1.5).model_copy(
        update={"scenario": "baseline"})
    tas = base.model_copy(update={"scenario": "tas", "ttft_p99_ms": 2 * base.ttft_p99_ms,  # type: ignore[operator]
                                  "goodput_tok_s": None})
    t = compare([base, tas])
    assert t.deltas["tas"]["ttft_p99_ms"] == pytest.approx(100.0)
    assert t.deltas["tas"]["tpot_p99_ms"] == 0.0
    assert t.values["tas"]["goodput_tok_s"] is None and t.deltas["tas"]["goodput_tok_s"] is None
    md = compare_markdown([t])
    assert "| ttft_p99_ms | ms | 1.97 | 3.94 (+100.0 %) |" in md
    assert "| goodput_tok_s | tokens/s | 875.0 | n/a |" in md


# --- bad input and HTTP --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("window", "update", "field"), [
    (2, {"t_first_token_ns": [R6[0] - 1]}, "windows[2].requests_done.t_first_token_ns[0]"),
    (2, {"t_done_ns": [R6[1] - 1]}, "windows[2].requests_done.t_done_ns[0]"),
    (1, {"t_done_ns": [5 * MS]}, "windows[1].requests_done.t_done_ns[0]"),  # window 1 is 2-4 ms
])
def test_impossible_requests_name_the_field(window: int, update: dict[str, list[int]], field: str) -> None:
    ws = hand_made_run()
    ws[window] = ws[window].model_copy(update={"requests_done": ws[window].requests_done.model_copy(update=update)})
    with pytest.raises(BadInput) as ei:
        _reduce(ws)
    assert ei.value.field == field and field in ei.value.message


def test_a_request_twice_in_a_window_is_refused() -> None:
    ws = hand_made_run()
    ws[2] = ws[2].model_copy(update={"requests_done": _done([(6, R6), (6, R6)])})
    with pytest.raises(BadInput) as ei:
        _reduce(ws)
    assert ei.value.field == "windows[2].requests_done.request_id[1]"


def test_http_reduce_with_the_slo(settings: Settings) -> None:
    ws = [w.model_dump(mode="json") for w in hand_made_run()]
    body: dict[str, Any] = {"scenario": "tas", "workload": "w", "thot_c": 80.0, "windows": ws,
                            "slo_ttft_p99_ms": 2.0, "slo_tpot_p99_ms": 2.0}
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/reduce", json=body)
        assert r.status_code == 200, r.text
        row = r.json()["row"]
        assert (row["goodput_tok_s"], row["slo_met"], row["tokens_offered"], row["tokens_unbalanced"]) == (
            1250.0, 0, 21, 0)  # the p99s are within, but r4 was shed and r5 is unfinished
        header, line = r.json()["csv"].splitlines()
        assert header.split(",") == list(ALL_COLUMNS)
        assert line.endswith(",4,21,12,4,5,1250,0,0,0,0")  # then the throttling columns: 0
        part = client.post("/v1/reduce/fold", json={"thot_c": 80.0, "windows": ws[:3]})
        assert part.status_code == 200, part.text
        r2 = client.post("/v1/reduce", json={**body, "windows": ws[3:], "partial": part.json()})
        assert r2.status_code == 200
        assert {c: r2.json()["row"][c] for c in SERVING_COLUMNS} == {c: row[c] for c in SERVING_COLUMNS}
        no_slo = client.post("/v1/reduce", json={k: v for k, v in body.items() if not k.startswith("slo_")})
        assert no_slo.json()["row"]["goodput_tok_s"] is None and no_slo.json()["row"]["slo_met"] is None
        for field, value in (("slo_tpot_p99_ms", None), ("slo_ttft_p99_ms", None), ("slo_ttft_p99_ms", -1.0)):
            r = client.post("/v1/reduce", json={**body, field: value})
            assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
        ws[0]["requests_done"]["output_tokens"][0] = 0
        r = client.post("/v1/reduce", json=body)
        assert r.status_code == 422 and r.json()["error"]["field"].startswith("windows[0].requests_done"), r.text
