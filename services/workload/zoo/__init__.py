"""The model zoo: HuggingFace ``config.json`` files shipped with the package (``<name>.json`` beside this module,
copied from ``../shared/reference/models/model_configs.json``), plus the models users register.

Registered models are **persisted**: ``<models_dir>/<name>.json`` (``TASMOE_MODELS_DIR``, default
``<results_dir>/models``) holds the config.json, its content hash (SHA-256 of the canonical JSON: sorted keys, no
spaces) and whether the generic mapping was asked for. Every process (each replica, a restarted cluster) reads that
folder, so a model registered through one replica is seen by all that share the folder (a volume in compose/k8s).
A name is bound to one content: registering the same config again is a no-op, a different config under a taken name
(or a shipped model's name) is a conflict. Files are written atomically (temporary file + rename).

Names are lower-case with dashes (``mixtral-8x7b``); lookups normalise case and underscores. A workload may also
carry its config inline (``model: {config: {...}}``): ``resolve_model`` builds it, named ``user-<hash12>`` unless the
inline entry names it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from services.workload.ir.hf_config import from_hf_config
from services.workload.ir.model_config import ModelConfig
from shared.configs.workload import InlineModel
from shared.errors import BadInput, Conflict, NotFound, QuotaExceeded
from shared.lru import LRU
from shared.settings import Settings

ZOO_DIR = Path(__file__).resolve().parent
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{0,63}$")
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB; 1 MiB bounds what a registration stores
MAX_REGISTERED = 1024  # registered models in the folder (429 beyond): bounds the folder at 1 GiB


def normalize_name(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def config_hash(raw: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a config.json mapping (sorted keys, compact separators)."""
    text = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


@cache
def _shipped() -> dict[str, ModelConfig]:
    """The shipped models (package data: the same in every process, never changed at run time)."""
    out: dict[str, ModelConfig] = {}
    for path in sorted(ZOO_DIR.glob("*.json")):
        out[path.stem] = from_hf_config(json.loads(path.read_text(encoding="utf-8")), name=path.stem)
    return out


def shipped_models() -> list[str]:
    return sorted(_shipped())


def _load_file(path: Path) -> tuple[str, ModelConfig] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        name = str(doc["name"])
        return str(doc["sha256"]), from_hf_config(doc["config"], name=name, generic=bool(doc.get("generic")))
    except (OSError, ValueError, KeyError, TypeError, BadInput):
        return None  # a half-written or foreign file is not a model


