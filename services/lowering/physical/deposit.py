"""Stage 6: each event's share of a window, pro rata of time.

An event running over ``[start, end)`` deposits ``overlap([start, end), [t0, t1)) / (end − start)`` of its energy,
FLOPs, cycles and bytes in window ``[t0, t1)``; a zero-length event belongs to the window holding its start. Summed
over consecutive windows the shares are 1, so energy is conserved (tests/lowering/test_schedule_energy.py).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


def share(start: F64, end: F64, t0: float, t1: float) -> F64:
    """Fraction of each interval inside ``[t0, t1)``."""
    span = end - start
    ov = np.clip(np.minimum(end, t1) - np.maximum(start, t0), 0.0, None)
    has_span = span > 0
    if has_span.all():  # the same quotients as below, without the zero-length branch
        every: F64 = ov / span
        return every
    inside = ((start >= t0) & (start < t1)).astype(np.float64)
    out: F64 = np.where(has_span, np.divide(ov, span, out=np.zeros_like(ov), where=has_span), inside)
    return out


def remains(end: F64, start: F64, t1: float) -> NDArray[np.bool_]:
    """Whether an interval still has a part at or after ``t1`` (it is carried to the next window)."""
    out: NDArray[np.bool_] = np.where(end > start, end > t1, start >= t1)
    return out
