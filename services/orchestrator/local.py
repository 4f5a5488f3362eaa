"""Run an experiment in this process (embedded mode): what ``scripts/run_all.py``, ``scripts/run_single.py``,
``tasmoe run``, ``make run`` and the benchmark call. Same code path as the API: an experiment row, one run per
scenario on the embedded pool, the compute services as in-process ASGI apps behind the shared HTTP client."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from services.orchestrator import repository as repo
from services.orchestrator.acceptance import check_results, policy_findings
from services.orchestrator.capacity import Capacity, estimate_capacity, serving_note
from services.orchestrator.db import make_engine, session_factory, upgrade
from services.orchestrator.jobs import EmbeddedRunner, ProcessRunner
from services.orchestrator.models import TERMINAL
from services.orchestrator.pipeline_clients import Pipeline
from services.orchestrator.progress import Progress, ProgressFn
from services.orchestrator.run_files import placement_path, result_csv_path
from services.orchestrator.schemas import POLICY_SCENARIOS, ExperimentRequest, ExperimentSpec, Scenario
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.settings import orchestrator_settings
from shared.client import ServiceClients
from shared.configs import ArchConfig, WorkloadConfig, load_arch, load_tas, load_workload
from shared.contracts.placement import Placement
from shared.errors import BadInput, TasmoeError, first_validation_error
from shared.settings import Settings


@dataclass(frozen=True)
class LocalResult:
    experiment_id: str
    out_dir: Path
    csvs: dict[str, Path]
    status: dict[str, str]
    errors: dict[str, str]
    windows: dict[str, int]
    wall_s: float
    compute_s: dict[str, float]
    ambient_c: float = 45.0
    capacity: Capacity | None = None  # the chip's capacity for the workload (services/orchestrator/capacity.py)
    capacity_note: str | None = None  # why there is none (a serving workload)
    workload: WorkloadConfig | None = None  # the workload the runs served (its SLO and drain, for the summary)

    @property
    def ok(self) -> bool:
        return all(s == "succeeded" for s in self.status.values())


def with_warmup(arch: ArchConfig, warmup_ms: float) -> ArchConfig:
    """``arch`` with ``thermal.warmup_ms`` replaced; a bad value is an error naming ``warmup_ms``."""
    data = arch.model_dump(mode="json")
    data["thermal"]["warmup_ms"] = warmup_ms
    try:
        return ArchConfig.model_validate(data)
    except ValidationError as exc:
        _, msg = first_validation_error(exc)
        raise BadInput(f"warmup_ms: {msg}", field="warmup_ms") from None


def local_spec(*, arch: str | Path, workload: str | Path | WorkloadConfig, tas: str | Path,
               scenarios: Sequence[Scenario] = POLICY_SCENARIOS, seed: int | None = None, windows: int | None = None,
               traces: bool = True, events: bool = False, warmup_ms: float | None = None,
               settings: Settings | None = None) -> ExperimentSpec:
    """The experiment `run_local` runs for these arguments, resolved (the spec each run's log records)."""
    s = orchestrator_settings(settings)
    arch_cfg = load_arch(arch)
    if warmup_ms is not None:
        arch_cfg = with_warmup(arch_cfg, warmup_ms)
    wl = workload if isinstance(workload, WorkloadConfig) else load_workload(workload)
    req = ExperimentRequest(arch=arch_cfg, workload=wl, tas=load_tas(tas),
                            scenarios=list(scenarios), seed=seed, windows=windows, traces=traces,
                            events=events)
    return resolve_spec(req, configs_dir=s.configs_dir)


def run_local(*, arch: str | Path, workload: str | Path | WorkloadConfig, tas: str | Path, out: str | Path,
              scenarios: Sequence[Scenario] = POLICY_SCENARIOS, seed: int | None = None, windows: int | None = None,
              settings: Settings | None = None, clients: ServiceClients | None = None, traces: bool = True,
              events: bool = False,
              progress: ProgressFn | None = None, database_url: str | None = None,
              apps: str | None = None, warmup_ms: float | None = None, epoch: int | None = None) -> LocalResult:
    """Run the scenarios of one experiment embedded and write ``<out>/<scenario>/<workload>.csv`` for each.

    Runs execute on worker processes (`ProcessRunner`, ``TASMOE_POOL=process``, the default), each building the
    compute services in-process, or on threads of this process over ``clients`` (given, or built here) when
    ``clients`` is given or ``TASMOE_POOL=thread``. ``apps``: ``module:factory`` building the compute services
    instead of the real ones (as ``python -m services.orchestrator.worker --apps``). ``warmup_ms`` replaces the arch
    config's ``thermal.warmup_ms`` (validated as the config field is). ``epoch``: the most windows of one control
    epoch (``TASMOE_EPOCH_WINDOWS``; 1 is the per-window reference loop; the results do not depend on it)."""
    from services.orchestrator.worker import compute_clients

    s = orchestrator_settings(settings)
    if epoch is not None:
        s = type(s).model_validate({**s.model_dump(), "epoch_windows": epoch})
    out_dir = Path(out)
    spec = local_spec(arch=arch, workload=workload, tas=tas, scenarios=scenarios, seed=seed, windows=windows,
                      traces=traces, events=events, warmup_ms=warmup_ms, settings=s)
    url = database_url or s.effective_database_url
    engine = make_engine(url)
    sessions = session_factory(engine)
    # the worker processes start before this process connects to the database or starts a thread (fork-safe)
    procs = ProcessRunner(sessions=sessions, database_url=url, settings=s, max_workers=s.pool_workers,
                          lease_s=s.lease_s, apps=apps) if clients is None and s.pool == "process" else None
    ambient = spec.arch.geometry.cooling.ambient_c
    warm = spec.arch.thermal.warmup_windows(spec.tas.tacs.window_ms)
    t0 = time.perf_counter()
    if progress is not None:  # the workers, the services and the experiment take a few seconds before any run shows
        progress(Progress(runs={}, warmup_windows=warm))
    try:
        upgrade(engine)

        def start(cc: ServiceClients) -> tuple[str, Capacity | None]:
            # the model (and a trace's arrivals) are checked before the experiment exists: one error, nothing created
            Pipeline(cc).check_workload(spec.workload, spec.tas.tacs.window_ms)
            exp_id, _ = create_experiment(sessions=sessions, spec=spec, settings=s, out_dir=out_dir,
                                          max_attempts=s.max_attempts)
            return exp_id, _capacity(cc, spec, exp_id, out_dir)

        if clients is not None:
            exp_id, cap = start(clients)
        else:
            with compute_clients(s, apps) as cc:
                exp_id, cap = start(cc)
        if procs is not None:
            res = _execute(exp_id, out_dir, spec.workload.label, sessions, procs, progress, t0, ambient, warm)
        elif clients is not None:
            res = _execute(exp_id, out_dir, spec.workload.label, sessions, _threads(clients, sessions, s), progress,
                           t0, ambient, warm)
        else:
            with compute_clients(s, apps) as cc:
                res = _execute(exp_id, out_dir, spec.workload.label, sessions, _threads(cc, sessions, s), progress,
                               t0, ambient, warm)
        return replace(res, capacity=cap, capacity_note=serving_note(spec), workload=spec.workload)
    finally:
        if procs is not None:
            procs.shutdown()
        engine.dispose()


def _capacity(clients: ServiceClients, spec: ExperimentSpec, exp_id: str, out_dir: Path) -> Capacity | None:
    """The chip's capacity for the experiment's workload, written to ``<out>/capacity.json``; None (no file) for a
    serving workload (``capacity.serving_note``, printed with the summary)."""
    cap = estimate_capacity(Pipeline(clients, run_key=f"{exp_id}-capacity"), spec)
    if cap is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "capacity.json").write_text(json.dumps(cap.to_json(), indent=1) + "\n", encoding="utf-8")
    return cap


