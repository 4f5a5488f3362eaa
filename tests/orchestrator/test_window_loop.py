"""The window loop on fake compute services: files, the frontier, crash/resume byte-identity, lease loss, retries,
and results that do not depend on the control epochs' sizes."""

from __future__ import annotations

import gzip
import json
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from services.orchestrator import repository as repo
from services.orchestrator import window_store
from services.orchestrator.epochs import ambient_telemetry, build_window_metrics, next_telemetry
from services.orchestrator.models import RunStatus, ScenarioRun
from services.orchestrator.run_files import RunFiles, placement_path, result_csv_path, run_dir_for
from services.orchestrator.schemas import ExperimentRequest
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.settings import OrchestratorSettings
from services.orchestrator.window_loop import run_scenario
from shared import gz_text
from shared.client import ServiceClients
from shared.configs import ArchConfig, TasParams, WorkloadConfig, load_arch
from shared.configs.arch import DtmConfig, DvfsConfig, DvfsDomain, unthrottled
from shared.contracts.events import RequestsDone, WindowTiming
from shared.contracts.thermal import ThermalSnapshot
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator import fakes
from tests.orchestrator.conftest import Db


def small_request(**kw: Any) -> ExperimentRequest:
    """A small experiment that writes every file, the physical events too (the crash and resume tests cover them)."""
    wl = WorkloadConfig.model_validate({"model": "mixtral-8x7b", "sequence": {"steps": 24, "micro_batch": 4}})
    return ExperimentRequest(workload=wl, **{"events": True, **kw})


def _clients(settings: Settings, epoch: int | None = None) -> ServiceClients:
    s = settings if epoch is None else OrchestratorSettings(**{**settings.model_dump(), "epoch_windows": epoch})
    return ServiceClients(s, asgi_apps=fakes.build_apps(s))


@pytest.fixture()
def clients(settings: Settings) -> Iterator[ServiceClients]:
    c = _clients(settings, epoch=2)  # epochs of at most 2 windows: the crash tests stop between epochs
    yield c
    c.close()


def _experiment(db: Db, settings: Settings, out: Path, **kw: Any) -> str:
    spec = resolve_spec(small_request(**kw), configs_dir=CONFIGS)
    exp_id, created = create_experiment(sessions=db.sessions, spec=spec, settings=settings, out_dir=out)
    assert created
    return exp_id


