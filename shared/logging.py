"""Logging set up once per process, with the run id in every record.

``bind_run_id(run_id)`` sets a context variable that a logging filter copies into each record, so a window loop's
records (and the services' records for the requests it makes, via the ``X-Run-Id`` header) carry its run id.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_run_id: contextvars.ContextVar[str] = contextvars.ContextVar("tasmoe_run_id", default="-")
_configured = False

RUN_ID_HEADER = "X-Run-Id"


def current_run_id() -> str:
    return _run_id.get()


@contextmanager
def bind_run_id(run_id: str | None) -> Iterator[None]:
    token = _run_id.set(run_id or "-")
    try:
        yield
    finally:
        _run_id.reset(token)


def _install_record_factory() -> None:
    """Give every LogRecord a ``run_id`` attribute at creation, whatever handler later sees it (ours, pytest's caplog,
    uvicorn's, Celery's). Installed once at import; wraps whatever factory was there before."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_tasmoe_run_id", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.run_id = _run_id.get()
        return record

    factory._tasmoe_run_id = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


_install_record_factory()


class RunIdFilter(logging.Filter):
    """Kept for handlers built elsewhere: (re)stamps the run id of the current context on a record."""


    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "run_id"):
            record.run_id = _run_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "run_id": getattr(record, "run_id", "-"),
            "msg": record.getMessage(),
        }
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s run=%(run_id)s %(message)s"


def setup_logging(level: str = "INFO", *, json_lines: bool = False, force: bool = False) -> None:
    """Configure the root logger once (idempotent unless ``force``)."""
    global _configured
    if _configured and not force:
        logging.getLogger().setLevel(level)
        return
    handler = logging.StreamHandler()
    handler.addFilter(RunIdFilter())
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    # httpx and httpcore log every request at INFO: a run's calls to the services are the services' own logs' to tell
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
    _configured = True


def run_file_handler(path: str) -> logging.Handler:
    """A file handler (for ``results/<run>/run.log``) with the run-id filter and the text format."""
    h = logging.FileHandler(path, encoding="utf-8")
    h.addFilter(RunIdFilter())
    h.setFormatter(logging.Formatter(TEXT_FORMAT))
    return h
