"""Experiment logic behind the HTTP layer: resolve configs, create experiments (idempotently), progress views,
results, per-window series, sweeps. Plain functions with keyword arguments; the caller owns the session."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from services.orchestrator import repository as repo
from services.orchestrator import series, window_store
from services.orchestrator.models import Experiment, RunStatus, ScenarioRun
from services.orchestrator.pipeline_clients import reads_a_trace
from services.orchestrator.run_files import power_reports, result_csv_path, run_dir_for
from services.orchestrator.schemas import (
    ExperimentRequest,
    ExperimentSpec,
    ExperimentView,
    RunProgress,
    SweepRequest,
    SweepView,
)
from shared.auth import LOCAL
from shared.configs import ArchConfig, TasParams, WorkloadConfig, load_config
from shared.configs.base import StrictModel
from shared.configs.loader import inline_model_file
from shared.contracts.metrics import RESULT_COLUMNS, WindowMetrics
from shared.contracts.thermal import ThermalState
from shared.errors import BadInput, Conflict, NotFound, QuotaExceeded, first_validation_error
from shared.settings import Settings

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")


def _load_named(name: str, model: type[StrictModel], *, configs_dir: Path, field: str) -> Any:
    if not _NAME.match(name) or name.startswith("."):
        raise BadInput(f"{field}: {name!r} is not a config file name (letters, digits, _ . - only)", field=field)
    candidates = [configs_dir / name] + ([] if name.endswith((".yaml", ".yml")) else [configs_dir / f"{name}.yaml"])
    for path in candidates:
        if path.is_file():
            return load_config(path, model)
    known = sorted(p.name for p in configs_dir.glob("*.yaml")) if configs_dir.is_dir() else []
    raise BadInput(f"{field}: no config file {name!r} under {configs_dir} (known: {', '.join(known) or 'none'})",
                   field=field)


def resolve_spec(req: ExperimentRequest, *, configs_dir: Path) -> ExperimentSpec:
    """Inline configs are used as given; names are loaded from ``configs_dir``. The seed (default: the workload's
    routing seed) is written into ``workload.routing.seed`` so the stored spec alone determines the run."""
    arch = req.arch if isinstance(req.arch, ArchConfig) else _load_named(req.arch, ArchConfig,
                                                                          configs_dir=configs_dir, field="arch")
    if isinstance(req.workload, WorkloadConfig):
        wl = req.workload
        if not isinstance(wl.model, str) and isinstance(wl.model.config, str):
            raise BadInput("workload.model.config: a file path is read only from configs on the server; send the "
                           "config.json object itself (or register it: POST /v1/models)",
                           field="workload.model.config")
    else:
        wl = inline_model_file(_load_named(req.workload, WorkloadConfig, configs_dir=configs_dir, field="workload"),
                               configs_dir)
    tas = req.tas if isinstance(req.tas, TasParams) else _load_named(req.tas, TasParams, configs_dir=configs_dir,
                                                                      field="tas")
    seed = wl.routing.seed if req.seed is None else req.seed
    wl_d = wl.model_dump(mode="json")
    wl_d["routing"]["seed"] = seed
    wl = WorkloadConfig.model_validate(wl_d)
    scenarios = list(dict.fromkeys(req.scenarios))
    check_cross_fields(arch, tas)
    return ExperimentSpec(arch=arch, workload=wl, tas=tas, scenarios=scenarios, seed=seed, windows=req.windows,
                          name=req.name or f"{wl.label}", traces=req.traces, events=req.events, plots=req.plots,
                          placement=req.placement, thermal_init=load_thermal_init(arch, configs_dir=configs_dir))


CONFIG_KINDS: dict[str, type[StrictModel]] = {"arch": ArchConfig, "workload": WorkloadConfig, "tas": TasParams}


def _config_kind(path: Path) -> str | None:
    """Which config a shipped YAML file holds: by its name's prefix (``arch_``, ``workload_``, ``tas_``), as the
    project names them, else the first model that validates it."""
    for kind in CONFIG_KINDS:
        if path.name.startswith(f"{kind}_"):
            return kind
    for kind, model in CONFIG_KINDS.items():
        try:
            load_config(path, model)
        except Exception:  # a file of another kind, or no config at all: tried as the next kind
            continue
        return kind
    return None


def list_configs(configs_dir: Path) -> dict[str, list[str]]:
    """The config files under ``configs_dir`` by kind (the presets of the dashboard's form; what a request may
    name)."""
    out: dict[str, list[str]] = {kind: [] for kind in CONFIG_KINDS}
    for path in sorted(configs_dir.glob("*.yaml")) if configs_dir.is_dir() else []:
        kind = _config_kind(path)
        if kind is not None:
            out[kind].append(path.name)
    return out


def read_config(name: str, *, configs_dir: Path) -> dict[str, Any]:
    """One config file, validated, with every default filled in (a workload's model config file read in, as a run
    would): ``{"name", "kind", "config"}``. 404 naming ``name`` when there is no such file; 422 when it is not
    valid."""
    path = configs_dir / name
    if not _NAME.match(name) or name.startswith(".") or not name.endswith((".yaml", ".yml")) or not path.is_file():
        raise NotFound(f"no config file {name!r} (GET /v1/configs lists them)", field="name")
    kind = _config_kind(path)
    if kind is None:
        raise BadInput(f"{name}: not a valid arch, workload or TAS-parameter config", field="name")
    cfg = load_config(path, CONFIG_KINDS[kind])
    if isinstance(cfg, WorkloadConfig):
        cfg = inline_model_file(cfg, configs_dir)
    return {"name": name, "kind": kind, "config": cfg.model_dump(mode="json")}


def check_cross_fields(arch: ArchConfig, tas: TasParams) -> None:
    """What no single config can check: TACS's ``Thot`` above the ambient temperature (a core at ambient would
    count as hot and TACS would act on an idle chip). One `BadInput` naming the field, before anything runs."""
    thot, amb = tas.tacs.thresholds.Thot, arch.geometry.cooling.ambient_c
    if not thot > amb:
        raise BadInput(f"tas.tacs.thresholds.Thot: {thot:g} °C is not above the ambient temperature "
                       f"(arch geometry.cooling.ambient_c = {amb:g} °C)", field="tas.tacs.thresholds.Thot")


def load_thermal_init(arch: ArchConfig, *, configs_dir: Path) -> ThermalState | None:
    """The state ``arch.thermal.init`` names (``<name>.json`` in ``configs_dir``; the config model admits bare file
    names only), ready to start window 0: window -1, no warm-up energy. None for "ambient" / "steady"."""
    name = arch.thermal.init
    if name in ("ambient", "steady"):
        return None
    field = "arch.thermal.init"
    path = configs_dir / name
    if "/" in name or "\\" in name or name.startswith(".") or not path.is_file():
        raise BadInput(f"{field}: no thermal state file {name!r} in the configs directory", field=field)
    try:
        state = ThermalState.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        fld, msg = first_validation_error(exc)
        raise BadInput(f"{field}: {name} is not a thermal state ({fld}: {msg})", field=field) from None
    if state.field_b64 is None:
        raise BadInput(f"{field}: {name} holds no temperature field", field=field)
    return state.model_copy(update={"window": -1, "t_ns": 0, "warm_energy_b64": None, "warm_s": 0.0})


def spec_hash(spec: ExperimentSpec) -> str:
    return hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def new_experiment_id() -> str:
    return f"exp-{uuid.uuid4().hex[:12]}"


MAX_ATTEMPTS = 3  # claims of a submitted run before it is failed (the API's experiments and sweeps)


@dataclass(frozen=True)
class RunQuota:
    """How many queued and running runs one principal may have (``TASMOE_QUOTA_ACTIVE_RUNS``), and how long a
    refused client is told to wait (its Retry-After)."""

    limit: int
    retry_after_s: int


def check_quota(*, session: Session, owner: str, new_runs: int, quota: RunQuota) -> None:
    """`QuotaExceeded` (429 + Retry-After) when the principal's queued and running runs plus ``new_runs`` would pass
    the quota. It binds only inside the transaction that took `repository.lock_owner_quota` and then inserts the runs
    (`create_experiment`, `create_sweep` do both); on its own it is a cheap early refusal that a concurrent
    submission can get past."""
    active = repo.active_runs_of_owner(session=session, owner=owner)
    if active + new_runs > quota.limit:
        raise QuotaExceeded(f"{owner} has {active} queued or running runs; {new_runs} more would pass the quota of "
                            f"{quota.limit} (TASMOE_QUOTA_ACTIVE_RUNS): retry when some finished, or cancel some",
                            field="scenarios", retry_after_s=quota.retry_after_s)


def _add_experiment(*, session: Session, exp_id: str, spec: ExperimentSpec, out_dir: Path,
                    idempotency_key: str | None, max_attempts: int, sweep_id: str | None, owner: str) -> None:
    repo.add_experiment(session=session, exp_id=exp_id, name=spec.name, configs=spec.model_dump(mode="json"),
                        seed=spec.seed, scenarios=spec.scenarios, out_dir=str(out_dir),
                        idempotency_key=idempotency_key, request_hash=spec_hash(spec), max_attempts=max_attempts,
                        sweep_id=sweep_id, owner=owner)


def create_experiment(*, sessions: sessionmaker[Session], spec: ExperimentSpec, settings: Settings,
                      idempotency_key: str | None = None, out_dir: Path | None = None,
                      max_attempts: int = MAX_ATTEMPTS,
                      sweep_id: str | None = None, exp_id: str | None = None,
                      owner: str = LOCAL, quota: RunQuota | None = None) -> tuple[str, bool]:
    """Create the experiment and its queued runs; (id, created). The same Idempotency-Key returns the principal's
    first experiment (a different body under a used key is a 409). Keys are per principal: another principal's use
    of the same key is neither seen nor told.

    ``quota``: the principal's run quota (None: none, e.g. the CLI's own runs). It is checked in the transaction
    that inserts the runs, under the principal's quota lock, so concurrent submissions cannot pass it together,
    with or without a key. A replayed key creates nothing and is not charged: the key is looked up under the same
    lock, so a replay racing the key's first submission finds it instead of counting its runs against itself."""
    h = spec_hash(spec)
    if idempotency_key is not None and len(idempotency_key) > 200:
        raise BadInput("Idempotency-Key: at most 200 characters", field="Idempotency-Key")
    exp_id = exp_id or new_experiment_id()
    out = out_dir or (settings.results_dir / exp_id)
    try:
        with sessions.begin() as s:
            if quota is not None:
                repo.lock_owner_quota(session=s, owner=owner)
            if idempotency_key is not None:
                old = repo.get_experiment_by_key(session=s, owner=owner, idempotency_key=idempotency_key)
                if old is not None:
                    return _same(old, h)
            if quota is not None:
                check_quota(session=s, owner=owner, new_runs=len(spec.scenarios), quota=quota)
            _add_experiment(session=s, exp_id=exp_id, spec=spec, out_dir=out, idempotency_key=idempotency_key,
                            max_attempts=max_attempts, sweep_id=sweep_id, owner=owner)
    except IntegrityError:
        if idempotency_key is None:
            raise
        with sessions() as s:  # a concurrent request of the principal with the same key (without a quota lock) won
            old = repo.get_experiment_by_key(session=s, owner=owner, idempotency_key=idempotency_key)
            if old is None:
                raise
            return _same(old, h)
    return exp_id, True


