"""A service's way to the other services ("peers"): HTTP through `ServiceClients`, the same code path embedded and in
the cluster (services meet only through ``shared/`` contracts and HTTP; no service imports another).

Whoever builds several services in one process (``services.root_app``: all six on one port or embedded; the
orchestrator's embedded worker wiring) hands them one `ServiceClients` over their ASGI apps with `wire_peers`. A
service started alone (``tasmoe serve placement``, a cluster pod) has none wired and reaches its peers at their
``TASMOE_<SERVICE>_URL`` (a client built on first use and kept on the app).

The calls services make of each other are typed here, once, against the ``shared/contracts`` models: the thermal
service's influence matrix, the workload service's model facts and the rows of the micro-batches a serving
scheduler (the lowering service's) forms.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from shared.client import ServiceClients
from shared.configs import ArchConfig
from shared.configs.workload import InlineModel
from shared.contracts.thermal import InfluenceMatrix, PulseResponse
from shared.contracts.workload import (
    MAX_MICROBATCHES_PER_CALL,
    LogicalCompute,
    LogicalMemory,
    MicroBatchRows,
    MicroBatchSpec,
)
from shared.errors import NotFound

_lock = threading.Lock()


def wire_peers(apps: Mapping[str, Any], clients: ServiceClients) -> None:
    """Give every app in ``apps`` the clients through which it reaches the others."""
    for app in apps.values():
        app.state.peers = clients


def close_peers(apps: Mapping[str, Any]) -> None:
    """Close the clients `wire_peers` (or `peers_of`) gave ``apps`` (each once; their event loop thread ends), when
    whoever built the apps is done with them."""
    seen: set[int] = set()
    for app in apps.values():
        with _lock:
            peers: ServiceClients | None = getattr(app.state, "peers", None)
            app.state.peers = None
        if peers is not None and id(peers) not in seen:
            seen.add(id(peers))
            peers.close()


def peers_of(app: Any) -> ServiceClients:
    """The app's clients to its peers: the wired ones, else URL clients from its settings (built once; where a peer's
    URL lists replicas, its replica ``TASMOE_REPLICA``)."""
    with _lock:
        peers: ServiceClients | None = getattr(app.state, "peers", None)
        if peers is None:
            settings = app.state.settings
            peers = ServiceClients(settings, replica=settings.replica)  # the peers' replica of this one's number
            app.state.peers = peers
        return peers


def thermal_model(clients: ServiceClients, arch: ArchConfig, **kw: Any) -> str:
    """``POST /v1/models`` of the thermal service: the content hash of the stack model of ``arch``."""
    r = clients["thermal"].post_json("/v1/models", {"arch": arch.model_dump(mode="json")}, **kw)
    return str(r["model"])


def _dies_params(vault_dies: Sequence[float] | None) -> dict[str, list[str]]:
    return {} if vault_dies is None else {"vault_dies": [repr(float(x)) for x in vault_dies]}


def thermal_influence(clients: ServiceClients, arch: ArchConfig, model_hash: str | None = None, *,
                      vault_dies: Sequence[float] | None = None, **kw: Any) -> InfluenceMatrix:
    """The thermal service's influence matrix of ``arch`` (its model built first when the service does not know it:
    a new model hash, a restart, an evicted cache); ``vault_dies``: the share of a vault's watt per DRAM die its
    ``H_vault`` is for (None: evenly)."""
    key = model_hash or thermal_model(clients, arch, **kw)
    params = _dies_params(vault_dies)
    try:
        r = clients["thermal"].get_json(f"/v1/models/{key}/influence", params=params)
    except NotFound:
        key = thermal_model(clients, arch, **kw)
        r = clients["thermal"].get_json(f"/v1/models/{key}/influence", params=params)
    return InfluenceMatrix.model_validate(r)


def thermal_pulse_response(clients: ServiceClients, arch: ArchConfig, slot_ms: float, lags: int, *,
                           vault_dies: Sequence[float] | None = None, **kw: Any) -> PulseResponse:
    """The thermal service's short-time responses of ``arch`` (``GET /v1/models/{hash}/pulse-response``), its model
    built (or found) first; ``vault_dies`` as in ``thermal_influence``."""
    key = thermal_model(clients, arch, **kw)
    r = clients["thermal"].get_json(f"/v1/models/{key}/pulse-response",
                                    params={"slot_ms": repr(float(slot_ms)), "lags": str(int(lags)),
                                            **_dies_params(vault_dies)})
    return PulseResponse.model_validate(r)


def influence_array(m: InfluenceMatrix) -> npt.NDArray[np.float64]:
    return np.asarray(m.H, dtype=np.float64)


def pulse_arrays(r: PulseResponse) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(Dc, Dv), each (lags, cores, cores) K/W; Dv zeros for a stack without DRAM dies."""
    Dc = np.asarray(r.core, dtype=np.float64)
    return Dc, np.asarray(r.vault, dtype=np.float64) if r.vault else np.zeros_like(Dc)


def _model_facts(clients: ServiceClients, model: str | InlineModel) -> dict[str, Any]:
    """The workload service's summary of a workload's model (``GET /v1/models/{name}``; an inline model: its IR)."""
    if isinstance(model, str):
        r: dict[str, Any] = clients["workload"].get_json(f"/v1/models/{quote(model, safe='')}")
        return r
    ir: dict[str, Any] = clients["workload"].post_json("/v1/ir", {"model": model.label, "config": model.config,
                                                                  "generic": model.generic, "seq_len": 1})
    return {**ir, "num_activated_experts": ir["topk"]}


def routed_experts(clients: ServiceClients, model: str | InlineModel) -> int:
    """Routed experts per MoE layer of a workload's model, from the workload service (0: a dense model)."""
    return int(_model_facts(clients, model)["num_routed_experts"])


def activated_experts(clients: ServiceClients, model: str | InlineModel) -> int:
    """Experts a token activates in each MoE layer of a workload's model (its config.json's
    ``num_experts_per_tok``), from the workload service (0: a dense model)."""
    return int(_model_facts(clients, model)["num_activated_experts"])


def workload_microbatches(clients: ServiceClients) -> Callable[[str, Sequence[MicroBatchSpec]], MicroBatchRows]:
    """The workload service's rows of micro-batches of a serving trace (``POST /v1/traces/{id}/microbatches``), as
    the function the lowering service's scheduler takes: all of a window's micro-batches in one call
    (`MAX_MICROBATCHES_PER_CALL` a call when there are more; each micro-batch is answered alone, so the split
    changes nothing). A trace the workload service does not know is its 404 ``unknown_trace``."""

    def rows(trace_id: str, batches: Sequence[MicroBatchSpec]) -> MicroBatchRows:
        path = f"/v1/traces/{quote(trace_id, safe='')}/microbatches"
        parts = [clients["workload"].post_model(
            path, {"batches": [b.model_dump(mode="json") for b in batches[i:i + MAX_MICROBATCHES_PER_CALL]]},
            MicroBatchRows) for i in range(0, len(batches), MAX_MICROBATCHES_PER_CALL)]
        if len(parts) == 1:
            return parts[0]
        return MicroBatchRows.model_construct(compute=LogicalCompute.concat([p.compute for p in parts]),
                                              memory=LogicalMemory.concat([p.memory for p in parts]))

    return rows
