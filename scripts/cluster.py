"""The local cluster without Docker: six uvicorn services (the five compute services in ``--replicas`` copies) and a
Celery worker on loopback.

    python -m scripts.cluster up      # make cluster
    python -m scripts.cluster status
    python -m scripts.cluster down    # make cluster-down

``up`` checks PostgreSQL (creating the database when it is missing) and Redis, runs the orchestrator's migrations when
they exist, starts ``tasmoe serve <name> --port <base+i>`` for the six services (replica r of a compute service,
process ``<name>-<r>``, on ``base + 10·r + i``, with ``TASMOE_REPLICA=r``) and ``celery -A
services.orchestrator.celery_app worker``, each in its own process group, with ``TASMOE_MODE=cluster``, the database
and Redis URLs and every ``TASMOE_<SERVICE>_URL`` pointing at loopback. It writes ``<state-dir>/<name>.pid`` and
``<name>.log`` per process and ``cluster.json``, then waits until every ``/healthz`` answers (as the right service)
and the worker answers a Celery ping. On a timeout or a crashed process it prints the log tail, stops what it started
and exits 1.

``down`` stops exactly the processes named by the pid files (their process groups: SIGTERM, then SIGKILL after a
grace period). A pid whose command line no longer matches what ``up`` started is left alone (recycled pid).

Flags override environment variables: TASMOE_CLUSTER_HOST, TASMOE_CLUSTER_BASE_PORT, TASMOE_CLUSTER_DIR,
TASMOE_CLUSTER_TIMEOUT_S, TASMOE_DATABASE_URL, TASMOE_REDIS_URL.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from shared import DEFAULT_PORTS, SERVICES
from shared.errors import first_validation_error
from shared.settings import Settings, sqlalchemy_url

REPO = Path(__file__).resolve().parents[1]
WORKER = "worker"
DEFAULT_CLUSTER_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/tasmoe"
ALEMBIC_INI = Path("services/orchestrator/migrations/alembic.ini")
CELERY_APP = "services.orchestrator.celery_app"
REPLICA_PORT_STEP = 10  # replica r of a service listens 10·r ports above replica 0


class ClusterError(Exception):
    """A readable, one-paragraph reason the cluster could not start or stop."""


@dataclass(frozen=True)
class ClusterConfig:
    host: str
    base_port: int
    state_dir: Path
    database_url: str
    redis_url: str
    timeout_s: float
    worker: bool = True
    worker_concurrency: int = 1
    migrate: bool = True
    replicas: int | None = None  # processes of each compute service (None: worker_concurrency; orchestrator: 1)

    def n_replicas(self, service: str) -> int:
        n = self.worker_concurrency if self.replicas is None else self.replicas
        return 1 if service == "orchestrator" else max(1, n)

    def port(self, service: str, replica: int = 0) -> int:
        """Replica 0 at ``base + i`` (i: the service's place in `SERVICES`), replica r at ``base + 10·r + i``."""
        return self.base_port + REPLICA_PORT_STEP * replica + (DEFAULT_PORTS[service] - DEFAULT_PORTS[SERVICES[0]])

    def url(self, service: str, replica: int = 0) -> str:
        return f"http://{self.host}:{self.port(service, replica)}"

    def processes(self) -> dict[str, tuple[str, int]]:
        """Every service process by name: (service, replica); replica 0 is named after its service, replica r
        ``<service>-<r>``."""
        return {(name if r == 0 else f"{name}-{r}"): (name, r)
                for name in SERVICES for r in range(self.n_replicas(name))}

    @property
    def worker_name(self) -> str:
        return f"tasmoe-worker-{self.base_port}@{socket.gethostname()}"

    def env(self) -> dict[str, str]:
        """The environment every cluster process gets (the caller's, plus the cluster's URLs)."""
        env = dict(os.environ)
        env.update({
            "TASMOE_MODE": "cluster",
            "TASMOE_DATABASE_URL": self.database_url,
            "TASMOE_REDIS_URL": self.redis_url,
            "PYTHONUNBUFFERED": "1",
        })
        for name in SERVICES:  # several replicas: a comma-separated list (shared.settings.Settings.service_url)
            env[f"TASMOE_{name.upper()}_URL"] = ",".join(self.url(name, r) for r in range(self.n_replicas(name)))
        return env


# ---------------------------------------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state first), or None when the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone: it has exited and only waits to be reaped)."""
    stat = _proc_stat(pid)
    if stat is not None:
        return stat[0] != "Z"
    if Path("/proc").is_dir():
        return False
    try:  # no /proc (macOS): signal 0 probes existence
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (Linux /proc scan; elsewhere the leader if it lives)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return [pgid] if is_alive(pgid) else []
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _proc_stat(int(entry.name))
        if stat is not None and stat[0] != "Z" and int(stat[2]) == pgid:
            members.append(int(entry.name))
    return sorted(members)


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid, it names one
    process incarnation, so a recycled pid is never mistaken for ours."""
    stat = _proc_stat(pid)
    return int(stat[19]) if stat is not None else None


def _serve_cmd(proc: str, cfg: ClusterConfig) -> list[str]:
    service, replica = cfg.processes()[proc]
    tasmoe = Path(sys.executable).with_name("tasmoe")
    prog = [str(tasmoe)] if tasmoe.exists() else [sys.executable, "-m", "services.cli"]
    return [*prog, "serve", service, "--host", cfg.host, "--port", str(cfg.port(service, replica))]


def _worker_cmd(cfg: ClusterConfig) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", CELERY_APP, "worker", "--loglevel", "INFO",
            "--concurrency", str(cfg.worker_concurrency), "--hostname", cfg.worker_name,
            "--without-mingle", "--without-gossip"]


def _pid_file(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.pid"


def _log_file(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.log"


def _state_file(state_dir: Path) -> Path:
    return state_dir / "cluster.json"


def _start(name: str, cmd: list[str], cfg: ClusterConfig, env: dict[str, str]) -> subprocess.Popen[bytes]:
    if name in cfg.processes():  # a service replica calls its peers' replicas of the same number
        env = {**env, "TASMOE_REPLICA": str(cfg.processes()[name][1])}
    log = _log_file(cfg.state_dir, name).open("wb")
    try:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()
    _pid_file(cfg.state_dir, name).write_text(f"{proc.pid}\n", encoding="utf-8")
    return proc


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:]) or "    (empty log)"


# ------------------------------------------------------------------------------------------------------------- checks


def _port_free(host: str, port: int) -> bool:
    """True when uvicorn could bind ``host:port`` now (SO_REUSEADDR, as uvicorn sets: TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _health(url: str, timeout_s: float = 1.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout_s) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _redact(url: str) -> str:
    """Hide a password in a URL for messages (``user:***@host``)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    cred, host = rest.rsplit("@", 1)
    if ":" in cred:
        cred = cred.split(":", 1)[0] + ":***"
    return f"{scheme}://{cred}@{host}"


def check_database(url: str, *, create: bool = True) -> str:
    """Connect (``SELECT 1``); for PostgreSQL create the database when it does not exist. Returns a status line."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    effective = sqlalchemy_url(url)
    parsed = make_url(effective)
    connect_args: dict[str, Any] = {"connect_timeout": 5} if parsed.get_backend_name() == "postgresql" else {}
    engine = create_engine(effective, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return f"database ok ({_redact(effective)})"
    except OperationalError as exc:
        missing = "does not exist" in str(exc) and parsed.get_backend_name() == "postgresql"
        if not (missing and create and parsed.database):
            raise ClusterError(f"database {_redact(effective)} is not reachable: {str(exc.orig).strip()}") from exc
    finally:
        engine.dispose()
    admin = create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT", connect_args=connect_args)
    try:
        with admin.connect() as conn:
            name = str(parsed.database).replace('"', '""')
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        raise ClusterError(f"could not create database {parsed.database!r}: {str(exc.orig).strip()}") from exc
    finally:
        admin.dispose()
    return f"database created ({_redact(effective)})"


def check_redis(url: str) -> str:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        raise ClusterError(f"Redis {_redact(url)} is not reachable: {exc}") from exc
    return f"redis ok ({_redact(url)})"


def worker_ping(redis_url: str, worker_name: str, timeout_s: float = 1.0) -> bool:
    """``celery inspect ping`` for one worker, through the broker (True when it answered)."""
    from celery import Celery

    app = Celery("tasmoe-cluster-check", broker=redis_url, backend=redis_url)
    try:
        replies = app.control.ping(destination=[worker_name], timeout=timeout_s)
    except Exception:  # broker hiccup while the worker starts: treat as "not yet"
        return False
    finally:
        app.close()
    return any(worker_name in reply for reply in replies or [])


# ------------------------------------------------------------------------------------------------------------ up/down


def _read_pid(state_dir: Path, name: str) -> int | None:
    try:
        return int(_pid_file(state_dir, name).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def _ours(pid: int, name: str, starts: dict[str, int]) -> bool:
    """False when ``pid`` now belongs to a newer process than the one `up` started (its start time differs)."""
    now = start_ticks(pid)
    return now is None or name not in starts or now == starts[name]


def _process_key(name: str) -> tuple[int, int] | None:
    """(place in service order, replica) of a cluster process name (``thermal``, ``thermal-1``, ``worker``); None for
    any other name."""
    order = {n: i for i, n in enumerate((*SERVICES, WORKER))}
    if name in order:
        return order[name], 0
    base, sep, r = name.rpartition("-")
    if sep and r.isdigit() and int(r) >= 1 and base in SERVICES and base != "orchestrator":
        return order[base], int(r)
    return None


def _names(state_dir: Path) -> list[str]:
    """The processes of this cluster's state folder: the six services, the worker and any replica with a pid file
    (a process name `up` gives, nothing else found there), in service order."""
    found = {p.stem for p in state_dir.glob("*.pid") if _process_key(p.stem) is not None}
    return sorted(found | {*SERVICES, WORKER}, key=lambda n: _process_key(n) or (0, 0))


def _running(state_dir: Path) -> dict[str, int]:
    """Processes of a previous `up` from ``state_dir`` that still run (stale pid files do not count)."""
    starts = _recorded_starts(state_dir)
    out = {}
    for name in _names(state_dir):
        pid = _read_pid(state_dir, name)
        if pid is not None and group_members(pid) and (not is_alive(pid) or _ours(pid, name, starts)):
            out[name] = pid
    return out


def _migrate(cfg: ClusterConfig, env: dict[str, str]) -> str:
    ini = REPO / ALEMBIC_INI
    if not cfg.migrate:
        return "migrations skipped (--no-migrate)"
    if not ini.is_file():
        return f"no migrations yet ({ALEMBIC_INI} does not exist)"
    log_path = _log_file(cfg.state_dir, "migrate")
    with log_path.open("wb") as log:
        rc = subprocess.run([sys.executable, "-m", "alembic", "-c", str(ini), "upgrade", "head"], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=120,
                            check=False).returncode
    if rc != 0:
        raise ClusterError(f"alembic upgrade head failed (exit {rc}); {log_path}:\n{_tail(log_path)}")
    return "migrations applied (alembic upgrade head)"


def up(cfg: ClusterConfig, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    running = _running(cfg.state_dir)
    if running:
        raise ClusterError(f"a cluster from {cfg.state_dir} is already running (pids "
                           f"{', '.join(f'{n}={p}' for n, p in running.items())}); run `make cluster-down` first")
    procs_of = cfg.processes()
    busy = [f"{n}:{cfg.port(*sr)}" for n, sr in procs_of.items() if not _port_free(cfg.host, cfg.port(*sr))]
    if busy:
        raise ClusterError(f"ports already in use on {cfg.host}: {', '.join(busy)} (choose --base-port)")
    for stale in cfg.state_dir.glob("*.pid"):  # none runs (above): pid files an earlier `up` left behind
        stale.unlink(missing_ok=True)
    print(check_database(cfg.database_url), file=out)
    print(check_redis(cfg.redis_url), file=out)
    env = cfg.env()
    print(_migrate(cfg, env), file=out)

    procs: dict[str, subprocess.Popen[bytes]] = {}
    cmds: dict[str, list[str]] = {}
    try:
        for name in procs_of:
            cmds[name] = _serve_cmd(name, cfg)
            procs[name] = _start(name, cmds[name], cfg, env)
        if cfg.worker:
            cmds[WORKER] = _worker_cmd(cfg)
            procs[WORKER] = _start(WORKER, cmds[WORKER], cfg, env)
        _save_config(cfg)
        _state_file(cfg.state_dir).write_text(json.dumps({
            "host": cfg.host, "base_port": cfg.base_port,
            "urls": {n: cfg.url(*sr) for n, sr in procs_of.items()},
            "database_url": _redact(cfg.database_url), "redis_url": _redact(cfg.redis_url),
            "worker_name": cfg.worker_name if cfg.worker else None,
            "processes": {n: {"pid": p.pid, "start_ticks": start_ticks(p.pid), "cmd": cmds[n]}
                          for n, p in procs.items()},
        }, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        _wait_ready(cfg, procs, out)
    except BaseException:
        down(cfg.state_dir, out=out)
        raise
    for name, sr in procs_of.items():
        print(f"  {name:<13} {cfg.url(*sr)}  pid {procs[name].pid}", file=out)
    if cfg.worker:
        print(f"  {WORKER:<13} {cfg.worker_name}  pid {procs[WORKER].pid}", file=out)
    print(f"cluster up (logs and pid files in {cfg.state_dir}); stop it with `make cluster-down`", file=out)
    return 0


def _wait_ready(cfg: ClusterConfig, procs: dict[str, subprocess.Popen[bytes]], out: TextIO) -> None:
    t0 = time.monotonic()
    deadline = t0 + cfg.timeout_s
    pending = set(procs)
    while pending:
        for name in sorted(pending):
            rc = procs[name].poll()
            if rc is not None:
                log = _log_file(cfg.state_dir, name)
                raise ClusterError(f"{name} exited with code {rc} while starting; {log}:\n{_tail(log)}")
            if name == WORKER:
                ready = worker_ping(cfg.redis_url, cfg.worker_name, timeout_s=0.5)
            else:
                service, replica = cfg.processes()[name]
                health = _health(cfg.url(service, replica))
                ready = health is not None and health.get("service") == service
            if ready:
                pending.discard(name)
                print(f"ready: {name} ({time.monotonic() - t0:.1f} s)", file=out)
        if not pending:
            return
        if time.monotonic() > deadline:
            details = "\n".join(f"  {n}: {_log_file(cfg.state_dir, n)}\n{_tail(_log_file(cfg.state_dir, n), 8)}"
                                for n in sorted(pending))
            raise ClusterError(f"timed out after {cfg.timeout_s:.0f} s waiting for {', '.join(sorted(pending))}:\n"
                               f"{details}")
        time.sleep(0.25)


def _recorded_starts(state_dir: Path) -> dict[str, int]:
    try:
        state = json.loads(_state_file(state_dir).read_text(encoding="utf-8"))
        return {n: int(p["start_ticks"]) for n, p in state.get("processes", {}).items()
                if p.get("start_ticks") is not None}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def down(state_dir: Path, *, grace_s: float = 10.0, out: TextIO | None = None) -> int:
    """Stop the process groups named by the pid files in ``state_dir``; remove the pid files. Returns 0."""
    out = out or sys.stdout
    starts = _recorded_starts(state_dir)
    targets: dict[str, int] = {}
    for name in _names(state_dir):
        pid = _read_pid(state_dir, name)
        if pid is None:
            _pid_file(state_dir, name).unlink(missing_ok=True)
            continue
        if is_alive(pid) and not _ours(pid, name, starts):
            print(f"{name}: pid {pid} belongs to a newer process now; left alone", file=out)
        elif group_members(pid):
            targets[name] = pid
            continue
        _pid_file(state_dir, name).unlink(missing_ok=True)
    if not targets:
        print(f"no cluster processes running (state dir {state_dir})", file=out)
        return 0
    _stop_groups(targets, grace_s, out)
    for name, pid in targets.items():
        print(f"stopped {name} (pid {pid})", file=out)
        _pid_file(state_dir, name).unlink(missing_ok=True)
    return 0


def _config_file(state_dir: Path) -> Path:
    return state_dir / "config.json"


def _save_config(cfg: ClusterConfig) -> None:
    """What `restart` needs to start a process as `up` did (the database URL unredacted: mode 0600)."""
    data = {f.name: (str(v) if isinstance(v, Path) else v) for f in fields(cfg) for v in [getattr(cfg, f.name)]}
    path = _config_file(cfg.state_dir)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)


def _load_config(state_dir: Path) -> ClusterConfig:
    try:
        data = json.loads(_config_file(state_dir).read_text(encoding="utf-8"))
        data["state_dir"] = Path(data["state_dir"])
        data.setdefault("replicas", 1)  # a cluster started before replicas existed ran one of each
        return ClusterConfig(**data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ClusterError(f"no cluster started from {state_dir} (its config.json: {exc}); run `up` first") from None


def restart(state_dir: Path, name: str, *, grace_s: float = 10.0, out: TextIO | None = None) -> int:
    """Stop one process of the cluster (SIGTERM, then SIGKILL) and start it again as `up` did, with the same command
    and environment; its pid file and cluster.json follow, so `down` stops the new process."""
    out = out or sys.stdout
    cfg = _load_config(state_dir)
    if name == WORKER and not cfg.worker:
        raise ClusterError("this cluster runs without a worker (--no-worker)")
    if name != WORKER and name not in cfg.processes():
        raise ClusterError(f"no process {name!r} in this cluster; its processes: "
                           f"{', '.join([*cfg.processes(), *([WORKER] if cfg.worker else [])])}")
    pid = _read_pid(state_dir, name)
    starts = _recorded_starts(state_dir)
    if pid is not None and group_members(pid) and (not is_alive(pid) or _ours(pid, name, starts)):
        _stop_groups({name: pid}, grace_s, out)
        print(f"stopped {name} (pid {pid})", file=out)
    if name != WORKER:
        deadline = time.monotonic() + 10.0  # the port leaves TIME_WAIT-free at once (SO_REUSEADDR); the socket may lag
        while not _port_free(cfg.host, cfg.port(*cfg.processes()[name])) and time.monotonic() < deadline:
            time.sleep(0.1)
    cmd = _worker_cmd(cfg) if name == WORKER else _serve_cmd(name, cfg)
    proc = _start(name, cmd, cfg, cfg.env())
    try:
        state = json.loads(_state_file(state_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {"processes": {}}
    state.setdefault("processes", {})[name] = {"pid": proc.pid, "start_ticks": start_ticks(proc.pid), "cmd": cmd}
    _state_file(state_dir).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    _wait_ready(cfg, {name: proc}, out)
    print(f"restarted {name} (pid {proc.pid})", file=out)
    return 0


def _stop_groups(targets: dict[str, int], grace_s: float, out: TextIO) -> None:
    """SIGTERM to each process group, SIGKILL to those still there after ``grace_s`` seconds (said on ``out``)."""
    _signal_groups(targets, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(group_members(p) for p in targets.values()):
        time.sleep(0.1)
    stubborn = {n: p for n, p in targets.items() if group_members(p)}
    if stubborn:
        print(f"SIGKILL after {grace_s:.0f} s: {', '.join(stubborn)}", file=out)
        _signal_groups(stubborn, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(group_members(p) for p in stubborn.values()):
            time.sleep(0.05)


def _signal_groups(targets: dict[str, int], sig: signal.Signals) -> None:
    for pid in targets.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)  # started with start_new_session: the group id is the leader's pid


def status(state_dir: Path, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    running = _running(state_dir)
    try:
        state = json.loads(_state_file(state_dir).read_text(encoding="utf-8"))
        urls: dict[str, str] = state["urls"]
        worker_name: str | None = state.get("worker_name")
        redis_url = Settings().redis_url
    except (OSError, ValueError, KeyError):
        urls, worker_name, redis_url = {}, None, ""
    if not running:
        print(f"no cluster processes running (state dir {state_dir})", file=out)
        return 1
    for name in _names(state_dir):
        if name not in running:
            print(f"  {name:<13} down", file=out)
            continue
        if name == WORKER:
            where = worker_name or ""
            ok = bool(worker_name) and worker_ping(redis_url, str(worker_name))
            answer = "answers ping" if ok else "running (no ping answer via TASMOE_REDIS_URL)"
        else:
            where = urls.get(name, "")
            answer = "healthy" if name in urls and _health(urls[name]) else "not answering /healthz"
        print(f"  {name:<13} pid {running[name]:<8} {where}  {answer}", file=out)
    return 0


# ---------------------------------------------------------------------------------------------------------------- CLI


def _env_default(name: str, default: str) -> str:
    return os.environ.get(name) or default


def build_parser(settings: Settings | None = None) -> argparse.ArgumentParser:
    settings = settings or Settings()
    ap = argparse.ArgumentParser(prog="python -m scripts.cluster", description=__doc__.split("\n\n")[0] if __doc__
                                 else None)
    sub = ap.add_subparsers(dest="command", required=True)

    def state_dir_arg(p: argparse.ArgumentParser) -> None:
        default = Path(_env_default("TASMOE_CLUSTER_DIR", str(REPO / ".cluster")))
        p.add_argument("--state-dir", type=Path, default=default,
                       help="pid files, logs and cluster.json (env TASMOE_CLUSTER_DIR; default .cluster/)")

    p = sub.add_parser("up", help="start the six services and the Celery worker, wait until all answer")
    p.add_argument("--host", default=_env_default("TASMOE_CLUSTER_HOST", "127.0.0.1"))
    p.add_argument("--base-port", type=int, default=int(_env_default("TASMOE_CLUSTER_BASE_PORT", "8000")),
                   help="orchestrator's port; the others follow in service order (default 8000 -> 8000-8005)")
    p.add_argument("--database-url", default=settings.database_url or DEFAULT_CLUSTER_DB,
                   help=f"env TASMOE_DATABASE_URL; default {DEFAULT_CLUSTER_DB} (created when missing)")
    p.add_argument("--redis-url", default=settings.redis_url, help="broker and result backend (env TASMOE_REDIS_URL)")
    p.add_argument("--timeout", type=float, default=float(_env_default("TASMOE_CLUSTER_TIMEOUT_S", "90")),
                   help="seconds to wait for every /healthz and the worker ping")
    p.add_argument("--no-worker", action="store_true", help="do not start the Celery worker")
    p.add_argument("--worker-concurrency", type=int, default=1, help="the Celery worker's pool processes (runs at "
                   "once)")
    p.add_argument("--replicas", type=int, default=None,
                   help="processes of each compute service (default: the worker concurrency): pool process i keeps "
                        "to replica i, so two runs at once do not queue in one service process; replica r listens "
                        f"{REPLICA_PORT_STEP}*r ports above the first")
    p.add_argument("--no-migrate", action="store_true", help="skip `alembic upgrade head`")
    state_dir_arg(p)

    p = sub.add_parser("down", help="stop the processes named by the pid files (SIGTERM, then SIGKILL)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    state_dir_arg(p)

    p = sub.add_parser("status", help="show the cluster's processes and whether each answers /healthz")
    state_dir_arg(p)

    p = sub.add_parser("restart", help="stop one process and start it again as `up` did (down stops the new one)")
    p.add_argument("name", help="the service (a replica: <service>-<r>), or the worker")
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    state_dir_arg(p)
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        settings = Settings()
    except ValidationError as exc:
        field, message = first_validation_error(exc)
        print(f"cluster: error: environment variable TASMOE_{field.upper()}: {message}", file=sys.stderr)
        return 2
    args = build_parser(settings).parse_args(argv)
    state_dir: Path = args.state_dir.resolve()
    try:
        if args.command == "up":
            last = args.base_port + len(SERVICES) - 1
            if not (args.base_port >= 1 and last <= 65535):
                raise ClusterError(f"--base-port {args.base_port}: the six ports must lie in 1..65535")
            if args.worker_concurrency < 1:
                raise ClusterError(f"--worker-concurrency {args.worker_concurrency}: must be >= 1")
            replicas = args.worker_concurrency if args.replicas is None else args.replicas
            if not 1 <= replicas <= 64:
                given = f"--replicas {replicas}" if args.replicas is not None else \
                    f"--replicas (default: --worker-concurrency {replicas})"
                raise ClusterError(f"{given}: must be in 1..64")
            if args.base_port + REPLICA_PORT_STEP * (replicas - 1) + len(SERVICES) - 1 > 65535:
                raise ClusterError(f"--base-port {args.base_port} with --replicas {replicas}: the replicas' ports "
                                   "must lie in 1..65535")
            cfg = ClusterConfig(host=args.host, base_port=args.base_port, state_dir=state_dir,
                                database_url=args.database_url, redis_url=args.redis_url, timeout_s=args.timeout,
                                worker=not args.no_worker, worker_concurrency=args.worker_concurrency,
                                migrate=not args.no_migrate, replicas=replicas)
            return up(cfg)
        if args.command == "down":
            return down(state_dir, grace_s=args.grace)
        if args.command == "restart":
            return restart(state_dir, args.name, grace_s=args.grace)
        return status(state_dir)
    except ClusterError as exc:
        print(f"cluster {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
