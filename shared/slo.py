"""When a served run meets its SLO: the one rule, read by the metrics reduction (the result row's ``slo_met``) and
by the SLO capacity search (`tasmoe capacity`'s verdict on each probe).

A run meets the SLO ``(slo_ttft_ms, slo_tpot_ms)`` when

- no request was shed (the queue never overflowed),
- every offered request finished within the run (no output token still queued at its end: a request left
  unfinished has a latency the run never measured, and a run that cannot drain its queue is overloaded),
- p99 TTFT over the finished requests is at most ``slo_ttft_ms`` (no finished request: no TTFT, not met),
- p99 TPOT over the finished requests of at least 2 output tokens is at most ``slo_tpot_ms`` (none such: no TPOT to
  exceed).

This is MLPerf Inference's server-scenario rule (every query answered, the latency percentiles within their bounds)
with the queue's overflow counted as unanswered. A limit is inclusive. Times in ms, counts in output tokens.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt


def slo_misses(*, tokens_shed: int, tokens_queued: int, ttft_p99_ms: float | None, tpot_p99_ms: float | None,
               slo_ttft_ms: float, slo_tpot_ms: float) -> list[str]:
    """What keeps a run from meeting the SLO, one phrase per failed condition (empty: the run meets it)."""
    why: list[str] = []
    if tokens_shed:
        why.append(f"{tokens_shed} tokens shed")
    if tokens_queued:
        why.append(f"{tokens_queued} tokens still queued at the end")
    if ttft_p99_ms is None or ttft_p99_ms > slo_ttft_ms:
        why.append(f"p99 TTFT {ttft_p99_ms if ttft_p99_ms is not None else 'n/a'} > {slo_ttft_ms:g} ms")
    if tpot_p99_ms is not None and tpot_p99_ms > slo_tpot_ms:
        why.append(f"p99 TPOT {tpot_p99_ms:.1f} > {slo_tpot_ms:g} ms")
    return why


def drain_to_judge_ms(t_arrival_ns: npt.ArrayLike, output_tokens: npt.ArrayLike, duration_ns: int, *,
                      slo_ttft_ms: float, slo_tpot_ms: float) -> float:
    """The shortest drain (simulated time without arrivals after the arrivals' ``duration_ns``) after which the rule
    above judges every offered request by its latency, not by the run's length, ms.

    A request arriving at ``a`` with ``o`` output tokens that meets both limits has its last token at
    ``a + TTFT + (o - 1) * TPOT`` (TPOT is its decode time over ``o - 1``), at most its deadline
    ``a + slo_ttft_ms + (o - 1) * slo_tpot_ms``. A run lasting until every deadline has passed, a drain of
    ``max(deadline) - duration`` or more, leaves unfinished only requests that missed a limit on their own; after a
    shorter drain a request still queued may yet have met both, and a miss on tokens still queued is undecided.
    Rounded up to the ms."""
    a_ms = np.asarray(t_arrival_ns, dtype=np.int64) / 1e6
    o = np.asarray(output_tokens, dtype=np.int64)
    if a_ms.size == 0:
        return 0.0
    deadline_ms = a_ms + slo_ttft_ms + np.maximum(o - 1, 0) * slo_tpot_ms
    return float(max(0, math.ceil(float(deadline_ms.max()) - duration_ns / 1e6)))
