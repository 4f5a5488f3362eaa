"""Settings from the environment: the TASMOE_ prefix, per-service URLs, the database URL (SQLite by default,
PostgreSQL when set)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shared import DEFAULT_PORTS, SERVICES
from shared.settings import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("TASMOE_"):
            monkeypatch.delenv(key)


def _env_settings() -> Settings:
    return Settings(_env_file=None)


def test_defaults_point_every_service_at_its_loopback_port() -> None:
    s = _env_settings()
    assert s.mode == "embedded"
    for name in SERVICES:
        assert s.service_url(name) == f"http://127.0.0.1:{DEFAULT_PORTS[name]}"
    assert DEFAULT_PORTS == {"orchestrator": 8000, "workload": 8001, "placement": 8002, "lowering": 8003,
                             "thermal": 8004, "metrics": 8005}


@pytest.mark.parametrize("service", SERVICES)
def test_service_url_from_env(monkeypatch: pytest.MonkeyPatch, service: str) -> None:
    port = DEFAULT_PORTS[service]
    monkeypatch.setenv(f"TASMOE_{service.upper()}_URL", f"http://{service}:{port}/")
    s = _env_settings()
    assert s.service_url(service) == f"http://{service}:{port}"
    others = [n for n in SERVICES if n != service]
    assert all(s.service_url(n).startswith("http://127.0.0.1:") for n in others)


def test_unknown_service_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown service 'gpu'"):
        _env_settings().service_url("gpu")


def test_database_url_defaults_to_sqlite_under_results(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TASMOE_RESULTS_DIR", str(tmp_path / "res"))
    s = _env_settings()
    assert s.database_url == ""
    assert s.effective_database_url == f"sqlite:///{(tmp_path / 'res' / 'tasmoe.sqlite3').as_posix()}"


@pytest.mark.parametrize(
    ("given", "effective"),
    [
        ("postgresql+psycopg://u:p@db:5432/tasmoe", "postgresql+psycopg://u:p@db:5432/tasmoe"),
        ("postgresql://u:p@db:5432/tasmoe", "postgresql+psycopg://u:p@db:5432/tasmoe"),
        ("postgres://u@db/tasmoe", "postgresql+psycopg://u@db/tasmoe"),
        ("sqlite:////tmp/x.sqlite3", "sqlite:////tmp/x.sqlite3"),
    ],
)
def test_database_url_from_env_selects_postgres(monkeypatch: pytest.MonkeyPatch, given: str, effective: str) -> None:
    """A plain ``postgresql://`` URL would make SQLAlchemy look for psycopg2, which is not installed: it is mapped to
    the psycopg (v3) driver the project ships."""
    monkeypatch.setenv("TASMOE_DATABASE_URL", given)
    s = _env_settings()
    assert s.database_url == given
    assert s.effective_database_url == effective


def test_other_fields_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASMOE_MODE", "cluster")
    monkeypatch.setenv("TASMOE_REDIS_URL", "redis://redis:6379/3")
    monkeypatch.setenv("TASMOE_LOG_LEVEL", "debug")
    monkeypatch.setenv("TASMOE_HTTP_RETRIES", "7")
    monkeypatch.setenv("TASMOE_HTTP_READ_TIMEOUT_S", "12.5")
    s = _env_settings()
    assert (s.mode, s.redis_url, s.log_level, s.http_retries, s.http_read_timeout_s) == (
        "cluster", "redis://redis:6379/3", "DEBUG", 7, 12.5)


def test_env_file_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("TASMOE_THERMAL_URL=http://thermal:8004\nTASMOE_MODE=cluster\n", encoding="utf-8")
    s = Settings(_env_file=env)
    assert (s.thermal_url, s.mode) == ("http://thermal:8004", "cluster")


@pytest.mark.parametrize(
    ("var", "value", "field"),
    [("TASMOE_LOG_LEVEL", "LOUD", "log_level"), ("TASMOE_MODE", "swarm", "mode"),
     ("TASMOE_HTTP_RETRIES", "-1", "http_retries"), ("TASMOE_HTTP_CONNECT_TIMEOUT_S", "0", "http_connect_timeout_s")],
)
def test_bad_env_values_name_the_field(monkeypatch: pytest.MonkeyPatch, var: str, value: str, field: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ValidationError) as info:
        _env_settings()
    assert info.value.errors()[0]["loc"] == (field,)
