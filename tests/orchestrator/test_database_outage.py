"""The run-state database away (a PostgreSQL server of the test's own, stopped and started by the test): reads answer
503 with Retry-After and the usual error body on a connection that stays open, the event stream stays open across
the outage and resumes with Last-Event-ID, and a run waits the outage out without spending an attempt, showing
``waiting``, and finishes with the files of an undisturbed run. Without a server: a run whose lease was taken while
the database was away stops cleanly, and the outage test itself (`shared.db.database_outage`)."""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import sqlalchemy as sa

from services.orchestrator import repository as repo
from services.orchestrator.app import create_app
from services.orchestrator.models import RunStatus, ScenarioRun, utcnow
from services.orchestrator.service import create_experiment
from services.orchestrator.settings import OrchestratorSettings
from services.orchestrator.window_loop import run_scenario
from shared.client import ServiceClients
from shared.db import database_outage
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator import fakes
from tests.orchestrator.conftest import SMALL_WL, Db
from tests.orchestrator.instances import PgServer, outage_db, own_pg, serve_app
from tests.orchestrator.test_kill_worker import _spec, _tree

__all__ = ["own_pg"]  # the module's PostgreSQL server (a fixture)


def _pg_url(db: Db) -> str:
    return f"{db.url}?options=-csearch_path%3D{db.schema}"


@pytest.fixture()
def pgdb(own_pg: PgServer) -> Iterator[Db]:
    """A migrated schema on the module's own server, which runs again after the test whatever it did."""
    yield from outage_db(own_pg)


@contextmanager
def _api(db: Db, tmp_path: Path) -> Iterator[tuple[str, ServiceClients]]:
    """The orchestrator on the database, over a real socket; runs are recorded, not run."""
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS, database_url=_pg_url(db))
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    try:
        with serve_app(create_app(settings, clients=clients, dispatcher=fakes.RecordingDispatcher())) as base:
            yield base, clients
    finally:
        clients.close()


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, Any]:
    """One request on the connection (http.client reconnects never: a connection the server closed fails)."""
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    raw = resp.read()
    return resp.status, resp.msg, json.loads(raw) if raw else None


def test_reads_answer_503_with_retry_after_while_the_database_is_away(own_pg: PgServer, pgdb: Db,
                                                                      tmp_path: Path) -> None:
    with _api(pgdb, tmp_path) as (base, _):
        u = urlsplit(base)
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=30)
        body = {"workload": SMALL_WL, "scenarios": ["baseline"]}
        status, _, accepted = _request(conn, "POST", "/v1/experiments", body)
        assert status == 202, accepted
        exp = accepted["id"]
        own_pg.stop()
        try:
            for method, path in (("GET", f"/v1/experiments/{exp}"), ("GET", "/v1/experiments"),
                                 ("GET", f"/v1/experiments/{exp}/results"), ("GET", f"/v1/experiments/{exp}/events"),
                                 ("GET", f"/v1/experiments/{exp}/files"), ("POST", f"/v1/experiments/{exp}/cancel")):
                status, headers, err = _request(conn, method, path)  # the same connection throughout
                assert status == 503, (path, err)
                assert int(headers["Retry-After"]) > 0
                assert err["error"]["code"] == "database_unavailable" and set(err["error"]) == {"code", "message",
                                                                                                 "field"}
            status, _, err = _request(conn, "POST", "/v1/experiments", body, {"Idempotency-Key": "k-outage"})
            assert status == 503 and err["error"]["code"] == "database_unavailable"
        finally:
            own_pg.start()
        status, _, view = _request(conn, "GET", f"/v1/experiments/{exp}")
        assert status == 200 and view["status"] == "queued"
        # the submission refused during the outage created nothing: the same key now creates the experiment
        status, _, again = _request(conn, "POST", "/v1/experiments", body, {"Idempotency-Key": "k-outage"})
        assert status == 202 and again["created"] is True
        status, _, page = _request(conn, "GET", "/v1/experiments")
        assert status == 200 and page["total"] == 2
        conn.close()


