"""One error base class, one JSON error body, one place that formats pydantic field paths.

Every service answers user errors with ``{"error": {"code", "message", "field"}}`` and a 4xx status; the CLI prints
the same message on one line and exits 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic is not imported at run time: `tasmoe hotspot` and `tasmoe --help` start without it
    from pydantic import ValidationError


class TasmoeError(Exception):
    """Base of all user-facing errors. ``status`` is the HTTP status; ``field`` the offending field path."""

    status: int = 400
    code: str = "bad_request"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        """The JSON error body (its schema: ``shared.service_app.ErrorBody``, tested to agree)."""
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}

    def __str__(self) -> str:
        return self.message


class BadInput(TasmoeError):
    status = 422
    code = "invalid"


class NotFound(TasmoeError):
    status = 404
    code = "not_found"


class Conflict(TasmoeError):
    status = 409
    code = "conflict"


class QuotaExceeded(TasmoeError):
    """Over a principal's quota (429); ``retry_after_s`` goes into the Retry-After header."""

    status = 429
    code = "quota"

    def __init__(self, message: str, *, field: str | None = None, retry_after_s: int = 60) -> None:
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s


class DatabaseUnavailable(TasmoeError):
    """The service's own database cannot be reached for now (a lost or refused connection, a server restarting):
    503 with Retry-After, an outage the client waits out, not a bug (500)."""

    status = 503
    code = "database_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ConfigError(TasmoeError):
    """A config file that cannot be read or does not validate (CLI exit 2, HTTP 422)."""

    status = 422
    code = "config_invalid"


class UpstreamError(TasmoeError):
    """A service this one called answered with an error or could not be reached."""

    status = 502
    code = "upstream"


class ServiceUnavailable(UpstreamError):
    """A service could not be reached, or answered 429/502/503/504, through all its retries: an outage, which a run
    waits out (``TASMOE_OUTAGE_BUDGET_S``), unlike a 500 (a bug) that fails it."""

    code = "unavailable"


def format_loc(loc: Sequence[str | int]) -> str:
    """Turn a pydantic location tuple into a field path: ``("mesh", "cores", 0)`` -> ``mesh.cores[0]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = str(part)
    return out


def _clean_msg(msg: str) -> str:
    # pydantic prefixes custom errors with "Value error, "; a user needs only the reason.
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def humanize(err: Any) -> str:
    """A short message for one pydantic error dict (``must be >= 1``, ``unknown key``, ``required``)."""
    typ = str(err.get("type", ""))
    ctx = err.get("ctx") or {}
    if typ in _BOUNDS:
        bound = next(iter(v for k, v in ctx.items() if k in {"gt", "ge", "lt", "le"}), "?")
        return f"must be {_BOUNDS[typ]} {bound}"
    if typ == "extra_forbidden":
        return "unknown key"
    if typ == "missing":
        return "required"
    return _clean_msg(str(err.get("msg", "invalid")))


def first_validation_error(exc: ValidationError, *, skip_loc_prefix: int = 0) -> tuple[str, str]:
    """(field path, message) of the first error in a pydantic ValidationError."""
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"][skip_loc_prefix:] if not (isinstance(p, str) and p.startswith("function-")))
    return format_loc(loc), humanize(err)


def validation_errors(errors: Sequence[Any], *, skip_loc_prefix: int = 0) -> list[dict[str, str]]:
    """All errors of a pydantic/FastAPI validation failure as ``{"field", "message"}`` dicts."""
    out = []
    for err in errors:
        loc = tuple(p for p in err["loc"][skip_loc_prefix:])
        out.append({"field": format_loc(loc), "message": humanize(err)})
    return out