def _threads(clients: ServiceClients, sessions: Any, s: Any) -> EmbeddedRunner:
    return EmbeddedRunner(sessions=sessions, clients=clients, max_workers=s.pool_workers, lease_s=s.lease_s)


def run_experiments(runner: EmbeddedRunner | ProcessRunner, sessions: Any, exp_ids: Sequence[str],
                    tick: Callable[[], None] | None = None, every_s: float = 0.5) -> None:
    """Run every run of the experiments on ``runner`` and return when none is queued or running; ``tick`` is called
    every ``every_s`` seconds meanwhile (a progress display) and once at the end. The runner is shut down."""
    stop = threading.Event()

    def unfinished() -> bool:
        with sessions() as ses:
            return any(r.status.value in {"queued", "running"}
                       for exp_id in exp_ids for r in repo.runs_of(session=ses, exp_id=exp_id))

    def watch() -> None:
        while not stop.wait(every_s):
            if tick is not None:
                tick()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for exp_id in exp_ids:
            runner.submit_experiment(exp_id)
        for exp_id in exp_ids:
            runner.wait(exp_id)
        # a run may have been taken by another process sharing the database (its lease, its claim): wait for it too
        while unfinished():
            time.sleep(0.5)
            for exp_id in exp_ids:  # ... and take over a run of ours whose lease expired
                runner.submit_experiment(exp_id)
            for exp_id in exp_ids:
                runner.wait(exp_id)
    finally:
        stop.set()
        watcher.join()
        runner.shutdown()
    if tick is not None:
        tick()


