"""Base model for configs: unknown keys are errors, models are frozen, hashing is canonical."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys, NaN and infinities are errors naming the field (``allow_inf_nan``: a config number is finite)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    def canonical_json(self) -> str:
        """Sorted-key JSON of the model with defaults filled in: the input of `content_hash`."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def content_hash(self, n: int = 16) -> str:
        """Hex SHA-256 prefix of the canonical JSON: a deterministic id for caches and trace ids."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:n]
