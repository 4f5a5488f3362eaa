"""The throttling columns: ``time_throttled_ms`` and ``time_emergency_ms`` sum the lengths of the windows in which a
core ran below its top DVFS step, and in emergency clock modulation; the fold gives the one-shot row."""

from __future__ import annotations

from services.metrics.reduce import finish, fold_windows, reduce_window_metrics
from shared.contracts.metrics import EXTRA_COLUMNS, WindowMetrics

THOT = 80.0


def _throttled(windows: list[WindowMetrics]) -> list[WindowMetrics]:
    """Unequal windows, some throttled, some of them in emergency throttle."""
    out, t = [], 0.0
    for i, w in enumerate(windows):
        dt = 1.0 + 0.5 * i
        out.append(w.model_copy(update={"dt_ms": dt, "t_start_ms": t, "cores_throttled": [0, 3, 64, 0, 1, 5][i % 6],
                                        "cores_emergency": [0, 0, 2, 0, 0, 5][i % 6]}))
        t += dt
    return out


def test_throttled_and_emergency_time_are_sums_of_window_lengths(windows: list[WindowMetrics]) -> None:
    ws = _throttled(windows)
    row = reduce_window_metrics(ws, scenario="tas", workload="w", thot_c=THOT)
    assert row.time_throttled_ms == sum(w.dt_ms for w in ws if w.cores_throttled > 0)
    assert row.time_emergency_ms == sum(w.dt_ms for w in ws if w.cores_emergency > 0)
    assert 0 < row.time_emergency_ms < row.time_throttled_ms < row.sim_time_ms
    assert EXTRA_COLUMNS[-2:] == ("time_throttled_ms", "time_emergency_ms")
    # windows that report no throttling (a run from before the snapshot counted it): both 0
    plain = reduce_window_metrics(windows, scenario="tas", workload="w", thot_c=THOT)
    assert plain.time_throttled_ms == plain.time_emergency_ms == 0.0


def test_the_fold_gives_the_one_shot_row(windows: list[WindowMetrics]) -> None:
    ws = _throttled(windows)
    one = reduce_window_metrics(ws, scenario="tas", workload="w", thot_c=THOT)
    p = None
    for k in range(0, len(ws), 2):
        p = fold_windows(ws[k:k + 2], thot_c=THOT, partial=p)
    assert p is not None
    folded = finish(p, scenario="tas", workload="w", thot_c=THOT)
    assert (folded.time_throttled_ms, folded.time_emergency_ms) == (one.time_throttled_ms, one.time_emergency_ms)