def _same(old: Experiment, h: str) -> tuple[str, bool]:
    if old.request_hash != h:
        raise Conflict(f"Idempotency-Key already used for experiment {old.id} with a different request",
                       field="Idempotency-Key", code="idempotency_mismatch")
    return old.id, False


def _progress(run: ScenarioRun) -> RunProgress:
    n = run.n_windows
    if run.status == RunStatus.succeeded and n is not None:
        text = f"window {n} of {n}"
    else:
        text = f"window {run.next_window} of {n if n is not None else '?'}"
    waiting = run.waiting_reason if run.status == RunStatus.running else None
    return RunProgress(scenario=run.scenario, run_id=run.id, status="waiting" if waiting else run.status.value,
                       window=run.next_window, n_windows=n, progress=text, attempts=run.attempts,
                       started_at=run.started_at, finished_at=run.finished_at, compute_s=round(run.compute_s, 3),
                       error=run.error, waiting=waiting)


def experiment_view(*, session: Session, exp_id: str) -> ExperimentView:
    exp = repo.get_experiment(session=session, exp_id=exp_id)
    if exp is None:
        raise NotFound(f"no experiment {exp_id!r}", field="id")
    runs = repo.runs_of(session=session, exp_id=exp_id)
    return ExperimentView(id=exp.id, name=exp.name, status=exp.status.value, seed=exp.seed,
                          created_at=exp.created_at, updated_at=exp.updated_at, out_dir=exp.out_dir,
                          error=exp.error, sweep_id=exp.sweep_id, runs=[_progress(r) for r in runs])


