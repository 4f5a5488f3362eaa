"""Every call the window loop makes to the five compute services, one typed function each (the only module that
knows their request and response bodies, so adapting to a contract change is a one-file edit).

All calls go through `shared.client.ServiceClients` (retries, timeouts, Idempotency-Key). Keys are derived from the
run, the window and the call, so a retried request (or a resumed run replaying the same window) carries the same key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from shared.client import ServiceClients
from shared.configs import ArchConfig, TasParams, WorkloadConfig
from shared.contracts.events import ComputeEvents, MemoryEvents, PhysicalState, WindowTiming
from shared.contracts.metrics import WindowMetrics
from shared.contracts.placement import Overlays, Placement, ReplicaState, Telemetry
from shared.contracts.thermal import ThermalSnapshot, ThermalState
from shared.contracts.workload import LogicalWindow
from shared.errors import NotFound, UpstreamError

PlacementMethod = Literal["default", "heuristic", "milp"]


@dataclass(frozen=True)
class TraceInfo:
    trace_id: str
    n_windows: int
    n_layers: int
    n_experts: int
    moe_layers: list[int]
    tokens_total: int
    flops_per_token_expert: float
    expert_bytes: float


@dataclass(frozen=True)
class TacsResult:
    overlays: Overlays
    state: ReplicaState
    smoothed: Any  # opaque to the orchestrator: passed back on the next step, saved at the frontier


@dataclass(frozen=True)
class PhysicalResult:
    compute: ComputeEvents
    memory: MemoryEvents
    state: PhysicalState
    timing: WindowTiming


@dataclass(frozen=True)
class ReduceResult:
    row: dict[str, Any]
    csv: str


class Pipeline:
    """Typed wrappers over the five services for one run (``run_key`` prefixes the idempotency keys)."""

    def __init__(self, clients: ServiceClients, *, run_key: str = "", milp_poll_s: float = 0.2,
                 milp_timeout_s: float = 600.0) -> None:
        self.clients = clients
        self.run_key = run_key
        self.milp_poll_s = milp_poll_s
        self.milp_timeout_s = milp_timeout_s

    def _key(self, *parts: object) -> str:
        return ":".join(str(p) for p in (self.run_key, *parts))

    # ----------------------------------------------------------------------------------------------- workload
    def create_trace(self, workload: WorkloadConfig, window_ms: float) -> TraceInfo:
        body = {"workload": workload.model_dump(mode="json"), "window_ms": window_ms}
        r = self.clients["workload"].post_json("/v1/traces", body, idempotency_key=self._key("trace"))
        return TraceInfo(trace_id=str(r["trace_id"]), n_windows=int(r["n_windows"]), n_layers=int(r["n_layers"]),
                         n_experts=int(r["n_experts"]), moe_layers=[int(x) for x in r["moe_layers"]],
                         tokens_total=int(r["tokens_total"]),
                         flops_per_token_expert=float(r["flops_per_token_expert"]),
                         expert_bytes=float(r["expert_bytes"]))

    def logical_window(self, trace: TraceInfo, k: int, *, workload: WorkloadConfig,
                       window_ms: float) -> LogicalWindow:
        """Window k of the trace; if the service forgot the trace (restart, LRU), re-create it and retry once."""
        path = f"/v1/traces/{trace.trace_id}/windows/{k}"
        try:
            return self.clients["workload"].get_model(path, LogicalWindow)
        except NotFound as exc:
            if exc.code not in {"unknown_trace", "not_found"}:
                raise
            again = self.create_trace(workload, window_ms)
            if again.trace_id != trace.trace_id:
                raise UpstreamError(f"workload: trace id changed on re-creation ({trace.trace_id} -> "
                                    f"{again.trace_id}); traces must be deterministic") from exc
            return self.clients["workload"].get_model(path, LogicalWindow)

    def expert_load(self, trace: TraceInfo, *, workload: WorkloadConfig, window_ms: float) -> list[list[float]]:
        path = f"/v1/traces/{trace.trace_id}/expert-load"
        try:
            r = self.clients["workload"].get_json(path)
        except NotFound:
            self.create_trace(workload, window_ms)
            r = self.clients["workload"].get_json(path)
        return [[float(x) for x in row] for row in r["load"]]

    # ------------------------------------------------------------------------------------------------ thermal
    def thermal_model(self, arch: ArchConfig) -> str:
        r = self.clients["thermal"].post_json("/v1/models", {"arch": arch.model_dump(mode="json")},
                                              idempotency_key=self._key("thermal-model"))
        return str(r["model"])

    def influence(self, model_hash: str, arch: ArchConfig) -> list[list[float]]:
        """The cores × cores influence matrix H (K/W); rebuilds the model if the service forgot it."""
        path = f"/v1/models/{model_hash}/influence"
        try:
            r = self.clients["thermal"].get_json(path)
        except NotFound:
            self.thermal_model(arch)
            r = self.clients["thermal"].get_json(path)
        for key in ("H", "matrix", "influence", "h"):
            if isinstance(r, dict) and key in r:
                return [[float(x) for x in row] for row in r[key]]
        if isinstance(r, list):
            return [[float(x) for x in row] for row in r]
        raise UpstreamError(f"thermal: influence response has no matrix field (keys: {sorted(r)})")

    def thermal_step(self, *, arch: ArchConfig, window: int, window_ms: float, state: ThermalState | None,
                     compute: ComputeEvents, memory: MemoryEvents) -> tuple[ThermalState, ThermalSnapshot]:
        body = {"arch": arch.model_dump(mode="json"), "window": window, "window_ms": window_ms,
                "state": state.model_dump(mode="json") if state is not None else None,
                "compute_events": compute.model_dump(mode="json"), "memory_events": memory.model_dump(mode="json")}
        r = self.clients["thermal"].post_json("/v1/step", body, idempotency_key=self._key("step", window))
        return ThermalState.model_validate(r["state"]), ThermalSnapshot.model_validate(r["snapshot"])

    # ---------------------------------------------------------------------------------------------- placement
    def placement(self, *, arch: ArchConfig, workload: WorkloadConfig, tas: TasParams, method: PlacementMethod,
                  trace: TraceInfo, expert_load: list[list[float]] | None,
                  H: list[list[float]] | None) -> Placement:
        body: dict[str, Any] = {
            "arch": arch.model_dump(mode="json"), "workload": workload.model_dump(mode="json"),
            "tas": tas.model_dump(mode="json"), "method": method, "expert_load": expert_load,
            "moe_layers": trace.moe_layers, "expert_flops_per_token": trace.flops_per_token_expert,
            "expert_bytes": trace.expert_bytes}
        if H is not None:
            body["H"] = H
        client = self.clients["placement"]
        resp = client.request("POST", "/v1/placements", json=body, idempotency_key=self._key("placement", method))
        data = resp.json()
        if resp.status_code == 202:
            data = self._poll_placement_job(str(data["job_id"]))
        return Placement.model_validate(data)

    def _poll_placement_job(self, job_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.milp_timeout_s
        while True:
            r = self.clients["placement"].get_json(f"/v1/placement-jobs/{job_id}")
            status = r.get("status")
            if status in {"succeeded", "done", "finished"} or ("experts" in r and status is None):
                result: dict[str, Any] = r.get("placement") or r.get("result") or r
                return result
            if status in {"failed", "error"}:
                raise UpstreamError(f"placement: MILP job {job_id} failed: {r.get('error')}")
            if time.monotonic() > deadline:
                raise UpstreamError(f"placement: MILP job {job_id} still {status} after {self.milp_timeout_s:.0f} s")
            time.sleep(self.milp_poll_s)

    def tacs_step(self, *, telemetry: Telemetry, placement: Placement, state: ReplicaState, tas: TasParams,
                  arch: ArchConfig, H: list[list[float]] | None, pending: LogicalWindow | None, smoothed: Any,
                  now_ns: int, window: int) -> TacsResult:
        body: dict[str, Any] = {
            "telemetry": telemetry.model_dump(mode="json"), "placement": placement.model_dump(mode="json"),
            "state": state.model_dump(mode="json"), "params": tas.tacs.model_dump(mode="json"),
            "arch": arch.model_dump(mode="json"), "smoothed": smoothed, "now_ns": now_ns}
        if H is not None:
            body["H"] = H
        if pending is not None:
            body["pending"] = pending.model_dump(mode="json")
        r = self.clients["placement"].post_json("/v1/tacs/step", body, idempotency_key=self._key("tacs", window))
        return TacsResult(overlays=Overlays.model_validate(r["overlays"]),
                          state=ReplicaState.model_validate(r["state"]), smoothed=r.get("smoothed"))

    # ----------------------------------------------------------------------------------------------- lowering
    def physicalize(self, *, window: int, logical: LogicalWindow, placement: Placement, overlays: Overlays,
                    state: PhysicalState, arch: ArchConfig, freq_ghz: list[float], window_ms: float,
                    bw_eff_factor: float | list[float], n_layers: int) -> PhysicalResult:
        body = {"window": window, "logical": logical.model_dump(mode="json"),
                "placement": placement.model_dump(mode="json"), "overlays": overlays.model_dump(mode="json"),
                "state": state.model_dump(mode="json"), "arch": arch.model_dump(mode="json"), "freq_ghz": freq_ghz,
                "window_ms": window_ms, "bw_eff_factor": bw_eff_factor, "n_layers": n_layers}
        r = self.clients["lowering"].post_json("/v1/physicalize", body, idempotency_key=self._key("phys", window))
        return PhysicalResult(compute=ComputeEvents.model_validate(r["compute"]),
                              memory=MemoryEvents.model_validate(r["memory"]),
                              state=PhysicalState.model_validate(r["state"]),
                              timing=WindowTiming.model_validate(r["timing"]))

    # ------------------------------------------------------------------------------------------------ metrics
    def reduce(self, *, scenario: str, workload: str, thot_c: float, bw_raw_gbps: float | None,
               windows: list[WindowMetrics] | list[dict[str, Any]]) -> ReduceResult:
        wins = [w.model_dump(mode="json") if isinstance(w, WindowMetrics) else w for w in windows]
        body = {"scenario": scenario, "workload": workload, "thot_c": thot_c, "bw_raw_gbps": bw_raw_gbps,
                "windows": wins}
        r = self.clients["metrics"].post_json("/v1/reduce", body, idempotency_key=self._key("reduce"))
        return ReduceResult(row=dict(r["row"]), csv=str(r["csv"]))

    def compare(self, rows: list[dict[str, Any]]) -> tuple[str, str]:
        """(CSV, Markdown) of the scenario comparison with deltas against baseline."""
        r = self.clients["metrics"].post_json("/v1/compare", {"rows": rows}, idempotency_key=self._key("compare"))
        return str(r["csv"]), str(r["markdown"])

    def plot(self, kind: str, *, workload: str, rows: list[dict[str, Any]],
             windows: dict[str, list[dict[str, Any]]], mesh: tuple[int, int] | None, thot_c: float | None,
             fmt: Literal["png", "svg"] = "png") -> bytes:
        """The figure's bytes (metrics ``POST /v1/plots/{kind}?format=``)."""
        body = {"workload": workload, "rows": rows, "windows": windows, "mesh": list(mesh) if mesh else None,
                "thot_c": thot_c}
        resp = self.clients["metrics"].request("POST", f"/v1/plots/{kind}", json=body, params={"format": fmt},
                                               idempotency_key=self._key("plot", kind))
        return resp.content
