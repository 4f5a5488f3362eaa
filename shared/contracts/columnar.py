"""Columnar batches: a pydantic model whose list fields all have the same length.

Subclasses declare ``list[...]`` fields only; ``to_numpy()`` gives arrays without copying row objects, and
``from_rows`` / ``rows()`` convert for CSV export.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import cache
from typing import Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator


class Columnar(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def columns(cls) -> list[str]:
        return list(cls.model_fields)

    @model_validator(mode="after")
    def _same_length(self) -> Self:
        lengths = {name: len(getattr(self, name)) for name in type(self).model_fields}
        if len(set(lengths.values())) > 1:
            first = next(iter(lengths))
            bad = next(n for n, v in lengths.items() if v != lengths[first])
            raise ValueError(f"column {bad!r} has {lengths[bad]} values but {first!r} has {lengths[first]}")
        return self

    def __len__(self) -> int:
        first = _first_column(type(self))
        return len(getattr(self, first)) if first is not None else 0

    @classmethod
    def empty(cls) -> Self:
        return cls.model_validate({name: [] for name in cls.model_fields})

    @classmethod
    def from_columns(cls, cols: Mapping[str, Sequence[Any] | np.ndarray]) -> Self:
        return cls.model_validate({k: (v.tolist() if isinstance(v, np.ndarray) else list(v)) for k, v in cols.items()})

    def to_numpy(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(getattr(self, name)) for name in type(self).model_fields}

    def rows(self) -> Iterator[tuple[Any, ...]]:
        return zip(*(getattr(self, name) for name in type(self).model_fields), strict=True)

    @classmethod
    def concat(cls, parts: Sequence[Self]) -> Self:
        out: dict[str, list[Any]] = {name: [] for name in cls.model_fields}
        for p in parts:
            for name in cls.model_fields:
                out[name].extend(getattr(p, name))
        return cls.model_validate(out)


@cache
def _first_column(cls: type[Columnar]) -> str | None:
    """The first declared column of a batch class (looked up once: ``model_fields`` is slow to read per call)."""
    return next(iter(cls.model_fields), None)