def _tree(root: Path) -> dict[str, bytes]:
    """Every file of an output tree except run.log (timestamps), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run.log"}


def _run(db: Db, run_id: str) -> ScenarioRun:
    with db.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None
        return run


def test_tas_run_writes_every_file_and_commits_every_window(db: Db, settings: Settings, clients: ServiceClients,
                                                            tmp_path: Path) -> None:
    exp_id = _experiment(db, settings, tmp_path / "out", scenarios=["tas"])
    run_id = repo.run_id_for(exp_id, "tas")
    out = run_scenario(run_id, clients, db.sessions)
    assert out.status == "succeeded", out.error
    assert out.windows_run == 8  # 24 steps of 1 ms in 3 ms windows
    rd = run_dir_for(tmp_path / "out", "tas")
    appended = RunFiles(tmp_path / "out", "tas", events=True).appended()
    assert "traces/logical_compute.csv.gz" in appended and "runs/tas/traces/physical/compute_events.csv.gz" in appended
    for path, cols in appended.values():
        if cols:
            assert gz_text.read_text(path).splitlines()[0] == ",".join(cols)
    assert len(gz_text.read_text(rd / "traces/physical/compute_events.csv.gz").splitlines()) > 8
    assert (rd / "mapping/placement.json").is_file() and (rd / "runtime/replica_state.json").is_file()
    log = (rd / "run.log").read_text()
    assert "seed 42" in log and "git revision" in log and '"numpy"' in log and "config {" in log
    csv = result_csv_path(tmp_path / "out", "tas", "mixtral-8x7b").read_text().splitlines()
    assert csv[0].startswith("scenario,workload,T_peak_logic,T_peak_dram")
    assert csv[1].startswith("tas,mixtral-8x7b,")
    run = _run(db, run_id)
    assert run.status == RunStatus.succeeded and run.next_window == 8 and run.frontier is None
    assert run.result_row is not None and run.result_row["T_peak_logic"] > 45.0
    windows = window_store.read(rd)
    assert [w["window"] for w in windows] == list(range(8)) and window_store.count(rd) == 8
    assert window_store.read(rd, 3, 2) == windows[3:5]


def test_crash_and_resume_is_byte_identical(db: Db, settings: Settings, clients: ServiceClients,
                                            tmp_path: Path) -> None:
    ref_id = _experiment(db, settings, tmp_path / "ref", scenarios=["tas"])
    assert run_scenario(repo.run_id_for(ref_id, "tas"), clients, db.sessions).status == "succeeded"

    exp_id = _experiment(db, settings, tmp_path / "crash", scenarios=["tas"])
    run_id = repo.run_id_for(exp_id, "tas")
    # worker 1 "dies" right after committing the epoch that ends with window 3 (its lease stays held) ...
    out1 = run_scenario(run_id, clients, db.sessions, owner="w1", lease_s=600, on_window=lambda _r, k, _n: k < 3)
    assert out1.status == "stopped" and out1.windows_run == 4
    saved = repo.load_frontier(sessions=db.sessions, run_id=run_id, next_window=4)
    assert saved is not None and saved["thermal"] is not None and saved["physical"]["replicas"]
    # ... after having written rows of windows 4-5 that never committed (the crash hit between append and commit)
    rd = run_dir_for(tmp_path / "crash", "tas")
    with open(rd / "traces/physical/compute_events.csv.gz", "ab") as fh:
        fh.write(gzip.compress(b"999,0,0,0,0.0,garbage,d0,0.0\n"))
    with open(rd / window_store.WINDOWS_FILE, "ab") as fh:
        fh.write(gzip.compress(b'{"window": 4}\n'))
    # worker 2 cannot take the live lease, then takes it once it expired and finishes the run on services that know
    # nothing of it (restarted: the states travel whole)
    fresh = _clients(settings, epoch=3)
    try:
        assert run_scenario(run_id, fresh, db.sessions, owner="w2", lease_s=5).status == "leased"
        with db.sessions.begin() as s:  # w1's lease runs out (set in the past: no wall-clock race on a slow machine)
            run = s.get(ScenarioRun, run_id)
            assert run is not None and run.lease_owner == "w1" and run.lease_expires_at is not None
            run.lease_expires_at = run.lease_expires_at - timedelta(seconds=601)
        out2 = run_scenario(run_id, fresh, db.sessions, owner="w2", lease_s=5)
    finally:
        fresh.close()
    assert out2.status == "succeeded" and out2.windows_run == 4
    assert "resuming at window 4 of 8" in (rd / "run.log").read_text()
    assert [w["window"] for w in window_store.read(rd)] == list(range(8))  # every window exactly once
    assert _tree(tmp_path / "crash") == _tree(tmp_path / "ref")


def test_lost_lease_stops_the_old_worker(db: Db, settings: Settings, clients: ServiceClients,
                                         tmp_path: Path) -> None:
    exp_id = _experiment(db, settings, tmp_path / "out", scenarios=["baseline"])
    run_id = repo.run_id_for(exp_id, "baseline")

    def steal(_r: str, k: int, _n: int) -> bool:
        if k == 1:  # another worker takes over the run behind our back
            with db.sessions.begin() as s:
                run = s.get(ScenarioRun, run_id)
                assert run is not None
                run.lease_owner = "thief"
        return True

    out = run_scenario(run_id, clients, db.sessions, owner="w1", on_window=steal)
    assert out.status == "lost_lease" and out.windows_run == 2
    assert _run(db, run_id).next_window == 2


def test_a_phase_longer_than_the_lease_keeps_the_run(db: Db, settings: Settings, clients: ServiceClients,
                                                     tmp_path: Path) -> None:
    """The lease is renewed by a heartbeat, not only at epoch commits: a pause of 4 leases (a loaded machine, a long
    placement) leaves the run with its worker; a second worker cannot take it meanwhile."""
    exp_id = _experiment(db, settings, tmp_path / "out", scenarios=["baseline"])
    run_id = repo.run_id_for(exp_id, "baseline")
    seen: list[str] = []

    def slow(_r: str, k: int, _n: int) -> bool:
        if k == 1:
            time.sleep(1.2)  # 4 x the 0.3 s lease without a commit
            seen.append(repo.claim_run(sessions=db.sessions, run_id=run_id, owner="w2", lease_s=0.3).outcome)
        return True

    out = run_scenario(run_id, clients, db.sessions, owner="w1", lease_s=0.3, on_window=slow)
    assert seen == ["leased"]
    assert out.status == "succeeded" and out.windows_run == 8
    assert _run(db, run_id).attempts == 1


def test_upstream_failure_fails_the_run_with_its_reason(db: Db, settings: Settings, tmp_path: Path) -> None:
    """With no outage budget (TASMOE_OUTAGE_BUDGET_S=0) an unreachable service fails the run at once, naming it
    (the waiting with a budget: tests/orchestrator/test_outage.py)."""
    apps: dict[str, FastAPI] = dict(fakes.build_apps(settings))
    del apps["thermal"]  # thermal is "down": the client targets a closed port
    s2 = OrchestratorSettings(**{**settings.model_dump(), "thermal_url": "http://127.0.0.1:9", "http_retries": 1,
                                 "http_backoff_s": 0.01, "outage_budget_s": 0.0})
    clients = ServiceClients(s2, asgi_apps=apps)
    exp_id = _experiment(db, settings, tmp_path / "out", scenarios=["baseline"])
    out = run_scenario(repo.run_id_for(exp_id, "baseline"), clients, db.sessions)
    clients.close()
    assert out.status == "failed" and "thermal" in (out.error or "")
    run = _run(db, repo.run_id_for(exp_id, "baseline"))
    assert run.status == RunStatus.failed and "thermal" in (run.error or "")


class FlakyApp:
    """A compute service that "restarts": it answers 503 to the next `down` requests, then works again."""

    def __init__(self, app: FastAPI, down: int) -> None:
        self.app, self.down, self.refused = app, down, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.down > 0:
            self.down -= 1
            self.refused += 1
            await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"restarting"})
            return
        await self.app(scope, receive, send)


def test_service_restart_mid_run_is_retried_and_changes_nothing(db: Db, settings: Settings,
                                                                tmp_path: Path) -> None:
    s2 = OrchestratorSettings(**{**settings.model_dump(), "http_retries": 4, "http_backoff_s": 0.01,
                                 "epoch_windows": 2})
    ref_clients = ServiceClients(s2, asgi_apps=fakes.build_apps(s2))
    ref = _experiment(db, settings, tmp_path / "ref", scenarios=["tacs"])
    assert run_scenario(repo.run_id_for(ref, "tacs"), ref_clients, db.sessions).status == "succeeded"
    ref_clients.close()

    apps: dict[str, Any] = dict(fakes.build_apps(s2))
    flaky = FlakyApp(apps["thermal"], down=0)
    apps["thermal"] = flaky
    clients = ServiceClients(s2, asgi_apps=apps)

    def restart(_r: str, k: int, _n: int) -> bool:
        if k == 2:
            flaky.down = 3  # thermal goes away for three requests of the next epoch
        return True

    exp = _experiment(db, settings, tmp_path / "flaky", scenarios=["tacs"])
    out = run_scenario(repo.run_id_for(exp, "tacs"), clients, db.sessions, on_window=restart)
    clients.close()
    assert out.status == "succeeded" and flaky.refused == 3
    assert _tree(tmp_path / "flaky") == _tree(tmp_path / "ref")


class RefusingPlacement:
    """A placement service that refuses every placement with a 422 naming a field (a model that does not fit)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/placements":
            body = {"error": {"code": "invalid", "message": "the model does not fit the chip's DRAM",
                              "field": "expert_bytes"}}
            await send({"type": "http.response.start", "status": 422,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(body).encode()})
            return
        await self.app(scope, receive, send)


