"""Logging: a record emitted inside `bind_run_id` carries that run id, in any handler; a service request carrying
``X-Run-Id`` logs it inside the service; the configured handler prints it."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from shared.client import ServiceClients
from shared.logging import JsonFormatter, bind_run_id, current_run_id, run_file_handler, setup_logging
from shared.service_app import create_service_app
from shared.settings import Settings

log = logging.getLogger("tasmoe.test")


def _run(record: logging.LogRecord) -> str:
    return str(getattr(record, "run_id", "<missing>"))


def test_bind_run_id_scopes_and_nests() -> None:
    assert current_run_id() == "-"
    with bind_run_id("outer"):
        with bind_run_id("inner"):
            assert current_run_id() == "inner"
        assert current_run_id() == "outer"
    assert current_run_id() == "-"


def test_record_inside_bind_run_id_carries_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tasmoe.test")
    with bind_run_id("exp-1/baseline"):
        log.info("window 3 stepped")
    log.info("outside")
    runs = [(r.getMessage(), _run(r)) for r in caplog.records if r.name == "tasmoe.test"]
    assert runs == [("window 3 stepped", "exp-1/baseline"), ("outside", "-")]


def test_run_id_is_per_thread_context(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tasmoe.test")

    def work(run: str) -> None:
        with bind_run_id(run):
            log.info("in %s", run)

    threads = [threading.Thread(target=work, args=(f"r{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = sorted((r.getMessage(), _run(r)) for r in caplog.records if r.name == "tasmoe.test")
    assert got == [(f"in r{i}", f"r{i}") for i in range(4)]


def _logging_app(settings: Settings) -> TestClient:
    router = APIRouter(tags=["probe"])

    @router.get("/work")
    def work() -> dict[str, str]:  # sync: runs in the thread pool
        log.info("working")
        return {"run": current_run_id()}

    @router.get("/awork")
    async def awork() -> dict[str, str]:
        log.info("async working")
        return {"run": current_run_id()}

    return TestClient(create_service_app("probe", settings, [router]))


def test_request_with_run_id_header_logs_it_inside_the_service(settings: Settings,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tasmoe.test")
    client = _logging_app(settings)
    assert client.get("/v1/work", headers={"X-Run-Id": "exp-9/tacs"}).json() == {"run": "exp-9/tacs"}
    assert client.get("/v1/awork", headers={"X-Run-Id": "exp-9/tas"}).json() == {"run": "exp-9/tas"}
    assert client.get("/v1/work").json() == {"run": "-"}
    assert [(r.getMessage(), _run(r)) for r in caplog.records if r.name == "tasmoe.test"] == [
        ("working", "exp-9/tacs"), ("async working", "exp-9/tas"), ("working", "-")]


def test_client_call_carries_the_run_id_into_the_service(settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tasmoe.test")
    app = _logging_app(settings).app
    clients = ServiceClients(settings, asgi_apps={"thermal": app})
    with bind_run_id("exp-3/taps"):
        assert clients["thermal"].get_json("/v1/work") == {"run": "exp-3/taps"}
    mine = [r for r in caplog.records if r.name == "tasmoe.test" and r.getMessage() == "working"]
    assert [_run(r) for r in mine] == ["exp-3/taps"]


def test_configured_handlers_print_the_run_id(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup_logging("INFO", force=True)
        with bind_run_id("exp-5"):
            logging.getLogger("tasmoe.text").info("hello")
        assert "run=exp-5 hello" in capsys.readouterr().err
        setup_logging("INFO", json_lines=True, force=True)
        with bind_run_id("exp-6"):
            logging.getLogger("tasmoe.json").warning("hot %d", 97)
        line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert (line["run_id"], line["msg"], line["level"]) == ("exp-6", "hot 97", "WARNING")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        setup_logging("INFO", force=False)


def test_run_file_handler_writes_the_run_id(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "run.log"
    handler = run_file_handler(str(path))
    lg = logging.getLogger("tasmoe.file")
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    try:
        with bind_run_id("exp-7/tas"):
            lg.info("done")
    finally:
        lg.removeHandler(handler)
        handler.close()
    assert "run=exp-7/tas done" in path.read_text(encoding="utf-8")
    assert isinstance(JsonFormatter(), logging.Formatter)


def test_an_unhandled_error_is_logged_with_the_callers_run_id(settings: Settings,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    router = APIRouter(tags=["probe"])

    @router.get("/boom")
    def boom() -> None:
        raise RuntimeError("kaput")

    client = TestClient(create_service_app("probe", settings, [router]), raise_server_exceptions=False)
    resp = client.get("/v1/boom", headers={"X-Run-Id": "exp-11/tas"})
    assert resp.status_code == 500
    assert resp.json()["error"]["code"] == "internal"
    errors = [r for r in caplog.records if r.name == "shared.service_app" and r.levelno == logging.ERROR]
    assert [_run(r) for r in errors] == ["exp-11/tas"]
    assert errors[0].exc_info is not None and "kaput" in str(errors[0].exc_info[1])
