"""Plain functions behind the placement endpoints (tests call them directly).

What placement needs from other services it asks them over HTTP (``shared.peers``: the same path embedded and in the
cluster): the thermal service's influence matrix H when a request has none, the workload service's expert count of
a model. ``peers`` None: a request must carry those facts itself (a 422 names the missing field)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from services.placement.balance import balance
from services.placement.default import default_placement
from services.placement.geometry import ChipGeometry
from services.placement.placer import PulseFn, build_placement
from services.placement.shards import check_shards
from services.placement.tacs import tacs_step, validate_inputs
from services.placement.taps import check_size, validate_loads
from shared.client import ServiceClients
from shared.configs import ArchConfig
from shared.configs.tas import TacsParams
from shared.configs.workload import InlineModel
from shared.content import ContentStore, M, arch_store, content_hash, object_or_hash, placement_store, state_store
from shared.contracts.placement import Placement, ReplicaState
from shared.contracts.placement_api import (
    BalanceRequest,
    BalanceResponse,
    InfluenceRegistration,
    PlacementRequest,
    TacsEpochRequest,
    TacsEpochResponse,
    TacsStepRequest,
    TacsStepResponse,
)
from shared.contracts.registry import Registered
from shared.errors import BadInput, TasmoeError, UpstreamError
from shared.lru import LRU
from shared.peers import (
    activated_experts,
    influence_array,
    pulse_arrays,
    routed_experts,
    thermal_influence,
    thermal_pulse_response,
)


def _model_count(req: PlacementRequest, peers: ServiceClients | None,
                 ask: Callable[[ServiceClients, str | InlineModel], int], field: str, what: str) -> int:
    """A count the workload service knows of the request's model (``ask``: e.g. its routed experts); a 422 naming
    ``field`` when it is 0 (a dense model), the model is unknown, or there is no workload service to ask."""
    n = 0
    if peers is not None:
        try:
            n = ask(peers, req.workload.model)
        except (UpstreamError, TasmoeError):
            n = -1
    if n <= 0:
        why = ("has no routed experts" if n == 0 else "is unknown to the workload service") if peers is not None \
            else "cannot be asked of a workload service here"
        raise BadInput(f"{field} is required {what}(workload.model {req.workload.model_name!r} {why})", field=field)
    return n


def _n_experts_of(req: PlacementRequest, peers: ServiceClients | None) -> int:
    """The request's ``n_experts``, else the workload service's count for the workload's model."""
    if req.n_experts is not None:
        return req.n_experts
    return _model_count(req, peers, routed_experts, "n_experts", "with method=default and no expert_load ")


def with_model_topk(req: PlacementRequest, peers: ServiceClients | None) -> PlacementRequest:
    """The request with its workload's experts per token: ``workload.routing.topk`` when given, else its model's
    (``num_experts_per_tok``, the workload service's count); a 422 naming ``workload.routing.topk`` when neither is
    known."""
    r = req.workload.routing
    if r.topk is not None:
        return req
    k = _model_count(req, peers, activated_experts, "workload.routing.topk", "")
    wl = req.workload.model_copy(update={"routing": r.model_copy(update={"topk": k})})
    return req.model_copy(update={"workload": wl})


def with_thermal_h(req: PlacementRequest, peers: ServiceClients | None) -> PlacementRequest:
    """The request with H: its own, else the thermal service's for its arch (TAPS needs one; the default mapping
    does not). Without peers a TAPS request must carry H (422)."""
    if req.H is not None or req.method == "default":
        return req
    if peers is None:
        raise BadInput(f"H (cores x cores influence matrix, K/W) is required with method={req.method} here; the "
                       "thermal service's: GET /v1/models/{hash}/influence", field="H")
    return req.model_copy(update={"H": thermal_influence(peers, req.arch).H})


MAX_CORES = 4096  # the placer works with dense cores x cores matrices


def _check_mesh(n_cores: int) -> None:
    if n_cores > MAX_CORES:
        raise BadInput(f"the placement service handles meshes of up to {MAX_CORES} cores, got {n_cores}",
                       field="arch.mesh.cores")