def result_rows(*, session: Session, exp_id: str) -> list[dict[str, Any]]:
    """The result rows (seed §3.6 columns + extras, as the metrics service reduced them) of the finished scenarios."""
    if repo.get_experiment(session=session, exp_id=exp_id) is None:
        raise NotFound(f"no experiment {exp_id!r}", field="id")
    return [dict(r.result_row) for r in repo.runs_of(session=session, exp_id=exp_id)
            if r.status == RunStatus.succeeded and r.result_row is not None]


def power_view(*, session: Session, exp_id: str) -> dict[str, dict[str, Any]]:
    """The power reports (metrics `PowerReport`: energy and mean/peak power by component and by die) of the finished
    scenarios, read from ``<out>/<scenario>/<workload>.power.json``."""
    exp = repo.get_experiment(session=session, exp_id=exp_id)
    if exp is None:
        raise NotFound(f"no experiment {exp_id!r}", field="id")
    spec = ExperimentSpec.model_validate(exp.configs)
    done = [r.scenario for r in repo.runs_of(session=session, exp_id=exp_id) if r.status == RunStatus.succeeded]
    return power_reports(Path(exp.out_dir), done, spec.workload.label)


def results_csv(*, session: Session, exp_id: str) -> str:
    """The scenarios' CSVs concatenated under one header (each file's bytes as the metrics service wrote them).
    Conflict (409) when no scenario has a result (yet): a header alone would read as an empty success."""
    exp = repo.get_experiment(session=session, exp_id=exp_id)
    if exp is None:
        raise NotFound(f"no experiment {exp_id!r}", field="id")
    spec = ExperimentSpec.model_validate(exp.configs)
    header: str | None = None
    body: list[str] = []
    for run in repo.runs_of(session=session, exp_id=exp_id):
        path = result_csv_path(Path(exp.out_dir), run.scenario, spec.workload.label)
        if run.status != RunStatus.succeeded or not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        if not lines:
            continue
        header = header or lines[0]
        body.extend(lines[1:])
    if not body:
        raise Conflict(f"experiment {exp_id} has no scenario with results (status {exp.status}): see "
                       f"GET /v1/experiments/{exp_id} for each run's status and error", field="id")
    return (header or ",".join(RESULT_COLUMNS) + "\n") + "".join(body)


