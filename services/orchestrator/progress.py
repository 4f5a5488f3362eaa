"""What ``tasmoe run`` and ``make run`` print while an experiment runs: a line per scenario with its bar, its elapsed
time and an estimate of the time left, and what the run is doing when no window advances (starting the workers,
setting a run up, the thermal warm-up pass, writing the summary files and drawing the figures).

A newcomer's first run of the default experiment is several minutes long, and a minute of it shows no window: the
thermal warm-up pass of every scenario and the figures at the end. Without a word on those phases the run looks
hung, so each phase is named when it starts and a heartbeat line repeats it every ``heartbeat_s`` seconds.

The estimate is the scenario's window rate since its first committed epoch (the warm-up and the set-up before it are
not windows of the run) times the windows left; before a second epoch has committed there is no rate to go on.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from services.orchestrator.models import TERMINAL

RunState = tuple[int, int | None, str]  # (next window, the run's windows or None until known, status)


@dataclass(frozen=True)
class Progress:
    """One look at an experiment: each scenario's run state, and the phases the runs' states do not show."""

    runs: dict[str, RunState]
    warmup_windows: int = 0  # the thermal warm-up pass of each run, before its first window (0: none)
    finalizing: bool = False  # every run has ended; the summary, series, comparison and figures are being written


ProgressFn = Callable[[Progress], None]


def format_duration(seconds: float) -> str:
    """A duration for a person: ``45 s``, ``3 min 05 s``, ``1 h 02 min`` (whole seconds; never negative)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def eta_seconds(first: tuple[int, float], now: tuple[int, float], n_windows: int) -> float | None:
    """Seconds left for a run at window ``now[0]`` of ``n_windows``, at the rate measured between two looks
    ``(window, clock)``; None when the two looks show no windows run between them."""
    (k0, t0), (k1, t1) = first, now
    if k1 <= k0 or t1 <= t0:
        return None
    return (n_windows - k1) * (t1 - t0) / (k1 - k0)


def phase(state: RunState, warmup_windows: int) -> str:
    """What a run is doing, in words, for a state that shows no window yet (or its status once it advances)."""
    k, n, status = state
    if status == "queued":
        return "queued: waits for a free worker"
    if status != "running" or k > 0:
        return status
    if n is None:
        return "setting up: the trace and the thermal model"
    if warmup_windows:
        return (f"placing the experts, then the thermal warm-up: {min(warmup_windows, n)} windows run to the chip's "
                "steady temperature (not counted in the results)")
    return "placing the experts"


@dataclass
class _Seen:
    started: float | None = None  # the clock when first seen running
    first: tuple[int, float] | None = None  # the first look with a committed window: (window, clock)
    last_frac: float = -1.0
    last_print: float = float("-inf")
    last_phase: str = ""
    done: bool = False


@dataclass
class _Printer:
    stream: TextIO | None  # None: sys.stderr as it is at each line (a test's capture replaces it)
    every: float
    heartbeat_s: float
    clock: Callable[[], float]
    t0: float | None = None
    seen: dict[str, _Seen] = field(default_factory=dict)
    started_said: bool = False
    final_said: float = float("-inf")

    def __call__(self, p: Progress) -> None:
        now = self.clock()
        if self.t0 is None:
            self.t0 = now
        if not p.runs:
            if not self.started_said:
                self._say("starting the worker processes and the compute services, creating the experiment")
                self.started_said = True
            return
        width = max(len(sc) for sc in p.runs)
        for sc, state in p.runs.items():
            line = self._scenario(sc, state, p.warmup_windows, now)
            if line is not None:
                self._say(f"{sc:>{width}} {line}")
        if p.finalizing and now - self.final_said >= self.heartbeat_s:
            first = self.final_said == float("-inf")
            self.final_said = now
            self._say(("every scenario done; " if first else "still ")
                      + "writing summary.csv, the comparison, each run's series and drawing the figures (plots/*.png)"
                      + f"  [{format_duration(now - self.t0)} elapsed]")

    def _scenario(self, sc: str, state: RunState, warmup_windows: int, now: float) -> str | None:
        k, n, status = state
        s = self.seen.setdefault(sc, _Seen())
        if s.done:
            return None
        if status == "running" and s.started is None:
            s.started = now
        if k > 0 and s.first is None:
            s.first = (k, now)
        frac = (k / n) if n else 0.0
        what = phase(state, warmup_windows)
        done = status in TERMINAL  # a RunStatus is a str: its value is found
        due = (done or what != s.last_phase or frac - s.last_frac >= self.every
               or (status == "running" and now - s.last_print >= self.heartbeat_s))
        if not due:
            return None
        s.last_frac, s.last_print, s.last_phase, s.done = frac, now, what, done
        bar_w = 30
        fill = round(bar_w * frac)
        line = f"[{'#' * fill}{'-' * (bar_w - fill)}] window {k} of {n if n else '?'}  {what}"
        if s.started is not None:
            line += f"  [{format_duration(now - s.started)}"
            if status == "running" and n and s.first is not None:
                eta = eta_seconds(s.first, (k, now), n)
                line += ", ETA after the next epoch" if eta is None else f", ETA {format_duration(eta)}"
            line += "]"
        return line

    def _say(self, text: str) -> None:
        print(text, file=self.stream or sys.stderr, flush=True)


def progress_printer(stream: TextIO | None = None, *, every: float = 0.1, heartbeat_s: float = 30.0,
                     clock: Callable[[], float] = time.monotonic) -> ProgressFn:
    """A `ProgressFn` printing to ``stream`` (default: stderr, looked up at each line): one line per scenario when
    its phase changes, when it advances by ``every`` of its windows, when it ends, and every ``heartbeat_s`` seconds
    while it runs (the warm-up and the figures otherwise look like a hang)."""
    return _Printer(stream=stream, every=every, heartbeat_s=heartbeat_s, clock=clock)
