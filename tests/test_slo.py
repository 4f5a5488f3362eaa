"""shared/slo.py: the drain after which the SLO judges every offered request (the rule itself, `slo_misses`, is
tested with the metrics reduction, tests/metrics/test_serving.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.slo import drain_to_judge_ms


def test_the_drain_is_the_last_deadline_after_the_arrivals() -> None:
    # deadlines: 0 + 2000 + 99 x 200 = 21.8 s (an early long answer) and 9 + 2 + 0.2 = 11.2 s (a late short one)
    assert drain_to_judge_ms([0, 9_000_000_000], [100, 2], 10_000_000_000, slo_ttft_ms=2000.0,
                             slo_tpot_ms=200.0) == 11_800.0
    # a one-token answer has no decode: its deadline is its TTFT limit; none past the arrivals: no drain
    assert drain_to_judge_ms([1_000_000_000], [1], 10_000_000_000, slo_ttft_ms=2000.0, slo_tpot_ms=200.0) == 0.0
    assert drain_to_judge_ms([], [], 10_000_000_000, slo_ttft_ms=2000.0, slo_tpot_ms=200.0) == 0.0
    assert drain_to_judge_ms([0], [2], 1_000_000, slo_ttft_ms=0.5, slo_tpot_ms=0.2) == 0.0  # 0.7 ms < 1 ms
    assert drain_to_judge_ms([999_999], [2], 1_000_000, slo_ttft_ms=0.5, slo_tpot_ms=0.2) == 1.0  # 0.7 up to 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(1, 4000), st.floats(0.0, 1.0),
                          st.floats(0.0, 1.0)), min_size=1, max_size=40),
       st.floats(1.0, 5000.0), st.floats(1.0, 500.0))
def test_a_request_within_both_limits_finishes_before_a_run_with_that_drain_ends(
        reqs: list[tuple[float, int, float, float]], ttft_lim: float, tpot_lim: float) -> None:
    """Whatever its arrival and output, a request with TTFT and TPOT within their limits has its last token before
    the end of a run drained that long: one still unfinished there has missed a limit."""
    duration_ns = 10_000_000_000
    a = np.array([int(f * duration_ns) for f, *_ in reqs], dtype=np.int64)
    o = np.array([n for _, n, *_ in reqs], dtype=np.int64)
    drain = drain_to_judge_ms(a, o, duration_ns, slo_ttft_ms=ttft_lim, slo_tpot_ms=tpot_lim)
    ttft = np.array([x for *_, x, _ in reqs]) * ttft_lim
    tpot = np.array([x for *_, x in reqs]) * tpot_lim
    finish_ms = a / 1e6 + ttft + (o - 1) * tpot
    assert np.all(finish_ms <= duration_ns / 1e6 + drain + 1e-6)
