"""The whole-window-against-compute measurement (issue 21's goal, a row of ``make bench``) times what it says."""

from __future__ import annotations

import importlib

import pytest

from services.orchestrator import window_overhead as wo
from shared.content import ContentStore
from tests.conftest import CONFIGS


def test_it_times_each_compute_call_of_every_window_and_the_window_holds_them() -> None:
    o = wo.measure(4, "tas", traces=True, workload=CONFIGS / "workload_quick.yaml")
    # windows 1-3 (from the first commit to the last): one call of each compute function per window; the capacity
    # estimate before the run and the reduce after it fall outside
    assert o.windows == 3
    assert o.calls == {name: 3 for name, _, _ in wo.COMPUTE}
    assert all(t > 0 for t in o.compute_s.values())
    # the windows hold their calls: the overhead is what is left, never negative
    assert o.whole_s >= o.compute_total_s + o.state_put_s
    assert o.ratio >= 1.0
    assert o.state_put_s > 0  # tacs, physicalize and thermal keep their new states by name
    assert "overhead" in wo.describe(o)


def test_the_functions_are_restored() -> None:
    names = [(m, a) for _, m, a in wo.COMPUTE] + [wo.COMMIT]
    before = {(m, a): getattr(importlib.import_module(m), a) for m, a in names}
    put = ContentStore.put
    with wo.timed_compute(wo.Timeline()):
        assert all(getattr(importlib.import_module(m), a) is not fn for (m, a), fn in before.items())
        assert ContentStore.put is not put
    assert all(getattr(importlib.import_module(m), a) is fn for (m, a), fn in before.items())
    assert ContentStore.put is put
    with pytest.raises(RuntimeError, match="inside"), wo.timed_compute(wo.Timeline()):
        raise RuntimeError("inside")
    assert all(getattr(importlib.import_module(m), a) is fn for (m, a), fn in before.items())
    assert ContentStore.put is put


def test_the_span_runs_from_the_first_commit_to_the_last() -> None:
    t = wo.Timeline(calls=[("thermal", 0.5, 9.0), ("thermal", 1.5, 0.25), ("physicalize", 2.0, 0.5),
                           ("thermal", 3.5, 9.0)], commits=[1.0, 2.0, 3.0],
                    puts=[(0.6, 1.0), (2.25, 0.125), (3.6, 1.0)])  # the first and last outside the span
    o = t.overhead()
    assert (o.windows, o.whole_s) == (2, 2.0)
    assert o.compute_s == {"thermal": 0.25, "physicalize": 0.375} and o.calls == {"thermal": 1, "physicalize": 1}
    assert o.state_put_s == 0.125
    assert o.ratio == 2.0 / 0.625
    assert wo.Timeline(commits=[1.0]).overhead().windows == 0
    # a call read ahead (the logical windows, in batches) counts for the window it read, whenever it ran: its last
    # read before the last commit (a read of window 5 at 0.25, before the run, and one after the run fall outside)
    t = wo.Timeline(calls=[("thermal", 1.5, 0.25)], commits=[1.0, 2.0, 3.0], committed=[4, 5, 6],
                    by_window=[("workload", 5, 0.25, 8.0), ("workload", 6, 3.5, 8.0)]
                    + [("workload", k, 0.5, 0.0625 * k) for k in range(3, 9)])
    o = t.overhead()
    assert o.compute_s == {"thermal": 0.25, "workload": 0.0625 * 11} and o.calls == {"thermal": 1, "workload": 2}


def test_a_baseline_run_calls_no_tacs() -> None:
    o = wo.measure(3, "baseline", traces=False, workload=CONFIGS / "workload_quick.yaml")
    assert "tacs" not in o.calls
    assert o.calls["physicalize"] == o.calls["thermal"] == 2