def placement_for(req: PlacementRequest, peers: ServiceClients | None = None) -> Placement:
    """Default mapping or TAPS (heuristic / milp) for one request."""
    _check_mesh(req.arch.mesh.n_cores)
    if req.method == "default":
        if req.expert_load is not None:
            loads = validate_loads(req.expert_load)
            n_layers, n_e = loads.shape
        else:
            if req.moe_layers is None:
                raise BadInput("moe_layers (or expert_load) is required", field="moe_layers")
            n_layers, n_e = len(req.moe_layers), _n_experts_of(req, peers)
        layers = req.moe_layers if req.moe_layers is not None else list(range(n_layers))
        if len(layers) != n_layers:
            raise BadInput(f"moe_layers lists {len(layers)} layers but expert_load has {n_layers}",
                           field="moe_layers")
        check_size(n_layers * n_e, req.arch.mesh.n_cores)
        check_shards(n_layers * n_e, req.expert_bytes, req.workload.tensors.weight_shard_mb)
        return default_placement(req.arch, layers, n_e, req.workload.tensors.weight_shard_mb, int(req.expert_bytes))
    expert_load = req.expert_load
    if expert_load is None:
        raise BadInput(f"expert_load is required with method={req.method}", field="expert_load")
    loads = validate_loads(expert_load)  # a bad request is refused before another service is asked anything
    check_size(loads.shape[0] * loads.shape[1], req.arch.mesh.n_cores)
    check_shards(loads.shape[0] * loads.shape[1], req.expert_bytes, req.workload.tensors.weight_shard_mb)
    H_vault, pulse, vault_influence = None, None, None
    if peers is not None and req.method == "heuristic":
        infl = thermal_influence(peers, req.arch)
        H_thermal = influence_array(infl)
        if req.H is None or np.array_equal(np.asarray(req.H, dtype=float), H_thermal):
            # the thermal service's own H: its vault matrix and pulse responses belong with it (the slot model)
            req = req.model_copy(update={"H": infl.H})
            H_vault = np.asarray(infl.H_vault, dtype=float) if infl.H_vault else None
            pulse = _pulse_fn(req, peers)
            vault_influence = _vault_influence_fn(req, peers)
    req = with_model_topk(with_thermal_h(req, peers), peers)
    H = None if req.H is None else np.asarray(req.H, dtype=float)
    return build_placement(req.arch, req.workload, req.tas.taps, expert_load, req.expert_flops_per_token, H,
                           moe_layers=req.moe_layers, expert_bytes=int(req.expert_bytes), method=req.method,
                           H_vault=H_vault, pulse=pulse, nonexpert_flops_per_step=req.nonexpert_flops_per_step,
                           nonexpert_bytes_per_step=req.nonexpert_bytes_per_step, vault_influence=vault_influence)


