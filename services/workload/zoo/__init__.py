"""The model zoo: HuggingFace-style ``config.json`` files shipped with the package (``<name>.json`` beside this
module, copied from ``../shared/reference/models/model_configs.json``), plus models registered at run time.

Names are lower-case with dashes (``mixtral-8x7b``); lookups normalise case and underscores.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from services.workload.ir.model_config import ModelConfig, from_hf_config
from shared.errors import BadInput, NotFound

ZOO_DIR = Path(__file__).resolve().parent

_registered: dict[str, ModelConfig] = {}


def normalize_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@cache
def _shipped() -> dict[str, ModelConfig]:
    out: dict[str, ModelConfig] = {}
    for path in sorted(ZOO_DIR.glob("*.json")):
        out[path.stem] = from_hf_config(json.loads(path.read_text(encoding="utf-8")), name=path.stem)
    return out


def known_models() -> list[str]:
    return sorted({*_shipped(), *_registered})


def get_model_config(name: str) -> ModelConfig:
    """The zoo model ``name``; ``NotFound`` (404) listing the known names otherwise."""
    key = normalize_name(name)
    mc = _registered.get(key) or _shipped().get(key)
    if mc is None:
        raise NotFound(f"unknown model {name!r}; known models: {', '.join(known_models())}", field="model",
                       code="unknown_model")
    return mc


def register_model(name: str, hf_config: Mapping[str, Any]) -> ModelConfig:
    """Add (or replace) a model built from a HuggingFace-style ``config.json`` mapping for this process."""
    key = normalize_name(name)
    if not key:
        raise BadInput("model name must not be empty", field="name")
    mc = from_hf_config(hf_config, name=key)
    _registered[key] = mc
    return mc


def register_model_file(path: str | Path, name: str | None = None) -> ModelConfig:
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: file not found", field="config")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BadInput(f"{p}: malformed JSON: {exc.msg} (line {exc.lineno})", field="config") from None
    return register_model(name or p.stem, raw)


def unregister_model(name: str) -> None:
    _registered.pop(normalize_name(name), None)
