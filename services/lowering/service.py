"""Plain functions behind the lowering endpoints (tests call these directly; the HTTP layer only parses)."""

from __future__ import annotations

from dataclasses import dataclass

from services.lowering.physical import physicalize_window
from shared.chip import Chip
from shared.configs import ArchConfig
from shared.content import ContentStore, arch_store, object_or_hash, placement_store
from shared.contracts.events import PhysicalizeRequest, PhysicalizeResponse
from shared.contracts.placement import Placement
from shared.contracts.registry import Registered

DEFAULT_ARCH = ArchConfig()


@dataclass(frozen=True)
class RunData:
    """What callers registered for their runs (``POST /v1/registry/...``), by content hash: LRUs of
    ``TASMOE_CACHE_SIZE`` entries per kind, kept on the app (``shared.content``)."""

    archs: ContentStore[ArchConfig]
    placements: ContentStore[Placement]

    @classmethod
    def of(cls, capacity: int) -> RunData:
        return cls(archs=arch_store(capacity), placements=placement_store(capacity))

    def clear(self) -> None:
        self.archs.clear()
        self.placements.clear()


def register_arch(data: RunData, arch: ArchConfig) -> Registered:
    key, size = data.archs.put(arch)
    return Registered(kind="arch", hash=key, bytes=size)


def register_placement(data: RunData, placement: Placement) -> Registered:
    key, size = data.placements.put(placement)
    return Registered(kind="placement", hash=key, bytes=size)


def default_freqs(arch: ArchConfig) -> list[float]:
    """Every core at the top step of its DVFS domain."""
    chip = Chip.from_arch(arch)
    steps = [d.steps_ghz[0] for d in arch.dvfs.domains]
    return [steps[d] for d in chip.core_domain]


def physicalize(req: PhysicalizeRequest, data: RunData | None = None) -> PhysicalizeResponse:
    """One window. ``data``: the registered run data the request's hashes name (None: a hash is unknown here)."""
    data = data or RunData.of(1)
    placement = object_or_hash(req.placement, req.placement_hash, data.placements, field="placement")
    arch = object_or_hash(req.arch, req.arch_hash, data.archs, field="arch", default=DEFAULT_ARCH)
    freq = req.freq_ghz if req.freq_ghz is not None else default_freqs(arch)
    c, m, st, tm = physicalize_window(req.window, req.logical, placement, req.overlays, req.state, arch,
                                      freq, req.window_ms, req.bw_eff_factor, n_layers=req.n_layers)
    return PhysicalizeResponse(compute=c, memory=m, state=st, timing=tm)
