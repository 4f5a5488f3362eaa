"""When a served run throttles: its time, throttled time and mean clock by the number of requests running.

A p99 of time per output token is expected to be set by the requests decoded in the run's busiest spells, when the
batch is largest and each decode step longest. Whether throttling falls in those spells or is spread over the run is
what this table says: each window of the run's own record (``<results>/runs/<scenario>/windows.jsonl.gz``, every
window; the merged series written for the figures would average busy and idle windows together) goes to the bin of
the requests running at its end
(``requests_running``; bins of ``--bin`` requests, 0 on its own), and each bin sums the windows' time, the time
with any core below its top step (``cores_throttled > 0``, as the result row's ``time_throttled_ms``) and the
time-weighted mean clock over the cores (GHz).

    .venv/bin/python -m scripts.clock_by_load --results results/capacity-sustained/baseline-2.0to2.4/probe-2 \\
        --scenario baseline --out probe-2.clock_by_load.csv          # ~30 s for 74,000 windows
"""

from __future__ import annotations

import argparse
import csv
import sys
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

if __package__ in {None, ""}:  # `python scripts/clock_by_load.py` as well as `python -m scripts.clock_by_load`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from services.orchestrator import window_store
from shared.errors import BadInput


@dataclass(frozen=True)
class LoadBin:
    """The windows that ended with ``running_from`` to ``running_to`` requests running (both included)."""

    running_from: int
    running_to: int
    windows: int
    ms: float
    throttled_ms: float
    clock_ghz: float  # time-weighted mean over the bin's windows of the mean clock over the cores


@dataclass(frozen=True)
class RunLoad:
    """Per window: requests running at its end, its length (ms), whether any core ran below its top step, and the
    mean clock over the cores (GHz; NaN where the window records none)."""

    running: np.ndarray
    dt_ms: np.ndarray
    throttled: np.ndarray
    clock_ghz: np.ndarray

    @classmethod
    def of(cls, windows: Sequence[dict[str, Any]]) -> RunLoad:
        """From window records as the run file holds them (`WindowMetrics` as JSON)."""
        return cls(running=np.array([w.get("requests_running", 0) for w in windows], dtype=np.int64),
                   dt_ms=np.array([w["dt_ms"] for w in windows], dtype=float),
                   throttled=np.array([w.get("cores_throttled", 0) > 0 for w in windows], dtype=bool),
                   clock_ghz=np.array([float(np.mean(w["freq_ghz"])) if w.get("freq_ghz") else np.nan
                                       for w in windows]))

    @classmethod
    def read(cls, run_dir: Path) -> RunLoad:
        """Every window of a run folder (``runs/<scenario>/``), read a thousand at a time."""
        if not (run_dir / window_store.WINDOWS_FILE).is_file() or window_store.count(run_dir) == 0:
            raise BadInput(f"results: {run_dir} holds no windows ({window_store.WINDOWS_FILE} with its "
                           f"{window_store.INDEX_FILE})", field="results")
        try:
            parts = [cls.of(chunk) for chunk in window_store.iter_chunks(run_dir)]
        except (KeyError, TypeError, ValueError, zlib.error, OSError) as exc:
            raise BadInput(f"results: {run_dir / window_store.WINDOWS_FILE} is not a readable window store "
                           f"({type(exc).__name__}: {exc})", field="results") from None
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) if parts else np.array([])
                     for f in ("running", "dt_ms", "throttled", "clock_ghz")))


def check_bin_width(bin_width: int) -> None:
    """A bin holds at least one request (`BadInput` naming ``bin`` otherwise)."""
    if bin_width < 1:
        raise BadInput(f"bin: {bin_width} requests; a bin holds at least one", field="bin")


def clock_by_load(load: RunLoad, bin_width: int = 10) -> list[LoadBin]:
    """The bins of a run's windows by requests running (0, then 1..w, w+1..2w, ...), empty bins left out."""
    check_bin_width(bin_width)
    running, dt, throttled, clock = load.running, load.dt_ms, load.throttled.astype(bool), load.clock_ghz
    which = np.where(running == 0, 0, (running - 1) // bin_width + 1)  # bin 0: none running; k: (k-1)w+1 .. kw
    bins = []
    for k in np.unique(which):
        sel = which == k
        ms = float(dt[sel].sum())
        known = sel & ~np.isnan(clock)
        mean_clock = float((clock[known] * dt[known]).sum() / dt[known].sum()) if known.any() else float("nan")
        lo, hi = (0, 0) if k == 0 else ((int(k) - 1) * bin_width + 1, int(k) * bin_width)
        bins.append(LoadBin(running_from=lo, running_to=hi, windows=int(sel.sum()), ms=ms,
                            throttled_ms=float(dt[sel & throttled].sum()), clock_ghz=mean_clock))
    return bins


def write_bins(bins: Sequence[LoadBin], out: Path) -> None:
    """The bins as CSV, one row each (times in ms to the microsecond, clocks in GHz to six decimals: fixed point,
    so that the times add up to the run's whatever its length)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[f.name for f in fields(LoadBin)])
        w.writeheader()
        for b in bins:
            w.writerow({k: (f"{v:.6f}".rstrip("0").rstrip(".") if isinstance(v, float) else v)
                        for k, v in asdict(b).items()})


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, type=Path, help="a run's results folder")
    ap.add_argument("--scenario", required=True, help="the scenario whose series to read")
    ap.add_argument("--bin", type=int, default=10, help="requests running per bin (default: 10)")
    ap.add_argument("--out", required=True, type=Path, help="the CSV to write")
    args = ap.parse_args(argv)
    try:
        check_bin_width(args.bin)  # before reading the windows (tens of seconds for a long run)
        bins = clock_by_load(RunLoad.read(args.results / "runs" / args.scenario), args.bin)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_bins(bins, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
