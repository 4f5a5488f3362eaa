"""JSON encoding and decoding for the hot paths (orjson): service request/response bodies in the shared client and
the orchestrator's pipeline, and the JSON columns of the run database.

Why orjson: a window of the default experiment moves ~1.5 MB of JSON between the orchestrator and the services (the
thermal state, the physical queue state, event tables) and writes a ~430 kB frontier to the database. The standard
library's encoder and decoder took ~20 % of `make run`'s CPU time (py-spy); orjson does the same work 5–10× faster.

Same values as ``json``: floats are written as their shortest round-trip representation and read back to the same
double, tuples become arrays, non-string dict keys are converted to strings, numpy scalars and arrays are converted
to Python numbers and lists (``json.dumps`` refuses them). One difference: non-finite floats are written as ``null``
(standard JSON; pydantic's serializer does the same and PostgreSQL's JSON types reject ``NaN`` anyway). ``loads``
still reads the ``NaN``/``Infinity`` tokens that ``json.dumps`` writes (database rows of older versions), and reads
an integer beyond 64 bits exactly, as ``json`` does: orjson reads one as the nearest float without a word, so a text
with 20 digits in a row anywhere (every integer past 64 bits has them; a float orjson or ``json`` writes never
does) is read by the standard library. The check is a C-speed scan, ~0.6 ms a MB.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS


def _default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


Encoded = orjson.Fragment  # a JSON value already encoded: `dumps` writes its bytes as they are


def encoded(data: bytes | str) -> Encoded:
    """A JSON value already encoded (e.g. a pydantic model's ``__pydantic_serializer__.to_json``), for a value that
    `dumps` writes (a database JSON column) without building its Python objects first."""
    return orjson.Fragment(data)


def dumps(obj: Any) -> bytes:
    """Compact JSON (no spaces) as UTF-8 bytes."""
    return orjson.dumps(obj, default=_default, option=_OPTIONS)


def dumps_str(obj: Any) -> str:
    """`dumps` as text (SQLAlchemy's ``json_serializer`` wants ``str``)."""
    return dumps(obj).decode()


_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # a digit to "0", any other byte to " "
_LONG_DIGITS = b"0" * 20  # 20 digits in a row: maybe an integer past 64 bits, which orjson reads as a float


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON; the standard library reads a text orjson would read differently (an integer beyond 64 bits) or
    refuses (the non-standard ``NaN``/``Infinity`` tokens)."""
    raw = data.encode() if isinstance(data, str) else bytes(data) if isinstance(data, memoryview) else data
    if _LONG_DIGITS in raw.translate(_DIGITS):
        return json.loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)
