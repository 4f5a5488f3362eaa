"""The window loop on fake compute services: files, frontier, crash/resume byte-identity, lease loss, retries."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from services.orchestrator import repository as repo
from services.orchestrator.models import RunStatus, ScenarioRun, WindowRecord
from services.orchestrator.run_files import RunFiles, result_csv_path, run_dir_for
from services.orchestrator.schemas import ExperimentRequest
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.window_loop import (
    Frontier,
    _Step,
    ambient_telemetry,
    build_window_metrics,
    replicas_at,
    run_scenario,
)
from shared import gz_text
from shared.client import ServiceClients
from shared.configs import ArchConfig, WorkloadConfig, load_arch
from shared.configs.arch import DvfsConfig, DvfsDomain
from shared.contracts.events import WindowTiming
from shared.contracts.thermal import ThermalSnapshot
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator import fakes
from tests.orchestrator.conftest import Db


def small_request(**kw: Any) -> ExperimentRequest:
    """A small experiment that writes every file, the physical events too (the crash and resume tests cover them)."""
    wl = WorkloadConfig.model_validate({"model": "mixtral-8x7b", "sequence": {"steps": 24, "micro_batch": 4}})
    return ExperimentRequest(workload=wl, **{"events": True, **kw})


@pytest.fixture()
def clients(settings: Settings) -> Iterator[ServiceClients]:
    c = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
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


def test_tas_run_writes_every_file_and_commits_each_window(db: Db, settings: Settings, clients: ServiceClients,
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
        assert gz_text.read_text(path).splitlines()[0] == ",".join(cols)
    assert len(gz_text.read_text(rd / "traces/physical/compute_events.csv.gz").splitlines()) > 8
    assert (rd / "mapping/placement.json").is_file() and (rd / "runtime/replica_state.json").is_file()
    log = (rd / "run.log").read_text()
    assert "seed 42" in log and "git revision" in log and '"numpy"' in log and "config {" in log
    csv = result_csv_path(tmp_path / "out", "tas", "mixtral-8x7b").read_text().splitlines()
    assert csv[0].startswith("scenario,workload,T_peak_logic,T_peak_dram")
    assert csv[1].startswith("tas,mixtral-8x7b,")
    with db.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.status == RunStatus.succeeded and run.next_window == 8
        assert run.result_row is not None and run.result_row["T_peak_logic"] > 45.0
        windows = [w for (w,) in s.execute(sa.select(WindowRecord.window).where(WindowRecord.run_id == run_id))]
        assert sorted(windows) == list(range(8))


def test_crash_and_resume_is_byte_identical(db: Db, settings: Settings, clients: ServiceClients,
                                            tmp_path: Path) -> None:
    ref_id = _experiment(db, settings, tmp_path / "ref", scenarios=["tas"])
    assert run_scenario(repo.run_id_for(ref_id, "tas"), clients, db.sessions).status == "succeeded"

    exp_id = _experiment(db, settings, tmp_path / "crash", scenarios=["tas"])
    run_id = repo.run_id_for(exp_id, "tas")
    # worker 1 "dies" right after committing window 3 (its lease stays held) ...
    out1 = run_scenario(run_id, clients, db.sessions, owner="w1", lease_s=0.3, on_window=lambda _r, k, _n: k < 3)
    assert out1.status == "stopped" and out1.windows_run == 4
    saved = repo.load_frontier(sessions=db.sessions, run_id=run_id, next_window=4)
    assert saved is not None and saved["replicas"] == 0  # the checkpoint's window: resumed through its row
    # ... after having written rows of window 4 that never committed (the crash hit between append and commit)
    rd = run_dir_for(tmp_path / "crash", "tas")
    with open(rd / "traces/physical/compute_events.csv.gz", "ab") as fh:
        fh.write(gzip.compress(b"999,0,0,0,0.0,garbage,d0,0.0\n"))
    # worker 2 cannot take the live lease, then takes it once it expired and finishes the run
    assert run_scenario(run_id, clients, db.sessions, owner="w2", lease_s=5).status == "leased"
    time.sleep(0.4)
    out2 = run_scenario(run_id, clients, db.sessions, owner="w2", lease_s=5)
    assert out2.status == "succeeded" and out2.windows_run == 4
    assert "resuming at window 4 of 8 (attempt 2)" in (rd / "run.log").read_text()
    with db.sessions() as s:
        rows = list(s.execute(sa.select(WindowRecord.window, WindowRecord.worker)
                              .where(WindowRecord.run_id == run_id).order_by(WindowRecord.window)))
    assert [w for w, _ in rows] == list(range(8))  # every window exactly once
    assert [o for _, o in rows] == ["w1"] * 4 + ["w2"] * 4
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
    with db.sessions() as s:
        assert repo.window_count(session=s, run_id=run_id) == 2


def test_a_phase_longer_than_the_lease_keeps_the_run(db: Db, settings: Settings, clients: ServiceClients,
                                                     tmp_path: Path) -> None:
    """The lease is renewed by a heartbeat, not only at window commits: a window that takes 4 leases (a loaded
    machine, a long placement) leaves the run with its worker; a second worker cannot take it meanwhile."""
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
    assert out.status == "succeeded"
    with db.sessions() as s:
        rows = list(s.scalars(sa.select(WindowRecord.worker).where(WindowRecord.run_id == run_id)))
    assert rows and set(rows) == {"w1"}


def test_upstream_failure_fails_the_run_with_its_reason(db: Db, settings: Settings, tmp_path: Path) -> None:
    """With no outage budget (TASMOE_OUTAGE_BUDGET_S=0) an unreachable service fails the run at once, naming it
    (the waiting with a budget: tests/orchestrator/test_outage.py)."""
    from services.orchestrator.settings import OrchestratorSettings

    apps: dict[str, FastAPI] = dict(fakes.build_apps(settings))
    del apps["thermal"]  # thermal is "down": the client targets a closed port
    s2 = OrchestratorSettings(**{**settings.model_dump(), "thermal_url": "http://127.0.0.1:9", "http_retries": 1,
                                 "http_backoff_s": 0.01, "outage_budget_s": 0.0})
    clients = ServiceClients(s2, asgi_apps=apps)
    exp_id = _experiment(db, settings, tmp_path / "out", scenarios=["baseline"])
    out = run_scenario(repo.run_id_for(exp_id, "baseline"), clients, db.sessions)
    clients.close()
    assert out.status == "failed" and "thermal" in (out.error or "")
    with db.sessions() as s:
        run = s.get(ScenarioRun, repo.run_id_for(exp_id, "baseline"))
        assert run is not None and run.status == RunStatus.failed and "thermal" in (run.error or "")


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
    s2 = settings.model_copy(update={"http_retries": 4, "http_backoff_s": 0.01})
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
            flaky.down = 3  # thermal goes away for three requests during window 3
        return True

    exp = _experiment(db, settings, tmp_path / "flaky", scenarios=["tacs"])
    out = run_scenario(repo.run_id_for(exp, "tacs"), clients, db.sessions, on_window=restart)
    clients.close()
    assert out.status == "succeeded" and flaky.refused == 3
    assert _tree(tmp_path / "flaky") == _tree(tmp_path / "ref")


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
    from shared.configs import TasParams

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


def _frontier_rows(db: Db, run_id: str) -> list[int]:
    with db.sessions() as s:
        return [w for (w,) in s.execute(sa.select(WindowRecord.window).where(
            WindowRecord.run_id == run_id, WindowRecord.frontier.is_not(None)).order_by(WindowRecord.window))]


def test_services_that_lost_the_run_states_get_them_rebuilt_from_the_checkpoint(
        db: Db, settings: Settings, clients: ServiceClients, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: the thermal and physical states stay with their services and windows name them; a frontier keeps
    them whole every CHECKPOINT_EVERY windows. A resume on restarted services (they know none of the run's states)
    replays the windows after the checkpoint, which must name the very states the run committed, and the outputs are
    byte-identical; states lost in the middle of a run are rebuilt the same way."""
    from services.orchestrator import window_loop

    monkeypatch.setattr(window_loop, "CHECKPOINT_EVERY", 3)
    ref_id = _experiment(db, settings, tmp_path / "ref", scenarios=["tas"])
    ref_run = repo.run_id_for(ref_id, "tas")
    assert run_scenario(ref_run, clients, db.sessions).status == "succeeded"
    assert _frontier_rows(db, ref_run) == [7]  # the last window is a checkpoint; the earlier ones were dropped

    exp_id = _experiment(db, settings, tmp_path / "crash", scenarios=["tas"])
    run_id = repo.run_id_for(exp_id, "tas")
    out1 = run_scenario(run_id, clients, db.sessions, owner="w1", lease_s=0.3, on_window=lambda _r, k, _n: k < 4)
    assert out1.status == "stopped" and out1.windows_run == 5
    assert _frontier_rows(db, run_id) == [3, 4]  # the checkpoint (window 3) and the newest
    time.sleep(0.4)
    fresh = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))  # restarted services: no states
    try:
        out2 = run_scenario(run_id, fresh, db.sessions, owner="w2", lease_s=5)
    finally:
        fresh.close()
    assert out2.status == "succeeded" and out2.windows_run == 3
    log = (run_dir_for(tmp_path / "crash", "tas") / "run.log").read_text()
    assert "replaying windows 4..4 from the checkpoint after window 3" in log
    assert _tree(tmp_path / "crash") == _tree(tmp_path / "ref")

    # in the middle of a run: both services forget every state after window 4 was committed
    apps = fakes.build_apps(settings)
    mid = ServiceClients(settings, asgi_apps=apps)

    def forget(_r: str, k: int, _n: int) -> bool:
        if k == 4:
            apps["thermal"].state.states.clear()
            apps["lowering"].state.states.clear()
        return True

    exp2 = _experiment(db, settings, tmp_path / "mid", scenarios=["tas"])
    try:
        out3 = run_scenario(repo.run_id_for(exp2, "tas"), mid, db.sessions, on_window=forget)
    finally:
        mid.close()
    assert out3.status == "succeeded"
    assert "replaying windows 4..4" in (run_dir_for(tmp_path / "mid", "tas") / "run.log").read_text()
    assert _tree(tmp_path / "mid") == _tree(tmp_path / "ref")


