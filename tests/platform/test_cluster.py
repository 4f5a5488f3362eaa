"""The local cluster (scripts/cluster.py): up on alternate ports against the real PostgreSQL and Redis, all six answer
/healthz over real sockets, the Celery worker answers a ping and runs a task through Redis, down leaves no process.

The first tests need nothing running: they check the refusals that happen before anything is started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scripts import cluster
from shared import SERVICES
from shared.client import ServiceClient, ServiceClients
from shared.settings import Settings, sqlalchemy_url
from tests.platform.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scripts.cluster", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def _free_block(n: int = len(SERVICES), start: int = 18000) -> int:
    """A base port with ``n`` consecutive free loopback ports (18000.. first, as docs/operations.md's example)."""
    for base in range(start, start + 2000, 10):
        if all(cluster._port_free("127.0.0.1", base + i) for i in range(n)):
            return base
    raise RuntimeError("no free block of loopback ports")


def test_config_ports_urls_and_env(tmp_path: Path) -> None:
    cfg = cluster.ClusterConfig(host="127.0.0.1", base_port=18000, state_dir=tmp_path, database_url="postgresql://db/x",
                                redis_url="redis://r:6379/2", timeout_s=5)
    assert [cfg.port(n) for n in SERVICES] == list(range(18000, 18006))
    env = cfg.env()
    assert env["TASMOE_MODE"] == "cluster"
    assert env["TASMOE_DATABASE_URL"] == "postgresql://db/x"
    assert env["TASMOE_REDIS_URL"] == "redis://r:6379/2"
    settings = Settings.model_validate({k[len("TASMOE_"):].lower(): v for k, v in env.items()
                                        if k.startswith("TASMOE_") and k[7:].lower() in Settings.model_fields})
    assert settings.service_url("thermal") == "http://127.0.0.1:18004"
    assert settings.service_url("orchestrator") == "http://127.0.0.1:18000"


def test_replicas_of_the_compute_services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--replicas 2``: a second process of each compute service 10 ports up, the URL variables list both, and a
    worker's pool process i keeps to replica i (its runs' window states live there)."""
    cfg = cluster.ClusterConfig(host="127.0.0.1", base_port=18000, state_dir=tmp_path, database_url="postgresql://db/x",
                                redis_url="redis://r:6379/2", timeout_s=5, worker_concurrency=2, replicas=2)
    procs = cfg.processes()
    assert procs["orchestrator"] == ("orchestrator", 0) and "orchestrator-1" not in procs
    assert procs["thermal-1"] == ("thermal", 1) and len(procs) == 2 * len(SERVICES) - 1
    assert cfg.port("thermal", 1) == 18014 and cluster._serve_cmd("thermal-1", cfg)[-1] == "18014"
    env = cfg.env()
    assert env["TASMOE_THERMAL_URL"] == "http://127.0.0.1:18004,http://127.0.0.1:18014"
    assert env["TASMOE_ORCHESTRATOR_URL"] == "http://127.0.0.1:18000"
    settings = Settings.model_validate({k[len("TASMOE_"):].lower(): v for k, v in env.items()
                                        if k.startswith("TASMOE_") and k[7:].lower() in Settings.model_fields})
    assert settings.service_urls("lowering") == ["http://127.0.0.1:18003", "http://127.0.0.1:18013"]
    assert [settings.service_url("lowering", r) for r in range(3)] == [
        "http://127.0.0.1:18003", "http://127.0.0.1:18013", "http://127.0.0.1:18003"]
    assert settings.service_url("orchestrator", 1) == "http://127.0.0.1:18000"

    import billiard.process

    from services.orchestrator import tasks
    from services.orchestrator.settings import orchestrator_settings

    class Child:
        index = 1

    monkeypatch.setattr(billiard.process, "current_process", lambda: Child())
    clients = tasks._clients(orchestrator_settings(settings))
    try:
        assert clients["thermal"].base_url == "http://127.0.0.1:18014"
        assert clients["orchestrator"].base_url == "http://127.0.0.1:18000"
    finally:
        clients.close()
    # a service replica's own calls go to its peers' replica of its number (TASMOE_REPLICA, set per process by `up`)
    from types import SimpleNamespace

    from shared.peers import close_peers, peers_of

    app = SimpleNamespace(state=SimpleNamespace(settings=settings.model_copy(update={"replica": 1})))
    assert peers_of(app)["thermal"].base_url == "http://127.0.0.1:18014"
    close_peers({"placement": app})
    for name in ("thermal-1", "worker", "orchestrator", "notes", "orchestrator-1", "thermal-x"):
        (tmp_path / f"{name}.pid").write_text("1\n")
    names = cluster._names(tmp_path)  # only process names `up` gives; every service and the worker
    assert names == [*SERVICES[:4], "thermal", "thermal-1", "metrics", "worker"], names


def test_bad_replica_urls_name_the_variable() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="several separated by commas"):
        Settings(thermal_url="http://a:1,,http://b:2")
    with pytest.raises(ValidationError, match="thermal_url"):
        Settings(thermal_url="a:1")
    res = _run("up", "--replicas", "0", "--state-dir", "/nonexistent-never-created")
    assert res.returncode == 1 and "--replicas 0: must be in 1..64" in res.stderr


def test_up_refuses_a_busy_port_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # the busy port is the thermal one (base + 4)
        res = _run("up", "--base-port", str(port - 4), "--state-dir", str(tmp_path), "--timeout", "5")
    assert res.returncode == 1
    assert f"thermal:{port}" in res.stderr and "ports already in use" in res.stderr
    assert not list(tmp_path.glob("*.pid"))


def test_up_refuses_an_unreachable_database(tmp_path: Path) -> None:
    dead = free_port()
    res = _run("up", "--base-port", str(_free_block(start=28000)), "--state-dir", str(tmp_path),
               "--database-url", f"postgresql+psycopg://postgres:secret@127.0.0.1:{dead}/x", "--timeout", "5")
    assert res.returncode == 1
    line = res.stderr.strip()
    assert "database postgresql+psycopg://postgres:***@127.0.0.1" in line and "not reachable" in line
    assert "secret" not in line and "Traceback" not in line
    assert not list(tmp_path.glob("*.pid"))


def test_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    res = _run("up", "--base-port", "65533", "--state-dir", str(tmp_path))
    assert res.returncode == 1 and "--base-port 65533" in res.stderr
    res = _run("down", "--state-dir", str(tmp_path))
    assert res.returncode == 0 and "no cluster processes running" in res.stdout


@pytest.fixture()
def cluster_env(postgres_url: str, redis_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The cluster's environment, with a database of its own (``up`` creates it; dropped afterwards)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(sqlalchemy_url(postgres_url))
    name = f"tasmoe_cluster_{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASMOE_")}
    # the experiments the test posts write their folders in the test's temporary folder, not the checkout's results/
    env.update({"TASMOE_DATABASE_URL": base.set(database=name).render_as_string(hide_password=False),
                "TASMOE_REDIS_URL": redis_url, "TASMOE_RESULTS_DIR": str(tmp_path / "results"),
                "TASMOE_MODELS_DIR": str(tmp_path / "models")})
    yield env
    admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture()
def running_cluster(tmp_path: Path, cluster_env: dict[str, str]) -> Iterator[tuple[Path, int]]:
    state = tmp_path / "cluster"
    base = _free_block(16)  # the services and their second replicas (base + 11 .. base + 15)
    res = _run("up", "--base-port", str(base), "--state-dir", str(state), "--timeout", "180",
               "--worker-concurrency", "2", env=cluster_env)  # two pool processes: two replicas of each service
    try:
        assert res.returncode == 0, f"cluster up failed:\n{res.stdout}\n{res.stderr}"
        yield state, base
    finally:
        _run("down", "--state-dir", str(state), env=cluster_env)


@pytest.mark.cluster
def test_cluster_up_serves_all_six_and_the_worker_then_down_stops_them(
        running_cluster: tuple[Path, int], cluster_env: dict[str, str], redis_url: str) -> None:
    state, base = running_cluster
    pids = {p.stem: int(p.read_text().strip()) for p in state.glob("*.pid")}
    replicas = {f"{n}-1" for n in SERVICES if n != "orchestrator"}
    assert set(pids) == {*SERVICES, *replicas, "worker"}
    assert all(cluster.is_alive(pid) for pid in pids.values()), {n: cluster._proc_stat(p) for n, p in pids.items()}

    # all six answer /healthz over real sockets, through the project's own client
    settings = Settings.model_validate({f"{n}_url": f"http://127.0.0.1:{base + i}" for i, n in enumerate(SERVICES)})
    clients = ServiceClients(settings)
    try:
        for name in SERVICES:
            assert clients[name].get_json("/healthz")["service"] == name
    finally:
        clients.close()
    for name in replicas:  # the second replicas, 10 ports up
        service = name[:-2]
        assert (cluster._health(f"http://127.0.0.1:{base + 10 + SERVICES.index(service)}") or {}).get(
            "service") == service

    # each service process got the cluster environment
    recorded = json.loads((state / "cluster.json").read_text())
    environ = dict(kv.split("=", 1) for kv in
                   Path(f"/proc/{pids['orchestrator']}/environ").read_text().split("\0") if "=" in kv)
    assert environ["TASMOE_MODE"] == "cluster"
    assert environ["TASMOE_THERMAL_URL"] == f"http://127.0.0.1:{base + 4},http://127.0.0.1:{base + 14}"
    assert environ["TASMOE_DATABASE_URL"] == cluster_env["TASMOE_DATABASE_URL"]
    assert environ["TASMOE_REDIS_URL"] == redis_url

    # the worker answers `celery inspect ping` and runs a task through Redis
    worker_name = recorded["worker_name"]
    assert cluster.worker_ping(redis_url, worker_name, timeout_s=3.0)
    from celery import Celery

    app = Celery("tasmoe-test", broker=redis_url, backend=redis_url)
    try:
        queues = (app.control.inspect([worker_name], timeout=3.0).active_queues() or {})[worker_name]
        queue = queues[0]["name"]  # whatever queue the orchestrator's app consumes
        assert app.send_task("tasmoe.ping", queue=queue).get(timeout=20) == "pong"
    finally:
        app.close()

    # an experiment posted to the orchestrator is claimed by the worker (Celery over Redis, run state in PostgreSQL):
    # the science may still fail mid-development, the wiring may not
    orch = ServiceClient("orchestrator", settings.service_url("orchestrator"), settings)
    try:
        # 100 windows: one micro-batch of the default workload needs 75 (a shorter run is refused at submission)
        accepted = orch.post_json("/v1/experiments", {"windows": 100, "scenarios": ["baseline"], "traces": False})
        deadline = time.monotonic() + 60
        view = orch.get_json(f"/v1/experiments/{accepted['id']}")
        while time.monotonic() < deadline and not any(r["attempts"] >= 1 for r in view["runs"]):
            time.sleep(0.25)
            view = orch.get_json(f"/v1/experiments/{accepted['id']}")
        assert any(r["attempts"] >= 1 for r in view["runs"]), f"no worker claimed the run: {view}"
        if view["status"] in {"queued", "running"}:
            orch.post_json(f"/v1/experiments/{accepted['id']}/cancel")
    finally:
        orch.close()

    # `up` created the cluster's database and ran the orchestrator's migrations into it
    from sqlalchemy import create_engine, inspect

    engine = create_engine(sqlalchemy_url(cluster_env["TASMOE_DATABASE_URL"]))
    try:
        assert "alembic_version" in inspect(engine).get_table_names()
    finally:
        engine.dispose()

    status = _run("status", "--state-dir", str(state), env=cluster_env)
    assert status.returncode == 0
    assert status.stdout.count("healthy") == len(SERVICES) + len(replicas) and "answers ping" in status.stdout

    # one process restarted (issue 17): a new pid that answers, and `down` below stops it too
    res = _run("restart", "thermal", "--state-dir", str(state), env=cluster_env)
    assert res.returncode == 0, res.stderr + res.stdout
    new_pid = int((state / "thermal.pid").read_text().strip())
    assert new_pid != pids["thermal"] and not cluster.group_members(pids["thermal"])
    assert json.loads((state / "cluster.json").read_text())["processes"]["thermal"]["pid"] == new_pid
    assert cluster._health(f"http://127.0.0.1:{base + 4}") is not None
    pids["thermal"] = new_pid
    res = _run("restart", "lowering-1", "--state-dir", str(state), env=cluster_env)
    assert res.returncode == 0, res.stderr + res.stdout
    pids["lowering-1"] = int((state / "lowering-1.pid").read_text().strip())
    assert cluster._health(f"http://127.0.0.1:{base + 13}") is not None
    res = _run("restart", "orchestrator-1", "--state-dir", str(state), env=cluster_env)
    assert res.returncode == 1 and "no process 'orchestrator-1'" in res.stderr
    assert stat.S_IMODE((state / "config.json").stat().st_mode) == 0o600  # it holds the database URL

    # a second `up` on the same state dir is refused while this one runs
    again = _run("up", "--base-port", str(base), "--state-dir", str(state), "--timeout", "5", env=cluster_env)
    assert again.returncode == 1 and "already running" in again.stderr

    res = _run("down", "--state-dir", str(state), env=cluster_env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("stopped") == len(pids)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(cluster.group_members(p) for p in pids.values()):
        time.sleep(0.1)
    assert not [n for n, p in pids.items() if cluster.group_members(p)], "processes left after down"
    assert not list(state.glob("*.pid"))
    assert all(cluster._port_free("127.0.0.1", base + i) for i in (*range(len(SERVICES)), *range(11, 16)))


def _fake_serve(failing: str | None) -> Callable[[str, cluster.ClusterConfig], list[str]]:
    """Stand-ins for `tasmoe serve`: cheap processes that never answer /healthz; ``failing`` exits 3 after 0.3 s."""

    def cmd(name: str, _: cluster.ClusterConfig) -> list[str]:
        if name == failing:
            return [sys.executable, "-c", "import sys, time; time.sleep(0.3); print('bad setting: log_level'); "
                                          "sys.exit(3)"]
        return [sys.executable, "-c", "import time; time.sleep(120)"]

    return cmd


def _assert_torn_down(state: Path) -> None:
    assert not list(state.glob("*.pid"))
    started = json.loads((state / "cluster.json").read_text())["processes"]
    assert set(started) == set(SERVICES)
    assert not [n for n, p in started.items() if cluster.group_members(int(p["pid"]))], "processes left running"


@pytest.mark.services
def test_a_process_that_dies_while_starting_tears_the_cluster_down(
        tmp_path: Path, postgres_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "_serve_cmd", _fake_serve(failing="thermal"))
    cfg = cluster.ClusterConfig(host="127.0.0.1", base_port=_free_block(), state_dir=tmp_path,
                                database_url=postgres_url, redis_url=redis_url, timeout_s=60, worker=False,
                                migrate=False)
    with (tmp_path / "out.txt").open("w") as out, pytest.raises(cluster.ClusterError) as info:
        cluster.up(cfg, out=out)
    assert "thermal exited with code 3 while starting" in str(info.value)
    assert "bad setting: log_level" in str(info.value)  # the log tail
    _assert_torn_down(tmp_path)


@pytest.mark.services
def test_a_start_timeout_names_the_silent_services_and_tears_down(
        tmp_path: Path, postgres_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "_serve_cmd", _fake_serve(failing=None))
    cfg = cluster.ClusterConfig(host="127.0.0.1", base_port=_free_block(), state_dir=tmp_path,
                                database_url=postgres_url, redis_url=redis_url, timeout_s=1.0, worker=False,
                                migrate=False)
    with (tmp_path / "out.txt").open("w") as out, pytest.raises(cluster.ClusterError) as info:
        cluster.up(cfg, out=out)
    assert f"timed out after 1 s waiting for {', '.join(sorted(SERVICES))}" in str(info.value)
    _assert_torn_down(tmp_path)


@pytest.mark.services
def test_check_database_creates_a_missing_database_once(postgres_url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(sqlalchemy_url(postgres_url))
    name = f"tasmoe_cluster_{uuid.uuid4().hex[:10]}"
    url = base.set(database=name).render_as_string(hide_password=False)
    missing = base.set(database=f"{name}_never").render_as_string(hide_password=False)
    admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        assert cluster.check_database(url).startswith("database created")
        assert cluster.check_database(url).startswith("database ok")
        with pytest.raises(cluster.ClusterError, match="not reachable"):
            cluster.check_database(missing, create=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


def test_redacted_urls_hide_passwords() -> None:
    assert cluster._redact("postgresql+psycopg://u:pw@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"
    assert cluster._redact("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert cluster._redact("redis://h:6379/0") == "redis://h:6379/0"


def test_down_stops_recorded_groups_and_spares_a_recycled_pid(tmp_path: Path) -> None:
    """`down` kills the process group a pid file names (children included), but not a process that merely reuses a
    recorded pid (its start time differs from the one `up` recorded)."""
    sleeper = [sys.executable, "-c", "import subprocess, sys, time; "
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"]
    ours = subprocess.Popen(sleeper, start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(cluster.group_members(ours.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        group = cluster.group_members(ours.pid)
        assert len(group) == 2  # the leader and its child
        (tmp_path / "thermal.pid").write_text(f"{ours.pid}\n")
        (tmp_path / "metrics.pid").write_text(f"{stranger.pid}\n")
        (tmp_path / "cluster.json").write_text(json.dumps({"processes": {
            "thermal": {"pid": ours.pid, "start_ticks": cluster.start_ticks(ours.pid)},
            "metrics": {"pid": stranger.pid, "start_ticks": (cluster.start_ticks(stranger.pid) or 0) - 1}}}))
        assert set(cluster._running(tmp_path)) == {"thermal"}
        out = tmp_path / "down.txt"
        with out.open("w") as fh:
            assert cluster.down(tmp_path, grace_s=5, out=fh) == 0
        text = out.read_text()
        assert "stopped thermal" in text and "metrics: pid" in text and "left alone" in text
        ours.wait(timeout=5)
        assert not [p for p in group if cluster.is_alive(p)]
        assert stranger.poll() is None  # untouched
        assert not list(tmp_path.glob("*.pid"))
    finally:
        for proc in (ours, stranger):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
