"""`tasmoe reduce|compare|plot` end to end on a results folder built from the synthetic fixture."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from services.cli import main
from services.metrics.compare import compare_all, compare_csv, compare_markdown
from services.metrics.plots import DPI, figure_size
from services.metrics.reduce import read_result_csv, reduce_window_metrics, row_csv
from services.metrics.series import append_windows, read_windows, windows_path, workloads_in
from shared.contracts.metrics import POLICIES, WindowMetrics
from shared.errors import BadInput


@pytest.fixture()
def results(tmp_path: Path, runs: dict[str, list[WindowMetrics]]) -> Path:
    """A results folder made with the CLI: per-window series appended window by window, then `tasmoe reduce`."""
    d = tmp_path / "results"
    for s, ws in runs.items():
        p = windows_path(d, s, "mixtral_8x7b")
        for w in ws:
            append_windows(p, [w])
        assert main(["reduce", str(p), "--scenario", s, "--workload", "mixtral_8x7b", "--thot", "80",
                     "--results", str(d)]) == 0
    (d / "plots").mkdir()
    return d


def test_reduce_writes_the_unified_csv(results: Path, runs: dict[str, list[WindowMetrics]]) -> None:
    for s, ws in runs.items():
        assert read_windows(windows_path(results, s, "mixtral_8x7b")) == ws
        want = reduce_window_metrics(ws, scenario=s, workload="mixtral_8x7b", thot_c=80.0)
        assert (results / s / "mixtral_8x7b.csv").read_text() == row_csv(want)


def test_window_series_are_compressed_and_plain_ones_still_read(results: Path, tmp_path: Path,
                                                                 runs: dict[str, list[WindowMetrics]]) -> None:
    """The series are gzip (a member per append); a folder with uncompressed ``.windows.jsonl`` files (written before
    the series were compressed) reads the same; a damaged file is an error naming ``windows``."""
    s = next(iter(runs))
    gz = windows_path(results, s, "mixtral_8x7b")
    assert gz.name.endswith(".windows.jsonl.gz") and gz.read_bytes()[:2] == b"\x1f\x8b"
    old = tmp_path / "old"
    for sc, ws in runs.items():
        plain = old / sc / "mixtral_8x7b.windows.jsonl"
        append_windows(plain, ws)
        assert plain.read_text().count("\n") == len(ws)
        assert windows_path(old, sc, "mixtral_8x7b") == plain and read_windows(plain) == ws
    assert workloads_in(old) == ["mixtral_8x7b"]
    bad = tmp_path / "bad.windows.jsonl.gz"
    bad.write_bytes(gz.read_bytes()[:40])
    with pytest.raises(BadInput) as exc:
        read_windows(bad)
    assert exc.value.field == "windows" and "bad.windows.jsonl.gz" in exc.value.message


def test_compare(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(results)]) == 0
    out = capsys.readouterr().out
    rows = [r for s in POLICIES for r in read_result_csv(results / s / "mixtral_8x7b.csv")]
    tables = compare_all(rows)
    assert (results / "comparison.csv").read_text() == compare_csv(tables)
    assert (results / "comparison.md").read_text() == compare_markdown(tables)
    assert compare_markdown(tables) in out


def test_compare_errors(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(results), "--scenarios", "baseline,fastest"]) == 2
    err = capsys.readouterr().err
    assert "fastest" in err and len(err.strip().splitlines()) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(empty)]) == 2
    assert main(["compare", str(results), "--scenarios", "taps,tas"]) == 2  # no baseline to compare against
    assert "baseline" in capsys.readouterr().err


@pytest.mark.parametrize(("kind", "name"), [("heatmap", "heat.png"), ("performance", "perf.svg")])
def test_plot(results: Path, kind: str, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = results / "plots" / name
    assert main(["plot", kind, "--results", str(results), "--out", str(out)]) == 0
    data = out.read_bytes()
    w_in, h_in = figure_size(kind, len(POLICIES))
    if name.endswith(".png"):
        assert struct.unpack(">II", data[16:24]) == (round(w_in * DPI), round(h_in * DPI))
    else:
        assert b"<svg" in data
    assert str(out) in capsys.readouterr().out


def test_plot_errors(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", "heatmap", "--results", str(results), "--out", str(results / "x.jpg")]) == 2
    assert main(["plot", "heatmap", "--results", str(results / "nope"), "--out", str(results / "x.png")]) == 2
    assert main(["plot", "heatmap", "--results", str(results), "--out", str(results / "x.png"),
                 "--dram-layer", "12"]) == 2
    err = capsys.readouterr().err
    assert "dram_layer" in err


def test_write_run_plots(results: Path) -> None:
    from services.metrics.plots import write_run_plots

    paths = write_run_plots(results)
    kinds = ("temperature", "performance", "heatmap", "power")
    assert [p.name for p in paths] == [f"mixtral_8x7b_{k}.png" for k in kinds]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