class _Events:
    """An SSE stream read on a thread: each event as ``{"event", "id", "data"}``; comments and ``retry:`` kept."""

    def __init__(self, base: str, path: str, headers: dict[str, str] | None = None) -> None:
        self.q: queue.Queue[dict[str, str]] = queue.Queue()
        self.lines: list[str] = []
        self._client = httpx.Client(base_url=base, timeout=httpx.Timeout(60.0))
        self._cm = self._client.stream("GET", path, headers=headers or {})
        self.resp = self._cm.__enter__()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        ev: dict[str, str] = {}
        try:
            for line in self.resp.iter_lines():
                self.lines.append(line)
                if line == "":
                    if "event" in ev:
                        self.q.put(ev)
                    ev = {}
                elif not line.startswith(":"):
                    key, _, value = line.partition(": ")
                    ev[key] = value
        except httpx.HTTPError:
            pass
        self.q.put({"event": "<closed>"})

    def next(self, timeout: float = 30.0) -> dict[str, str]:
        return self.q.get(timeout=timeout)

    def close(self) -> None:
        self._client.close()


def _set_run(db: Db, run_id: str, **values: Any) -> None:
    with db.sessions.begin() as s:
        s.execute(sa.update(ScenarioRun).where(ScenarioRun.id == run_id).values(**values))


def test_the_event_stream_stays_open_across_a_database_outage(own_pg: PgServer, pgdb: Db, tmp_path: Path) -> None:
    with _api(pgdb, tmp_path) as (base, _):
        exp = httpx.post(f"{base}/v1/experiments", json={"workload": SMALL_WL, "scenarios": ["baseline"]}).json()["id"]
        run_id = repo.run_id_for(exp, "baseline")
        stream = _Events(base, f"/v1/experiments/{exp}/events?poll_s=0.1")
        try:
            assert stream.resp.status_code == 200
            first = stream.next()
            assert first["event"] == "progress" and first["id"]
            own_pg.stop()
            try:
                away = stream.next()
                assert away["event"] == "unavailable", away
                assert json.loads(away["data"])["error"]["code"] == "database_unavailable"
                time.sleep(1.0)  # several looks at the database, still away: one event, the connection open
                assert stream.q.empty()
            finally:
                own_pg.start()
            _set_run(pgdb, run_id, status=RunStatus.running, next_window=5, n_windows=8)
            moved = stream.next()
            while json.loads(moved["data"])["runs"][0]["window"] != 5:  # the first look after the outage may be
                moved = stream.next()                                # the state before the update
            assert moved["event"] == "progress" and moved["id"] != first["id"]
            # a client that reconnects with the last id it got is not sent the same state again
            again = _Events(base, f"/v1/experiments/{exp}/events?poll_s=0.1", {"Last-Event-ID": moved["id"]})
            try:
                assert again.resp.status_code == 200
                time.sleep(0.5)
                assert again.q.empty() and "retry: 2000" in again.lines
                assert httpx.post(f"{base}/v1/experiments/{exp}/cancel").status_code == 200
                for s in (stream, again):
                    ev = s.next()
                    assert ev["event"] == "progress" and json.loads(ev["data"])["status"] == "cancelled"
                    done = s.next()
                    assert done["event"] == "done" and json.loads(done["data"])["status"] == "cancelled"
                    assert s.next()["event"] == "<closed>"
            finally:
                again.close()
        finally:
            stream.close()


def _settings(settings: Settings) -> OrchestratorSettings:
    return OrchestratorSettings(**{**settings.model_dump(), "outage_budget_s": 120.0, "outage_backoff_max_s": 1.0,
                                   "epoch_windows": 2})