def _pulse_fn(req: PlacementRequest, peers: ServiceClients) -> PulseFn:
    """The thermal service's pulse responses of the request's arch, as the placer asks for them."""
    def pulse(slot_s: float, lags: int, vault_dies: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
        try:
            r = thermal_pulse_response(peers, req.arch, slot_s * 1e3, lags,
                                       vault_dies=None if vault_dies is None else vault_dies.tolist())
        except BadInput as exc:  # a stack too large for the pulse responses: the steady model alone (placer notes it)
            if exc.field != "lags":
                raise
            return None
        _check_dies_answered(vault_dies, r.vault_dies, "pulse-response")
        return pulse_arrays(r)
    return pulse


def _vault_influence_fn(req: PlacementRequest, peers: ServiceClients) -> Callable[[np.ndarray], np.ndarray]:
    """The thermal service's H_vault of the request's arch for a vault's watt in given shares per DRAM die."""
    def vault_influence(vault_dies: np.ndarray) -> np.ndarray:
        infl = thermal_influence(peers, req.arch, vault_dies=vault_dies.tolist())
        _check_dies_answered(vault_dies, infl.vault_dies, "influence")
        return np.asarray(infl.H_vault, dtype=float)
    return vault_influence


def _check_dies_answered(asked: np.ndarray | None, answered: list[float] | None, what: str) -> None:
    """The thermal service answered for the die shares asked (one that ignores ``vault_dies`` answers None)."""
    if asked is not None and (answered is None or not np.allclose(answered, asked / asked.sum(), atol=1e-9)):
        raise UpstreamError(f"the thermal service's {what} did not answer for vault_dies {asked.tolist()} "
                            f"(it answered {answered}): an older thermal service?")


class PulseCache:
    """The thermal service's pulse responses TACS's look-ahead asked for, by (arch hash, slot, lags): an LRU of
    ``capacity`` entries (``TASMOE_CACHE_SIZE``); each is computed once by the thermal service (~1 s on the default
    chip) and used by every window of every run on that chip."""

    def __init__(self, capacity: int) -> None:
        self._items: LRU[tuple[str, float, int], tuple[np.ndarray, np.ndarray]] = LRU(capacity)

    def get(self, arch: ArchConfig, slot_ms: float, lags: int, peers: ServiceClients | None
            ) -> tuple[np.ndarray, np.ndarray]:
        key = (content_hash(arch), float(slot_ms), int(lags))
        hit = self._items.get(key)
        if hit is not None:
            return hit
        if peers is None:
            raise BadInput("params.lookahead_windows > 0 needs the thermal service's pulse responses, and this "
                           "service has no way to it here", field="params.lookahead_windows")
        try:
            r = thermal_pulse_response(peers, arch, slot_ms, lags)
        except BadInput as exc:  # e.g. a stack too large for the pulse responses
            raise BadInput(f"params.lookahead_windows: the thermal service cannot give the pulse responses: "
                           f"{exc.message}", field="params.lookahead_windows") from None
        return self._items.keep(key, pulse_arrays(r))

    def clear(self) -> None:
        self._items.clear()


@dataclass(frozen=True)
class RunData:
    """What callers registered for their runs (``POST /v1/registry/...``), by content hash: LRUs of
    ``TASMOE_CACHE_SIZE`` entries per kind, kept on the app (``shared.content``)."""

    archs: ContentStore[ArchConfig]
    placements: ContentStore[Placement]
    params: ContentStore[TacsParams]
    influence: ContentStore[InfluenceRegistration]
    states: ContentStore[ReplicaState]  # the replica states TACS answered (TASMOE_STATE_CACHE_SIZE), by hash
    pulses: PulseCache  # TACS look-ahead: the thermal service's pulse responses

    @classmethod
    def of(cls, capacity: int, state_capacity: int = 64) -> RunData:
        return cls(archs=arch_store(capacity), placements=placement_store(capacity),
                   params=ContentStore("tacs_params", capacity, field="params_hash", path="/v1/registry/tacs-params"),
                   influence=ContentStore("influence", capacity, field="H_hash", path="/v1/registry/influence"),
                   states=state_store("replica_state", state_capacity), pulses=PulseCache(capacity))

    def clear(self) -> None:
        """Forget the registered run data (the replica states are not run data: ``states.clear()``)."""
        for store in (self.archs, self.placements, self.params, self.influence):
            store.clear()
        self.pulses.clear()


def register(store: ContentStore[M], obj: M) -> Registered:
    key, size = store.put(obj)
    return Registered(kind=store.kind, hash=key, bytes=size)


DEFAULT_ARCH = ArchConfig()
DEFAULT_TACS = TacsParams()


@dataclass(frozen=True)
class _TacsRun:
    """A TACS request's fixed objects, resolved (inline or by the hashes the service knows)."""

    arch: ArchConfig
    placement: Placement
    params: TacsParams
    H: np.ndarray
    pulse: tuple[np.ndarray, np.ndarray] | None


def _tacs_run(req: TacsStepRequest | TacsEpochRequest, data: RunData, peers: ServiceClients | None,
              pulse_peers: ServiceClients | None, check: Callable[[ArchConfig, Placement], None]) -> _TacsRun:
    """The arch, placement, params, H and (with a look-ahead) the pulse responses of a TACS request. ``check``
    validates the request's own fields before a missing H is named."""
    arch = object_or_hash(req.arch, req.arch_hash, data.archs, field="arch", default=DEFAULT_ARCH)
    _check_mesh(arch.mesh.n_cores)
    placement = object_or_hash(req.placement, req.placement_hash, data.placements, field="placement")
    params = object_or_hash(req.params, req.params_hash, data.params, field="params", default=DEFAULT_TACS)
    check(arch, placement)  # the request's own fields first: a bad one is named before a missing H is
    if req.H is not None and req.H_hash is not None:
        raise BadInput("H: give H or H_hash, not both", field="H")
    if req.H_hash is not None:
        H = np.asarray(data.influence.get(req.H_hash).H, dtype=float)
    elif req.H is not None:
        H = np.asarray(req.H, dtype=float)
    elif peers is not None:
        H = influence_array(thermal_influence(peers, arch))
    else:
        raise BadInput("H (cores x cores influence matrix, K/W) is required here (or H_hash: its hash from POST "
                       "/v1/registry/influence); the thermal service's: GET /v1/models/{hash}/influence", field="H")
    pulse = data.pulses.get(arch, params.window_ms, params.lookahead_windows, pulse_peers or peers) \
        if params.lookahead_windows > 0 else None
    return _TacsRun(arch=arch, placement=placement, params=params, H=H, pulse=pulse)


def tacs_for(req: TacsStepRequest, peers: ServiceClients | None = None,
             data: RunData | None = None, *, pulse_peers: ServiceClients | None = None) -> TacsStepResponse:
    """One TACS step; the run's fixed objects inline or by the hashes ``data`` knows (`RunData`). ``peers``: where a
    missing H comes from (None: a 422 naming H); ``pulse_peers`` (default ``peers``): where the look-ahead's pulse
    responses come from."""
    data = data or RunData.of(1)
    # no replica state: no change yet (every expert at its placement cores)
    state = object_or_hash(req.state, req.state_ref, data.states, field="state", default=ReplicaState())
    run = _tacs_run(req, data, peers, pulse_peers, lambda arch, placement: validate_inputs(
        req.telemetry, placement, state, ChipGeometry.of(arch), req.smoothed))
    overlays, new, smoothed = tacs_step(req.telemetry, run.placement, state, run.params, run.arch, run.H,
                                        req.pending, req.smoothed, req.now_ns, bank_bw_gbps=req.bank_bw_gbps,
                                        pulse=run.pulse)
    if new is state and req.state_ref is not None:  # no move: the very state kept under that name (no re-hash)
        ref = req.state_ref
        data.states.keep(ref, new)  # kept as an answered state is, should it have left the cache meanwhile
    else:
        ref, _ = data.states.put(new)
    send = req.return_state or new != state
    return TacsStepResponse(overlays=overlays, state=new if send else None, state_ref=ref, smoothed=smoothed)


def tacs_epoch(req: TacsEpochRequest, peers: ServiceClients | None = None, data: RunData | None = None, *,
               pulse_peers: ServiceClients | None = None) -> TacsEpochResponse:
    """TACS's decisions for the windows of a control epoch (``POST /v1/tacs/epoch``): step after step, each from the
    smoothed temperatures the one before left, until a decision acts (non-empty overlays). Each decision is exactly
    what `tacs_for` answers for that window alone; the caller discards the windows it physicalized past the one that
    acted."""
    data = data or RunData.of(1)
    state = req.state if req.state is not None else ReplicaState()

    def check(arch: ArchConfig, placement: Placement) -> None:
        geom = ChipGeometry.of(arch)
        for i, step in enumerate(req.steps):
            try:
                validate_inputs(step.telemetry, placement, state, geom, req.smoothed if i == 0 else None)
            except BadInput as exc:
                if exc.field and exc.field.startswith("telemetry"):
                    exc.field = f"steps[{i}].{exc.field}"
                raise

    run = _tacs_run(req, data, peers, pulse_peers, check)
    smoothed = req.smoothed
    seen: list[list[float]] = []
    for i, step in enumerate(req.steps):
        overlays, new, smoothed = tacs_step(step.telemetry, run.placement, state, run.params, run.arch, run.H,
                                            step.pending, smoothed, step.now_ns, bank_bw_gbps=req.bank_bw_gbps,
                                            pulse=run.pulse)
        seen.append(smoothed)
        if not overlays.is_empty():
            return TacsEpochResponse(smoothed=seen, acted=i, overlays=overlays,
                                     state=new if new != state else None)
    return TacsEpochResponse(smoothed=seen)


def balance_for(req: BalanceRequest) -> BalanceResponse:
    return BalanceResponse.model_validate(balance(req.loads, req.cores, req.slots))
