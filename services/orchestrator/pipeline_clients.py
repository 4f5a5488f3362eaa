"""Every call the window loop makes to the five compute services, one typed function each (the only module that
knows their request and response bodies, so adapting to a contract change is a one-file edit).

All calls go through `shared.client.ServiceClients` (retries, timeouts, Idempotency-Key). Keys are derived from the
run, the window and the call, so a retried request (or a resumed run replaying the same window) carries the same key.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel

from shared import json_codec
from shared.client import ServiceClients
from shared.configs import ArchConfig, TasParams, WorkloadConfig
from shared.configs.tas import TacsParams
from shared.configs.workload import InlineModel
from shared.content import field_order_json
from shared.contracts.events import PhysicalizeRequest, WindowTiming
from shared.contracts.metrics import (
    CompareRequest,
    CompareResponse,
    FoldRequest,
    PlotRequest,
    PowerTableRequest,
    PowerTableResponse,
    ReduceRequest,
    ReduceResponse,
    WindowMetrics,
)
from shared.contracts.placement import Overlays, Placement, Telemetry
from shared.contracts.placement_api import (
    InfluenceRegistration,
    JobAccepted,
    JobStatus,
    PlacementRequest,
    TacsStepRequest,
)
from shared.contracts.registry import Registered
from shared.contracts.thermal import StepRequest, ThermalSnapshot, WarmStartRequest
from shared.contracts.workload import ExpertLoad, TraceSummary
from shared.contracts.workload_api import IrRequest, TraceRequest
from shared.errors import BadInput, NotFound, UpstreamError
from shared.peers import thermal_influence, thermal_model

PlacementMethod = Literal["default", "heuristic", "milp"]
WINDOW_BATCH = 16  # logical windows read per call to the workload service (GET /v1/traces/{id}/windows)
Columns = dict[str, list[Any]]  # a columnar batch as plain JSON (one list per field)


class RawJson:
    """A JSON value already encoded: spliced into request bodies as is (a large object that passes through
    unchanged — the logical window — is encoded once, not per call; what is fixed for a run is registered once and
    named by hash: `RunData`)."""

    __slots__ = ("data",)

    def __init__(self, text: str | bytes) -> None:
        self.data = text.encode() if isinstance(text, str) else bytes(text)  # UTF-8

    @property
    def text(self) -> str:
        return self.data.decode()

    @classmethod
    def of(cls, value: Any) -> RawJson:
        if isinstance(value, BaseModel):
            return cls(field_order_json(value))
        return cls(json_codec.dumps(value))


def encode_body(parts: Mapping[str, Any]) -> bytes:
    """A JSON object from parts that are `RawJson`, pydantic models or plain JSON values (assembled as bytes: no
    text copy of the whole body)."""
    out = []
    for key, value in parts.items():
        if isinstance(value, RawJson):
            data = value.data
        elif isinstance(value, BaseModel):
            data = field_order_json(value)
        else:
            data = json_codec.dumps(value)
        out.append(json_codec.dumps(key) + b":" + data)
    return b"{" + b",".join(out) + b"}"


@functools.lru_cache(maxsize=128)
def _request_fields(model: type[BaseModel]) -> tuple[frozenset[str], tuple[str, ...]]:
    """A request model's field names and its required ones (the contract models are fixed: read once each)."""
    fields = model.model_fields
    return frozenset(fields), tuple(k for k, f in fields.items() if f.is_required())


def encode_request(model: type[BaseModel], parts: Mapping[str, Any]) -> bytes:
    """`encode_body` of a request to a route that takes ``model`` (a `shared.contracts` request): every key a field of
    the model and every required field given, checked on each call (a `TypeError`: a misspelt optional key would be
    dropped by the service and the run would silently use its default). The values are not validated here: most
    pass through unparsed (`RawJson`, states as the services answered them); the service validates them, and
    ``tests/orchestrator/test_contract_bodies.py`` checks a run's bodies against the models."""
    names, required = _request_fields(model)
    unknown = [k for k in parts if k not in names]
    missing = [k for k in required if k not in parts]
    if unknown or missing:
        raise TypeError(f"a {model.__name__} body with unknown keys {unknown} and without the required {missing}")
    return encode_body(parts)


@dataclass(frozen=True)
class WindowData:
    """One logical window: the response text (forwarded to TACS and the physicalizer unchanged) and its parsed form
    (for the trace files and the window bounds)."""

    raw: RawJson
    data: dict[str, Any]

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


