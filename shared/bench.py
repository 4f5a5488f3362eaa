"""Benchmark helpers: each service's ``services/<name>/bench.py`` defines ``bench() -> list[BenchRow]``;
``make bench`` (scripts/bench.py) runs them all and writes BENCHMARKS.md. Goals are reported, never asserted:
the machines are shared and noisy, so compare ratios measured in one run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchRow:
    name: str  # what was measured
    value: str  # the measurement, with its unit ("1.84 ms median of 50")
    target: str = ""  # the goal from the issue ("< 2 ms")
    met: bool | None = None  # None when there is no goal
    note: str = ""


def time_call(fn: Callable[[], object], *, repeat: int = 20, warmup: int = 2) -> tuple[float, float]:
    """(median, min) wall time in seconds of ``fn()`` over ``repeat`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), min(samples)


def fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
