"""The whole-window-against-compute measurement (issue 21's goal, a row of ``make bench``) times what it says."""

from __future__ import annotations

import importlib

from services.orchestrator import window_overhead as wo
from tests.conftest import CONFIGS


def test_it_times_each_compute_call_of_every_window_and_the_window_holds_them() -> None:
    o = wo.measure(4, "tas", traces=True, workload=CONFIGS / "workload_quick.yaml")
    # windows 1-3 (from the first commit to the last): one call of each compute function per window; the capacity
    # estimate before the run and the reduce after it fall outside
    assert o.windows == 3
    assert o.calls == {name: 3 for name, _, _ in wo.COMPUTE}
    assert all(t > 0 for t in o.compute_s.values())
    # the windows hold their calls: the overhead is what is left, never negative
    assert o.whole_s >= o.compute_total_s
    assert o.ratio >= 1.0
    assert "overhead" in wo.describe(o)


def test_the_functions_are_restored() -> None:
    names = [(m, a) for _, m, a in wo.COMPUTE] + [wo.COMMIT]
    before = {(m, a): getattr(importlib.import_module(m), a) for m, a in names}
    with wo.timed_compute(wo.Timeline()):
        assert all(getattr(importlib.import_module(m), a) is not fn for (m, a), fn in before.items())
    assert all(getattr(importlib.import_module(m), a) is fn for (m, a), fn in before.items())


def test_the_span_runs_from_the_first_commit_to_the_last() -> None:
    t = wo.Timeline(calls=[("thermal", 0.5, 9.0), ("thermal", 1.5, 0.25), ("physicalize", 2.0, 0.5),
                           ("thermal", 3.5, 9.0)], commits=[1.0, 2.0, 3.0])
    o = t.overhead()
    assert (o.windows, o.whole_s) == (2, 2.0)
    assert o.compute_s == {"thermal": 0.25, "physicalize": 0.5} and o.calls == {"thermal": 1, "physicalize": 1}
    assert o.ratio == 2.0 / 0.75
    assert wo.Timeline(commits=[1.0]).overhead().windows == 0


def test_a_baseline_run_calls_no_tacs() -> None:
    o = wo.measure(3, "baseline", traces=False, workload=CONFIGS / "workload_quick.yaml")
    assert "tacs" not in o.calls
    assert o.calls["physicalize"] == o.calls["thermal"] == 2
