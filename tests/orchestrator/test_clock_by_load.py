"""`scripts/clock_by_load.py`: a run's time, throttled time and mean clock by requests running, read from the run's
own window store."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scripts.clock_by_load import RunLoad, clock_by_load, main, write_bins
from services.orchestrator import window_store
from shared.errors import BadInput


def _store(run_dir: Path, windows: list[dict[str, Any]]) -> None:
    """A window store as the loop writes it: one gzip member per window and the offset of each."""
    run_dir.mkdir(parents=True)
    offset = 0
    with (run_dir / window_store.WINDOWS_FILE).open("wb") as data, \
            (run_dir / window_store.INDEX_FILE).open("wb") as idx:
        for w in windows:
            m = window_store.member((json.dumps(w) + "\n").encode())
            idx.write(window_store.offset_entry(offset))
            data.write(m)
            offset += len(m)


def _w(running: int, throttled: int, freqs: list[float], dt: float = 3.0) -> dict[str, Any]:
    return {"dt_ms": dt, "requests_running": running, "cores_throttled": throttled, "freq_ghz": freqs}


WINDOWS = [_w(0, 0, [2.0, 2.0]), _w(3, 1, [1.0, 2.0]), _w(10, 0, [2.0, 2.0], dt=6.0), _w(11, 2, [1.0, 1.0]),
           _w(35, 0, [2.0, 2.0]), _w(0, 0, [])]


def test_windows_go_to_the_bin_of_their_requests_running_and_the_time_adds_up(tmp_path: Path) -> None:
    _store(tmp_path / "runs" / "tas", WINDOWS)
    bins = clock_by_load(RunLoad.read(tmp_path / "runs" / "tas"), bin_width=10)
    assert [(b.running_from, b.running_to, b.windows) for b in bins] == [(0, 0, 2), (1, 10, 2), (11, 20, 1),
                                                                        (31, 40, 1)]  # 21..30 holds none
    assert sum(b.ms for b in bins) == sum(w["dt_ms"] for w in WINDOWS)
    assert [b.throttled_ms for b in bins] == [0.0, 3.0, 3.0, 0.0]
    assert bins[0].clock_ghz == 2.0  # a window without clocks is left out of the mean, not counted as 0
    assert bins[1].clock_ghz == pytest.approx((1.5 * 3 + 2.0 * 6) / 9)  # time-weighted
    assert bins[2].clock_ghz == 1.0


def test_the_cli_writes_the_table_and_a_missing_run_is_one_line_and_exit_2(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    _store(tmp_path / "runs" / "baseline", WINDOWS)
    out = tmp_path / "load.csv"
    assert main(["--results", str(tmp_path), "--scenario", "baseline", "--bin", "20", "--out", str(out)]) == 0
    with out.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["running_from"], r["running_to"], r["windows"]) for r in rows] == [("0", "0", "2"), ("1", "20", "3"),
                                                                                ("21", "40", "1")]
    assert main(["--results", str(tmp_path), "--scenario", "tacs", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results:" in err[0] and "windows.jsonl.gz" in err[0]
    assert main(["--results", str(tmp_path / "nowhere"), "--scenario", "baseline", "--bin", "0", "--out",
                 str(out)]) == 2  # refused before any window is read
    assert "bin: 0" in capsys.readouterr().err
    with pytest.raises(BadInput, match="bin"):
        clock_by_load(RunLoad.of(WINDOWS), bin_width=0)
    assert clock_by_load(RunLoad(*(np.array([]) for _ in range(4)))) == []


def test_a_store_without_its_index_or_with_a_broken_window_is_refused_naming_it(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "tas"
    _store(run, WINDOWS)
    (run / window_store.INDEX_FILE).unlink()
    with pytest.raises(BadInput, match="holds no windows"):
        RunLoad.read(run)
    broken = tmp_path / "runs" / "taps"
    _store(broken, [{"requests_running": 3}])  # no dt_ms
    with pytest.raises(BadInput, match="not a readable window store"):
        RunLoad.read(broken)


def test_long_runs_write_times_in_fixed_point(tmp_path: Path) -> None:
    """A bin of more than 10^6 ms (a run of about 17 minutes) keeps its digits: the times add up to the run's."""
    load = RunLoad(running=np.array([5, 5]), dt_ms=np.array([1_234_567.125, 3.0]), throttled=np.array([True, False]),
                   clock_ghz=np.array([1.5, 2.0]))
    write_bins(clock_by_load(load), tmp_path / "t.csv")
    with (tmp_path / "t.csv").open(encoding="utf-8") as fh:
        (row,) = list(csv.DictReader(fh))
    assert (row["ms"], row["throttled_ms"]) == ("1234570.125", "1234567.125")
