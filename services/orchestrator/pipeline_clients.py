"""Every call the window loop makes to the five compute services, one typed function each (the only module that
knows their request and response bodies, so adapting to a contract change is a one-file edit).

The loop talks to the services once per control epoch (a run of windows), so bodies are plain JSON built from
dicts and models; the states travel whole. All calls go through `shared.client.ServiceClients` (retries, timeouts,
Idempotency-Key). Keys are derived from the run, the epoch's first window and the call, so a retried request (or a
resumed run replaying the same epoch) carries the same key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel

from shared import json_codec
from shared.body_guard import JsonLimits, Shape, check_raw
from shared.client import ServiceClients
from shared.configs import ArchConfig, TasParams, WorkloadConfig
from shared.configs.tas import TacsParams
from shared.configs.workload import InlineModel, ServingConfig, ServingSlo
from shared.contracts.events import PhysicalizeEpochRequest, WindowTiming
from shared.contracts.metrics import (
    CompareRequest,
    CompareResponse,
    FoldRequest,
    PlotRequest,
    PowerTableRequest,
    PowerTableResponse,
    ReduceRequest,
    ReduceResponse,
    SweepPlotRequest,
    WindowMetrics,
)
from shared.contracts.placement import Overlays, Placement
from shared.contracts.placement_api import (
    InfluenceRegistration,
    JobAccepted,
    JobStatus,
    PlacementRequest,
    TacsEpochRequest,
    TacsEpochResponse,
)
from shared.contracts.registry import Registered
from shared.contracts.thermal import StepEpochRequest, ThermalSnapshot, WarmStartRequest
from shared.contracts.workload import MAX_WINDOWS_PER_CALL, ExpertLoad, TraceSummary
from shared.contracts.workload_api import IrRequest, TraceRequest
from shared.errors import BadInput, NotFound, UpstreamError
from shared.peers import thermal_influence, thermal_model

PlacementMethod = Literal["default", "heuristic", "milp"]
Columns = dict[str, list[Any]]  # a columnar batch as plain JSON (one list per field)
Json = dict[str, Any]


def encode_request(model: type[BaseModel], parts: Mapping[str, Any]) -> bytes:
    """The JSON body of a request to a route that takes ``model`` (a `shared.contracts` request), from parts that
    are pydantic models or plain JSON values: every key a field of the model and every required field given (a
    `TypeError` otherwise: a misspelt optional key would be dropped by the service and the run would silently use
    its default). The values are validated by the service (``tests/orchestrator/test_contract_bodies.py`` checks a
    run's bodies against the models)."""
    fields = model.model_fields
    unknown = [k for k in parts if k not in fields]
    missing = [k for k, f in fields.items() if f.is_required() and k not in parts]
    if unknown or missing:
        raise TypeError(f"a {model.__name__} body with unknown keys {unknown} and without the required {missing}")
    return json_codec.dumps({k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v
                             for k, v in parts.items()})


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
    nonexpert_flops_per_step: float = 0.0
    nonexpert_bytes_per_step: float = 0.0
    drain_to_judge_ms: float = 0.0  # serving: the drain after which the SLO judges every offered request, ms


@dataclass(frozen=True)
class LogicalWindow:
    """One logical window as the workload service answered it (JSON), forwarded to TACS and the physicalizer."""

    data: Json

    @property
    def t0_ns(self) -> int:
        return int(self.data["t0_ns"])

    @property
    def t1_ns(self) -> int:
        return int(self.data["t1_ns"])

    @property
    def compute(self) -> Columns:
        c: Columns = self.data["compute"]
        return c

    @property
    def memory(self) -> Columns:
        m: Columns = self.data["memory"]
        return m


@dataclass(frozen=True)
class PhysicalWindow:
    """One physicalized window: its energy deposit (forwarded to the thermal step as it came), its timing, and its
    events when they were asked for."""

    deposit: Json
    timing: WindowTiming
    compute: Columns | None
    memory: Columns | None


@dataclass(frozen=True)
class PhysicalEpoch:
    windows: list[PhysicalWindow]
    state: Json | None  # `PhysicalState` after the last window (when asked for)


@dataclass(frozen=True)
class ThermalEpoch:
    snapshots: list[ThermalSnapshot]  # one per window stepped
    state: Json | None  # `ThermalState` after the last window stepped (when asked for)
    event: str | None  # "dvfs" | "refresh": why the next window's inputs change


def _registered_hash(answer: Any) -> str:
    return Registered.model_validate(answer).hash


def _model_hash(answer: Any) -> str:
    return str(answer["model"])  # `ModelInfo.model` (as ``shared.peers.thermal_model`` reads it)


@dataclass
class RunObject:
    """One object fixed for a run (arch, placement, influence matrix, TACS params), registered with one service and
    named there by the content hash that service answered (``shared.content``); the epoch requests carry the hash.
    ``code`` is the 404 code of a service that does not know it (a restart, an eviction, another replica): the
    pipeline registers it again and repeats the request once. Nothing but these run objects is kept by a service
    between calls: the states travel whole."""

    service: str
    path: str  # the registration endpoint
    body: bytes  # the registration's JSON body, encoded once
    code: str  # unknown_<kind>
    read: Callable[[Any], str]  # the hash from the registration's answer
    key: str = ""  # the hash, once registered

    @classmethod
    def of(cls, service: str, kind: str, path: str, body: bytes | BaseModel) -> RunObject:
        data = body.model_dump_json().encode() if isinstance(body, BaseModel) else body
        return cls(service=service, path=path, body=data, code=f"unknown_{kind}", read=_registered_hash)


RunObjects = Mapping[str, RunObject]  # {request field carrying the hash: the object}


@dataclass(frozen=True)
class RunData:
    """A run's fixed objects per consumer, keyed by the field of the epoch request that names them: lowering
    (arch_hash, placement_hash), thermal (model: the hash of ``POST /v1/models``) and placement's TACS
    (placement_hash, arch_hash, params_hash, H_hash; empty when the run has no TACS)."""

    lowering: dict[str, RunObject]
    thermal: dict[str, RunObject]
    tacs: dict[str, RunObject]

    @classmethod
    def of(cls, *, arch: ArchConfig, placement: Placement, tacs: TacsParams | None = None,
           H: list[list[float]] | None = None) -> RunData:
        arch_j, plc_j = arch.model_dump_json().encode(), placement.model_dump_json().encode()
        lowering = {"arch_hash": RunObject.of("lowering", "arch", "/v1/registry/archs", arch_j),
                    "placement_hash": RunObject.of("lowering", "placement", "/v1/registry/placements", plc_j)}
        thermal = {"model": RunObject(service="thermal", path="/v1/models", body=b'{"arch":' + arch_j + b"}",
                                      code="unknown_model", read=_model_hash)}
        on: dict[str, RunObject] = {}
        if tacs is not None:
            on = {"placement_hash": RunObject.of("placement", "placement", "/v1/registry/placements", plc_j),
                  "arch_hash": RunObject.of("placement", "arch", "/v1/registry/archs", arch_j),
                  "params_hash": RunObject.of("placement", "tacs_params", "/v1/registry/tacs-params", tacs)}
            if H is not None:
                on["H_hash"] = RunObject.of("placement", "influence", "/v1/registry/influence",
                                            InfluenceRegistration(H=H))
        return cls(lowering=lowering, thermal=thermal, tacs=on)

    def objects(self) -> list[RunObject]:
        return [*self.lowering.values(), *self.thermal.values(), *self.tacs.values()]


@dataclass(frozen=True)
class ReduceResult:
    row: dict[str, Any]
    csv: str
    power: dict[str, Any] | None = None  # the run's `PowerReport` (JSON), when every window reported its power


class EpochTooLarge(Exception):
    """An epoch's request is past the bounds a service reads (``TASMOE_MAX_BODY_MB``, ``TASMOE_MAX_JSON_*``, the
    cluster's shared settings): it is not sent, and the epoch is asked again with fewer windows."""


def reads_a_trace(workload: WorkloadConfig) -> bool:
    """Whether making ``workload``'s trace reads a file (arrivals, ``serving``; recorded routing, ``routing.trace``)
    that may not give what the config asks: what `Pipeline.check_workload` asks the workload service beyond the
    model."""
    return workload.serving is not None or workload.routing.trace is not None


class Pipeline:
    """Typed wrappers over the five services for one run (``run_key`` prefixes the idempotency keys)."""

    def __init__(self, clients: ServiceClients, *, run_key: str = "", milp_poll_s: float = 0.2,
                 milp_timeout_s: float = 600.0) -> None:
        self.clients = clients
        self.run_key = run_key
        self.milp_poll_s = milp_poll_s
        self.milp_timeout_s = milp_timeout_s
        self._windows: dict[tuple[str, int], LogicalWindow] = {}  # the last batch of logical windows read
        self._limits = JsonLimits.of(clients.settings)
        self._max_body = int(clients.settings.max_body_mb * 2**20)

    def _key(self, *parts: object) -> str:
        return ":".join(str(p) for p in (self.run_key, *parts))

    # ---------------------------------------------------------------------------------------------- run data
    def register(self, obj: RunObject) -> str:
        """Register ``obj`` with its service; its hash (the same on every registration: content-addressed)."""
        resp = self.clients[obj.service].request("POST", obj.path, content=obj.body,
                                                 idempotency_key=self._key("register", obj.service, obj.path))
        key = obj.read(json_codec.loads(resp.content))
        if obj.key and key != obj.key:
            raise UpstreamError(f"{obj.service}: {obj.path} named the same object {key} after {obj.key}; run data "
                                "must be content-addressed")
        obj.key = key
        return key

    def register_all(self, objs: Iterable[RunObject]) -> None:
        for obj in objs:
            self.register(obj)

    def register_run(self, data: RunData) -> RunData:
        """Register every object of ``data`` with its service (once per run and attempt)."""
        self.register_all(data.objects())
        return data

    def _post_naming(self, service: str, path: str, model: type[BaseModel], parts: Mapping[str, Any],
                     run: RunObjects, idempotency_key: str) -> bytes:
        """POST ``parts`` plus the hashes of ``run`` (by field); the answer's bytes. A service that does not know one
        of them (404 ``unknown_<kind>``: restart, eviction, another replica) gets them registered again, and the
        request is repeated once (as `logical_windows` re-creates a forgotten trace). A body past the services' bounds
        raises `EpochTooLarge` unsent."""
        client = self.clients[service]

        def body() -> bytes:
            raw = encode_request(model, {**parts, **{field: obj.key for field, obj in run.items()}})
            self._check_bounds(service, path, raw)
            return raw

        try:
            return client.request("POST", path, content=body(), idempotency_key=idempotency_key).content
        except NotFound as exc:
            if exc.code not in {obj.code for obj in run.values()}:
                raise
            for obj in run.values():
                self.register(obj)
            return client.request("POST", path, content=body(), idempotency_key=idempotency_key).content

    def _check_bounds(self, service: str, path: str, body: bytes) -> None:
        """Raise `EpochTooLarge` when the service would refuse ``body`` for its size (413) or its JSON shape (422):
        the same raw count the service's body guard makes."""
        why = (f"request body is {len(body)} bytes, over TASMOE_MAX_BODY_MB" if len(body) > self._max_body
               else check_raw(body, self._limits))
        if isinstance(why, str):
            raise EpochTooLarge(f"{service}: POST {path}: {why}")

    def windows_per_request(self, sample: Json, most: int) -> int:
        """How many windows like ``sample`` (a window's JSON) one request may carry within half the services' body
        bounds (the other half: what comes with them), at most ``most`` and at least one."""
        raw = json_codec.dumps(sample)
        shape = check_raw(raw, self._limits)
        values = shape.values if isinstance(shape, Shape) else self._limits.max_values
        return max(1, min(most, self._limits.max_values // 2 // values, self._max_body // 2 // max(1, len(raw))))

    def _post(self, service: str, path: str, model: type[BaseModel], parts: Mapping[str, Any], *,
              idempotency_key: str | None = None, params: Mapping[str, Any] | None = None) -> bytes:
        """POST a ``model`` request (`encode_request`) and return the answer's body."""
        resp = self.clients[service].request("POST", path, content=encode_request(model, parts), params=params,
                                             idempotency_key=idempotency_key)
        return resp.content

    def check_workload(self, workload: WorkloadConfig, window_ms: float) -> None:
        """`check_model`, and for a workload that reads a trace (its arrivals, ``serving``, or its recorded routing,
        ``routing.trace``) that the workload service can make the run's trace of it: a `BadInput` naming the field
        (``workload.serving.start_s``, ``workload.serving.trace``, ...; the control window as the request names it,
        ``tas.tacs.window_ms``) with the service's message otherwise."""
        self.check_model(workload.model)
        if not reads_a_trace(workload):
            return
        try:
            self._post("workload", "/v1/traces", TraceRequest, {"workload": workload, "window_ms": window_ms})
        except BadInput as exc:
            if exc.field == "window_ms":
                raise BadInput(f"tas.tacs.window_ms: {exc.message}", field="tas.tacs.window_ms") from None
            raise

    def check_model(self, model: str | InlineModel) -> None:
        """The workload service knows the model (its zoo or a registered one), or builds the inline config.json;
        otherwise a `BadInput` naming ``workload.model`` (``workload.model.config.<key>`` for an inline config) with
        the workload service's message (which lists the known models, or names the config key)."""
        if not isinstance(model, str):
            body = {"model": model.label, "config": model.config, "generic": model.generic}
            try:
                self._post("workload", "/v1/ir", IrRequest, body)
            except BadInput as exc:
                field = f"workload.model.config.{exc.field}" if exc.field else "workload.model.config"
                raise BadInput(f"workload.model: {exc.message}", field=field) from None
            return
        try:
            self.clients["workload"].get_json(f"/v1/models/{quote(model, safe='')}")
        except NotFound as exc:
            raise BadInput(f"workload.model: {exc.message}", field="workload.model") from None

    # ----------------------------------------------------------------------------------------------- workload
    def create_trace(self, workload: WorkloadConfig, window_ms: float) -> TraceInfo:
        body = {"workload": workload, "window_ms": window_ms}
        r = TraceSummary.model_validate_json(self._post("workload", "/v1/traces", TraceRequest, body,
                                                        idempotency_key=self._key("trace")))
        return TraceInfo(trace_id=r.trace_id, n_windows=r.n_windows, n_layers=r.n_layers, n_experts=r.n_experts,
                         moe_layers=list(r.moe_layers), tokens_total=r.tokens_total,
                         flops_per_token_expert=r.flops_per_token_expert, expert_bytes=float(r.expert_bytes),
                         nonexpert_flops_per_step=r.nonexpert_flops_per_step,
                         nonexpert_bytes_per_step=r.nonexpert_bytes_per_step,
                         drain_to_judge_ms=r.drain_to_judge_ms)

    def logical_windows(self, trace: TraceInfo, start: int, count: int, *, workload: WorkloadConfig,
                        window_ms: float) -> list[LogicalWindow]:
        """Windows ``start`` .. ``start + count - 1`` of the trace, read `MAX_WINDOWS_PER_CALL` at a time (a batch is
        kept: an epoch cut short by an event reads the rest of it again). If the service forgot the trace (restart,
        LRU), re-create it and retry once."""
        out: list[LogicalWindow] = []
        for k in range(start, start + count):
            hit = self._windows.get((trace.trace_id, k))
            if hit is None:
                self._read_batch(trace, k, workload=workload, window_ms=window_ms)
                hit = self._windows[(trace.trace_id, k)]
            out.append(hit)
        return out

    def _read_batch(self, trace: TraceInfo, k: int, *, workload: WorkloadConfig, window_ms: float) -> None:
        path = f"/v1/traces/{trace.trace_id}/windows"
        params = {"start": k, "count": max(1, min(MAX_WINDOWS_PER_CALL, trace.n_windows - k))}
        client = self.clients["workload"]
        try:
            resp = client.request("GET", path, params=params)
        except NotFound as exc:
            if exc.code not in {"unknown_trace", "not_found"}:
                raise
            again = self.create_trace(workload, window_ms)
            if again.trace_id != trace.trace_id:
                raise UpstreamError(f"workload: trace id changed on re-creation ({trace.trace_id} -> "
                                    f"{again.trace_id}); traces must be deterministic") from exc
            resp = client.request("GET", path, params=params)
        windows: list[Json] = json_codec.loads(resp.content)["windows"]
        if not windows or windows[0].get("window") != k:
            raise UpstreamError(f"workload: asked for windows from {k}, got "
                                f"{[w.get('window') for w in windows[:3]]}...")
        self._windows = {(trace.trace_id, int(w["window"])): LogicalWindow(w) for w in windows}

    def expert_load(self, trace: TraceInfo, *, workload: WorkloadConfig, window_ms: float,
                    expected: bool = False) -> list[list[float]]:
        """Per MoE layer, each expert's share of the trace's token→expert assignments; ``expected``: the routing
        law's expected shares (a serving trace's tokens are not known before the run forms its micro-batches)."""
        path = f"/v1/traces/{trace.trace_id}/expert-load"
        params = {"expected": "true"} if expected else None
        try:
            r = self.clients["workload"].get_json(path, params=params)
        except NotFound:
            self.create_trace(workload, window_ms)
            r = self.clients["workload"].get_json(path, params=params)
        return ExpertLoad.model_validate(r).load

    # ------------------------------------------------------------------------------------------------ thermal
    def thermal_model(self, arch: ArchConfig) -> str:
        return thermal_model(self.clients, arch, idempotency_key=self._key("thermal-model"))

    def influence(self, model_hash: str, arch: ArchConfig) -> list[list[float]]:
        """The cores × cores influence matrix H (K/W); rebuilds the model if the service forgot it."""
        return thermal_influence(self.clients, arch, model_hash, idempotency_key=self._key("thermal-model")).H

    def thermal_epoch(self, *, run: RunObjects, window: int, window_ms: float, state: Json | None,
                      deposits: Sequence[Json], bw_eff_factor: float | None, until_event: bool,
                      return_state: bool = True, tag: str = "") -> ThermalEpoch:
        """Windows ``window`` .. from ``state`` (the run's start when None), one energy deposit each; with
        ``until_event``, up to the first window after which the DVFS levels or the refresh factor (against
        ``bw_eff_factor``, the one the deposits were physicalized with) change. ``tag`` keeps the idempotency keys
        of a warm-up pass apart from the run's own windows of the same number."""
        parts: dict[str, Any] = {"window": window, "window_ms": window_ms, "state": state,
                                 "deposits": list(deposits), "bw_eff_factor": bw_eff_factor,
                                 "until_event": until_event, "return_state": return_state}
        raw = json_codec.loads(self._post_naming("thermal", "/v1/step/epoch", StepEpochRequest, parts, run,
                                                 self._key(tag + "step", window, len(deposits), until_event)))
        return ThermalEpoch(snapshots=[ThermalSnapshot.model_validate(s) for s in raw["snapshots"]],
                            state=raw.get("state"), event=raw.get("event"))

    def warm_start(self, *, run: RunObjects, state: Json) -> Json:
        """The `ThermalState` (JSON) window 0 starts from after a warm-up pass whose last state is ``state``."""
        return dict(json_codec.loads(self._post_naming("thermal", "/v1/warm_start", WarmStartRequest,
                                                       {"state": state}, run, self._key("warm_start"))))

    # ---------------------------------------------------------------------------------------------- placement
    def placement(self, *, arch: ArchConfig, workload: WorkloadConfig, tas: TasParams, method: PlacementMethod,
                  trace: TraceInfo, expert_load: list[list[float]],
                  H: list[list[float]] | None) -> Placement:
        req = PlacementRequest(arch=arch, workload=workload, tas=tas, method=method, expert_load=expert_load,
                               moe_layers=trace.moe_layers, expert_flops_per_token=trace.flops_per_token_expert,
                               expert_bytes=trace.expert_bytes, H=H,
                               nonexpert_flops_per_step=trace.nonexpert_flops_per_step,
                               nonexpert_bytes_per_step=trace.nonexpert_bytes_per_step)
        resp = self.clients["placement"].request("POST", "/v1/placements", content=req.model_dump_json().encode(),
                                                 idempotency_key=self._key("placement", method))
        if resp.status_code == 202:
            return self._poll_placement_job(JobAccepted.model_validate(json_codec.loads(resp.content)).job_id)
        return Placement.model_validate(json_codec.loads(resp.content))

    def _poll_placement_job(self, job_id: str) -> Placement:
        deadline = time.monotonic() + self.milp_timeout_s
        while True:
            job = JobStatus.model_validate(self.clients["placement"].get_json(f"/v1/placement-jobs/{job_id}"))
            if job.status == "done" and job.result is not None:
                return job.result
            if job.status in ("failed", "cancelled"):
                raise UpstreamError(f"placement: MILP job {job_id} {job.status}: {job.error}")
            if time.monotonic() > deadline:
                raise UpstreamError(f"placement: MILP job {job_id} still {job.status} after "
                                    f"{self.milp_timeout_s:.0f} s")
            time.sleep(self.milp_poll_s)

    def tacs_epoch(self, *, run: RunObjects, steps: Sequence[Json], state: Json, smoothed: Any,
                   bank_bw_gbps: float, window: int, tag: str = "") -> TacsEpochResponse:
        """TACS's decisions for consecutive windows from ``window`` on (``steps``: telemetry, pending logical window
        and start time of each), until one acts; ``run``: the run's placement, arch, params and H registered with
        placement (`RunData`)."""
        parts: dict[str, Any] = {"steps": list(steps), "state": state, "smoothed": smoothed,
                                 "bank_bw_gbps": bank_bw_gbps}
        raw = self._post_naming("placement", "/v1/tacs/epoch", TacsEpochRequest, parts, run,
                                self._key(tag + "tacs", window, len(steps)))
        return TacsEpochResponse.model_validate_json(raw)

    # ----------------------------------------------------------------------------------------------- lowering
    def physicalize_epoch(self, *, window: int, logical: Sequence[LogicalWindow], run: RunObjects,
                          overlays: Json, state: Json | None, replicas: Json | None, freq_ghz: list[float],
                          window_ms: float, bw_eff_factor: float | list[float], n_layers: int, return_state: bool,
                          events: bool, tag: str = "", serving: ServingConfig | None = None,
                          retrace: Callable[[], object] | None = None) -> PhysicalEpoch:
        """The physical events of windows ``window`` .. (``events``: the events themselves, else only their energy
        deposits) under one mapping and one set of clocks: ``overlays`` (TACS's decision) at the first window only,
        ``replicas`` replacing the state's (the placement service owns them). ``serving``: the lowering service's
        scheduler serves the windows' requests, asking the workload service for the rows of the micro-batches it
        forms; when the workload service no longer knows the trace (404 ``unknown_trace``), ``retrace`` creates it
        again and the request is repeated once."""
        parts: dict[str, Any] = {"window": window, "logical": [w.data for w in logical], "overlays": overlays,
                                 "state": state, "freq_ghz": freq_ghz, "window_ms": window_ms,
                                 "bw_eff_factor": bw_eff_factor, "n_layers": n_layers,
                                 "return_state": return_state, "events": events}
        if replicas is not None:
            parts["replicas"] = replicas
        if serving is not None:  # left out otherwise: a fixed-arrival body reads as it always has
            parts["serving"] = serving

        def post() -> bytes:
            return self._post_naming("lowering", "/v1/physicalize/epoch", PhysicalizeEpochRequest, parts, run,
                                     self._key(tag + "phys", window, len(logical), return_state, events))

        try:
            answer = post()
        except NotFound as exc:
            if retrace is None or exc.code != "unknown_trace":
                raise
            retrace()
            answer = post()
        raw = json_codec.loads(answer)
        return PhysicalEpoch(
            windows=[PhysicalWindow(deposit=w["deposit"], timing=WindowTiming.model_validate(w["timing"]),
                                    compute=w.get("compute"), memory=w.get("memory")) for w in raw["windows"]],
            state=raw.get("state"))

    # ------------------------------------------------------------------------------------------------ metrics
    def reduce(self, *, scenario: str, workload: str, thot_c: float, bw_raw_gbps: float | None,
               windows: list[WindowMetrics] | list[dict[str, Any]], partial: dict[str, Any] | None = None,
               slo: ServingSlo | None = None) -> ReduceResult:
        """The run's row from its last windows and ``partial`` (the windows before them, `reduce_fold`); ``slo``: a
        served run's latency limits (goodput and ``slo_met`` against them)."""
        wins = [w.model_dump(mode="json") if isinstance(w, WindowMetrics) else w for w in windows]
        body: dict[str, Any] = {"scenario": scenario, "workload": workload, "thot_c": thot_c,
                                "bw_raw_gbps": bw_raw_gbps, "windows": wins, "partial": partial}
        if slo is not None:  # left out otherwise: a fixed-arrival body reads as it always has
            body.update(slo_ttft_p99_ms=slo.ttft_p99_ms, slo_tpot_p99_ms=slo.tpot_p99_ms)
        raw = json_codec.loads(self._post("metrics", "/v1/reduce", ReduceRequest, body,
                                          idempotency_key=self._key("reduce")))
        r = ReduceResponse.model_validate(raw)  # the answer is a ReduceResponse; its row and report kept as answered
        return ReduceResult(row=dict(raw["row"]), csv=r.csv, power=raw.get("power"))

    def power_table(self, reports: dict[str, dict[str, Any]]) -> str:
        """Markdown table of the scenarios' power reports (metrics ``POST /v1/power/table``)."""
        answer = self._post("metrics", "/v1/power/table", PowerTableRequest, {"reports": reports},
                            idempotency_key=self._key("power-table"))
        return PowerTableResponse.model_validate_json(answer).markdown

    def reduce_fold(self, *, thot_c: float, windows: list[dict[str, Any]], partial: dict[str, Any] | None,
                    chunk: int) -> dict[str, Any]:
        """Fold chunk number ``chunk`` of a run's windows into ``partial`` (metrics ``POST /v1/reduce/fold``)."""
        body = {"thot_c": thot_c, "windows": windows, "partial": partial}
        r = json_codec.loads(self._post("metrics", "/v1/reduce/fold", FoldRequest, body,
                                        idempotency_key=self._key("fold", chunk)))
        return dict(r)  # a `ReducePartial`, passed back to the next fold unread

    def compare(self, rows: list[dict[str, Any]]) -> tuple[str, str]:
        """(CSV, Markdown) of the scenario comparison with deltas against baseline."""
        r = CompareResponse.model_validate_json(self._post("metrics", "/v1/compare", CompareRequest, {"rows": rows},
                                                           idempotency_key=self._key("compare")))
        return r.csv, r.markdown

    def plot(self, kind: str, *, workload: str, rows: list[dict[str, Any]],
             windows: dict[str, list[dict[str, Any]]], mesh: tuple[int, int] | None, thot_c: float | None,
             warmup_ms: float | None = None, fmt: Literal["png", "svg"] = "png") -> bytes:
        """The figure's bytes (metrics ``POST /v1/plots/{kind}?format=``)."""
        body = {"workload": workload, "rows": rows, "windows": windows, "mesh": list(mesh) if mesh else None,
                "thot_c": thot_c, "warmup_ms": warmup_ms}
        return self._post("metrics", f"/v1/plots/{kind}", PlotRequest, body, params={"format": fmt},
                          idempotency_key=self._key("plot", kind))

    def sweep_plot(self, kind: str, *, label: str, rows: list[dict[str, Any]], at_cooling: float | None = None,
                   at_limit: float | None = None, fmt: Literal["png", "svg"] = "png") -> bytes:
        """A sweep's figure from its table's rows (`SweepRow` bodies; metrics ``POST /v1/plots/sweep/{kind}``)."""
        body = {"label": label, "rows": rows, "at_cooling": at_cooling, "at_limit": at_limit}
        return self._post("metrics", f"/v1/plots/sweep/{kind}", SweepPlotRequest, body, params={"format": fmt},
                          idempotency_key=self._key("sweep-plot", kind, fmt))


EMPTY_OVERLAYS: Json = Overlays().model_dump(mode="json")