def _execute(exp_id: str, out_dir: Path, label: str, sessions: Any, runner: EmbeddedRunner | ProcessRunner,
             progress: ProgressFn | None, t0: float, ambient_c: float, warmup_windows: int) -> LocalResult:
    def snapshot() -> Progress:
        with sessions() as ses:
            runs = {r.scenario: (r.next_window, r.n_windows, r.status.value)
                    for r in repo.runs_of(session=ses, exp_id=exp_id)}
            exp = repo.get_experiment(session=ses, exp_id=exp_id)
            finalizing = (exp is not None and exp.finalized_at is None and bool(runs)
                          and all(st in TERMINAL for _, _, st in runs.values()))
        return Progress(runs=runs, warmup_windows=warmup_windows, finalizing=finalizing)

    run_experiments(runner, sessions, [exp_id], None if progress is None else lambda: progress(snapshot()))
    with sessions() as ses:
        runs = repo.runs_of(session=ses, exp_id=exp_id)
        return LocalResult(
            experiment_id=exp_id, out_dir=out_dir,
            csvs={r.scenario: result_csv_path(out_dir, r.scenario, label) for r in runs},
            status={r.scenario: r.status.value for r in runs},
            errors={r.scenario: r.error for r in runs if r.error},
            windows={r.scenario: r.next_window for r in runs},
            wall_s=time.perf_counter() - t0,
            compute_s={r.scenario: r.compute_s for r in runs},
            ambient_c=ambient_c)


SUMMARY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (heading, result column, format); energy per token is energy_j / tokens
    ("scenario", "scenario", "s"), ("T_peak_logic °C", "T_peak_logic", ".2f"),
    ("T_peak_dram °C", "T_peak_dram", ".2f"), ("ips tok/s", "ips", ".1f"), ("lat_ms", "lat_ms", ".1f"),
    ("lat_p99_ms", "lat_p99_ms", ".1f"), ("tokens", "tokens", "d"), ("mJ/token", "", ".1f"),
    ("power W", "power_avg_w", ".2f"), ("migrations", "migrations", "d"),
)


def summary_table(rows: list[dict[str, str]]) -> str:
    """The result rows as an aligned text table (the columns a reader checks first; the CSVs hold them all)."""
    def cell(row: dict[str, str], col: str, fmt: str) -> str:
        if fmt == "s":
            return row[col]
        if not col:  # energy per completed token
            tokens = int(row["tokens"])
            return "-" if tokens == 0 else format(1e3 * float(row["energy_j"]) / tokens, fmt)
        return format(int(row[col]) if fmt == "d" else float(row[col]), fmt)

    table = [[h for h, _, _ in SUMMARY_COLUMNS]] + [[cell(r, c, f) for _, c, f in SUMMARY_COLUMNS] for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(SUMMARY_COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(t, widths,
                                                                                                   strict=True)))
                     for t in table) + "\n"


