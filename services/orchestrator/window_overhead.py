"""A whole window against its pure compute (issue 21's goal: <= 1.3x), measured.

The compute services run in process (the embedded wiring, one event loop on a portal thread). The plain functions
their endpoints call — the workload's ``get_window`` (the logical window from the cached trace), placement's
``tacs_for`` (the TACS step), lowering's ``physicalize`` and thermal's ``step_request`` — are wrapped in timers for
the run; everything else a window costs is overhead: the request and answer bodies (JSON, pydantic validation), the
in-process transport, the orchestrator's trace files, its metrics and the window's commit with the frontier. Inside
those functions, keeping the new window state by name (``shared.content.ContentStore.put``: the state's JSON and its
sha256, the price of states that stay with their services) is timed apart and counted as overhead too; decoding the
request's parts (the energy deposit, a state named by hash) stays in the compute. A whole window runs from the end
of one window's commit to the end of the next's; no warm-up pass (its windows write no files and commit nothing).
The window loop reads the logical windows a batch at a time (`pipeline_clients.WINDOW_BATCH`), before the windows
they belong to: a ``get_window`` call counts for the window it reads (its last read before the last commit: the capacity
estimate before the run reads some of the same windows), not for the moment it ran.

    python -m services.orchestrator.window_overhead [--windows 200] [--scenario tas] [--no-traces]

(also a row of ``make bench``).
"""

from __future__ import annotations

import argparse
import importlib
import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.orchestrator.local import run_local
from services.orchestrator.schemas import Scenario
from services.orchestrator.worker import compute_clients
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]

# (call, module, attribute): the plain function each endpoint of a window calls, looked up at call time by the
# endpoint (``service.physicalize(...)`` or a name imported into the app module), so patching it there times it
# (a call by window: its window index is the function's second argument, ``get_window(entry, k, ...)``)
COMPUTE: tuple[tuple[str, str, str], ...] = (
    ("workload", "services.workload.service", "get_window"),
    ("tacs", "services.placement.app", "tacs_for"),
    ("physicalize", "services.lowering.service", "physicalize"),
    ("thermal", "services.thermal.service", "step_request"),
)
BY_WINDOW = frozenset({"workload"})  # calls counted for the window they read (read ahead, in batches)
COMMIT = ("services.orchestrator.repository", "commit_window")  # the window loop calls ``repo.commit_window``
STATE_PUT = "state store"  # `ContentStore.put` inside the compute functions, timed apart (overhead)


@dataclass
class Overhead:
    """The windows between a run's first and last commit: their wall time and the compute functions' time and
    calls in them, in s."""

    windows: int
    whole_s: float
    compute_s: dict[str, float] = field(default_factory=dict)  # by function, the state store's puts taken out
    calls: dict[str, int] = field(default_factory=dict)
    state_put_s: float = 0.0  # `ContentStore.put` inside them

    @property
    def compute_total_s(self) -> float:
        return sum(self.compute_s.values())

    @property
    def ratio(self) -> float:
        """Whole window over its pure compute (inf when nothing was computed)."""
        c = self.compute_total_s
        return self.whole_s / c if c > 0 else float("inf")

    def per_window_ms(self, seconds: float) -> float:
        return 1e3 * seconds / self.windows if self.windows else float("nan")


@dataclass
class Timeline:
    """What `timed_compute` saw: each compute call (name, start, duration) and each window commit's end (s,
    ``time.perf_counter``)."""

    calls: list[tuple[str, float, float]] = field(default_factory=list)
    puts: list[tuple[float, float]] = field(default_factory=list)  # (start, duration) of each state-store put
    commits: list[float] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)  # the window of each commit (beside ``commits``)
    by_window: list[tuple[str, int, float, float]] = field(default_factory=list)  # `BY_WINDOW`: (name, window,
    # start, duration)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def overhead(self) -> Overhead:
        """The windows after the first commit up to the last: each from the end of the previous window's commit to
        the end of its own (the logical window, TACS, physicalize, thermal step, metrics, trace files, the commit),
        and the compute calls that started in that span, or (`BY_WINDOW`) that read one of its windows. The capacity
        estimate before the run and the reduce after it call some of the same functions; they fall outside."""
        if len(self.commits) < 2:
            return Overhead(windows=0, whole_s=0.0)
        first, last = self.commits[0], self.commits[-1]
        times: dict[str, float] = {}
        calls: dict[str, int] = {}
        spans: list[tuple[str, float, float]] = []
        for name, t0, dt in self.calls:
            if first <= t0 <= last:
                times[name] = times.get(name, 0.0) + dt
                calls[name] = calls.get(name, 0) + 1
                spans.append((name, t0, t0 + dt))
        if self.committed:
            span = set(self.committed[1:])
            read: dict[tuple[str, int], tuple[float, float]] = {}  # each window's last read before the last commit
            for name, k, t0, dt in self.by_window:
                if k in span and t0 <= last and t0 >= read.get((name, k), (-math.inf, 0.0))[0]:
                    read[(name, k)] = (t0, dt)
            for (name, _), (_, dt) in read.items():
                times[name] = times.get(name, 0.0) + dt
                calls[name] = calls.get(name, 0) + 1
        put_s = 0.0
        for t0, dt in self.puts:  # each put inside one compute call: taken out of that call's time
            owner = next((name for name, a, b in spans if a <= t0 <= b), None)
            if owner is not None:
                times[owner] -= dt
                put_s += dt
        return Overhead(windows=len(self.commits) - 1, whole_s=last - first, compute_s=times, calls=calls,
                        state_put_s=put_s)


