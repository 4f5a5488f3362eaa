"""Typed experiment configs (arch, workload, TAS parameters) and their YAML loader."""

from shared.configs.arch import ArchConfig
from shared.configs.loader import load_arch, load_config, load_tas, load_workload, parse_config
from shared.configs.tas import TasParams
from shared.configs.workload import ServingConfig, ServingSlo, WorkloadConfig

__all__ = [
    "ArchConfig",
    "ServingConfig",
    "ServingSlo",
    "TasParams",
    "WorkloadConfig",
    "load_arch",
    "load_config",
    "load_tas",
    "load_workload",
    "parse_config",
]
