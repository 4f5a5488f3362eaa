"""`make bench`: run every service's benchmarks (``services/<name>/bench.py: bench()``) and write BENCHMARKS.md.

A benchmark that needs another service's answers takes the services as ``bench(clients)``: they run in this process,
wired to each other, and are reached over HTTP as in a run (no service imports another)."""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from services import optional_module
from services.root_app import embedded
from shared import SERVICES
from shared.bench import BenchRow
from shared.blas import limit_blas_threads
from shared.client import ServiceClients
from shared.settings import Settings, load_settings

MEMORY = "memory"  # `--only memory`: the request memory of every service (scripts/bench_memory.py)


def _table(rows: list[BenchRow]) -> list[str]:
    out = ["| benchmark | measured | goal | met | note |", "|---|---|---|---|---|"]
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        out.append(f"| {r.name} | {r.value} | {r.target} | {met} | {r.note} |")
    return out


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"
    except OSError:  # pragma: no cover - not on every platform
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make bench")
    ap.add_argument("--only", nargs="*", default=None,
                    help=f"services to run, and/or '{MEMORY}' (scripts/bench_memory.py) (default: all)")
    ap.add_argument("--out", default="BENCHMARKS.md")
    args = ap.parse_args(argv)
    blas = load_settings().blas_threads
    limit_blas_threads(blas)  # as the services run (shared/blas.py)
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` on {time.strftime('%Y-%m-%d %H:%M')} ({platform.machine()}, "
        f"Python {platform.python_version()}). Goals are reported, not asserted; ratios are measured in one run. "
        f"BLAS threads per process: {blas or 'library default'} (TASMOE_BLAS_THREADS). "
        f"Load average at the start: {_load()} on {os.cpu_count()} CPUs.",
        "",
    ]
    failed: list[str] = []
    with ExitStack() as stack:
        clients: ServiceClients | None = None

        def services() -> ServiceClients:
            """The services in process, wired to each other: for benchmarks that ask another service (as a run
            does) instead of importing it."""
            nonlocal clients
            if clients is None:
                clients = stack.enter_context(embedded(Settings())).clients
            return clients

        failed += _run_all([n for n in args.only or SERVICES if n in SERVICES], lines, services)
    if args.only is None or MEMORY in args.only:
        failed += _run_memory(lines)
    history = Path(__file__).resolve().parents[1] / "docs" / "bench_history.md"
    if history.is_file():  # its trend only; the diary below it stays in docs/bench_history.md
        trend = history.read_text(encoding="utf-8").split("\n## Diary", 1)[0].rstrip()
        lines += [trend, "", "The measurements behind it: [docs/bench_history.md](docs/bench_history.md).", ""]
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


def _run_all(names: list[str], lines: list[str], services: Callable[[], ServiceClients]) -> list[str]:
    failed: list[str] = []
    for name in names:
        mod = optional_module(name, "bench")
        if mod is None:
            continue
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            wants_services = bool(inspect.signature(mod.bench).parameters)
            rows: list[BenchRow] = mod.bench(services()) if wants_services else mod.bench()
        except Exception as exc:  # one service's failure must not lose the others' rows (written at the end)
            traceback.print_exc()
            failed.append(name)
            rows = [BenchRow(f"{name}: the benchmark failed", f"{type(exc).__name__}: {exc}"[:300])]
        lines += [f"## {name}", "", *_table(rows), "", f"({time.perf_counter() - t0:.1f} s)", ""]
    return failed


def _run_memory(lines: list[str]) -> list[str]:
    """The memory one worst-case request takes in each service, at the body limit (`scripts.bench_memory`)."""
    from scripts import bench_memory

    print(f"bench: {MEMORY} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        rows = bench_memory.bench()
    except Exception as exc:
        traceback.print_exc()
        rows = [BenchRow(f"{MEMORY}: the benchmark failed", f"{type(exc).__name__}: {exc}"[:300])]
        failed = [MEMORY]
    else:
        failed = []
    lines += ["## request memory (every service)", "", *_table(rows), "", f"({time.perf_counter() - t0:.1f} s)", ""]
    return failed


if __name__ == "__main__":
    sys.exit(main())
