"""Small stacks for fast thermal tests (the default 64 × 64 × 12 stack is exercised by the bench)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.configs import ArchConfig


def small_arch(**thermal: Any) -> ArchConfig:
    """4 × 4 cores, 8 × 8 × 2 banks, 16 × 16 grid: the default materials and package, starting at ambient."""
    return ArchConfig.model_validate({
        "mesh": {"cores": [4, 4]},
        "dram": {"banks": [8, 8, 2]},
        # the first wave's 10 mm die under a 0.028 K/W sink (the tests' expected values were derived for it; the
        # calibrated package is checked in tests/test_calibration.py and by the bench)
        "geometry": {"die_mm": [10.0, 10.0], "cooling": {"h_wmk2k": 10000.0}, "stack": [
            {"name": "logic", "kind": "logic", "thickness_um": 50, "k_wmk": 120},
            {"name": "dram", "kind": "dram", "thickness_um": 50, "k_wmk": 2, "count": 2},
            {"name": "tim", "kind": "tim", "thickness_um": 20, "k_wmk": 5, "rho_c_jm3k": 4.0e6},
        ]},
        "thermal": {"grid": [16, 16], "init": "ambient", **thermal},  # from ambient unless a test asks
    })


@pytest.fixture(scope="session")
def arch_small() -> ArchConfig:
    return small_arch()


@pytest.fixture(scope="session")
def arch_small_hotspot() -> ArchConfig:
    return small_arch(variant="hotspot")