def test_a_run_waits_a_database_outage_out(own_pg: PgServer, pgdb: Db, sqlite: Db, settings: Settings,
                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server stops after window 10 for 4 s, four times the run's lease: the commit, the heartbeat and the
    retries meet it; the run keeps its one attempt, takes its lease back, shows ``waiting`` with the reason once the
    database answers, and ends with the bytes of an undisturbed run."""
    osettings = _settings(settings)
    clients = ServiceClients(osettings, asgi_apps=fakes.build_apps(osettings))
    try:
        ref, _ = create_experiment(sessions=sqlite.sessions, spec=_spec(), settings=settings, out_dir=tmp_path / "ref")
        assert run_scenario(repo.run_id_for(ref, "tas"), clients, sqlite.sessions).status == "succeeded"
        exp, _ = create_experiment(sessions=pgdb.sessions, spec=_spec(), settings=settings, out_dir=tmp_path / "x")
        run_id = repo.run_id_for(exp, "tas")
        marks: list[tuple[str | None, bool | str]] = []
        real_set_waiting = repo.set_waiting

        def set_waiting(**kw: Any) -> bool:
            try:
                ok = real_set_waiting(**kw)
            except Exception as exc:
                marks.append((kw["reason"], type(exc).__name__))
                raise
            marks.append((kw["reason"], ok))
            return ok

        monkeypatch.setattr(repo, "set_waiting", set_waiting)
        timers: list[threading.Timer] = []

        def outage(_r: str, k: int, _n: int) -> bool:
            if k >= 10 and not timers:
                own_pg.stop()
                timers.append(threading.Timer(4.0, own_pg.start))
                timers[0].start()
            return True

        t0 = time.monotonic()
        out = run_scenario(run_id, clients, pgdb.sessions, lease_s=1.0, on_window=outage)
        for t in timers:
            t.join()
    finally:
        clients.close()
    assert timers and time.monotonic() - t0 >= 4.0
    assert out.status == "succeeded", out.error
    with pgdb.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.attempts == 1 and run.waiting_reason is None and run.lease_owner is None
    reason = "the run-state database is unreachable"
    assert any(r is not None and reason in r and ok is True for r, ok in marks), marks  # shown once it answered
    assert any(ok == "OperationalError" for _, ok in marks)  # it tried while the server was down
    assert all(r is not None for r, _ in marks)  # never cleared between two tries: no flip to running
    log = (tmp_path / "x" / "runs" / "tas" / "run.log").read_text()
    assert f"waiting: {reason}" in log and "resuming at window" in log
    assert _tree(tmp_path / "x") == _tree(tmp_path / "ref")


def _operational(msg: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("UPDATE scenario_runs ...", {}, Exception(msg))


def test_a_run_whose_lease_was_taken_during_the_outage_stops_cleanly(sqlite: Db, settings: Settings,
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    osettings = _settings(settings)
    clients = ServiceClients(osettings, asgi_apps=fakes.build_apps(osettings))
    exp, _ = create_experiment(sessions=sqlite.sessions, spec=_spec(), settings=settings, out_dir=tmp_path / "x")
    run_id = repo.run_id_for(exp, "tas")
    real_commit = repo.commit_epoch

    def commit_epoch(**kw: Any) -> bool:
        if kw["first"] >= 6:  # the database goes away at this commit; meanwhile another worker takes the run
            _set_run(sqlite, run_id, lease_expires_at=utcnow() - timedelta(hours=1))
            assert repo.claim_run(sessions=sqlite.sessions, run_id=run_id, owner="w2", lease_s=60).ok
            raise _operational("server closed the connection unexpectedly")
        return real_commit(**kw)

    monkeypatch.setattr(repo, "commit_epoch", commit_epoch)
    try:
        out = run_scenario(run_id, clients, sqlite.sessions, owner="w1", lease_s=1.0)
    finally:
        clients.close()
    assert out.status == "lost_lease", out
    with sqlite.sessions() as s:
        run = s.get(ScenarioRun, run_id)
        assert run is not None and run.status == RunStatus.running and run.lease_owner == "w2"
        assert run.error is None and run.next_window == 6 and run.attempts == 2
    assert "stopping while waiting: lost_lease" in (tmp_path / "x" / "runs" / "tas" / "run.log").read_text()


def test_what_counts_as_a_database_outage() -> None:
    assert database_outage(_operational('connection to server at "127.0.0.1", port 5 failed: Connection refused'))
    assert database_outage(_operational("terminating connection due to administrator command"))
    assert database_outage(_operational("database is locked"))
    assert database_outage(sa.exc.TimeoutError("QueuePool limit of size 8 overflow 8 reached"))
    invalidated = sa.exc.DBAPIError("SELECT 1", {}, Exception("gone"), connection_invalidated=True)
    assert database_outage(invalidated)
    assert not database_outage(_operational("no such table: experiments"))
    assert not database_outage(sa.exc.IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed")))
    assert not database_outage(sa.exc.ProgrammingError("SELECT", {}, Exception("syntax error")))
    assert not database_outage(ValueError("not a database error"))