def default_mapping_notes(res: LocalResult) -> list[str]:
    """What the default mapping of each succeeded scenario notes about itself (it places every model, a model over
    the chip's DRAM too, where TAPS refuses; `services/placement/default.py`), from its ``mapping/placement.json``."""
    out: list[str] = []
    for sc, status in res.status.items():
        path = placement_path(res.out_dir, sc)
        if status != "succeeded" or not path.is_file():
            continue
        try:
            meta = Placement.model_validate_json(path.read_bytes()).meta
        except ValidationError:  # not ours to judge here: the summary goes on without it
            continue
        if meta.method == "default":
            out.extend(f"{sc}: the default mapping: {note}" for note in meta.notes)
    return out


def files_lines(res: LocalResult) -> list[str]:
    """The files the run wrote, by their real paths under its folder (the ones a reader opens first: the tables, the
    figures, each scenario's result row), so that they can be copied from the terminal as they are."""
    out = res.out_dir
    tables = [p for p in ("summary.csv", "comparison.md", "power.md") if (out / p).is_file()]
    figures = sorted(p.relative_to(out).as_posix() for p in (out / "plots").glob("*.png"))
    rows = [p.relative_to(out).as_posix() for p in res.csvs.values() if p.is_file()]
    series = [p for p in rows if (out / p).with_suffix(".series.csv.gz").is_file()]
    lines = [f"files in {out}/:"]
    for group in (tables, figures, rows):
        if group:
            lines.append("  " + ", ".join(group))
    if series:
        lines[-1] += " (each with its per-window series beside it, .series.csv.gz)"
    return lines


def roofline_line(rows: list[dict[str, str]], cap: Capacity) -> str | None:
    """Each scenario's served tokens per second as a share of the DRAM roofline at the workload's batch (None: no
    roofline, or no row). A run that ends with micro-batches in flight counts none of their tokens."""
    if not rows or not math.isfinite(cap.roofline_tok_s) or cap.roofline_tok_s <= 0:
        return None
    shares = ", ".join(f"{r['scenario']} {100 * float(r['ips']) / cap.roofline_tok_s:.0f} %" for r in rows)
    return f"served of the DRAM roofline ({cap.roofline_tok_s:.1f} tok/s): {shares}"


JUDGE_WINDOW_MS = 3.0  # the window the drain's trace summary is asked at (the drain does not depend on it)


def drain_to_judge_ms(workload: WorkloadConfig, settings: Settings | None = None) -> float:
    """The shortest drain after which the SLO judges every request ``workload`` offers, as the workload service
    computes it (its trace summary's ``drain_to_judge_ms``, `shared.slo.drain_to_judge_ms`), ms."""
    from services.orchestrator.worker import compute_clients

    with compute_clients(orchestrator_settings(settings), only=("workload",)) as cc:
        # one Idempotency-Key per workload asked about
        key = "capacity-drain-" + hashlib.sha256(workload.model_dump_json().encode()).hexdigest()[:16]
        return Pipeline(cc, run_key=key).create_trace(workload, JUDGE_WINDOW_MS).drain_to_judge_ms


