"""Link tokens: short-lived, HMAC-signed read access to ONE experiment for ONE principal, passed as ``?token=`` where
a browser cannot send an ``Authorization`` header (an ``EventSource`` stream, an ``<img>`` of a figure, a download
link of the dashboard).

A token is ``<payload>.<signature>``: the payload is the URL-safe base64 of ``{"e": experiment id, "p": principal,
"s": scope, "k": key id, "x": expiry (Unix seconds)}``, the signature the URL-safe base64 of its HMAC-SHA256 under
the server's link secret. A principal gets one for an experiment it can see (``GET /v1/experiments/{id}/token``,
with its bearer key); the auth middleware accepts it instead of a key only

- on a GET of that experiment's own read-only paths (``/v1/experiments/{id}``, ``.../events``, ``.../windows``,
  ``.../series``, ``.../map``, ``.../trace``, ``.../files/...``, ...; never ``.../token``, so a token cannot renew
  itself, and never another experiment's path),
- before its expiry (``TASMOE_LINK_TOKEN_TTL_S``, 10 minutes by default), and
- while the key that asked for it is not revoked.

The request then runs as that principal, so the route's own visibility check (its owner, or an admin) still applies.
The token is not a key: it opens nothing else, and a leaked one (a URL in a proxy log) expires by itself.

The secret: ``TASMOE_LINK_SECRET`` when set (every orchestrator replica the same); else derived from
``TASMOE_SERVICE_KEY`` (Compose and Kubernetes set it for every container: a one-way derivation, the service key
cannot be recovered from it); else random per process (a single ``tasmoe serve``: its tokens end with it, and the page
asks for a new one).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from shared.auth import SCOPES, KeyStore, Principal

# the experiment paths a token opens: the experiment itself and its read-only sub-resources (not /token)
_TOKEN_PATH = re.compile(r"^/v1/experiments/([A-Za-z0-9_.-]{1,120})"
                         r"(?:|/(?:events|windows|series|map|trace|results|power|log|files|archive)|/files/.+)$")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def experiment_of_path(path: str) -> str | None:
    """The experiment id of a path a token may open (None: a token opens nothing there)."""
    m = _TOKEN_PATH.match(path)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Grant:
    """What a valid token grants on a request: its principal, until ``expires_at`` (Unix seconds)."""

    principal: Principal
    expires_at: int


@dataclass(frozen=True)
class IssuedToken:
    token: str
    experiment: str
    expires_at: int  # Unix seconds
    ttl_s: int


class LinkTokens:
    """Issues and checks link tokens under one secret. ``store``: the key store whose revocations end the tokens of
    a revoked key (None when keys are off: every caller is the local admin and no token is checked)."""

    def __init__(self, secret: bytes, ttl_s: int, store: KeyStore | None = None) -> None:
        if len(secret) < 16:
            raise ValueError("a link secret needs at least 16 bytes")
        self._secret = secret
        self.ttl_s = ttl_s
        self.store = store

    @classmethod
    def from_settings(cls, link_secret: str, service_key: str, ttl_s: int,
                      store: KeyStore | None = None) -> LinkTokens:
        """The secret as the module docstring orders it: explicit, else derived from the service key, else random."""
        if link_secret:
            secret = link_secret.encode()
        elif service_key:
            secret = hmac.new(service_key.encode(), b"tasmoe link tokens v1", hashlib.sha256).digest()
        else:
            secret = secrets.token_bytes(32)
        return cls(secret, ttl_s, store)

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._secret, payload.encode("ascii"), hashlib.sha256).digest())

    def issue(self, principal: Principal, experiment: str, now: float | None = None) -> IssuedToken:
        expires = int(now if now is not None else time.time()) + self.ttl_s
        body = {"e": experiment, "p": principal.name, "s": principal.scope, "k": principal.key_id, "x": expires}
        payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
        return IssuedToken(f"{payload}.{self._sign(payload)}", experiment, expires, self.ttl_s)

    def verify(self, token: str, path: str, method: str, now: float | None = None) -> Grant | None:
        """What a token grants on this request, or None: a GET (or HEAD) of a path of the token's own experiment, a
        valid signature, not expired, its key not revoked."""
        if method.upper() not in {"GET", "HEAD"} or len(token) > 1024:
            return None
        exp_id = experiment_of_path(path)
        payload, _, sig = token.partition(".")
        if exp_id is None or not payload or not hmac.compare_digest(sig.encode(), self._sign(payload).encode()):
            return None
        try:
            body: dict[str, Any] = json.loads(_unb64(payload))
        except ValueError:
            return None
        if body.get("e") != exp_id or not isinstance(body.get("x"), int):
            return None
        if body["x"] <= (now if now is not None else time.time()):
            return None
        scope, key_id = body.get("s"), body.get("k")
        if scope not in SCOPES or not isinstance(body.get("p"), str):
            return None
        if self.store is not None and (key_id is None or not self.store.active(str(key_id))):
            return None
        return Grant(Principal(body["p"], scope, key_id), body["x"])
