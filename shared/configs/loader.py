"""Load YAML configs into the typed models, with one readable error line naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from shared.configs.arch import ArchConfig
from shared.configs.tas import TasParams
from shared.configs.workload import WorkloadConfig
from shared.errors import ConfigError, first_validation_error

M = TypeVar("M", bound=BaseModel)


def parse_config(data: Any, model: type[M], *, source: str = "config") -> M:
    """Validate a mapping (already parsed) into ``model``; errors name ``source`` and the field path."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        field, msg = first_validation_error(exc)
        where = f"{source}: {field}" if field else source
        raise ConfigError(f"{where}: {msg}", field=field or None) from None


def read_yaml(path: str | Path) -> Any:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: file not found", code="file_not_found")
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{p}: {line}malformed YAML: {problem}", code="malformed_yaml") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}: {exc.object[exc.start:exc.start + 1]!r})",
                          code="malformed_yaml") from None
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise ConfigError(f"{p}: malformed YAML: nested too deeply", code="malformed_yaml") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}", code="file_not_found") from None


def load_config(path: str | Path, model: type[M]) -> M:
    return parse_config(read_yaml(path), model, source=str(path))


def load_arch(path: str | Path) -> ArchConfig:
    return load_config(path, ArchConfig)


def load_workload(path: str | Path) -> WorkloadConfig:
    """A workload config file; ``model: {config: <path>}`` is read (relative to this file) and inlined, so what
    reaches a service is the config.json object itself."""
    cfg = load_config(path, WorkloadConfig)
    return inline_model_file(cfg, Path(path).parent)


def inline_model_file(cfg: WorkloadConfig, base: Path) -> WorkloadConfig:
    """Replace ``model.config: <path>`` by the file's JSON object (relative paths from ``base``)."""
    model = cfg.model
    if isinstance(model, str) or not isinstance(model.config, str):
        return cfg
    p = Path(model.config)
    p = p if p.is_absolute() else base / p
    if not p.is_file():
        raise ConfigError(f"model.config: {p}: file not found", field="model.config")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model.config: {p}: malformed JSON: {exc}", field="model.config") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"model.config: {p}: config.json must be a JSON object", field="model.config")
    name = model.name or p.stem
    return cfg.model_copy(update={"model": model.model_copy(update={"config": raw, "name": name})})


def load_tas(path: str | Path) -> TasParams:
    return load_config(path, TasParams)