class ModelZoo:
    """The models one workload service knows: the shipped ones, the ones registered in ``models_dir`` (None: none
    can be registered or persisted; the offline functions' default) and the ones this object registered without
    persisting; and the inline configs it built (an LRU of ``cache_size``). One per workload app, built from the
    app's settings (`from_settings`), so two apps in one process with different settings do not share a registry
    (no module-level state)."""

    def __init__(self, models_dir: Path | None = None, cache_size: int = 64) -> None:
        self.models_dir = models_dir
        self.cache_size = max(1, int(cache_size))
        self._lock = threading.Lock()
        self._registered: dict[str, tuple[str, ModelConfig]] = {}  # name -> (sha256, config): this object's view
        self._inline: LRU[str, ModelConfig] = LRU(self.cache_size)  # sha256:generic -> config

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelZoo:
        """``TASMOE_MODELS_DIR`` (default ``<results_dir>/models``) and ``TASMOE_CACHE_SIZE`` of ``settings``."""
        return cls(settings.effective_models_dir(), settings.cache_size)

    # --- the registered models' folder ----------------------------------------------------------------------
    def _persisted(self, name: str) -> tuple[str, ModelConfig] | None:
        """The registered model ``name`` from the models folder (re-read when its content hash changed)."""
        if self.models_dir is None or not NAME_RE.match(name):  # a name is never a path (../x, /abs, a/b)
            return None
        path = self.models_dir / f"{name}.json"
        if not path.is_file():
            return None
        loaded = _load_file(path)
        if loaded is not None:
            with self._lock:
                self._registered[name] = loaded
        return loaded

    def _persisted_names(self) -> list[str]:
        d = self.models_dir
        if d is None or not d.is_dir():
            return []
        return sorted(p.stem for p in d.glob("*.json") if NAME_RE.match(p.stem))

    def _found(self, key: str) -> tuple[str, ModelConfig] | None:
        with self._lock:
            hit = self._registered.get(key)
        return hit or self._persisted(key)

    # --- lookups --------------------------------------------------------------------------------------------
    def known_models(self) -> list[str]:
        with self._lock:
            mine = set(self._registered)
        return sorted({*_shipped(), *mine, *self._persisted_names()})

    def registered_models(self) -> list[str]:
        with self._lock:
            mine = set(self._registered)
        return sorted({*mine, *self._persisted_names()} - set(_shipped()))

    def model_hash(self, name: str) -> str | None:
        """Content hash of a registered model (None for a shipped one)."""
        found = self._found(normalize_name(name))
        return found[0] if found else None

    def get_model_config(self, name: str) -> ModelConfig:
        """The zoo or registered model ``name``; ``NotFound`` (404) listing the known names otherwise."""
        key = normalize_name(name)
        shipped = _shipped().get(key)
        if shipped is not None:
            return shipped
        found = self._found(key)
        if found is None:
            raise NotFound(f"unknown model {name!r}; known models: {', '.join(self.known_models())}",
                           field="model", code="unknown_model")
        return found[1]

    def resolve_model(self, model: str | InlineModel) -> ModelConfig:
        """A workload's model: a zoo/registered name, or an inline config.json (built once per content)."""
        if isinstance(model, str):
            return self.get_model_config(model)
        if not isinstance(model.config, Mapping):
            raise BadInput("model.config: a path must be read into the config before it reaches a service "
                           "(tasmoe inlines files it loads); send the config.json object itself",
                           field="model.config")
        key = f"{config_hash(model.config)}:{int(model.generic)}"
        mc = self._inline.get(key)
        if mc is not None:
            return mc
        try:
            mc = from_hf_config(model.config, name=model.label, generic=model.generic)
        except BadInput as exc:  # the key inside the workload: model.config.<key> (as the orchestrator names it)
            field = f"model.config.{exc.field}" if exc.field and exc.field != "config" else "model.config"
            raise BadInput(f"model.config: {exc.message}", field=field) from None
        self._inline.put(key, mc)
        return mc

    # --- registration ---------------------------------------------------------------------------------------
    def register_model(self, name: str, hf_config: Mapping[str, Any], *, generic: bool = False,
                       persist: bool = True) -> ModelConfig:
        """Register a model built from a HuggingFace ``config.json`` mapping: validated first (nothing is stored
        for a config that does not build), then persisted atomically unless ``persist`` is False (this object
        only; a zoo without a models folder never persists). Same name and content again: a no-op; another content
        under a taken or shipped name: ``Conflict`` (409)."""
        key = normalize_name(name)
        if not NAME_RE.match(key):
            raise BadInput(f"model name {name!r} must be 1-64 characters of letters, digits, '.', '-' or '_' "
                           "(starting with a letter or digit)", field="name")
        if key in _shipped():
            raise Conflict(f"model name {key!r} is a shipped model; choose another name", field="name")
        if not isinstance(hf_config, Mapping):
            raise BadInput("config.json must be a JSON object", field="config")
        try:
            sha = config_hash(hf_config)
        except (TypeError, ValueError) as exc:
            raise BadInput(f"config.json is not plain JSON: {exc}", field="config") from None
        mc = from_hf_config(hf_config, name=key, generic=generic)
        persist = persist and self.models_dir is not None
        with self._lock:
            existing = self._registered.get(key)
        if existing is None and persist:
            existing = self._persisted(key)
        if existing is not None and existing[0] != sha:
            raise Conflict(f"model {key!r} is already registered with another config.json (sha256 "
                           f"{existing[0][:12]}); register this one under another name", field="name")
        if persist and existing is None and self.models_dir is not None:
            if len(self._persisted_names()) >= MAX_REGISTERED:
                raise QuotaExceeded(f"{MAX_REGISTERED} models are registered; no more can be", field="name")
            _write_exclusive(self.models_dir / f"{key}.json",
                             {"name": key, "sha256": sha, "generic": generic, "config": dict(hf_config)})
        with self._lock:
            self._registered[key] = (sha, mc)
        return mc

    def register_model_file(self, path: str | Path, name: str | None = None, *, generic: bool = False,
                            persist: bool = False) -> ModelConfig:
        """Register ``path`` (named after the file unless ``name``); by default in this object only; ``persist``
        stores it like ``POST /v1/models``."""
        p = Path(path)
        return self.register_model(name or p.stem, read_config_file(p), generic=generic, persist=persist)

    def unregister_model(self, name: str, *, delete: bool = False) -> None:
        """Forget a registered model in this object (and delete its persisted file when ``delete``)."""
        key = normalize_name(name)
        with self._lock:
            self._registered.pop(key, None)
        if delete and self.models_dir is not None:
            (self.models_dir / f"{key}.json").unlink(missing_ok=True)


def _write_exclusive(path: Path, doc: dict[str, Any]) -> None:
    """Write ``path`` whole or not at all, and only if no one else has: the content goes to a temporary file that is
    hard-linked to the final name (``link`` fails when the name exists, also when another replica won the race; the
    winner's content then decides: the same hash is fine, another is a ``Conflict``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1, sort_keys=True)
    if len(text) > MAX_CONFIG_BYTES:
        raise BadInput(f"config.json is {len(text)} bytes; at most {MAX_CONFIG_BYTES}", field="config")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            other = _load_file(path)
            if other is None or other[0] != doc["sha256"]:
                raise Conflict(f"model {doc['name']!r} was just registered with another config.json; register "
                               "this one under another name", field="name") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A config.json file as a mapping; ``BadInput`` naming the file for a missing or malformed one."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: file not found", field="config")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise BadInput(f"{p}: malformed JSON{where}: {exc}", field="config") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{p}: config.json must be a JSON object", field="config")
    return raw
