"""The six services of TAS-MoE Lab. Each is a package with ``app.create_app(settings)`` and ``cli.register``."""

from __future__ import annotations

import importlib
from types import ModuleType


def optional_module(service: str, part: str) -> ModuleType | None:
    """``services.<service>.<part>`` (``cli``, ``bench``, ``settings``) when the service has one, else None.

    A module that exists but fails to import (a missing dependency inside it) still raises.
    """
    name = f"services.{service}.{part}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None
