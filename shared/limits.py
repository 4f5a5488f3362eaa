"""Upper bounds of what one request may ask for (one request, bounded cost), in one place.

A bound is derived from what it costs: a dimension bounds the products the analytic cost models form (M·K·N ≤ 2⁶⁰
stays an exact float and far from int64 overflow), a list length bounds the loop over it. The bounds are listed in
docs/operations.md, "Security and limits"; configs have their own next to their fields (shared/configs), the thermal
grid and the trace windows theirs next to the code that allocates (shared/configs/arch.py,
services/workload/traces.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Protocol

from pydantic import Field

MAX_DIM = 1 << 20
"""One tensor dimension (tokens, hidden size, heads, head dim, FFN width, experts, ...): 1,048,576. The largest
dimension of a public model is its vocabulary (~2.6e5); three of them multiply to ≤ 2⁶⁰."""
MAX_ITEMS = 4096
"""Items of one request list (ops, blocks, per-expert token counts)."""

Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
"""A positive tensor dimension, bounded by ``MAX_DIM``."""
DimOrZero = Annotated[int, Field(ge=0, le=MAX_DIM)]
"""A tensor dimension that may be 0 (cached tokens, a layer index), bounded by ``MAX_DIM``."""
MAX_EXPERTS = 4096
"""Routed experts of one MoE layer (and top-k): the largest public models route over 256-384."""
MAX_LAYERS = 1024
"""Transformer layers of one model: the largest public models have ~128."""
MAX_POSITIONS = 1 << 30
"""A model's context length (max_position_embeddings; public configs go to ~1e7). Never allocated from."""
MAX_STAGES = 65536
"""Stages of one `/v1/lower/stages` request: a block is ~30 stages plus ~5 per selected expert."""

MAX_EPOCH_WINDOWS = 1024
"""Windows of one control epoch (one call of a service's ``.../epoch`` endpoint): the window loop grows its epochs to
a few hundred windows while nothing happens."""

Experts = Annotated[int, Field(ge=1, le=MAX_EXPERTS)]
Layers = Annotated[int, Field(ge=1, le=MAX_LAYERS)]


def cache_size() -> int:
    """``TASMOE_CACHE_SIZE``: entries of a service's in-process caches (models, solvers, traces). Settings are read
    on first use (``shared.settings``), so a module that keeps a cache does not load pydantic-settings at import."""
    from shared.settings import get_settings

    return get_settings().cache_size


def thermal_cache_size() -> int:
    """``TASMOE_THERMAL_CACHE_SIZE``: stack models, spectral solvers and influence matrices a thermal process keeps
    (each model can hold hundreds of MB, so this is smaller than ``cache_size``). Read on first use."""
    from shared.settings import get_settings

    return get_settings().thermal_cache_size


THERMAL_CACHE_NODES = 2**22  # grid nodes of the stack models (and their solvers) a thermal process keeps at once


class _Nodes(Protocol):
    @property
    def n_nodes(self) -> int: ...


class _OnNetwork(Protocol):  # a stack model or a solver: its RC network's grid nodes
    @property
    def net(self) -> _Nodes: ...


def over_thermal_budget(entries: Sequence[_OnNetwork]) -> bool:
    """Whether a thermal cache holding ``entries`` (stack models or solvers, each on its RC network) must evict its
    oldest: more entries than ``TASMOE_THERMAL_CACHE_SIZE``, or more grid nodes in all than ``THERMAL_CACHE_NODES`` (a
    model of 2^20 nodes with its solver's factors takes GBs: eight of them filled a 24 GiB machine); the newest entry
    always stays. The ``over`` rule of those caches (`shared.lru.LRU`)."""
    n = len(entries)
    return n > 1 and (n > thermal_cache_size() or sum(e.net.n_nodes for e in entries) > THERMAL_CACHE_NODES)
