"""The figures' windows fit one plot request: merged further (exactly: dt-weighted means, maxima of the peaks, sums
of the counts) until their JSON is within the budget, and left alone when they already fit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.orchestrator import finalize
from services.orchestrator.finalize import fit_plot_windows


def _window(i: int) -> dict[str, Any]:
    return {"window": i, "t_start_ms": 3.0 * i, "dt_ms": 3.0, "T_peak_logic": 60.0 + (i % 17), "T_peak_dram": 50.0,
            "bytes_moved": 10.0, "tokens_completed": 2, "migrations": i % 2, "latencies_ms": [],
            "oldest_inflight_ms": 0.0, "power_w": 100.0 + i, "core_temps": [float(i)] * 200}


def _size(windows: dict[str, list[dict[str, Any]]]) -> int:
    return len(json.dumps(windows, separators=(",", ":")))


def test_windows_that_fit_are_unchanged() -> None:
    windows = {"baseline": [_window(i) for i in range(10)]}
    assert fit_plot_windows(windows, budget_bytes=1e9) is windows


@pytest.mark.parametrize("scenarios", [1, 5])
def test_windows_over_the_budget_are_merged_until_they_fit_and_keep_time_peaks_and_counts(scenarios: int) -> None:
    windows = {f"s{k}": [_window(i) for i in range(300)] for k in range(scenarios)}
    budget = _size(windows) / 7
    fitted = fit_plot_windows(windows, budget_bytes=budget)
    assert _size(fitted) <= budget
    for sc, ws in windows.items():
        merged = fitted[sc]
        assert 1 <= len(merged) < len(ws)
        assert sum(w["dt_ms"] for w in merged) == pytest.approx(sum(w["dt_ms"] for w in ws))
        assert max(w["T_peak_logic"] for w in merged) == max(w["T_peak_logic"] for w in ws)
        assert sum(w["tokens_completed"] for w in merged) == sum(w["tokens_completed"] for w in ws)
        assert sum(w["migrations"] for w in merged) == sum(w["migrations"] for w in ws)
        assert [w["window"] for w in merged] == sorted(w["window"] for w in merged)
        energy = sum(w["power_w"] * w["dt_ms"] for w in ws)  # a dt-weighted mean keeps its integral
        assert sum(w["power_w"] * w["dt_ms"] for w in merged) == pytest.approx(energy)


def test_windows_that_cannot_fit_are_merged_as_far_as_they_go_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []  # the module's logger, whatever another test did to the logging tree
    monkeypatch.setattr(finalize.log, "warning", lambda msg, *args: said.append(msg % args))
    windows = {"baseline": [dict(_window(i), latencies_ms=[1.0] * 500) for i in range(40)]}
    fitted = fit_plot_windows(windows, budget_bytes=1000)
    assert len(fitted["baseline"]) == 1 and any("over the 1000 bytes" in m for m in said)
