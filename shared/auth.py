"""API keys: who may call a service, and what they may do.

A key is ``tsk_<id>_<secret>`` (``id``: 8 hex digits, ``secret``: 32 random bytes, URL-safe base64). The key file
(JSON, ``TASMOE_KEYS_FILE``, default ``<results_dir>/keys.json``) keeps, per key, its id, principal, scope and the
SHA-256 of the whole key — never the key. (A key is 256 random bits, so a fast hash suffices: there is no password to
guess; a stolen file gives no key.) Every service reads the same file (Compose: a volume; Kubernetes: a Secret),
again whenever it changes, so `tasmoe keys create` takes effect without a restart.

Scopes, each including the ones before it:

- ``read``: GET (list and read its principal's experiments and sweeps, their results and logs without server paths);
- ``submit``: also POST/DELETE (create, cancel, retry its own experiments and sweeps; the compute endpoints);
- ``admin``: also every principal's experiments and the server's full logs.

Service-to-service calls carry ``TASMOE_SERVICE_KEY`` (a key of scope ``admin``, principal ``service``).

``TASMOE_AUTH=off`` (the default) checks nothing: every caller is the principal ``local`` with scope ``admin``. The
services then refuse to listen on anything but a loopback address (`check_bind`): the laptop default stays
zero-set-up, and exposing a port takes ``TASMOE_AUTH=keys`` (the first start without a key creates an admin key and
prints it once).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from shared.errors import BadInput

Scope = Literal["read", "submit", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "submit", "admin")
LOCAL = "local"  # the principal of every request when TASMOE_AUTH=off
_KEY = re.compile(r"^tsk_([0-9a-f]{8})_([A-Za-z0-9_-]{20,100})$")
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
PUBLIC_PATHS = frozenset({"/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json",
                          "/docs-static/swagger-ui-bundle.js", "/docs-static/swagger-ui.css",
                          "/docs-static/redoc.standalone.js", "/docs-static/favicon.png", "/ui"})
PUBLIC_PREFIXES = ("/ui/",)  # the orchestrator's dashboard: static files, no data (the data needs a key or token)


@dataclass(frozen=True)
class Principal:
    name: str
    scope: Scope
    key_id: str | None = None

    def allows(self, needed: Scope) -> bool:
        return SCOPES.index(self.scope) >= SCOPES.index(needed)

    @property
    def admin(self) -> bool:
        return self.scope == "admin"


LOCAL_ADMIN = Principal(LOCAL, "admin")
ANONYMOUS = Principal("-anonymous-", "read")  # a public path's caller (health, docs): owns nothing, sees nothing


def needed_scope(method: str) -> Scope:
    """What a request needs: reading for GET/HEAD/OPTIONS, submitting for anything that changes state."""
    return "read" if method.upper() in {"GET", "HEAD", "OPTIONS"} else "submit"


def new_key() -> str:
    """``tsk_<8 hex>_<43 URL-safe characters>``: 32 random bytes of secret."""
    return f"tsk_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class KeyStore:
    """The key file: read on demand (again when its modification time changes), written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[str, dict[str, Any]] = {}

    def _load(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                self._stamp, self._keys = None, {}
                return self._keys
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                try:
                    rows = json.loads(self.path.read_text(encoding="utf-8")).get("keys", [])
                except (OSError, ValueError, AttributeError) as exc:
                    raise BadInput(f"key file {self.path} is not readable JSON: {exc}", field="keys_file") from None
                self._keys = {str(r["id"]): r for r in rows if isinstance(r, dict) and "id" in r}
                self._stamp = stamp
            return self._keys

    def records(self) -> list[dict[str, Any]]:
        """Every key's record (id, principal, scope, created, revoked; never the key)."""
        return [{k: v for k, v in r.items() if k != "sha256"} for r in self._load().values()]

    def verify(self, key: str) -> Principal | None:
        """The principal of a presented key, or None (unknown, revoked or malformed)."""
        m = _KEY.match(key)
        if m is None:
            return None
        rec = self._load().get(m.group(1))
        if rec is None or rec.get("revoked") or not hmac.compare_digest(str(rec.get("sha256", "")), _digest(key)):
            return None
        scope = rec.get("scope")
        if scope not in SCOPES:
            return None
        return Principal(str(rec["principal"]), scope, m.group(1))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[dict[str, Any]]]:
        """Read-modify-write under an exclusive lock on ``<file>.lock`` (six services starting at once must not lose
        each other's key); yields the current rows, written back when the block ends without error."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with self._lock:
                self._stamp = None
            rows = [dict(r) for r in self._load().values()]
            before = json.dumps(rows, sort_keys=True)
            yield rows
            if json.dumps(rows, sort_keys=True) != before:
                self._write(rows)

    @staticmethod
    def _check(principal: str, scope: str) -> None:
        if not _PRINCIPAL.match(principal):
            raise BadInput(f"principal {principal!r}: letters, digits and . _ @ - only, at most 64", field="principal")
        if scope not in SCOPES:
            raise BadInput(f"scope {scope!r}: one of {', '.join(SCOPES)}", field="scope")

    def active(self, key_id: str) -> bool:
        """Whether the key of this id is in the file and not revoked (a link token of a revoked key opens nothing)."""
        rec = self._load().get(key_id)
        return rec is not None and not rec.get("revoked")

    def create(self, principal: str, scope: Scope) -> str:
        """A new key (returned once; only its hash is stored)."""
        self._check(principal, scope)
        key = new_key()
        key_id = key.split("_")[1]
        with self._locked() as rows:
            rows.append({"id": key_id, "principal": principal, "scope": scope, "sha256": _digest(key),
                         "created": _now()})
        return key

    def ensure(self, key: str, principal: str, scope: Scope) -> None:
        """Register a key made elsewhere (``TASMOE_SERVICE_KEY``: the deployment's secret) if it is not there yet."""
        self._check(principal, scope)
        m = _KEY.match(key)
        if m is None:
            raise BadInput("TASMOE_SERVICE_KEY: expected tsk_<8 hex digits>_<at least 20 of A-Z a-z 0-9 _ ->, e.g. "
                           "from tasmoe keys create", field="service_key")
        with self._locked() as rows:
            if not any(r["id"] == m.group(1) for r in rows):
                rows.append({"id": m.group(1), "principal": principal, "scope": scope, "sha256": _digest(key),
                             "created": _now()})

    def first_admin_key(self) -> str | None:
        """A new admin key when the file holds no active key (the first start of TASMOE_AUTH=keys), else None."""
        with self._locked() as rows:
            if any(not r.get("revoked") for r in rows):
                return None
            key = new_key()
            rows.append({"id": key.split("_")[1], "principal": "admin", "scope": "admin", "sha256": _digest(key),
                         "created": _now()})
            return key

    def revoke(self, key_id: str) -> None:
        with self._locked() as rows:
            hit = [r for r in rows if r["id"] == key_id]
            if not hit:
                raise BadInput(f"no key {key_id!r} in {self.path}", field="id")
            hit[0]["revoked"] = _now()

    def _write(self, rows: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # hashes only, still nobody else's business
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"keys": rows}, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, self.path)
        with self._lock:
            self._stamp = None


def is_loopback(host: str) -> bool:
    if host in {"localhost", ""}:
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: str) -> None:
    """Refuse to listen beyond loopback without authentication."""
    if auth == "off" and not is_loopback(host):
        raise BadInput(f"refusing to serve on {host} with TASMOE_AUTH=off (anyone who reaches the port could read, "
                       "submit and cancel): set TASMOE_AUTH=keys (keys: tasmoe keys create --scope ...) or listen on "
                       "127.0.0.1", field="host")


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    if not header:
        return None
    kind, _, token = header.partition(" ")
    return token.strip() if kind.lower() == "bearer" and token.strip() else None


_ABS_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]*")


def redact_paths(text: str) -> str:
    """Server paths out of a text shown to a non-admin (``/srv/x/results/run.log`` -> ``<path>/run.log``)."""
    return _ABS_PATH.sub(lambda m: "<path>/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)