def short_drain_note(workload: WorkloadConfig | None, rows: list[dict[str, str]],
                     settings: Settings | None = None) -> str | None:
    """When a served run ended with tokens still queued (none shed) before the SLO had judged every request it
    offered: which scenarios, and that their ``slo_met`` 0 may be the run's length, not the chip's. The judging end is
    the arrivals plus the drain after which every request is past its SLO deadline (the workload service's, as
    ``tasmoe capacity`` drains, `drain_to_judge_ms`); asked for only when some run left tokens queued."""
    sv = None if workload is None else workload.serving
    queued = [r for r in rows if int(float(r.get("tokens_queued") or 0)) > 0
              and int(float(r.get("tokens_shed") or 0)) == 0 and r.get("sim_time_ms")]
    if workload is None or sv is None or not queued:
        return None
    try:  # the offered requests alone decide it: asked of the arrivals without the run's drain, as the search asks
        needed = drain_to_judge_ms(workload.model_copy(update={"serving": sv.model_copy(update={"drain_ms": 0.0})}),
                                   settings)
    except TasmoeError as exc:  # the run succeeded: its summary goes on without the note
        return f"note: tokens were still queued at the end; the drain that judges every request is unknown ({exc})"
    judged_ms = sv.duration_ms + needed
    short = [r for r in queued if float(r["sim_time_ms"]) < judged_ms]
    if not short:
        return None
    ran_s = max(float(r["sim_time_ms"]) for r in short) / 1e3
    who = "every scenario" if len(short) == len(rows) > 1 else ", ".join(r["scenario"] for r in short)
    return (f"note: {who} ended with tokens still queued after {ran_s:g} s, "
            f"before the SLO judges every request offered ({sv.duration_ms / 1e3:g} s of arrivals and "
            f"{needed / 1e3:.1f} s of drain; workload.serving.drain_ms is {sv.drain_ms / 1e3:g} s): slo_met 0 may be "
            "the run's length, not the chip's")


def print_summary(res: LocalResult, stream: TextIO | None = None) -> None:
    stream = sys.stdout if stream is None else stream  # looked up per call (not bound at import)
    rows: list[dict[str, str]] = []
    for sc, path in res.csvs.items():
        if res.status[sc] != "succeeded" or not path.is_file():
            print(f"{sc}: {res.status[sc]}: {res.errors.get(sc, '')}", file=stream)
            continue
        with path.open(encoding="utf-8", newline="") as f:
            rows.extend(csv.DictReader(f))
    if rows:
        print(summary_table(rows), end="", file=stream)
        for line in default_mapping_notes(res):
            print(f"note: {line}", file=stream)
        drain = short_drain_note(res.workload, rows)
        if drain is not None:
            print(drain, file=stream)
        cmp_md = res.out_dir / "comparison.md"  # the metrics service's table: its throttling line, when it has one
        if cmp_md.is_file():
            for line in cmp_md.read_text(encoding="utf-8").splitlines():
                if line.startswith("Throttling ("):
                    print(line, file=stream)
        for line in files_lines(res):
            print(line, file=stream)
    if res.capacity_note is not None:
        print(res.capacity_note, file=stream)
    if res.capacity is not None:
        print(res.capacity.line(), file=stream)
        roof = roofline_line(rows, res.capacity)
        if roof:
            print(roof, file=stream)
        if rows and all(int(r["tokens"]) == 0 for r in rows):
            sim_ms = max(float(r["sim_time_ms"]) for r in rows)
            print(f"note: no token completed: the run ({sim_ms:g} ms simulated) is shorter than one micro-batch "
                  f"({res.capacity.makespan_ms:.1f} ms alone on the chip); ips is 0 and lat_* are lower bounds "
                  "(lat_censored = 1)", file=stream)
    print(f"experiment {res.experiment_id}: {sum(res.windows.values())} windows in {res.wall_s:.1f} s -> "
          f"{res.out_dir}", file=stream)
    if res.ok and set(res.csvs) == {"baseline", "taps", "tacs", "tas"}:
        label = next(iter(res.csvs.values())).stem
        problems = check_results(res.out_dir, workload=label, ambient_c=res.ambient_c)
        print("acceptance (seed §9.2/§15): " + ("ok" if not problems else "; ".join(problems)), file=stream)
        for line in policy_findings(res.out_dir, workload=label):
            print(f"finding: {line}", file=stream)


def check_ok(res: LocalResult) -> None:
    if not res.ok:
        bad = ", ".join(f"{sc}: {res.errors.get(sc, st)}" for sc, st in res.status.items() if st != "succeeded")
        raise TasmoeError(f"scenario run(s) did not succeed: {bad}", code="run_failed", status=500)
