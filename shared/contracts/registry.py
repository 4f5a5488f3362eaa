"""Run data registered by content hash (``shared.content``): the answer of every ``POST /v1/registry/<kind>``
endpoint and the type of the hash fields of the per-window requests.

Owner: shared (the registration answer of the lowering and placement services). Consumers: orchestrator
(``Pipeline``: registers a run's fixed objects once, sends their hashes every window)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

ContentHash = Annotated[str, Field(pattern=r"^[0-9a-f]{16,64}$", description="hex SHA-256 of the object's canonical "
                                                                             "JSON, as its registration answered")]


class Registered(BaseModel):
    """``POST /v1/registry/<kind>``: the object is kept (LRU of ``TASMOE_CACHE_SIZE`` per kind) under ``hash``; a
    request naming an evicted or unknown hash gets 404 ``unknown_<kind>`` (register it again)."""

    kind: str
    hash: str  # hex SHA-256 of the canonical JSON (sorted keys, defaults filled in)
    bytes: int  # size of that canonical JSON
