"""Config models: the shipped configs load, bad ones fail with the file and the field path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from services.cli import main
from shared.configs import ArchConfig, load_arch, load_tas, load_workload, parse_config
from shared.configs.workload import WorkloadConfig
from shared.errors import ConfigError
from tests.conftest import CONFIGS


def test_shipped_configs_load_with_seed_values() -> None:
    arch = load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")  # calibrated (tests/test_calibration.py)
    assert arch.mesh.cores == (8, 8)
    assert arch.dram.banks == (16, 16, 8)
    stack = arch.geometry.expanded_stack()
    assert [layer.kind for layer in stack] == ["logic"] + ["dram"] * 8 + ["tim"]
    assert (arch.thermal.integrator, arch.thermal.exp_degree, arch.thermal.init) == ("exponential", 6, "steady")
    seed = load_arch(CONFIGS / "arch_seed.yaml")  # the seed's literal values (seed 001 §2.1)
    assert seed.dram.banks == (32, 32, 8) and seed.geometry.cooling.h_wmk2k == 10000
    assert [(layer.thickness_um, layer.k_wmk) for layer in seed.geometry.stack] == [(50, 120), (50, 2), (20, 5)]
    assert seed.refresh.tref_curve == ((40, 1.0), (55, 2.0), (70, 4.0), (85, 8.0))
    assert seed.dvfs.domains[0].steps_ghz == (2.0, 1.8, 1.6, 1.2) and seed.dvfs.domains[0].trip_c == (80, 85, 90)
    mix = load_workload(CONFIGS / "workload_mixtral_8x7b.yaml")
    assert (mix.routing.topk, mix.routing.zipf_s, mix.sequence.micro_batch) == (2, 1.2, 32)
    sat = load_workload(CONFIGS / "workload_mixtral_8x7b_saturated.yaml")  # the seed's arrival process
    assert (sat.sequence.steps, sat.sequence.step_interval_ms, sat.label) == (500, 1.0, "mixtral-8x7b-saturated")
    ds = load_workload(CONFIGS / "workload_deepseek_v2.yaml")
    assert (ds.routing.topk, ds.routing.n_group, ds.routing.topk_group) == (6, 8, 3)
    tas = load_tas(CONFIGS / "tas_params.yaml")
    assert tas.tacs.thresholds.Thot == 80.0 and tas.taps.replicate_hot_k == 1


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"mesh": {"cores": [0, 8]}}, "mesh.cores[0]", "must be >= 1"),
        ({"mesh": {"cores": [8, 8], "bogus": 1}}, "mesh.bogus", "unknown key"),
        ({"dram": {"page_kb": -1}}, "dram.page_kb", "must be >= 0.001"),
        ({"mesh": {"cores": "eight"}}, "mesh.cores", ""),
        ({"dvfs": {"domains": [{"steps_ghz": [2.0, 1.0], "trip_c": [80, 90]}]}}, "dvfs.domains[0]", "one entry fewer"),
        ({"thermal": {"exp_degree": 5}}, "thermal.exp_degree", "6"),
        ({"thermal": {"integrator": "rk4"}}, "thermal.integrator", "exponential"),
    ],
)
def test_bad_arch_names_the_field(data: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config(data, ArchConfig, source="arch.yaml")
    text = str(ei.value)
    assert text.startswith(f"arch.yaml: {field}"), text
    assert message in text


def test_cross_field_checks() -> None:
    with pytest.raises(ConfigError, match="DRAM layers"):
        parse_config({"dram": {"banks": [32, 32, 4]}}, ArchConfig)
    with pytest.raises(ConfigError, match=r"Temg must be > thresholds\.Thot"):
        from shared.configs import TasParams

        parse_config({"tacs": {"thresholds": {"Thot": 90, "Temg": 80}}}, TasParams)


def test_content_hash_is_canonical() -> None:
    a = parse_config({"mesh": {"cores": [8, 8]}}, ArchConfig)
    b = ArchConfig()
    assert a.content_hash() == b.content_hash()
    c = parse_config({"mesh": {"cores": [4, 8]}}, ArchConfig)
    assert c.content_hash() != a.content_hash()


def test_cli_config_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("mesh: {cores: [8, 8]\n", encoding="utf-8")
    assert main(["config", "arch", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "malformed YAML" in err and str(bad) in err
    assert main(["config", "arch", str(tmp_path / "missing.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("mesh:\n  cores: [-1, 8]\n", encoding="utf-8")
    assert main(["config", "arch", str(wrong)]) == 2
    assert "mesh.cores[0]: must be >= 1" in capsys.readouterr().err
    assert main(["config", "arch", str(CONFIGS / "arch_8x8_32x32x8.yaml")]) == 0


@pytest.mark.parametrize(("patch", "where"), [
    ({"geometry": {"stack": [{"name": "logic", "kind": "logic", "thickness_um": 50, "k_wmk": 120},
                             {"name": "dram", "kind": "dram", "thickness_um": 50, "k_wmk": 130, "count": 2_000_000}]}},
     "count"),
    ({"thermal": {"grid": [1024, 1024]}}, "grid"),
    ({"mesh": {"cores": [5000, 1]}}, "cores"),
    ({"mesh": {"cores": [64, 64]}}, "cores"),
    ({"geometry": {"cooling": {"h_wmk2k": 5e-324}}}, "h_wmk2k"),
    ({"geometry": {"cooling": {"h_wmk2k": float("inf")}}}, "h_wmk2k"),
    ({"power": {"logic_leak_w_per_core": float("nan")}}, "logic_leak_w_per_core"),
    ({"refresh": {"tref_curve": [[float("nan"), 1.0]]}}, "tref_curve"),
    ({"dram": {"banks": [32, 32, 1000]}}, "banks"),
])
def test_a_config_that_would_exhaust_the_service_is_refused_before_anything_is_built(patch: dict[str, Any],
                                                                                     where: str) -> None:
    """Hostile or careless configs (issue 17): refused by validation, naming the field, without expanding anything
    (a 2e6-layer stack is refused by its count, not after building two million layers)."""
    with pytest.raises(ValidationError) as ei:
        ArchConfig.model_validate(patch)
    assert where in str(ei.value)


@pytest.mark.parametrize(("patch", "where"), [
    ({"sequence": {"steps": 1_000_000}}, "steps"),
    ({"sequence": {"step_interval_ms": float("inf")}}, "step_interval_ms"),
    ({"tensors": {"weight_shard_mb": 1e-300}}, "weight_shard_mb"),
])
def test_a_workload_that_would_exhaust_the_service_is_refused(patch: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as ei:
        WorkloadConfig.model_validate(patch)
    assert where in str(ei.value)