def test_a_refused_request_fails_the_run_without_a_traceback(db: Db, settings: Settings, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A service's 422 on the run's configs fails the run with the service's message; the log says so in one line,
    no traceback (it is the run's outcome, not a fault of the code), and the experiment, with no scenario that has
    results, is finalised without one either."""
    from services.orchestrator import jobs

    apps: dict[str, Any] = dict(fakes.build_apps(settings))
    apps["placement"] = RefusingPlacement(apps["placement"])
    clients = ServiceClients(settings, asgi_apps=apps)
    exp_id = _experiment(db, settings, tmp_path / "out", scenarios=["baseline"])
    caplog.set_level(logging.INFO)
    out = run_scenario(repo.run_id_for(exp_id, "baseline"), clients, db.sessions)
    assert jobs.finalize_once(sessions=db.sessions, clients=clients, exp_id=exp_id)
    clients.close()
    assert out.status == "failed" and "does not fit the chip's DRAM" in (out.error or "")
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert failed and all(r.exc_info is None and r.exc_text is None for r in failed)
    assert all(r.exc_info is None for r in caplog.records if r.levelno >= logging.ERROR)


def test_hand_made_placement_replaces_default_and_taps(db: Db, settings: Settings, clients: ServiceClients,
                                                       tmp_path: Path) -> None:
    from shared.contracts.placement import ExpertPlacement, Placement

    hot = Placement(experts={f"L{layer}E{e}": ExpertPlacement(cores=[27]) for layer in range(2) for e in range(8)})
    exp_id = _experiment(db, settings, tmp_path / "out", scenarios=["taps"], placement=hot)
    assert run_scenario(repo.run_id_for(exp_id, "taps"), clients, db.sessions).status == "succeeded"
    written = json.loads((run_dir_for(tmp_path / "out", "taps") / "mapping/placement.json").read_text())
    assert {e["cores"][0] for e in written["experts"].values()} == {27}
    rd = run_dir_for(tmp_path / "out", "taps")
    phys = gz_text.read_text(rd / "traces/physical/compute_events.csv.gz").splitlines()
    cores = {line.split(",")[2] for line in phys[1:]}
    assert cores == {"27"}  # every expert event ran on the hot core


def test_milp_placement_is_a_polled_job_kept_for_resume(db: Db, settings: Settings, clients: ServiceClients,
                                                        tmp_path: Path) -> None:
    tas = TasParams.model_validate({"taps": {"method": "milp"}})
    exp_id = _experiment(db, settings, tmp_path / "out", scenarios=["tas"], tas=tas)
    run_id = repo.run_id_for(exp_id, "tas")
    assert run_scenario(run_id, clients, db.sessions).status == "succeeded"
    with db.sessions() as s:
        job = repo.get_job(session=s, job_id=f"plc-{run_id}")
        assert job is not None and job.status == RunStatus.succeeded and job.result is not None
        assert job.result["meta"]["method"] == "milp"


def test_runs_are_handed_out_most_expensive_scenario_first(db: Db, settings: Settings, tmp_path: Path) -> None:
    from services.orchestrator.jobs import run_ids_of

    exp_id = _experiment(db, settings, tmp_path / "out")
    with db.sessions() as s:
        scenario = {r.id: r.scenario for r in repo.runs_of(session=s, exp_id=exp_id)}
    order = [scenario[r] for r in run_ids_of(sessions=db.sessions, exp_id=exp_id)]
    assert order == ["tas", "taps", "tacs", "baseline"]  # positions are baseline, taps, tacs, tas
    with db.sessions() as s:  # finished runs are not handed out again
        s.execute(sa.update(ScenarioRun).where(ScenarioRun.experiment_id == exp_id, ScenarioRun.scenario == "tas")
                  .values(status=RunStatus.succeeded))
        s.commit()
    assert [scenario[r] for r in run_ids_of(sessions=db.sessions, exp_id=exp_id)] == ["taps", "tacs", "baseline"]


def _eventful(**kw: Any) -> dict[str, Any]:
    """An experiment on a chip whose fake physics crosses its DVFS trips and refresh step and makes TACS move: the
    epochs are cut by every kind of event."""
    arch = ArchConfig(dvfs=DvfsConfig(domains=(DvfsDomain(trip_c=(47.0, 48.0, 49.0), hysteresis_c=0.5),)))
    tas = TasParams.model_validate({"tacs": {"thresholds": {"Thot": 46.0, "Temg": 60.0}, "min_residency_ms": 0.0}})
    wl = WorkloadConfig.model_validate({"model": "mixtral-8x7b", "sequence": {"steps": 60, "micro_batch": 16}})
    return {"arch": arch, "tas": tas, "workload": wl, **kw}


@pytest.mark.parametrize("scenario", ["tas", "baseline"])
def test_results_do_not_depend_on_the_epoch_sizes(sqlite: Db, settings: Settings, tmp_path: Path,
                                                  scenario: str) -> None:
    """Every file a run writes (trace files, events, overlays, the window store, the result CSV, the final field) is
    the same bytes whether the loop advances one window per call (the reference), a few or up to 256, with DVFS,
    refresh and TACS events cutting the epochs."""
    trees = {}
    for epoch in (1, 3, 256):
        c = _clients(settings, epoch=epoch)
        spec = resolve_spec(ExperimentRequest(**_eventful(events=True, scenarios=[scenario])), configs_dir=CONFIGS)
        exp_id, _ = create_experiment(sessions=sqlite.sessions, spec=spec, settings=settings,
                                      out_dir=tmp_path / f"e{epoch}")
        try:
            out = run_scenario(repo.run_id_for(exp_id, scenario), c, sqlite.sessions)
        finally:
            c.close()
        assert out.status == "succeeded", out.error
        trees[epoch] = _tree(tmp_path / f"e{epoch}")
        log = (run_dir_for(tmp_path / f"e{epoch}", scenario) / "run.log").read_text()
        if epoch == 256:
            assert "epochs" in log
    assert trees[1] == trees[3] == trees[256]
    rd = run_dir_for(tmp_path / "e1", scenario)
    windows = window_store.read(rd)
    assert len({tuple(w["freq_ghz"]) for w in windows}) > 1  # the clocks changed: DVFS events happened
    if scenario == "tas":
        assert len(gz_text.read_text(rd / "runtime/overlay_migrate.csv").splitlines()) > 1  # TACS acted


def test_tacs_sees_the_clocks_of_the_window_it_decides_for() -> None:
    """TACS prices compute at each core's voltage: its telemetry carries the thermal snapshot's clocks for the next
    window (the DVFS governor's, per core), and before the first window every core's top step."""
    arch = ArchConfig(dvfs=DvfsConfig(domains=(DvfsDomain(), DvfsDomain(cores=(0, 1), steps_ghz=(1.5, 1.0),
                                                                         trip_c=(80.0,)))))
    first = ambient_telemetry(arch).freq_ghz
    assert first[:2] == [1.5, 1.5] and set(first[2:]) == {2.0}  # shared.chip.core_domains: a listed core's domain
    n = arch.mesh.n_cores
    slow = [1.6] * n
    snap = ThermalSnapshot(window=4, temps_core_c=[50.0] * n, freq_ghz=slow)
    tele = next_telemetry(snap, WindowTiming(util_core=[0.5] * n), 9_000_000, list(snap.freq_ghz))
    assert tele.freq_ghz == slow and tele.ts_ns == 9_000_000 and tele.util_core == [0.5] * n


def test_window_peaks_read_the_layers_by_their_kind_not_their_name() -> None:
    """T_peak_logic / T_peak_dram and the layer means come from the layers the arch config calls logic and DRAM
    (`GeometryConfig.layer_names`), whatever they are named: a stack naming them ``base`` and ``hbm`` gives the
    figures the default names give, not the per-vault or per-core fallbacks."""
    arch = load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")
    renamed_stack = [layer.model_copy(update={"name": {"logic": "base", "dram": "hbm"}.get(layer.kind, layer.name)})
                     for layer in arch.geometry.stack]
    renamed = ArchConfig.model_validate({**arch.model_dump(), "geometry": {**arch.geometry.model_dump(),
                                                                          "stack": [x.model_dump() for x in
                                                                                    renamed_stack]}})
    n_dram = len(arch.geometry.layer_names("dram"))
    assert renamed.geometry.layer_names("dram") == tuple(f"hbm_{i + 1}" for i in range(n_dram))
    assert renamed.geometry.layer_names("logic") == ("base",)

    def snap(logic: str, dram: list[str]) -> ThermalSnapshot:
        peaks = {logic: 60.0, **{d: 55.0 + i for i, d in enumerate(dram)}, "tim": 40.0}
        means = {logic: 50.0, **{d: 48.0 + i for i, d in enumerate(dram)}, "tim": 39.0}
        return ThermalSnapshot(window=0, temps_core_c=[47.0] * 64, temps_core_max_c=[49.0] * 64,
                               temps_bank_c=[[46.0] * n_dram] * 64, peak_c=peaks, mean_c=means)

    timing = WindowTiming(util_core=[0.5] * 64)
    got = [build_window_metrics(window=0, t0_ns=0, t1_ns=3_000_000, timing=timing, arch=a,
                                snap=snap(lg, list(a.geometry.layer_names("dram"))))
           for a, lg in ((arch, "logic"), (renamed, "base"))]
    for wm in got:
        assert (wm.T_peak_logic, wm.T_peak_dram) == (60.0, 55.0 + n_dram - 1)
        assert wm.T_mean_logic == 50.0 and wm.T_mean_dram == pytest.approx(48.0 + (n_dram - 1) / 2)


def test_a_window_carries_the_physicalizers_served_requests() -> None:
    """`build_window_metrics` copies the request fields of the timing (served runs) into the window's metrics; a
    fixed-arrival timing leaves them empty / 0."""
    arch = load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")
    n_dram = len(arch.geometry.layer_names("dram"))
    snap = ThermalSnapshot(window=0, temps_core_c=[47.0] * 64, temps_core_max_c=[49.0] * 64,
                           temps_bank_c=[[46.0] * n_dram] * 64)
    served = {"requests_done": RequestsDone(request_id=[7], t_arrival_ns=[10], t_first_token_ns=[20], t_done_ns=[90],
                                            output_tokens=[3]),
              "requests_arrived": 2, "requests_shed": 1, "tokens_offered": 9, "tokens_shed": 4,
              "requests_waiting": 1, "requests_running": 0, "tokens_queued": 2, "tokens_completed": 3}
    wm = build_window_metrics(window=0, t0_ns=0, t1_ns=3_000_000, snap=snap, arch=arch,
                              timing=WindowTiming(util_core=[0.5] * 64, **served))
    assert {k: getattr(wm, k) for k in served} == served
    fixed = build_window_metrics(window=0, t0_ns=0, t1_ns=3_000_000, snap=snap, arch=arch,
                                 timing=WindowTiming(util_core=[0.5] * 64))
    assert len(fixed.requests_done) == 0 and fixed.tokens_offered == fixed.tokens_queued == 0


def test_epochs_past_the_body_bounds_are_halved_and_change_nothing(sqlite: Db, settings: Settings,
                                                                   tmp_path: Path) -> None:
    """With the services' JSON bounds so low that a long epoch's requests would be refused, the loop asks shorter
    epochs (it says so in the run log) and writes the same bytes as one window per call (the power report's sums to
    the last bits: the metrics requests carry fewer windows too); a bound no single window fits is a clear error
    naming the window's length."""
    trees = {}
    for name, epoch, values in (("ref", 1, None), ("bounded", 256, 3_000), ("tiny", 256, 500)):
        extra = {"epoch_windows": epoch} if values is None else {"epoch_windows": epoch, "max_json_values": values}
        s = OrchestratorSettings(**{**settings.model_dump(), **extra})
        c = ServiceClients(s, asgi_apps=fakes.build_apps(s))
        spec = resolve_spec(ExperimentRequest(**_eventful(scenarios=["baseline"])), configs_dir=CONFIGS)
        exp_id, _ = create_experiment(sessions=sqlite.sessions, spec=spec, settings=settings, out_dir=tmp_path / name)
        try:
            out = run_scenario(repo.run_id_for(exp_id, "baseline"), c, sqlite.sessions)
        finally:
            c.close()
        if name == "tiny":
            assert out.status == "failed" and "tas.tacs.window_ms" in (out.error or ""), out
            continue
        assert out.status == "succeeded", out.error
        trees[name] = _tree(tmp_path / name)
        if name == "bounded":
            log = (run_dir_for(tmp_path / name, "baseline") / "run.log").read_text()
            assert "(TASMOE_MAX_JSON_VALUES); epochs of at most" in log
    power = [k for k in trees["ref"] if k.endswith(".power.json")]
    # the metrics requests carry fewer windows too: the power sums are folded in more parts (last bits only)
    assert {k: v for k, v in trees["ref"].items() if k not in power} == \
        {k: v for k, v in trees["bounded"].items() if k not in power}
    for k in power:
        _close(json.loads(trees["ref"][k]), json.loads(trees["bounded"][k]))


def _close(a: Any, b: Any) -> None:
    """The same JSON tree, its numbers to 1e-12 relative."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _close(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _close(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15)
    else:
        assert a == b


def test_the_unthrottled_reference_runs_baseline_without_dvfs_trips_or_a_limit(sqlite: Db, settings: Settings,
                                                                             tmp_path: Path) -> None:
    """On a chip whose fake physics crosses its DVFS trips, baseline changes clocks and the reference never does:
    the same placement, every window at the top step."""
    arch = ArchConfig(dvfs=DvfsConfig(domains=(DvfsDomain(trip_c=(47.0, 48.0, 49.0), hysteresis_c=0.5),)),
                      dtm=DtmConfig(limit_c=120.0))
    wl = WorkloadConfig.model_validate({"model": "mixtral-8x7b", "sequence": {"steps": 60, "micro_batch": 16}})
    spec = resolve_spec(ExperimentRequest(arch=arch, workload=wl, scenarios=["baseline", "unthrottled"]),
                        configs_dir=CONFIGS)
    exp_id, _ = create_experiment(sessions=sqlite.sessions, spec=spec, settings=settings, out_dir=tmp_path)
    c = _clients(settings)
    try:
        for sc in ("baseline", "unthrottled"):
            out = run_scenario(repo.run_id_for(exp_id, sc), c, sqlite.sessions)
            assert out.status == "succeeded", out.error
    finally:
        c.close()
    clocks = {sc: {tuple(w["freq_ghz"]) for w in window_store.read(run_dir_for(tmp_path, sc))}
              for sc in ("baseline", "unthrottled")}
    assert len(clocks["baseline"]) > 1
    assert clocks["unthrottled"] == {(2.0,) * 64}
    assert placement_path(tmp_path, "baseline").read_bytes() == placement_path(tmp_path, "unthrottled").read_bytes()


def test_unthrottled_keeps_each_domains_top_step_and_drops_the_limit() -> None:
    arch = load_arch(CONFIGS / "arch_hbm_on_logic.yaml")
    ref = unthrottled(arch)
    assert ref.dtm is None and arch.dtm is not None
    assert [(d.steps_ghz, d.trip_c) for d in ref.dvfs.domains] == [(d.steps_ghz[:1], ()) for d in arch.dvfs.domains]
    assert ArchConfig.model_validate(ref.model_dump(mode="json")) == ref  # still a valid arch
    assert ref.model_copy(update={"dvfs": arch.dvfs, "dtm": arch.dtm}) == arch  # nothing else changed
