"""What ``tasmoe run`` prints while it runs and when it ends: durations and estimates a person reads, the phases in
which no window advances named, the files line naming real paths, ``--quiet`` silencing the migrations' lines."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from services.orchestrator.cli import MIGRATION_LOGGER, quiet_migrations, start_line
from services.orchestrator.local import LocalResult, files_lines
from services.orchestrator.progress import Progress, eta_seconds, format_duration, phase, progress_printer


@pytest.mark.parametrize(("seconds", "text"), [(0, "0 s"), (44.6, "45 s"), (59.4, "59 s"), (60, "1 min 00 s"),
                                               (185, "3 min 05 s"), (3600, "1 h 00 min"), (3725, "1 h 02 min"),
                                               (-3, "0 s")])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_eta_is_the_rate_since_the_first_epoch_times_the_windows_left() -> None:
    assert eta_seconds((100, 10.0), (300, 30.0), 1000) == pytest.approx(70.0)
    assert eta_seconds((100, 10.0), (100, 20.0), 1000) is None  # no window between the two looks: no rate


def test_phases_name_what_runs_before_the_first_window() -> None:
    assert phase((0, None, "queued"), 0).startswith("queued")
    assert phase((0, None, "running"), 1000).startswith("setting up")
    warm = phase((0, 334, "running"), 1000)
    assert "warm-up" in warm and "334 windows" in warm  # at most the run's own windows
    assert phase((0, 334, "running"), 0) == "placing the experts"
    assert phase((5, 334, "running"), 1000) == "running"


def test_printer_says_each_phase_heartbeats_and_estimates() -> None:
    now = [0.0]
    out = io.StringIO()
    show = progress_printer(out, every=0.25, heartbeat_s=30.0, clock=lambda: now[0])
    show(Progress(runs={}, warmup_windows=100))
    show(Progress(runs={"baseline": (0, None, "running"), "unthrottled": (0, None, "queued")}, warmup_windows=100))
    now[0] = 5.0
    show(Progress(runs={"baseline": (0, 400, "running"), "unthrottled": (0, None, "queued")}, warmup_windows=100))
    now[0] = 20.0
    show(Progress(runs={"baseline": (0, 400, "running"), "unthrottled": (0, None, "queued")}, warmup_windows=100))
    now[0] = 36.0  # the warm-up still runs: a heartbeat
    show(Progress(runs={"baseline": (0, 400, "running"), "unthrottled": (0, None, "queued")}, warmup_windows=100))
    now[0] = 40.0
    show(Progress(runs={"baseline": (100, 400, "running"), "unthrottled": (0, None, "queued")}, warmup_windows=100))
    now[0] = 50.0
    show(Progress(runs={"baseline": (200, 400, "running"), "unthrottled": (0, None, "queued")}, warmup_windows=100))
    now[0] = 60.0
    show(Progress(runs={"baseline": (400, 400, "succeeded"), "unthrottled": (400, 400, "succeeded")},
                  warmup_windows=100, finalizing=True))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("starting the worker processes")
    assert "setting up" in lines[1] and lines[1].startswith("   baseline ")  # names aligned on the longest
    assert "queued" in lines[2]
    assert "thermal warm-up: 100 windows" in lines[3] and "[5 s]" in lines[3]
    assert "thermal warm-up" in lines[4] and "[36 s]" in lines[4]  # heartbeat; nothing printed at 20 s
    assert "window 100 of 400" in lines[5] and "ETA after the next epoch" in lines[5]
    assert "window 200 of 400" in lines[6] and "ETA 20 s" in lines[6]  # 100 windows in 10 s, 200 left
    assert "succeeded" in lines[7] and "[1 min 00 s]" in lines[7]
    assert "succeeded" in lines[8]
    assert lines[9].startswith("every scenario done; writing summary.csv") and "figures" in lines[9]
    assert len(lines) == 10


def test_files_line_names_real_paths(tmp_path: Path) -> None:
    for sc in ("baseline", "tas"):
        (tmp_path / sc).mkdir()
        (tmp_path / sc / "mixtral-8x7b.csv").write_text("x\n")
        (tmp_path / sc / "mixtral-8x7b.series.csv.gz").write_bytes(b"")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "temperature.png").write_bytes(b"")
    (tmp_path / "summary.csv").write_text("x\n")
    res = LocalResult(experiment_id="e", out_dir=tmp_path,
                      csvs={sc: tmp_path / sc / "mixtral-8x7b.csv" for sc in ("baseline", "tas")},
                      status={"baseline": "succeeded", "tas": "succeeded"}, errors={}, windows={}, wall_s=1.0,
                      compute_s={})
    text = "\n".join(files_lines(res))
    assert "<" not in text
    assert f"files in {tmp_path}/:" in text
    for rel in ("summary.csv", "plots/temperature.png", "baseline/mixtral-8x7b.csv", "tas/mixtral-8x7b.csv"):
        assert rel in text and (tmp_path / rel).is_file()
    assert "comparison.md" not in text  # not written: not named


def test_quiet_silences_the_migration_lines(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger(MIGRATION_LOGGER)
    before = logger.level
    try:
        quiet_migrations()
        with caplog.at_level(logging.INFO):
            logger.info("Running upgrade 0001 -> 0002")
            logger.warning("a warning still shows")
        assert [r.getMessage() for r in caplog.records] == ["a warning still shows"]
    finally:
        logger.setLevel(before)


def test_start_line() -> None:
    line = start_line("quick", arch="a.yaml", workload="w.yaml", tas="t.yaml", out="results/quick/", scenarios=5,
                      workers=2)
    assert line.startswith("experiment quick: a.yaml, w.yaml, t.yaml -> results/quick/; 5 scenarios, 2 at a time")
