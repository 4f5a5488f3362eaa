"""Schemathesis against every service's own OpenAPI document, in process (issue 17, item 3): for every operation,
schema-valid and schema-violating requests (a fixed seed, a bounded number of examples per operation: the
TASMOE_SCHEMATHESIS_EXAMPLES environment variable, default 25). Every response must be: no 5xx, a documented status
code, a documented content type, a body and headers conforming to the documented schema.

Not checked: ``positive_data_acceptance`` and ``negative_data_rejection`` (whether the schema states every semantic
rule: it cannot, e.g. that a model config names a hidden size or that top-k <= experts; such requests get a 4xx
naming the field, which the checks above cover). The orchestrator's runs are recorded, not executed (the API layer
is under test, not the simulation)."""

from __future__ import annotations

import importlib
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, seed
from hypothesis import settings as hsettings
from schemathesis import GenerationMode
from schemathesis import checks as c

from shared import SERVICES
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator.fakes import RecordingDispatcher

EXAMPLES = int(os.environ.get("TASMOE_SCHEMATHESIS_EXAMPLES", "25"))
SEED = 17
CHECKS = [c.not_a_server_error, c.status_code_conformance, c.content_type_conformance,
          c.response_schema_conformance, c.response_headers_conformance]



def _closed_port() -> int:
    """A loopback port nothing listens on: one the kernel just handed out and that was closed again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _app(service: str, tmp: Path) -> FastAPI:
    mod = importlib.import_module(f"services.{service}.app")
    # the models the workload operations register (``POST /v1/models`` with generated names: "0", "00", ...) go to
    # a folder of the app's own, not to the session's (tests/conftest.py)
    settings = Settings(results_dir=tmp / service / "results", configs_dir=CONFIGS,
                        models_dir=tmp / service / "models")
    if service == "orchestrator":
        # its submission checks ask the services at their URLs: a closed port, so that a cluster on the default ports
        # (a developer's, or another test's) is never asked (each check could spend seconds running the cycle model)
        closed = f"http://127.0.0.1:{_closed_port()}"
        settings = settings.model_copy(update={f"{s}_url": closed for s in SERVICES if s != "orchestrator"})
        app: FastAPI = mod.create_app(settings, dispatcher=RecordingDispatcher())
        return app
    if service == "placement":  # as it runs: its peers (the thermal and workload services it asks) in process
        from services.orchestrator.apps import build_apps

        placement: FastAPI = build_apps(settings)["placement"]
        return placement
    app = mod.create_app(settings)
    return app


def _schema(service: str) -> Any:
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=f"tasmoe-st-{service}-"))
    schema = schemathesis.openapi.from_asgi("/openapi.json", _app(service, tmp))
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                    max_examples=EXAMPLES, deterministic=True)
    return schema


def _make_test(service: str) -> Any:
    schema = _schema(service)

    @schema.parametrize()  # type: ignore[untyped-decorator]
    @seed(SEED)
    @hsettings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
               database=None)
    def test(case: Any) -> None:
        case.call_and_validate(checks=CHECKS)

    test.__name__ = f"test_{service}_api_conforms"
    return test


for _service in SERVICES:
    globals()[f"test_{_service}_api_conforms"] = pytest.mark.timeout(1800)(_make_test(_service))
