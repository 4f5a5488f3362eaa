"""The token balance of a served run: every output token a request asked for is generated, still queued or shed.

Window by window, with ``tokens_queued_{-1} = 0`` (a run starts with an empty queue; the warm-up's queues are not
carried into it)::

    tokens_queued_w = tokens_queued_{w-1} + tokens_offered_w - tokens_completed_w - tokens_shed_w

which, summed over the run, is ``Σ tokens_offered = Σ tokens_completed + tokens_queued(end) + Σ tokens_shed``. The
physicalizer must keep it; the metrics reduction writes ``Σ_w |error_w|`` into the result row (``tokens_unbalanced``)
and the orchestrator's acceptance lists the windows that break it (`check_token_balance_columns` on the run's series
table). A run whose windows report no request at all (fixed arrival: every request field empty / 0) has nothing to
balance: its tokens are not offered by requests, and the check says nothing about it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from shared.contracts.metrics import WindowMetrics

# the windows' request counts; one of them nonzero anywhere, or a finished request, makes a run a served one
WINDOW_COUNTS: tuple[str, ...] = ("requests_arrived", "requests_shed", "tokens_offered", "tokens_shed",
                                  "requests_waiting", "requests_running", "tokens_queued")
REQUEST_COUNTS: tuple[str, ...] = (*WINDOW_COUNTS, "requests_done")  # requests_done: the finished requests' count
MAX_LISTED = 10  # windows named one by one; the rest are counted


def token_imbalance(offered: np.ndarray, served: np.ndarray, queued: np.ndarray, shed: np.ndarray, *,
                    queued_before: int = 0) -> np.ndarray:
    """Per window, ``tokens_queued_w`` minus what the balance expects (tokens; > 0: tokens appeared, < 0: tokens
    were lost); ``queued_before``: the queue at the start of the first of these windows."""
    q = np.asarray(queued, dtype=np.int64)
    prev = np.concatenate((np.array([queued_before], dtype=np.int64), q[:-1]))
    return q - (prev + np.asarray(offered, dtype=np.int64) - np.asarray(served, dtype=np.int64)
                - np.asarray(shed, dtype=np.int64))


def serving_columns(windows: Sequence[WindowMetrics]) -> dict[str, np.ndarray]:
    """The windows' request counts (`REQUEST_COUNTS`, ``requests_done`` as a count) and ``tokens_completed`` as
    int64 arrays, and their ``window`` numbers."""
    cols = {name: np.array([getattr(w, name) for w in windows], dtype=np.int64)
            for name in (*WINDOW_COUNTS, "tokens_completed")}
    cols["window"] = np.array([w.window for w in windows], dtype=object)  # named in messages only
    cols["requests_done"] = np.array([len(w.requests_done) for w in windows], dtype=np.int64)
    return cols


def reports_requests(cols: Mapping[str, np.ndarray]) -> bool:
    """Whether any window of the columns reports a request (a served run) rather than fixed arrivals."""
    return any(bool(np.any(np.asarray(cols[name]) != 0)) for name in REQUEST_COUNTS if name in cols)


def windows_report_requests(windows: Sequence[WindowMetrics]) -> bool:
    """`reports_requests` of windows."""
    return any(len(w.requests_done) or any(getattr(w, name) for name in WINDOW_COUNTS) for w in windows)


def check_token_balance_columns(cols: Mapping[str, np.ndarray]) -> list[str]:
    """The problems of a run's token balance (empty: it balances, or the run reports no request) from per-window
    columns: ``window``, ``tokens_offered``, ``tokens_completed``, ``tokens_queued``, ``tokens_shed`` (e.g. the
    run's series table, shared/series_table.py)."""
    if not reports_requests(cols):
        return []
    missing = [c for c in ("tokens_offered", "tokens_completed", "tokens_queued", "tokens_shed") if c not in cols]
    if missing:
        return [f"token balance: the windows report requests but no {', '.join(missing)}"]
    offered, served, queued, shed = (np.asarray(cols[c]).astype(np.int64) for c in
                                     ("tokens_offered", "tokens_completed", "tokens_queued", "tokens_shed"))
    err = token_imbalance(offered, served, queued, shed)
    bad = np.flatnonzero(err)
    if not bad.size:
        return []
    win = cols["window"] if "window" in cols else np.arange(err.size)
    prev = np.concatenate(([0], queued[:-1]))
    out = [f"windows[{i}] (window {int(win[i])}): tokens_queued {queued[i]}, but {prev[i]} queued before + "
           f"{offered[i]} offered - {served[i]} served - {shed[i]} shed = {queued[i] - err[i]} "
           f"({abs(int(err[i]))} tokens {'appeared' if err[i] > 0 else 'lost'})" for i in bad[:MAX_LISTED]]
    if bad.size > MAX_LISTED:
        out.append(f"... and {bad.size - MAX_LISTED} more windows that do not balance")
    total = int(err.sum())  # the per-window errors telescope to the run's
    if total:
        out.append(f"run: {int(offered.sum())} tokens offered != {int(served.sum())} served + {int(queued[-1])} "
                   f"queued at the end + {int(shed.sum())} shed ({abs(total)} tokens "
                   f"{'appeared' if total > 0 else 'lost'})")
    return out


def check_token_balance(windows: Sequence[WindowMetrics]) -> list[str]:
    """`check_token_balance_columns` of a run's windows (all of them, in window order)."""
    return check_token_balance_columns(serving_columns(windows)) if windows else []
