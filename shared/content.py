"""Run data named by its content: an object fixed for a whole run (arch, placement, influence
matrix, TACS parameters) is registered once with the service that uses it and named by the SHA-256 of its canonical
JSON; the per-window requests carry that name instead of the object.

A service keeps what was registered in a `ContentStore`: an LRU bounded by ``TASMOE_CACHE_SIZE`` (entries), held on
the app (``app.state``), so the service stays stateless in ARCHITECTURE's sense: a name the service does not know (a
restart, an eviction, another replica) is a 404 with the code ``unknown_<kind>``, and the caller registers the object
again and retries (``services.orchestrator.pipeline_clients.Pipeline``). Objects are kept validated (pydantic),
so a window never re-validates unchanged run data; they are shared by every request naming them and never mutated.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from pydantic import BaseModel

from shared import json_codec
from shared.configs.arch import ArchConfig
from shared.contracts.placement import Placement
from shared.errors import BadInput, NotFound
from shared.lru import LRU

M = TypeVar("M", bound=BaseModel)


def canonical_json(obj: BaseModel) -> str:
    """Sorted-key compact JSON of the model with defaults filled in (the rule of ``StrictModel.canonical_json``)."""
    return json.dumps(obj.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def content_hash(obj: BaseModel) -> str:
    """Hex SHA-256 (64 digits) of `canonical_json`: for a config, ``cfg.content_hash(64)``."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def field_order_json(obj: BaseModel) -> bytes:
    """Pydantic's compact JSON of the model, fields in their declared order (a window state's name: no sorting)."""
    return obj.__pydantic_serializer__.to_json(obj)


def field_order_json_orjson(obj: BaseModel) -> bytes:
    """`field_order_json`'s bytes written by orjson from ``model_dump()`` (the same text: both write the shortest
    round-trip floats, escape the same characters and keep the field order; ``tests/test_content.py`` compares them
    on the services' states). 0.012 ms instead of 0.12 ms for the thermal state, 262 kB that are mostly one base64
    string that pydantic's serializer copies and scans character by character; slower than pydantic's on a state of
    many small numbers (the physical queue: 0.45 against 0.37 ms)."""
    return json_codec.dumps(obj.model_dump())


class KeptParts:
    """A state's key text that names some of its fields by their own digest: `field_order_json` of the state
    without ``parts``, then one line per part, ``<name>=<SHA-256 of the part's field_order_json>``. A part that is
    the very object a recent state held (the physicalizer carries the placement service's replica state from window
    to window unchanged: 25 kB) keeps the digest it had, without being written and hashed again (~0.15 ms a window
    right after the compute). Objects in a `ContentStore` are never mutated, so the same object has the same text;
    the digests of the last ``capacity`` parts are kept, with the parts (an id is not reused while they are)."""

    def __init__(self, parts: tuple[str, ...], capacity: int = 8) -> None:
        self.parts = parts
        self._digests: LRU[int, tuple[object, str]] = LRU(capacity)
        self._lock = threading.Lock()

    def digest(self, part: BaseModel) -> str:
        with self._lock:
            hit = self._digests.get(id(part))
        if hit is not None and hit[0] is part:
            return hit[1]
        d = hashlib.sha256(field_order_json(part)).hexdigest()
        with self._lock:
            self._digests.keep(id(part), (part, d))
        return d

    def __call__(self, obj: BaseModel) -> bytes:
        rest = obj.__pydantic_serializer__.to_json(obj, exclude=set(self.parts))
        lines = [f"\n{name}={self.digest(getattr(obj, name))}".encode() for name in self.parts]
        return b"".join([rest, *lines])