@dataclass(frozen=True)
class TacsResult:
    overlays: dict[str, Columns]  # {"reroute": columns, "migrate": columns} (an `Overlays` as JSON)
    state: dict[str, Any] | None  # the `ReplicaState` as JSON when the step changed it (None: unchanged)
    state_ref: str | None  # its name at the placement service
    smoothed: Any  # opaque to the orchestrator: passed back on the next step, saved at the frontier


@dataclass(frozen=True)
class PhysicalResult:
    compute: Columns | None  # `ComputeEvents` as JSON (the run's trace files), when asked for
    memory: Columns | None  # `MemoryEvents` as JSON
    deposit: RawJson  # their `EnergyDeposit` (forwarded to the thermal step unparsed)
    state: dict[str, Any] | None  # `PhysicalState` as JSON, when asked for (a checkpoint)
    state_ref: str  # its name at the lowering service (the next window's ``state_ref``)
    timing: WindowTiming


class _StepAnswer(BaseModel):
    """What the window loop reads of ``POST /v1/step``'s `StepResult`, parsed in one pass from the answer's bytes:
    the state stays JSON (as the service wrote it: it goes back to the service, or into the frontier, unparsed)."""

    state: dict[str, Any] | None = None
    state_ref: str
    snapshot: ThermalSnapshot


@dataclass(frozen=True)
class ThermalResult:
    state: dict[str, Any] | None  # `ThermalState` as JSON, when asked for (a checkpoint)
    state_ref: str  # its name at the thermal service
    snapshot: ThermalSnapshot


STATE_CODES = frozenset({"unknown_thermal_state", "unknown_physical_state", "unknown_replica_state"})


class StateMissing(Exception):
    """A service no longer keeps a window state the run named (a restart, an eviction, another replica): the window
    loop rebuilds it from its last checkpoint (`window_loop`)."""


EMPTY_OVERLAYS: dict[str, Columns] = Overlays().model_dump(mode="json")


def _registered_hash(answer: Any) -> str:
    return Registered.model_validate(answer).hash


def _model_hash(answer: Any) -> str:
    return str(answer["model"])  # `ModelInfo.model` (as ``shared.peers.thermal_model`` reads it)


@dataclass
class RunObject:
    """One object fixed for a run (arch, placement, influence matrix, TACS params), registered with one service and
    named there by the content hash that service answered (``shared.content``); the per-window requests carry the
    hash. ``code`` is the 404 code of a service that does not know it (a restart, an eviction, another replica):
    the pipeline registers it again and repeats the request once."""

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
    """A run's fixed objects per consumer, keyed by the field of the per-window request that names them:
    lowering ``/v1/physicalize`` (arch_hash, placement_hash), thermal ``/v1/step`` and ``/v1/warm_start`` (model:
    the hash of ``POST /v1/models``) and placement ``/v1/tacs/step`` (placement_hash, arch_hash, params_hash,
    H_hash; empty when the run has no TACS)."""

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