@contextmanager
def timed_compute(timeline: Timeline) -> Iterator[None]:
    """Wrap every `COMPUTE` function and the window commit (``repository.commit_window``) in timers adding to
    ``timeline`` (thread-safe); restored on exit."""
    saved: list[tuple[Any, str, Any]] = []

    Wrapper = Callable[[Callable[..., Any]], Callable[..., Any]]

    def timing(record: Callable[[float, float, tuple[Any, ...]], None]) -> Wrapper:
        """A wrapper handing (start, duration, arguments) of each call to ``record``, under the timeline's lock."""
        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            def timed(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    dt = time.perf_counter() - t0
                    with timeline.lock:
                        record(t0, dt, args)
            return timed
        return wrap

    def timer(name: str) -> Wrapper:
        return timing(lambda t0, dt, _: timeline.calls.append((name, t0, dt)))

    def window_timer(name: str) -> Wrapper:
        """A call counted for its window (the function's second argument)."""
        return timing(lambda t0, dt, args: timeline.by_window.append((name, int(args[1]), t0, dt)))

    putting = timing(lambda t0, dt, _: timeline.puts.append((t0, dt)))

    def committed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def commit(*args: Any, **kwargs: Any) -> Any:
            ok = fn(*args, **kwargs)
            with timeline.lock:
                timeline.commits.append(time.perf_counter())
                timeline.committed.append(int(kwargs["window"]))
            return ok
        return commit

    def patch(module: str, attr: str, wrapper: Wrapper) -> None:
        owner: Any = importlib.import_module(module)
        *path, name = attr.split(".")  # "Class.method": patched on the class
        for part in path:
            owner = getattr(owner, part)
        fn = getattr(owner, name)
        saved.append((owner, name, fn))
        setattr(owner, name, wrapper(fn))

    try:
        for name, module, attr in COMPUTE:
            patch(module, attr, window_timer(name) if name in BY_WINDOW else timer(name))
        patch(*COMMIT, committed)
        patch("shared.content", "ContentStore.put", putting)
        yield
    finally:
        for mod, attr, fn in reversed(saved):
            setattr(mod, attr, fn)


def measure(windows: int = 200, scenario: Scenario = "tas", *, traces: bool = True,
            workload: Path = REPO / "configs/workload_mixtral_8x7b.yaml") -> Overhead:
    """The first ``windows`` windows of one scenario of the default experiment (``workload``: another config), run
    embedded on this process's threads, writing its trace files as ``make run`` does (``traces``); the figures
    cover windows 1 to ``windows - 1`` (`Timeline.overhead`)."""
    tmp = Path(tempfile.mkdtemp(prefix="tasmoe-overhead-"))
    settings = Settings(results_dir=tmp / "results", configs_dir=REPO / "configs")
    timeline = Timeline()
    try:
        with compute_clients(settings) as clients, timed_compute(timeline):
            res = run_local(arch=REPO / "configs/arch_8x8_32x32x8.yaml", workload=workload,
                            tas=REPO / "configs/tas_params.yaml", out=tmp / "out", scenarios=[scenario],
                            windows=windows, settings=settings, clients=clients, traces=traces, warmup_ms=0.0,
                            database_url=f"sqlite:///{tmp / 'db.sqlite3'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not res.ok:
        raise RuntimeError("; ".join(f"{k}: {v}" for k, v in res.errors.items()))
    return timeline.overhead()


def describe(o: Overhead) -> str:
    parts = ", ".join(f"{name} {o.per_window_ms(o.compute_s.get(name, 0.0)):.1f}" for name, _, _ in COMPUTE)
    return (f"whole {o.per_window_ms(o.whole_s):.1f} ms, compute {o.per_window_ms(o.compute_total_s):.1f} ms "
            f"({parts}), overhead {o.per_window_ms(o.whole_s - o.compute_total_s):.1f} ms per window (of it "
            f"{STATE_PUT} {o.per_window_ms(o.state_put_s):.1f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--windows", type=int, default=200, help="windows of the run (default: %(default)s)")
    ap.add_argument("--scenario", default="tas", choices=["baseline", "taps", "tacs", "tas"])
    ap.add_argument("--no-traces", action="store_true", help="the run writes no trace files")
    args = ap.parse_args(argv)
    o = measure(args.windows, args.scenario, traces=not args.no_traces)
    print(f"{args.scenario}, {o.windows} windows: {describe(o)}; whole / compute = {o.ratio:.2f}x")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
