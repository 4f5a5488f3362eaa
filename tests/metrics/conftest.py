"""Metrics test fixtures: small synthetic runs drawn with a seeded numpy generator (services.metrics.synthetic)."""

from __future__ import annotations

import pytest

from services.metrics.synthetic import synthetic_runs
from shared.contracts.metrics import WindowMetrics

N_WINDOWS = 6


@pytest.fixture(scope="session")
def runs() -> dict[str, list[WindowMetrics]]:
    """Six windows for each of the four scenarios, 8x8 cores, 8 DRAM layers (seed 7)."""
    return synthetic_runs(N_WINDOWS, seed=7)


@pytest.fixture()
def windows(runs: dict[str, list[WindowMetrics]]) -> list[WindowMetrics]:
    """A fresh deep copy of the baseline run (tests may mutate it)."""
    return [w.model_copy(deep=True) for w in runs["baseline"]]