class Pipeline:
    """Typed wrappers over the five services for one run (``run_key`` prefixes the idempotency keys)."""

    def __init__(self, clients: ServiceClients, *, run_key: str = "", milp_poll_s: float = 0.2,
                 milp_timeout_s: float = 600.0) -> None:
        self.clients = clients
        self.run_key = run_key
        self.milp_poll_s = milp_poll_s
        self.milp_timeout_s = milp_timeout_s
        self._windows: dict[tuple[str, int], WindowData] = {}  # the last batch of logical windows read

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
                     run: RunObjects, idempotency_key: str, *, parse: bool = True) -> Any:
        """POST ``parts`` plus the hashes of ``run`` (by field) and parse the answer (``parse``; else its bytes). A
        service that does not know one of them (404 ``unknown_<kind>``: restart, eviction, another replica) gets them
        registered again, and the request is repeated once (as `logical_window` re-creates a forgotten trace)."""
        client = self.clients[service]

        def body() -> bytes:
            return encode_request(model, {**parts, **{field: obj.key for field, obj in run.items()}})

        try:
            resp = client.request("POST", path, content=body(), idempotency_key=idempotency_key)
        except NotFound as exc:
            if exc.code not in {obj.code for obj in run.values()}:
                raise
            for obj in run.values():
                self.register(obj)
            resp = client.request("POST", path, content=body(), idempotency_key=idempotency_key)
        return json_codec.loads(resp.content) if parse else resp.content

    def _post_stateful(self, service: str, path: str, model: type[BaseModel], parts: Mapping[str, Any],
                       run: RunObjects, idempotency_key: str, *, parse: bool = True) -> Any:
        """`_post_naming` for a request that names a window state: `StateMissing` when the service no longer keeps
        it (404 ``unknown_<kind>_state``)."""
        try:
            return self._post_naming(service, path, model, parts, run, idempotency_key, parse=parse)
        except NotFound as exc:
            if exc.code in STATE_CODES:
                raise StateMissing(f"{service}: {exc}") from exc
            raise

    def _post(self, service: str, path: str, model: type[BaseModel], parts: Mapping[str, Any], *,
              idempotency_key: str | None = None, params: Mapping[str, Any] | None = None) -> bytes:
        """POST a ``model`` request (`encode_request`) and return the answer's body."""
        resp = self.clients[service].request("POST", path, content=encode_request(model, parts), params=params,
                                             idempotency_key=idempotency_key)
        return resp.content

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
                         nonexpert_bytes_per_step=r.nonexpert_bytes_per_step)

    def logical_window(self, trace: TraceInfo, k: int, *, workload: WorkloadConfig, window_ms: float) -> WindowData:
        """Window k of the trace. Read with the `WINDOW_BATCH` - 1 windows after it in one call (the window loop
        walks the trace in order; a window the last batch does not hold starts a new one, so a replay or a resumed
        run reads from where it stands). If the service forgot the trace (restart, LRU), re-create it and retry
        once."""
        hit = self._windows.get((trace.trace_id, k))
        if hit is not None:
            return hit
        path = f"/v1/traces/{trace.trace_id}/windows"
        params = {"start": k, "count": WINDOW_BATCH}
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
        windows: list[dict[str, Any]] = json_codec.loads(resp.content)["windows"]
        if not windows or windows[0].get("window") != k:
            raise UpstreamError(f"workload: asked for windows from {k}, got "
                                f"{[w.get('window') for w in windows[:3]]}...")
        # each window's text is spliced into the TACS and physicalize requests as it came (orjson writes the same
        # shortest round-trip floats pydantic wrote)
        self._windows = {(trace.trace_id, int(w["window"])): WindowData(raw=RawJson(json_codec.dumps(w)), data=w)
                         for w in windows}
        return self._windows[(trace.trace_id, k)]

    def expert_load(self, trace: TraceInfo, *, workload: WorkloadConfig, window_ms: float) -> list[list[float]]:
        path = f"/v1/traces/{trace.trace_id}/expert-load"
        try:
            r = self.clients["workload"].get_json(path)
        except NotFound:
            self.create_trace(workload, window_ms)
            r = self.clients["workload"].get_json(path)
        return ExpertLoad.model_validate(r).load

    # ------------------------------------------------------------------------------------------------ thermal
    def thermal_model(self, arch: ArchConfig) -> str:
        return thermal_model(self.clients, arch, idempotency_key=self._key("thermal-model"))

    def influence(self, model_hash: str, arch: ArchConfig) -> list[list[float]]:
        """The cores × cores influence matrix H (K/W); rebuilds the model if the service forgot it."""
        return thermal_influence(self.clients, arch, model_hash, idempotency_key=self._key("thermal-model")).H

    def thermal_step(self, *, run: RunObjects, window: int, window_ms: float, state: dict[str, Any] | None,
                     state_ref: str | None, deposit: RawJson, return_state: bool, tag: str = "") -> ThermalResult:
        """One window from the previous state (inline, or named by ``state_ref``; both None: the run's start) and
        the window's energy deposit; ``run``: the run's thermal model (`RunData`). ``tag`` keeps the idempotency keys
        of a warm-up pass apart from the run's own windows of the same number. `StateMissing` when the service no
        longer keeps ``state_ref``."""
        parts: dict[str, Any] = {"window": window, "window_ms": window_ms, "deposit": deposit,
                                 "return_state": return_state}
        if state_ref is not None and state is None:
            parts["state_ref"] = state_ref
        else:
            parts["state"] = state
        r = _StepAnswer.model_validate_json(self._post_stateful("thermal", "/v1/step", StepRequest, parts, run,
                                                               self._key(tag + "step", window), parse=False))
        return ThermalResult(state=r.state, state_ref=r.state_ref, snapshot=r.snapshot)

    def warm_start(self, *, run: RunObjects, state: dict[str, Any] | None, state_ref: str | None
                   ) -> dict[str, Any]:
        """The `ThermalState` (JSON) window 0 starts from after a warm-up pass whose last state is ``state`` (or is
        named ``state_ref``)."""
        part = {"state": state} if state is not None else {"state_ref": state_ref}
        return dict(self._post_stateful("thermal", "/v1/warm_start", WarmStartRequest, part, run,
                                        self._key("warm_start")))

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

    def tacs_step(self, *, telemetry: Telemetry, run: RunObjects, state: dict[str, Any], state_ref: str | None,
                  pending: RawJson | None, smoothed: Any, now_ns: int, bank_bw_gbps: float, window: int,
                  tag: str = "") -> TacsResult:
        """One TACS step; ``run``: the run's placement, arch, params and H registered with placement (`RunData`).
        The replica state by the name the previous step gave it (``state_ref``, when it is still ``state``), else
        whole; a placement service that no longer keeps it gets it whole (``state``: the caller's copy)."""
        parts: dict[str, Any] = {"telemetry": telemetry, "smoothed": smoothed, "now_ns": now_ns,
                                 "bank_bw_gbps": bank_bw_gbps, "return_state": False}
        if pending is not None:
            parts["pending"] = pending
        key = self._key(tag + "tacs", window)
        try:
            r = self._post_naming("placement", "/v1/tacs/step", TacsStepRequest,
                                  {**parts, **({"state_ref": state_ref} if state_ref else {"state": state})}, run, key)
        except NotFound as exc:
            if exc.code != "unknown_replica_state":
                raise
            r = self._post_naming("placement", "/v1/tacs/step", TacsStepRequest, {**parts, "state": state}, run, key)
        return TacsResult(overlays=r["overlays"], state=r.get("state"), state_ref=r.get("state_ref"),
                          smoothed=r.get("smoothed"))

    # ----------------------------------------------------------------------------------------------- lowering
    def physicalize(self, *, window: int, logical: RawJson, run: RunObjects, overlays: dict[str, Columns],
                    state: dict[str, Any] | None, state_ref: str | None, replicas: dict[str, Any] | None,
                    freq_ghz: list[float], window_ms: float, bw_eff_factor: float | list[float], n_layers: int,
                    return_state: bool, events: bool, tag: str = "") -> PhysicalResult:
        """One window's physical events (``events``: also the events themselves, else only their energy deposit);
        ``run``: the run's arch and placement registered with lowering. The previous state inline or named by
        ``state_ref`` (`StateMissing` when the service no longer keeps it), ``replicas`` replacing its replica
        state (the TACS step's answer: the placement service owns it; the physicalizer never changes it)."""
        parts: dict[str, Any] = {"window": window, "logical": logical, "overlays": overlays}
        if state is not None or state_ref is None:
            parts["state"] = state
        else:
            parts["state_ref"] = state_ref
        if replicas is not None:
            parts["replicas"] = replicas
        parts.update({"freq_ghz": freq_ghz, "window_ms": window_ms, "bw_eff_factor": bw_eff_factor,
                      "n_layers": n_layers, "return_state": return_state, "events": events})
        r = self._post_stateful("lowering", "/v1/physicalize", PhysicalizeRequest, parts, run,
                                self._key(tag + "phys", window))
        return PhysicalResult(compute=r.get("compute"), memory=r.get("memory"), deposit=RawJson.of(r["deposit"]),
                              state=r.get("state"), state_ref=str(r["state_ref"]),
                              timing=WindowTiming.model_validate(r["timing"]))

    # ------------------------------------------------------------------------------------------------ metrics
    def reduce(self, *, scenario: str, workload: str, thot_c: float, bw_raw_gbps: float | None,
               windows: list[WindowMetrics] | list[dict[str, Any]], partial: dict[str, Any] | None = None
               ) -> ReduceResult:
        """The run's row from its last windows and ``partial`` (the windows before them, `reduce_fold`)."""
        wins = [w.model_dump(mode="json") if isinstance(w, WindowMetrics) else w for w in windows]
        body = {"scenario": scenario, "workload": workload, "thot_c": thot_c, "bw_raw_gbps": bw_raw_gbps,
                "windows": wins, "partial": partial}
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
