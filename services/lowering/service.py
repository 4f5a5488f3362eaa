"""Plain functions behind the lowering endpoints (tests call these directly; the HTTP layer only parses)."""

from __future__ import annotations

from dataclasses import dataclass

from services.lowering.physical import physicalize_one
from services.lowering.physical.serving import MicroBatchFn
from shared.configs import ArchConfig
from shared.content import ContentStore, arch_store, object_or_hash, placement_store, state_store
from shared.contracts.events import PhysicalizeRequest, PhysicalizeResponse, PhysicalState
from shared.contracts.placement import Placement, check_cores_in_mesh
from shared.contracts.registry import Registered
from shared.dvfs import top_freqs
from shared.errors import BadInput

DEFAULT_ARCH = ArchConfig()


@dataclass(frozen=True)
class RunData:
    """What callers registered for their runs (``POST /v1/registry/...``), by content hash: LRUs of
    ``TASMOE_CACHE_SIZE`` entries per kind, kept on the app (``shared.content``)."""

    archs: ContentStore[ArchConfig]
    placements: ContentStore[Placement]
    states: ContentStore[PhysicalState]  # the states physicalize answered (TASMOE_STATE_CACHE_SIZE), by hash

    @classmethod
    def of(cls, capacity: int, state_capacity: int = 64) -> RunData:
        return cls(archs=arch_store(capacity), placements=placement_store(capacity),
                   states=state_store("physical_state", state_capacity, kept_parts=("replicas",)))

    def clear(self) -> None:
        """Forget the registered run data (the window states are not run data: ``states.clear()``)."""
        self.archs.clear()
        self.placements.clear()


def register_arch(data: RunData, arch: ArchConfig) -> Registered:
    key, size = data.archs.put(arch)
    return Registered(kind="arch", hash=key, bytes=size)


def register_placement(data: RunData, placement: Placement) -> Registered:
    key, size = data.placements.put(placement)
    return Registered(kind="placement", hash=key, bytes=size)


def default_freqs(arch: ArchConfig) -> list[float]:
    """Every core at the top step of its DVFS domain (``shared.dvfs.top_freqs``)."""
    return top_freqs(arch)


def physicalize(req: PhysicalizeRequest, data: RunData | None = None,
                microbatches: MicroBatchFn | None = None) -> PhysicalizeResponse:
    """One window. ``data``: the registered run data the request's hashes name (None: a hash is unknown here).
    ``microbatches``: the workload service's rows of serving micro-batches (``req.serving``; the app passes its
    peer, a test the workload function)."""
    data = data or RunData.of(1)
    placement = object_or_hash(req.placement, req.placement_hash, data.placements, field="placement")
    arch = object_or_hash(req.arch, req.arch_hash, data.archs, field="arch", default=DEFAULT_ARCH)
    freq = req.freq_ghz if req.freq_ghz is not None else default_freqs(arch)
    state = object_or_hash(req.state, req.state_ref, data.states, field="state", default=PhysicalState())
    if req.replicas is not None:
        state = state.model_copy(update={"replicas": req.replicas})
    if req.replicas is not None or req.state is not None:  # a state this service answered was checked then
        check_cores_in_mesh({k: e.cores for k, e in state.replicas.experts.items()}, arch.mesh.n_cores,
                            "replicas.experts" if req.replicas is not None else "state.replicas.experts", nonempty=True)
    try:
        res = physicalize_one(req.window, req.logical, placement, req.overlays, state, arch, freq, req.window_ms,
                              req.bw_eff_factor, n_layers=req.n_layers, serving=req.serving,
                              microbatches=microbatches)
        deposit = res.deposit()
    except BadInput as exc:
        raise named_replicas(exc, req.replicas is not None) from None
    st = res.carry.to_state(res.ctx)
    ref, _ = data.states.put(st)
    return PhysicalizeResponse(
        compute=res.compute_events() if req.events else None, memory=res.memory_events() if req.events else None,
        deposit=deposit, state=st if req.return_state else None, state_ref=ref, timing=res.timing)


def named_replicas(exc: BadInput, given: bool) -> BadInput:
    """A replica state given as ``replicas`` is named so, not as the state's."""
    if given and exc.field and exc.field.startswith("state.replicas"):
        exc.field = "replicas" + exc.field[len("state.replicas"):]
        exc.message = exc.message.replace("state.replicas", "replicas")
    return exc
