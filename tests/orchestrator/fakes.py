"""Small, deterministic stand-ins for four compute services (metrics is the real one), implementing their HTTP
contracts with cheap physics (T = T_amb + H·P with first-order lag),
mounted exactly as embedded mode mounts the real apps.

They exist so the orchestrator's durability tests (crash/resume, lease loss, retries) run in well under a second per
scenario; the end-to-end tests use the real services. `build_apps(settings)` is importable by worker subprocesses.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Body, FastAPI, Query
from fastapi.responses import JSONResponse

from shared.configs import ArchConfig, TasParams, WorkloadConfig
from shared.contracts.events import ComputeEvents, EnergyDeposit, MemoryEvents, PhysicalState, WindowTiming
from shared.contracts.ids import expert_id, parse_expert_id
from shared.contracts.placement import (
    ExpertPlacement,
    OverlayMigrate,
    OverlayReroute,
    Overlays,
    Placement,
    ReplicaEntry,
    ReplicaState,
    Telemetry,
)
from shared.contracts.placement_api import JobAccepted, JobStatus
from shared.contracts.thermal import InfluenceMatrix, RefreshReport, ThermalSnapshot, ThermalState
from shared.contracts.workload import (
    MAX_WINDOWS_PER_CALL,
    ExpertLoad,
    LogicalCompute,
    LogicalMemory,
    LogicalWindow,
    TraceSummary,
)
from shared.energy import deposit_of_events
from shared.errors import BadInput, Conflict, NotFound
from shared.service_app import create_service_app
from shared.settings import Settings

N_LAYERS = 2
N_EXPERTS = 8


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def registry(router: APIRouter, kinds: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``POST /registry/<path>`` for each ``{path: kind}`` (the run data of ``shared.content``, as raw JSON)."""
    stores: dict[str, dict[str, Any]] = {kind: {} for kind in kinds.values()}

    def endpoint(kind: str) -> Any:
        def register(body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
            key = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
            stores[kind][key] = body
            return {"kind": kind, "hash": key, "bytes": 0}
        return register

    for path, kind in kinds.items():
        router.post(f"/registry/{path}")(endpoint(kind))
    return stores


def inline_or_hash(body: dict[str, Any], field: str, stores: dict[str, dict[str, Any]], kind: str) -> Any:
    """``body[field]``, or the registered object ``body[field + "_hash"]`` names (404 ``unknown_<kind>``)."""
    key = body.get(f"{field}_hash")
    if key is None:
        return body[field]
    if key not in stores[kind]:
        raise NotFound(f"unknown {kind} {key}", code=f"unknown_{kind}")
    return stores[kind][key]


# ------------------------------------------------------------------------------------------------------ workload


def topk_of(wl: WorkloadConfig) -> int:
    """The workload's experts per token: its ``routing.topk``, else the fake model's own (2, as Mixtral's)."""
    return wl.routing.topk if wl.routing.topk is not None else 2


def workload_app(settings: Settings) -> FastAPI:
    router = APIRouter(tags=["workload"])
    traces: dict[str, tuple[WorkloadConfig, float]] = {}

    def n_windows(wl: WorkloadConfig, window_ms: float) -> int:
        return math.ceil(wl.sequence.steps * wl.sequence.step_interval_ms / window_ms)

    @router.get("/models/{name}")
    def model(name: str) -> dict[str, Any]:
        from services.workload.zoo import ModelZoo  # the real zoo: its names and its 404

        return {"name": ModelZoo().get_model_config(name).name}

    @router.post("/traces")
    def create(body: dict[str, Any]) -> dict[str, Any]:
        wl = WorkloadConfig.model_validate(body["workload"])
        window_ms = float(body["window_ms"])
        tid = _hash([wl.model_dump(mode="json"), window_ms])
        traces[tid] = (wl, window_ms)
        return TraceSummary(trace_id=tid, model=wl.model_name, window_ms=window_ms,
                            n_windows=n_windows(wl, window_ms), n_layers=N_LAYERS, n_experts=N_EXPERTS,
                            topk=topk_of(wl), moe_layers=list(range(N_LAYERS)), steps=wl.sequence.steps,
                            micro_batch=wl.sequence.micro_batch,
                            tokens_total=wl.sequence.steps * wl.sequence.micro_batch, flops_per_token_expert=2.0e8,
                            expert_bytes=64_000_000).model_dump(mode="json")

    def popularity(wl: WorkloadConfig) -> np.ndarray:
        p = 1.0 / np.arange(1, N_EXPERTS + 1) ** wl.routing.zipf_s
        return np.asarray(p / p.sum())

    @router.get("/traces/{trace_id}/windows/{k}")
    def window(trace_id: str, k: int) -> dict[str, Any]:
        if trace_id not in traces:
            raise NotFound(f"unknown trace {trace_id}", code="unknown_trace")
        wl, window_ms = traces[trace_id]
        t0, t1 = int(k * window_ms * 1e6), int((k + 1) * window_ms * 1e6)
        step_ns = int(wl.sequence.step_interval_ms * 1e6)
        mbs = [m for m in range(wl.sequence.steps) if t0 <= m * step_ns < t1]
        rng = np.random.default_rng([wl.routing.seed, k])
        cols: dict[str, list[Any]] = {n: [] for n in LogicalCompute.model_fields}
        mem: dict[str, list[Any]] = {n: [] for n in LogicalMemory.model_fields}
        eid = k * 100_000
        for mb in mbs:
            for layer in range(N_LAYERS):
                counts = rng.multinomial(wl.sequence.micro_batch * topk_of(wl), popularity(wl))
                for e in range(N_EXPERTS):
                    if counts[e] == 0:
                        continue
                    for name, v in (("event_id", eid), ("t_gen_ns", mb * step_ns), ("mb_id", mb),
                                    ("layer", layer), ("op_type", "fc"), ("expert", e), ("tokens", int(counts[e])),
                                    ("flops", float(counts[e]) * 2.0e8)):
                        cols[name].append(v)
                    for name, v in (("event_id", eid), ("tensor_id", f"W_L{layer}E{e}_0"), ("access", "read"),
                                    ("bytes", 1.0e6), ("locality_hint", "shard0")):
                        mem[name].append(v)
                    eid += 1
        return LogicalWindow(trace_id=trace_id, window=k, t0_ns=t0, t1_ns=t1, compute=LogicalCompute(**cols),
                             memory=LogicalMemory(**mem),
                             tokens_generated=len(mbs) * wl.sequence.micro_batch).model_dump(mode="json")

    @router.get("/traces/{trace_id}/windows")  # the real one's bounds (window_ms: the trace's own only)
    def windows(trace_id: str, start: Annotated[int, Query(ge=0)] = 0,
                count: Annotated[int, Query(ge=1, le=MAX_WINDOWS_PER_CALL)] = 16) -> dict[str, Any]:
        if trace_id not in traces:
            raise NotFound(f"unknown trace {trace_id}", code="unknown_trace")
        wl, window_ms = traces[trace_id]
        last = min(n_windows(wl, window_ms), start + count)
        if start >= last:
            raise NotFound(f"window {start} out of range", field="start", code="unknown_window")
        return {"windows": [window(trace_id, k) for k in range(start, last)]}

    @router.get("/traces/{trace_id}/expert-load")
    def load(trace_id: str) -> dict[str, Any]:
        if trace_id not in traces:
            raise NotFound(f"unknown trace {trace_id}", code="unknown_trace")
        wl, _ = traces[trace_id]
        return ExpertLoad(trace_id=trace_id, layers=list(range(N_LAYERS)),
                          load=[popularity(wl).tolist() for _ in range(N_LAYERS)]).model_dump(mode="json")

    app = create_service_app("workload", settings, [router])
    app.state.traces = traces
    return app


# ------------------------------------------------------------------------------------------------------- thermal


def influence_matrix(arch: ArchConfig) -> np.ndarray:
    X, Y = arch.mesh.cores
    xs, ys = np.meshgrid(np.arange(X), np.arange(Y))
    x, y = xs.ravel(), ys.ravel()
    d = np.abs(x[:, None] - x[None, :]) + np.abs(y[:, None] - y[None, :])
    return np.asarray(0.6 * np.exp(-d / 1.5) + 0.02)  # K/W


def kept_state(body: dict[str, Any], states: dict[str, Any], kind: str) -> Any:
    """The request's previous state: inline (``state``) or by the name an answer gave it (``state_ref``; a 404
    ``unknown_<kind>`` when this app does not keep it, as the real services)."""
    ref = body.get("state_ref")
    if ref is not None and body.get("state") is None:
        if ref not in states:
            raise NotFound(f"unknown {kind} {ref}", field="state_ref", code=f"unknown_{kind}")
        return states[ref]
    return body.get("state")


def answer_state(body: dict[str, Any], states: dict[str, Any], state: dict[str, Any], rest: dict[str, Any]
                 ) -> dict[str, Any]:
    """Keep ``state`` under its hash and answer it (whole unless ``return_state`` is false) with ``rest``."""
    ref = _hash(state)
    states[ref] = state
    out = {**rest, "state_ref": ref}
    if body.get("return_state", True):
        out["state"] = state
    return out


def thermal_app(settings: Settings) -> FastAPI:
    router = APIRouter(tags=["thermal"])
    models: dict[str, ArchConfig] = {}
    states: dict[str, Any] = {}

    @router.post("/models")
    def model(body: dict[str, Any]) -> dict[str, Any]:
        arch = ArchConfig.model_validate(body["arch"])
        models[arch.content_hash()] = arch
        return {"model": arch.content_hash(), "n_cores": arch.mesh.n_cores}

    @router.get("/models/{h}/influence")
    def influence(h: str) -> dict[str, Any]:
        if h not in models:
            raise NotFound(f"unknown model {h}")
        return InfluenceMatrix(model=h, cores=models[h].mesh.n_cores,
                               H=influence_matrix(models[h]).tolist()).model_dump(mode="json")

    @router.post("/step")
    def step(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model") is not None:
            if body["model"] not in models:
                raise NotFound(f"unknown model {body['model']}", code="unknown_model")
            arch = models[body["model"]]
        else:
            arch = ArchConfig.model_validate(body["arch"])
        k, dt_ms = int(body["window"]), float(body["window_ms"])
        state = ThermalState.model_validate(kept_state(body, states, "thermal_state") or {})
        if state.window != k - 1:
            raise Conflict(f"state is at window {state.window}, cannot step window {k}", code="out_of_order")
        n = arch.mesh.n_cores
        amb = arch.geometry.cooling.ambient_c
        p = np.full(n, 0.5)
        if body.get("deposit") is not None:  # compute energy per core; the DRAM energy
            dep = EnergyDeposit.model_validate(body["deposit"])
            p += np.asarray(dep.core_compute_j) * 2 / (dt_ms * 1e-3)
            bytes_total = (dep.array_j + dep.tsv_io_j) / (8 * 3.9e-12)
        else:
            ce = ComputeEvents.model_validate(body["compute_events"])
            me = MemoryEvents.model_validate(body["memory_events"])
            np.add.at(p, np.asarray(ce.core_id, dtype=int), np.asarray(ce.flops) * 1.5e-12 / (dt_ms * 1e-3))
            bytes_total = float(np.sum(me.bytes))
        t_prev = (np.frombuffer(base64.b64decode(state.field_b64), dtype="<f4").astype(float) - 273.15
                  if state.field_b64 else np.full(n, amb))
        t_ss = amb + influence_matrix(arch) @ p
        t = t_prev + 0.35 * (t_ss - t_prev)
        dom = arch.dvfs.domains[0]
        levels = np.searchsorted(np.asarray(dom.trip_c), t)
        freq = [float(dom.steps_ghz[i]) for i in levels]
        banks = [[float(v - 0.2 * j) for j in range(arch.dram.banks[2])] for v in t]
        hot = float(np.max(t))
        mult = 2.0 if hot > 85 else 1.0
        new = ThermalState(t_ns=state.t_ns + int(dt_ms * 1e6), window=k, dvfs_level=[int(x) for x in levels],
                           field_b64=base64.b64encode((t + 273.15).astype("<f4").tobytes()).decode())
        t32 = np.frombuffer(base64.b64decode(new.field_b64 or ""), dtype="<f4").astype(float) - 273.15
        snap = ThermalSnapshot(
            window=k, temps_core_c=t32.tolist(), temps_core_max_c=(t32 + 0.5).tolist(), temps_bank_c=banks,
            peak_c={"logic": float(np.max(t32) + 0.5), "dram_1": float(np.max(t32))},
            mean_c={"logic": float(np.mean(t32)), "dram_1": float(np.mean(t32)) - 0.5},
            power_core_w=p.tolist(), freq_ghz=freq,
            refresh=RefreshReport(multiplier=[mult], refresh_mhz=1000.0 * mult / 7.8,
                                  bw_eff_factor=1.0 - 0.045 * mult))
        snap.power_w.logic_dynamic = float(np.sum(p))
        snap.power_w.dram_dynamic = bytes_total * 8 * 3.9e-12 / (dt_ms * 1e-3)
        return answer_state(body, states, new.model_dump(mode="json"), {"snapshot": snap.model_dump(mode="json")})

    @router.post("/step/epoch")
    def step_epoch(body: dict[str, Any]) -> dict[str, Any]:
        """``/step`` window after window from the state the one before left, stopping after the first window
        whose next window runs at other DVFS levels or another refresh factor (``until_event``)."""
        state, snaps, event = body.get("state"), [], None
        for i, dep in enumerate(body["deposits"]):
            one = {"model": body.get("model"), "arch": body.get("arch"), "window": int(body["window"]) + i,
                   "window_ms": body["window_ms"], "state": state, "deposit": dep}
            out = step(one)
            before = list((state or {}).get("dvfs_level") or [])
            state = out["state"]
            snaps.append(out["snapshot"])
            after = list(state["dvfs_level"])
            bw = body.get("bw_eff_factor")
            here = ("dvfs" if after != (before or [0] * len(after))
                    else "refresh" if bw is not None and out["snapshot"]["refresh"]["bw_eff_factor"] != bw else None)
            event = event or here
            if here is not None and body.get("until_event", True):
                break
        return {"snapshots": snaps, "state": state if body.get("return_state", True) else None, "event": event}

    @router.post("/warm_start")
    def warm_start(body: dict[str, Any]) -> dict[str, Any]:
        """The fake keeps no energy: the run proper starts from the warm-up pass's last field."""
        state = ThermalState.model_validate(kept_state(body, states, "thermal_state"))
        return ThermalState(field_b64=state.field_b64, window=-1).model_dump(mode="json")

    app = create_service_app("thermal", settings, [router])
    app.state.models = models
    app.state.states = states
    return app


# ----------------------------------------------------------------------------------------------------- placement


def placement_app(settings: Settings) -> FastAPI:
    router = APIRouter(tags=["placement"])
    jobs: dict[str, dict[str, Any]] = {}
    replica_states: dict[str, Any] = {}
    stores = registry(router, {"placements": "placement", "archs": "arch", "tacs-params": "tacs_params",
                               "influence": "influence"})

    def build(body: dict[str, Any]) -> Placement:
        arch = ArchConfig.model_validate(body["arch"])
        n = arch.mesh.n_cores
        layers = body["moe_layers"]
        ids = [(layer, e) for layer in layers for e in range(N_EXPERTS)]
        if body["method"] == "default":
            cores = [i % n for i in range(len(ids))]
            method = "default"
        else:  # spread by load onto the cores with the least influence from the others (corners/edges first)
            load = body["expert_load"]
            H = np.asarray(body.get("H") or influence_matrix(arch))
            order = sorted(range(len(ids)), key=lambda i: -load[ids[i][0]][ids[i][1]])
            cool = list(np.argsort(H.sum(axis=1), kind="stable"))
            cores = [0] * len(ids)
            for rank, i in enumerate(order):
                cores[i] = int(cool[rank % n])
            method = str(body["method"])
        return Placement(experts={expert_id(layer, e): ExpertPlacement(cores=[c])
                                  for (layer, e), c in zip(ids, cores, strict=True)},
                         meta={"method": method})

    @router.post("/placements")
    def placements(body: dict[str, Any]) -> Any:
        plc = build(body)
        if body["method"] == "milp":
            jid = _hash(body)[:12]
            jobs[jid] = JobStatus(job_id=jid, status="done", result=plc).model_dump(mode="json")
            return JSONResponse(JobAccepted(job_id=jid, status="queued").model_dump(), status_code=202)
        return plc.model_dump(mode="json")

    @router.get("/placement-jobs/{jid}")
    def job(jid: str) -> dict[str, Any]:
        if jid not in jobs:
            raise NotFound(f"unknown job {jid}")
        return jobs[jid]

    @router.post("/tacs/step")
    def tacs(body: dict[str, Any]) -> dict[str, Any]:
        tele = Telemetry.model_validate(body["telemetry"])
        state = ReplicaState.model_validate(kept_state(body, replica_states, "replica_state") or {})
        before = state.model_copy(deep=True)
        params = TasParams.model_validate({"tacs": inline_or_hash(body, "params", stores, "tacs_params")}).tacs
        t = np.asarray(tele.temps_core)
        prev = body.get("smoothed")
        sm = t if prev is None else params.smoothing_alpha * t + (1 - params.smoothing_alpha) * np.asarray(prev)
        now = int(body["now_ns"])
        reroute = OverlayReroute.empty()
        migrate = OverlayMigrate.empty()
        hot, cool = int(np.argmax(sm)), int(np.argmin(sm))
        if sm[hot] > params.thresholds.Thot and hot != cool:
            movable = [e for e, r in sorted(state.experts.items())
                       if r.cores == [hot] and now - r.ts_created_ns >= params.min_residency_ms * 1e6]
            if movable:
                e = movable[0]
                layer, ex = parse_expert_id(e)
                migrate = OverlayMigrate(t_apply_ns=[now], obj_type=["expert"], obj_id=[e], src=[str(hot)],
                                         dst=[str(cool)], size_bytes=[64_000_000], cost=[1.0])
                reroute = OverlayReroute(t_apply_ns=[now], scope=["expert"], from_core=[hot], to_core=[cool],
                                         mb_ids_json=[json.dumps([e])], reason=["hot_core"],
                                         expected_gain=[float(sm[hot] - sm[cool])])
                state.experts[e] = ReplicaEntry(cores=[cool], ts_created_ns=now, last_change_ns=now,
                                                prev_cores=[hot])
                _ = (layer, ex)
        out = answer_state(body, replica_states, state.model_dump(mode="json"),
                           {"overlays": Overlays(reroute=reroute, migrate=migrate).model_dump(mode="json"),
                            "smoothed": [float(x) for x in sm]})
        if state != before:
            out["state"] = state.model_dump(mode="json")  # a changed state comes back whole (as the real one)
        return out

    @router.post("/tacs/epoch")
    def tacs_epoch(body: dict[str, Any]) -> dict[str, Any]:
        """``/tacs/step`` step after step until a decision acts."""
        state, smoothed, seen = body.get("state"), body.get("smoothed"), []
        fixed = {k: body[k] for k in body if k.endswith("_hash") or k in {"placement", "params", "arch", "H"}}
        for i, st in enumerate(body["steps"]):
            out = tacs({**fixed, **st, "state": state, "smoothed": smoothed})
            smoothed = out["smoothed"]
            seen.append(smoothed)
            ov = Overlays.model_validate(out["overlays"])
            if not ov.is_empty():
                return {"smoothed": seen, "acted": i, "overlays": out["overlays"], "state": out.get("state")}
        return {"smoothed": seen}

    app = create_service_app("placement", settings, [router])
    app.state.run_data = stores
    app.state.states = replica_states
    return app


# ------------------------------------------------------------------------------------------------------ lowering


def lowering_app(settings: Settings) -> FastAPI:
    router = APIRouter(tags=["lowering"])
    states: dict[str, Any] = {}
    stores = registry(router, {"placements": "placement", "archs": "arch"})

    @router.post("/physicalize")
    def physicalize(body: dict[str, Any]) -> dict[str, Any]:
        arch = ArchConfig.model_validate(inline_or_hash(body, "arch", stores, "arch"))
        n = arch.mesh.n_cores
        lw = LogicalWindow.model_validate(body["logical"])
        state = PhysicalState.model_validate(kept_state(body, states, "physical_state") or {})
        if body.get("replicas") is not None:
            state.replicas = ReplicaState.model_validate(body["replicas"])
        freq = body["freq_ghz"]
        ov = Overlays.model_validate(body["overlays"])
        for obj, dst in zip(ov.migrate.obj_id, ov.migrate.dst, strict=True):  # the replica state is TACS's alone
            if obj in state.replicas.experts and int(dst) not in state.replicas.experts[obj].cores:
                raise BadInput(f"{obj} moves to core {dst} the replica state does not list", field="overlays.migrate")
        c = lw.compute
        evt = state.next_evt_id
        comp: dict[str, list[Any]] = {name: [] for name in ComputeEvents.model_fields}
        busy = np.zeros(n)
        for i in range(len(c)):
            e = c.expert[i]
            core = state.replicas.experts[expert_id(c.layer[i], e)].cores[0] if e >= 0 else c.mb_id[i] % n
            cyc = int(c.flops[i] / 2048)
            busy[core] += cyc / (freq[core] * 1e9)
            for name, v in (("evt_id", evt), ("t_start_ns", c.t_gen_ns[i]), ("core_id", core),
                            ("duration_cycles", cyc), ("flops", c.flops[i]), ("op", c.op_type[i]),
                            ("dvfs_domain", "d0"), ("power_hint", 1.0),
                            ("energy_j", c.flops[i] * 0.75e-12)):
                comp[name].append(v)
            evt += 1
        m = lw.memory
        memv = MemoryEvents(evt_id=list(range(evt, evt + len(m))), t_start_ns=[lw.t0_ns] * len(m),
                            src_core=[0] * len(m), dst_bank=["B(0,0,0)"] * len(m), bytes=list(m.bytes),
                            rw=["r"] * len(m), hops=[1] * len(m), noc_qos=["normal"] * len(m))
        evt += len(m)
        dt = float(body["window_ms"]) * 1e-3
        lat = 0.5 + 1e3 * float(busy.max())
        timing = WindowTiming(tokens_completed=lw.tokens_generated, latencies_ms=[lat] * min(lw.tokens_generated, 8),
                              util_core=np.minimum(busy / dt, 1.0).tolist(), bytes_moved=float(sum(m.bytes)),
                              noc_link_util=[0.1, 0.2], migrations=len(ov.migrate))
        new = PhysicalState(replicas=state.replicas, next_evt_id=evt)
        deposit = deposit_of_events(ComputeEvents(**comp), memv, arch).to_contract()  # the real one (shared)
        rest: dict[str, Any] = {"deposit": deposit.model_dump(mode="json"), "timing": timing.model_dump(mode="json")}
        if body.get("events", True):
            rest.update(compute=ComputeEvents(**comp).model_dump(mode="json"), memory=memv.model_dump(mode="json"))
        return answer_state(body, states, new.model_dump(mode="json"), rest)

    @router.post("/physicalize/epoch")
    def physicalize_epoch(body: dict[str, Any]) -> dict[str, Any]:
        """``/physicalize`` window after window: the overlays and replicas at the first window only."""
        state, windows = body.get("state"), []
        fixed = {k: body[k] for k in ("arch", "arch_hash", "placement", "placement_hash", "freq_ghz", "window_ms",
                                      "bw_eff_factor", "n_layers", "events") if k in body}
        for i, lw in enumerate(body["logical"]):
            one = {**fixed, "window": int(body["window"]) + i, "logical": lw, "state": state,
                   "overlays": body.get("overlays") if i == 0 else Overlays().model_dump(mode="json")}
            if i == 0 and body.get("replicas") is not None:
                one["replicas"] = body["replicas"]
            out = physicalize(one)
            state = out["state"]
            windows.append({k: out[k] for k in ("compute", "memory", "deposit", "timing") if k in out})
        return {"windows": windows, "state": state if body.get("return_state", True) else None}

    app = create_service_app("lowering", settings, [router])
    app.state.run_data = stores
    app.state.states = states
    return app


def build_apps(settings: Settings) -> dict[str, FastAPI]:
    """The five fake compute services (the orchestrator is not one of them)."""
    from services.metrics.app import create_app as metrics_app  # the real one: cheap and already merged

    return {"workload": workload_app(settings), "thermal": thermal_app(settings),
            "placement": placement_app(settings), "lowering": lowering_app(settings),
            "metrics": metrics_app(settings)}


class RecordingDispatcher:
    """A dispatcher that records the experiments it is handed and runs nothing (tests of the API layer)."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def submit_experiment(self, exp_id: str) -> None:
        self.submitted.append(exp_id)

    def shutdown(self) -> None:
        return None
