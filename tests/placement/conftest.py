"""Fixtures of the placement tests: a small chip, the shipped configs, synthetic thermal kernels and Zipf loads."""

from __future__ import annotations

import numpy as np
import pytest

from services.placement.geometry import synthetic_diffusion_kernel
from shared.configs import ArchConfig, TasParams, WorkloadConfig, load_arch, load_tas, load_workload
from shared.configs.arch import DramConfig, GeometryConfig, MeshConfig, StackLayer
from tests.conftest import CONFIGS


def small_arch(x: int = 4, y: int = 4, banks: tuple[int, int, int] = (8, 8, 2), bank_mb: float = 64.0) -> ArchConfig:
    stack = (StackLayer(name="logic", kind="logic", thickness_um=50, k_wmk=120),
             StackLayer(name="dram", kind="dram", thickness_um=50, k_wmk=2, count=banks[2]),
             StackLayer(name="tim", kind="tim", thickness_um=20, k_wmk=5))
    return ArchConfig(mesh=MeshConfig(cores=(x, y)), dram=DramConfig(banks=banks, bank_capacity_mb=bank_mb),
                      geometry=GeometryConfig(stack=stack))




@pytest.fixture(scope="session")
def arch() -> ArchConfig:
    return load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")


@pytest.fixture(scope="session")
def mixtral() -> WorkloadConfig:
    return load_workload(CONFIGS / "workload_mixtral_8x7b.yaml")


@pytest.fixture(scope="session")
def tas() -> TasParams:
    return load_tas(CONFIGS / "tas_params.yaml")


@pytest.fixture(scope="session")
def kernel64() -> np.ndarray:
    """Synthetic symmetric diffusion kernel on the 8x8 mesh (K/W): NOT the thermal model."""
    return synthetic_diffusion_kernel(8, 8, self_kw=2.0, length=1.2, base_kw=0.05)