def test_a_replay_that_does_not_reproduce_the_committed_states_is_said_and_the_run_goes_on(
        db: Db, settings: Settings, clients: ServiceClients, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Determinism is checked, not assumed: a replay naming other states than those committed (here: a committed
    name no replay can give) is written to the run log, and the run goes on from the replayed states."""
    from services.orchestrator import window_loop

    monkeypatch.setattr(window_loop, "CHECKPOINT_EVERY", 3)
    exp_id = _experiment(db, settings, tmp_path / "out", scenarios=["baseline"])
    run_id = repo.run_id_for(exp_id, "baseline")
    assert run_scenario(run_id, clients, db.sessions, owner="w1", lease_s=0.3,
                        on_window=lambda _r, k, _n: k < 5).status == "stopped"
    with db.sessions.begin() as s:
        row = s.execute(sa.select(WindowRecord).where(WindowRecord.run_id == run_id, WindowRecord.window == 5)
                        ).scalar_one()
        assert row.frontier is not None
        row.frontier = {**row.frontier, "thermal_ref": "0" * 16}
    time.sleep(0.4)
    fresh = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    try:
        out = run_scenario(run_id, fresh, db.sessions, owner="w2", lease_s=5)
    finally:
        fresh.close()
    assert out.status == "succeeded", out.error
    log = (run_dir_for(tmp_path / "out", "baseline") / "run.log").read_text()
    assert "replaying windows 4..5" in log and "did not reproduce the committed states" in log


def test_a_warm_up_pass_whose_states_are_lost_goes_on_from_its_last_whole_states(
        db: Db, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up pass keeps whole states every CHECKPOINT_EVERY windows (in memory): a service that loses one
    sends the pass back there, and the run is the same as an undisturbed one."""
    from services.orchestrator import window_loop

    monkeypatch.setattr(window_loop, "CHECKPOINT_EVERY", 2)
    ref_apps = fakes.build_apps(settings)
    ref_clients = ServiceClients(settings, asgi_apps=ref_apps)
    ref = _experiment(db, settings, tmp_path / "ref", scenarios=["tas"])
    try:
        assert run_scenario(repo.run_id_for(ref, "tas"), ref_clients, db.sessions).status == "succeeded"
    finally:
        ref_clients.close()
    apps = fakes.build_apps(settings)
    thermal = apps["thermal"]
    steps = {"n": 0}

    async def forgetful(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/step":
            steps["n"] += 1
            if steps["n"] == 4:  # the warm-up's 4th window: every state the service kept is gone
                thermal.state.states.clear()
        await thermal(scope, receive, send)

    apps["thermal"] = forgetful  # type: ignore[assignment]
    clients = ServiceClients(settings, asgi_apps=apps)
    exp = _experiment(db, settings, tmp_path / "lost", scenarios=["tas"])
    try:
        out = run_scenario(repo.run_id_for(exp, "tas"), clients, db.sessions)
    finally:
        clients.close()
    assert out.status == "succeeded", out.error
    assert "going on from window 2 with the states kept then" in (
        run_dir_for(tmp_path / "lost", "tas") / "run.log").read_text()
    assert _tree(tmp_path / "lost") == _tree(tmp_path / "ref")


def test_tacs_is_told_the_clocks_of_the_window_it_decides_for() -> None:
    """TACS prices compute at each core's voltage: its telemetry carries the thermal snapshot's clocks for the next
    window (the DVFS governor's, per core), and before the first window every core's top step."""
    arch = ArchConfig(dvfs=DvfsConfig(domains=(DvfsDomain(), DvfsDomain(cores=(0, 1), steps_ghz=(1.5, 1.0),
                                                                         trip_c=(80.0,)))))
    first = ambient_telemetry(arch).freq_ghz
    assert first[:2] == [1.5, 1.5] and set(first[2:]) == {2.0}  # shared.chip.core_domains: a listed core's domain
    n = arch.mesh.n_cores
    clocks = [1.2 if c % 3 == 0 else 2.0 for c in range(n)]
    before = Frontier(thermal=None, physical=None, smoothed=None, telemetry=ambient_telemetry(arch),
                      freq_ghz=clocks, bw_eff_factor=1.0, files={})

    def after(snap_clocks: list[float]) -> Frontier:
        snap = ThermalSnapshot(window=4, temps_core_c=[50.0] * n, freq_ghz=snap_clocks)
        P: Any = SimpleNamespace(state={}, state_ref=None, timing=WindowTiming(util_core=[0.5] * n))
        th: Any = SimpleNamespace(snapshot=snap, state={}, state_ref=None)
        step = _Step(L=SimpleNamespace(t1_ns=9_000_000), overlays={}, smoothed=None, P=P, th=th, replicas={},
                     replicas_ref=None, times=(0.0,) * 5)
        return step.frontier(before, ckpt=-1, files={})

    slow = [1.6] * n
    nxt = after(slow)  # the governor's clocks for the next window reach TACS and the physicalizer alike
    assert nxt.telemetry.freq_ghz == nxt.freq_ghz == slow and nxt.telemetry.ts_ns == 9_000_000
    kept = after([])  # a snapshot without clocks: both keep the window's own
    assert kept.telemetry.freq_ghz == kept.freq_ghz == clocks


def test_a_frontier_names_its_checkpoints_replicas_instead_of_repeating_them() -> None:
    """A frontier without whole states whose replicas are its checkpoint's saves the checkpoint's window instead of
    them (a number: a worker of an older version fails on it instead of resuming with none); read back with the
    checkpoint's row it gives them whole again, and without that row it is refused. Replicas that changed since the
    checkpoint, and the checkpoint's own row, are saved whole. A step carries the checkpoint's replicas forward, and
    a new checkpoint takes its own."""
    arch = ArchConfig()
    reps = {"experts": {"L0E0": {"cores": [3], "shard_banks": ["b0_1_2"]}}}
    base: dict[str, Any] = {"smoothed": None, "telemetry": ambient_telemetry(arch), "freq_ghz": [2.0],
                            "bw_eff_factor": 1.0, "files": {}}
    ck = Frontier(thermal={"t_ns": 1}, physical={"replicas": reps, "next_evt_id": 9}, replicas=dict(reps), ckpt=5,
                  **base)
    row5 = json.loads(json.dumps(ck.to_json()))
    assert row5["replicas"] == reps and replicas_at(row5) is None  # the checkpoint's own row: whole
    read5 = Frontier.from_json(row5, window=5)
    assert read5.ckpt_replicas == reps

    later = Frontier(thermal=None, physical=None, replicas=dict(reps), ckpt=5, ckpt_replicas=read5.ckpt_replicas,
                     thermal_ref="a" * 64, physical_ref="b" * 64, **base)
    row7 = json.loads(json.dumps(later.to_json()))
    assert row7["replicas"] == 5 and replicas_at(row7) == 5
    with pytest.raises(TypeError):  # what a worker of the version before does with it: a loud failure
        dict(row7["replicas"])
    with pytest.raises(ValueError, match="checkpoint"):
        Frontier.from_json(row7, window=7)
    back = Frontier.from_json(row7, window=7, ckpt_row=row5)
    assert back.replicas == reps and back.ckpt_replicas == reps and back.physical_ref == "b" * 64

    moved = {"experts": {"L0E0": {"cores": [4], "shard_banks": ["b0_2_2"]}}}
    changed = Frontier(thermal=None, physical=None, replicas=moved, ckpt=5, ckpt_replicas=reps, **base).to_json()
    assert changed["replicas"] == moved and replicas_at(changed) is None
    unknown = Frontier(thermal=None, physical=None, replicas=dict(reps), ckpt=5, **base).to_json()
    assert unknown["replicas"] == reps  # the checkpoint's replicas not known here: whole

    n = arch.mesh.n_cores
    snap = ThermalSnapshot(window=8, temps_core_c=[50.0] * n)

    def step(replicas: dict[str, Any], whole: bool) -> _Step:
        P: Any = SimpleNamespace(state={"replicas": replicas} if whole else None, state_ref="c" * 64,
                                 timing=WindowTiming(util_core=[0.5] * n))
        th: Any = SimpleNamespace(snapshot=snap, state={"t_ns": 2} if whole else None, state_ref="d" * 64)
        return _Step(L=SimpleNamespace(t1_ns=9_000_000), overlays={}, smoothed=None, P=P, th=th, replicas=replicas,
                     replicas_ref=None, times=(0.0,) * 5)

    carried = step(dict(reps), whole=False).frontier(back, ckpt=5, files={})
    assert carried.ckpt_replicas == reps and carried.to_json()["replicas"] == 5
    new_ckpt = step(moved, whole=True).frontier(back, ckpt=8, files={})
    assert new_ckpt.ckpt_replicas == moved and new_ckpt.to_json()["replicas"] == moved


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