class ContentStore(Generic[M]):
    """LRU of validated objects of one kind by content hash (thread-safe: sync endpoints run in a thread pool).

    ``kind`` names the errors: an unknown hash is ``NotFound`` with code ``unknown_<kind>`` and field
    ``<field>`` (the request field that carried it). Where the object comes from, for the messages: ``path``, the
    endpoint that registers it, or ``inline``, the request field that carries it whole (a window state)."""

    def __init__(self, kind: str, capacity: int, *, field: str, path: str | None = None, inline: str | None = None,
                 key_json: Callable[[BaseModel], bytes | str] = canonical_json) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if (path is None) == (inline is None):
            raise ValueError("give path (a registry) or inline (a state sent whole), exactly one")
        self.kind = kind
        self.capacity = capacity
        self.field = field
        self.origin = f"POST {path}" if path is not None else "an earlier answer of this service"
        self.again = f"POST {path} with it again" if path is not None else f"send it inline (`{inline}`) again"
        self.key_json = key_json  # an object's name: the SHA-256 of this text (run data: `canonical_json`)
        self._items: LRU[str, M] = LRU(capacity)

    @property
    def code(self) -> str:
        return f"unknown_{self.kind}"

    def put(self, obj: M) -> tuple[str, int]:
        """(hash, bytes of the JSON it hashes) of ``obj``, kept (an object already known keeps its first copy)."""
        text = self.key_json(obj)
        key = hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()
        self._items.keep(key, obj)
        return key, len(text)

    def keep(self, key: str, obj: M) -> None:
        """Keep ``obj`` under ``key``, a name `put` gave it (e.g. the object a `get` of ``key`` returned, answered
        again unchanged), without serialising and hashing it again; it becomes the most recently used."""
        self._items.keep(key, obj)

    def get(self, key: str) -> M:
        obj = self._items.get(key)
        if obj is None:
            raise NotFound(f"unknown {self.kind} {key!r} (not in this replica's cache): {self.again}",
                           field=self.field, code=self.code)
        return obj

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items


def object_or_hash(obj: M | None, key: str | None, store: ContentStore[M], *, field: str,
                   default: M | None = None) -> M:
    """The request's object: given inline (``field``) or by its hash (``store.field``), exactly one of the two
    (``default`` when neither is given and the field has one). A 422 naming ``field`` otherwise."""
    if obj is not None and key is not None:
        raise BadInput(f"{field}: give {field} or {store.field}, not both", field=field)
    if key is not None:
        return store.get(key)
    if obj is not None:
        return obj
    if default is not None:
        return default
    raise BadInput(f"{field}: required (the object, or {store.field}: its hash from {store.origin})",
                   field=field)


def arch_store(capacity: int) -> ContentStore[ArchConfig]:
    """The registered arch configs of a service (``POST /v1/registry/archs``; requests name one by ``arch_hash``)."""
    return ContentStore("arch", capacity, field="arch_hash", path="/v1/registry/archs")


def state_store(kind: str, capacity: int, *, field: str = "state_ref", long_strings: bool = False,
                kept_parts: tuple[str, ...] = ()) -> ContentStore[M]:
    """The window states a service produced (``kind``: ``thermal_state``, ``physical_state``), by the hash of their
    JSON: a window request names the previous window's state by it (``state_ref``) instead of sending it back.
    An unknown name is a 404 ``unknown_<kind>``: the caller sends the state inline (from its last
    checkpoint) and the service keeps it again. The name hashes `field_order_json` (no sorting: ~1 ms less a window);
    ``long_strings``: a state that is mostly long strings (thermal's field) has the same text written by orjson
    (`field_order_json_orjson`, 10x faster there); ``kept_parts``: fields usually carried unchanged from the state
    before, named by their own digest (`KeptParts`)."""
    if long_strings and kept_parts:
        raise ValueError("long_strings and kept_parts: one key rule at a time")
    key_json: Callable[[BaseModel], bytes | str] = (
        KeptParts(kept_parts) if kept_parts else field_order_json_orjson if long_strings else field_order_json)
    return ContentStore(kind, capacity, field=field, inline="state", key_json=key_json)


def placement_store(capacity: int) -> ContentStore[Placement]:
    """The registered placements of a service (``POST /v1/registry/placements``; ``placement_hash``)."""
    return ContentStore("placement", capacity, field="placement_hash", path="/v1/registry/placements")