MAX_WINDOWS_PAGE = 2000  # windows per scenario in one answer of GET /v1/experiments/{id}/windows (~17 kB each)


def window_series(*, session: Session, exp_id: str, scenario: str | None, offset: int = 0,
                  limit: int = MAX_WINDOWS_PAGE, fields: set[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per scenario, the committed windows ``offset`` .. ``offset + limit - 1`` (a page: a long run has 10^4), from
    the run's window store (what the frontier covers: an epoch appended but not yet committed is not shown);
    ``fields``: only these keys of each window (a replay's heat maps need 2 of its ~35)."""
    exp = repo.get_experiment(session=session, exp_id=exp_id)
    if exp is None:
        raise NotFound(f"no experiment {exp_id!r}", field="id")
    runs = repo.runs_of(session=session, exp_id=exp_id)
    if scenario is not None and scenario not in {r.scenario for r in runs}:
        raise NotFound(f"experiment {exp_id} has no scenario {scenario!r}", field="scenario")
    out = {r.scenario: window_store.read(run_dir_for(Path(exp.out_dir), r.scenario), offset,
                                         max(0, min(limit, r.next_window - offset)))
           for r in runs if scenario is None or r.scenario == scenario}
    if fields is not None:
        out = {sc: [{k: v for k, v in w.items() if k in fields} for w in ws] for sc, ws in out.items()}
    return out


def window_fields(fields: str | None) -> set[str] | None:
    """The WindowMetrics keys a ``fields`` parameter names (comma-separated; ``window`` always), or None for all.
    An unknown key is a 422 naming ``fields``."""
    if fields is None or not fields.strip():
        return None
    names = {f.strip() for f in fields.split(",") if f.strip()}
    unknown = sorted(names - set(WindowMetrics.model_fields))
    if unknown:
        raise BadInput(f"fields: unknown window field(s) {', '.join(unknown)}; known: "
                       f"{', '.join(WindowMetrics.model_fields)}", field="fields")
    return names | {"window"}


# ----------------------------------------------------------------------------------------------------- dashboard


@dataclass(frozen=True)
class RunRef:
    """One scenario run as the dashboard reads it: its folder and how many windows are committed."""

    scenario: str
    run_dir: Path
    committed: int  # windows 0 .. committed-1 are committed (the run's next_window)
    n_windows: int | None
    status: str


_SPECS: OrderedDict[str, ExperimentSpec] = OrderedDict()  # an experiment's spec never changes: parsed once
_SPECS_LOCK = threading.Lock()


def experiment_spec(exp: Experiment) -> ExperimentSpec:
    """The experiment's stored spec, parsed (the 64 most recent kept)."""
    with _SPECS_LOCK:
        spec = _SPECS.pop(exp.id, None)
    if spec is None:
        spec = ExperimentSpec.model_validate(exp.configs)
    with _SPECS_LOCK:
        _SPECS[exp.id] = spec
        while len(_SPECS) > 64:
            _SPECS.popitem(last=False)
    return spec


def dashboard_runs(*, session: Session, exp_id: str, scenario: str | None = None
                   ) -> tuple[Experiment, ExperimentSpec, list[RunRef]]:
    """The experiment, its spec and its runs (one when ``scenario`` is given: 404 naming ``scenario`` when it has no
    such run)."""
    exp = repo.get_experiment(session=session, exp_id=exp_id)
    if exp is None:
        raise NotFound(f"no experiment {exp_id!r}", field="id")
    runs = [RunRef(r.scenario, run_dir_for(Path(exp.out_dir), r.scenario), r.next_window, r.n_windows,
                   r.status.value) for r in repo.runs_of(session=session, exp_id=exp_id)]
    if scenario is not None:
        runs = [r for r in runs if r.scenario == scenario]
        if not runs:
            raise NotFound(f"experiment {exp_id} has no scenario {scenario!r}", field="scenario")
    return exp, experiment_spec(exp), runs


def chip_facts(spec: ExperimentSpec) -> dict[str, Any]:
    """What the dashboard marks and lays out: the mesh, the DRAM dies, ambient, TACS's Thot/Temg, the refresh
    curve's temperatures (85 °C: the JEDEC step of the default chip), the DTM limit, the window length."""
    arch = spec.arch
    dies = sum(layer.count for layer in arch.geometry.stack if layer.kind == "dram")
    return {"mesh": list(arch.mesh.cores), "dram_dies": dies, "banks": list(arch.dram.banks),
            "ambient_c": arch.geometry.cooling.ambient_c, "thot_c": spec.tas.tacs.thresholds.Thot,
            "temg_c": spec.tas.tacs.thresholds.Temg, "refresh_step_c": 85.0,
            "refresh_curve_c": [t for t, _ in arch.refresh.tref_curve],
            "dtm_limit_c": arch.dtm.limit_c if arch.dtm is not None else None,
            "window_ms": spec.tas.tacs.window_ms, "workload": spec.workload.label}


def colour_scale(summaries: list[series.RunSummary]) -> dict[str, float] | None:
    """One scale for every heat map of the experiment (°C, steps of 5): from the coolest to the hottest cell of the
    maps over every committed window of every scenario, at least 10 K wide (None before any window). Fitted to the
    data, not to Thot: a chip at 50 °C with Thot at 80 °C still shows its pattern (the page marks Thot at the edge
    of the bar when it lies outside)."""
    done = [s for s in summaries if s.n]
    if not done:
        return None
    lo = 5.0 * math.floor(min(min(s.cols["T_map_min"]) for s in done) / 5.0)
    hi = 5.0 * math.ceil(max(max(s.cols["T_map_max"]) for s in done) / 5.0)
    return {"lo": lo, "hi": max(hi, lo + 10.0)}


def log_text(*, session: Session, exp_id: str, scenario: str | None = None) -> str:
    exp = repo.get_experiment(session=session, exp_id=exp_id)
    if exp is None:
        raise NotFound(f"no experiment {exp_id!r}", field="id")
    parts = []
    for run in repo.runs_of(session=session, exp_id=exp_id):
        if scenario is not None and run.scenario != scenario:
            continue
        p = run_dir_for(Path(exp.out_dir), run.scenario) / "run.log"
        if p.is_file():
            parts.append(f"==> {run.scenario} ({p}) <==\n" + p.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------------- sweeps


def set_dotted(d: dict[str, Any], key: str, value: Any, *, where: str = "grid", source: Any = None) -> None:
    """``d`` (configs as JSON, by kind) with the value at the dotted ``key`` replaced; a key that names no existing
    value is a `BadInput` naming ``<where>.<key>`` (a sweep's ``grid``, `tasmoe capacity`'s ``set``). ``source``: what
    ``d`` was dumped from (a model, or a dict of models by kind): a field its JSON leaves out at its default
    (``exclude_if``, so that every config's hash reads as before the field existed) is a key too."""
    parts = key.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            raise BadInput(f"{where}: {key!r}: {p!r} is not a section of the config", field=f"{where}.{key}")
        cur = nxt
    if parts[-1] not in cur and not _declares(source, parts):
        raise BadInput(f"{where}: {key!r}: unknown key {parts[-1]!r}", field=f"{where}.{key}")
    cur[parts[-1]] = value


def _declares(source: Any, parts: list[str]) -> bool:
    """Whether the section of ``source`` at ``parts[:-1]`` is a model that declares the field ``parts[-1]``."""
    obj = source
    for p in parts[:-1]:
        obj = obj.get(p) if isinstance(obj, dict) else getattr(obj, p, None)
    return isinstance(obj, BaseModel) and parts[-1] in type(obj).model_fields


def sweep_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    for key, values in grid.items():
        if not values:
            raise BadInput(f"grid: {key!r} has no values", field=f"grid.{key}")
        if key != "seed" and key.split(".", 1)[0] not in {"arch", "workload", "tas"}:
            raise BadInput(f"grid: {key!r} must start with arch., workload., tas. or be 'seed'", field=f"grid.{key}")
    keys = list(grid)
    points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]
    if len(points) > 256:
        raise BadInput(f"grid: {len(points)} points; at most 256", field="grid")
    return points


def apply_point(base: ExperimentSpec, point: dict[str, Any]) -> ExperimentSpec:
    d = base.model_dump(mode="json")
    for key, value in point.items():
        if key == "seed":
            d["seed"] = value
            d["workload"]["routing"]["seed"] = value
        else:
            set_dotted(d, key, value, source=base)
            if key == "workload.routing.seed":
                d["seed"] = value
    try:
        return ExperimentSpec.model_validate(d)
    except ValidationError as exc:
        field, msg = first_validation_error(exc)
        raise BadInput(f"grid point {point}: {field}: {msg}", field=f"grid.{field}") from None


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


def plan_sweep(req: SweepRequest, *, configs_dir: Path) -> tuple[list[dict[str, Any]], list[ExperimentSpec]]:
    """The sweep's points and each point's resolved experiment, every one checked (the configs, the grid's keys and
    values, the cross-field checks): a `BadInput` naming the field before anything is created or started."""
    base = resolve_spec(req.base, configs_dir=configs_dir)
    points = sweep_points(req.grid)
    specs = [apply_point(base, p) for p in points]
    for i, spec in enumerate(specs):
        try:
            check_cross_fields(spec.arch, spec.tas)
        except BadInput as exc:
            raise BadInput(f"grid point {i} ({points[i]}): {exc.message}", field=exc.field) from None
    return points, specs


def create_sweep(*, sessions: sessionmaker[Session], req: SweepRequest, settings: Settings,
                 check_workload: Callable[[WorkloadConfig, float], None] | None = None, owner: str = LOCAL,
                 quota: RunQuota | None = None, out_dir: Path | None = None) -> tuple[str, list[str]]:
    """One experiment per grid point (sharing the sweep id); the sweep itself is a job row. Every point is checked
    (`plan_sweep`; ``check_workload`` on each distinct workload and control window) before any experiment is created.
    The experiments and the job row are inserted in one transaction, which charges all their runs (points x
    scenarios) to ``quota`` as `create_experiment` does: the whole sweep is accepted or none of it. Point ``i``'s
    folder is ``<out_dir>/p<i>`` (default ``out_dir``: ``<results_dir>/<sweep id>``)."""
    points, specs = plan_sweep(req, configs_dir=settings.configs_dir)
    if quota is not None:  # refused early, before the checks below (it binds at the insert)
        with sessions() as s:
            check_quota(session=s, owner=owner, new_runs=sum(len(sp.scenarios) for sp in specs), quota=quota)
    checked: set[str] = set()
    for i, sp in enumerate(specs):  # each distinct check once: the model, or a trace-reading workload's trace
        wl, ms = sp.workload, sp.tas.tacs.window_ms
        model = wl.model if isinstance(wl.model, str) else wl.model.model_dump_json()
        key = f"{wl.canonical_json()}|{ms!r}" if reads_a_trace(wl) else f"model|{model}"
        if check_workload is None or key in checked:
            continue
        checked.add(key)
        try:
            check_workload(wl, ms)
        except BadInput as exc:
            raise BadInput(f"grid point {i} ({points[i]}): {exc.message}", field=exc.field) from None
    sweep_id = f"swp-{uuid.uuid4().hex[:12]}"
    folder = out_dir if out_dir is not None else settings.results_dir / sweep_id
    exp_ids = [new_experiment_id() for _ in specs]
    with sessions.begin() as s:
        if quota is not None:
            repo.lock_owner_quota(session=s, owner=owner)
            check_quota(session=s, owner=owner, new_runs=sum(len(sp.scenarios) for sp in specs), quota=quota)
        for i, (exp_id, spec) in enumerate(zip(exp_ids, specs, strict=True)):
            named = spec.model_copy(update={"name": f"{req.name or 'sweep'}[{i}]"})
            _add_experiment(session=s, exp_id=exp_id, spec=named, out_dir=folder / f"p{i:03d}",
                            idempotency_key=None, max_attempts=MAX_ATTEMPTS, sweep_id=sweep_id, owner=owner)
        repo.add_job(session=s, job_id=sweep_id, kind="sweep", owner=owner,
                     payload={"grid": req.grid, "points": points, "experiments": exp_ids, "name": req.name})
    return sweep_id, exp_ids


def sweep_view(*, session: Session, sweep_id: str) -> SweepView:
    job = repo.get_job(session=session, job_id=sweep_id)
    if job is None or job.kind != "sweep":
        raise NotFound(f"no sweep {sweep_id!r}", field="id")
    exp_ids: list[str] = list(job.payload["experiments"])
    points: list[dict[str, Any]] = list(job.payload["points"])
    table: list[dict[str, Any]] = []
    statuses = []
    for exp_id, point in zip(exp_ids, points, strict=True):
        exp = repo.get_experiment(session=session, exp_id=exp_id)
        statuses.append(exp.status if exp is not None else RunStatus.failed)
        for row in result_rows(session=session, exp_id=exp_id):
            table.append({"experiment": exp_id, **{f"param:{k}": v for k, v in point.items()}, **row})
    if all(s == RunStatus.succeeded for s in statuses):
        status = "succeeded"
    elif all(s in {RunStatus.succeeded, RunStatus.failed, RunStatus.cancelled} for s in statuses):
        status = "failed" if RunStatus.failed in statuses else "cancelled"
    elif all(s == RunStatus.queued for s in statuses):
        status = "queued"
    else:
        status = "running"
    return SweepView(id=sweep_id, status=status, experiments=exp_ids, points=points, table=table)
