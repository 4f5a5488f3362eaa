"""docker-compose.yml and the Dockerfile, checked against the code (Docker itself cannot run here): every service's
command parses with the real `tasmoe` CLI, its port is shared.DEFAULT_PORTS's, every TASMOE_* variable is a Settings
field and validates, the URLs name the compose services, and the start-up order is enforced by health checks."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts.cluster import ALEMBIC_INI, CELERY_APP
from services.cli import build_parser
from shared import DEFAULT_PORTS, SERVICES
from shared.settings import Settings, sqlalchemy_url

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))
    return data


def _env(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _settings_from_env(env: dict[str, str]) -> Settings:
    unknown = sorted(k for k in env if k.startswith("TASMOE_") and k[7:].lower() not in Settings.model_fields)
    assert not unknown, f"not Settings fields: {unknown}"
    return Settings.model_validate({k[7:].lower(): v for k, v in env.items() if k.startswith("TASMOE_")})


def test_services_present(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {*SERVICES, "worker", "migrate", "postgres", "redis"}


@pytest.mark.parametrize("name", SERVICES)
def test_service_command_port_and_health(compose: dict[str, Any], name: str) -> None:
    svc = compose["services"][name]
    port = DEFAULT_PORTS[name]
    cmd = svc["command"]
    assert cmd[0] == "tasmoe"
    args = build_parser().parse_args(cmd[1:])
    assert (args.command, args.service, args.host, args.port) == ("serve", name, "0.0.0.0", port)
    # published on the host's loopback unless TASMOE_BIND says otherwise (issue 17: no open ports by default)
    assert svc["ports"] == [f"${{TASMOE_BIND:-127.0.0.1}}:{port}:{port}"]
    test = " ".join(svc["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/healthz" in test


def test_one_image_for_all_app_containers(compose: dict[str, Any]) -> None:
    app = [*SERVICES, "worker", "migrate"]
    images = {compose["services"][n]["image"] for n in app}
    builds = {yaml.safe_dump(compose["services"][n]["build"]) for n in app}
    assert len(images) == 1 and len(builds) == 1
    assert compose["services"]["orchestrator"]["build"]["dockerfile"] == "Dockerfile"


@pytest.mark.parametrize("name", [*SERVICES, "worker", "migrate"])
def test_environment_is_real_settings_pointing_at_compose_services(compose: dict[str, Any], name: str) -> None:
    env = _env(compose["services"][name])
    settings = _settings_from_env(env)
    assert settings.mode == "cluster"
    for target in SERVICES:
        assert f"TASMOE_{target.upper()}_URL" in env, f"{name}: TASMOE_{target.upper()}_URL missing"
        assert settings.service_url(target) == f"http://{target}:{DEFAULT_PORTS[target]}"
    assert settings.redis_url.startswith("redis://redis:6379/")

    pg = _env(compose["services"]["postgres"])
    user, password, db = pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"]
    expected = f"postgresql+psycopg://{user}:{password}@postgres:5432/{db}"
    assert sqlalchemy_url(settings.database_url) == expected
    assert settings.effective_database_url == expected


def test_backing_services_have_health_checks(compose: dict[str, Any]) -> None:
    pg = compose["services"]["postgres"]
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    redis = compose["services"]["redis"]
    assert redis["healthcheck"]["test"][-2:] == ["redis-cli", "ping"] or "redis-cli ping" in " ".join(
        redis["healthcheck"]["test"])


def test_migrate_is_a_one_shot_alembic_upgrade(compose: dict[str, Any]) -> None:
    mig = compose["services"]["migrate"]
    assert mig["command"] == ["alembic", "-c", ALEMBIC_INI.as_posix(), "upgrade", "head"]
    assert mig["restart"] == "no"
    assert mig["depends_on"]["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", ["orchestrator", "worker"])
def test_stateful_processes_wait_for_db_redis_migrations_and_services(compose: dict[str, Any], name: str) -> None:
    deps = compose["services"][name]["depends_on"]
    assert deps["postgres"]["condition"] == "service_healthy"
    assert deps["redis"]["condition"] == "service_healthy"
    assert deps["migrate"]["condition"] == "service_completed_successfully"
    for svc in SERVICES:
        if svc != "orchestrator":
            assert deps[svc]["condition"] == "service_healthy", f"{name} should wait for {svc}"


def test_every_depends_on_uses_a_condition(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in compose["services"], f"{name} depends on unknown {dep}"
            assert spec["condition"] in {"service_healthy", "service_completed_successfully"}, (name, dep)
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in compose["services"][dep], f"{dep} has no healthcheck but {name} waits on it"


def test_worker_runs_the_celery_app_with_a_ping_health_check(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    cmd = worker["command"]
    assert cmd[:4] == ["celery", "-A", CELERY_APP, "worker"]
    assert importlib.util.find_spec(CELERY_APP) is not None
    hostname = cmd[cmd.index("--hostname") + 1]
    check = " ".join(worker["healthcheck"]["test"])
    assert f"celery -A {CELERY_APP} inspect ping" in check
    assert f"-d {hostname.replace('%h', '$$HOSTNAME')}" in check


def test_orchestrator_and_worker_share_the_results_volume(compose: dict[str, Any]) -> None:
    settings = _settings_from_env(_env(compose["services"]["worker"]))
    mounts = {n: compose["services"][n]["volumes"] for n in ("orchestrator", "worker")}
    assert mounts["orchestrator"] == mounts["worker"]
    assert f"results:{settings.results_dir.as_posix()}" in mounts["worker"]
    assert "results" in compose["volumes"]


def test_dockerfile_builds_one_locked_non_root_image() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert "uv sync --frozen --no-dev" in text
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in {"root", "0"}
    for path in ("pyproject.toml", "uv.lock", "shared", "services", "configs"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", text, re.M), f"Dockerfile does not copy {path}"
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").split()
    assert {".venv", ".git", "results", ".cluster"} <= set(ignored)


@pytest.mark.parametrize("name", [*SERVICES, "worker"])
def test_every_app_container_checks_api_keys_from_the_shared_key_volume(compose: dict[str, Any], name: str) -> None:
    """Issue 17: TASMOE_AUTH=keys, one key file on a volume every app container mounts, and a service key the user
    must provide (compose refuses to start without it, naming it)."""
    svc = compose["services"][name]
    env = _env(svc)
    settings = _settings_from_env(env)
    assert settings.auth == "keys"
    assert env["TASMOE_SERVICE_KEY"].startswith("${TASMOE_SERVICE_KEY:?")
    mounts = dict(v.split(":", 1) for v in svc["volumes"])
    assert mounts["keys"] == str(settings.effective_keys_file().parent)
    assert "keys" in compose["volumes"]
