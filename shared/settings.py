"""Settings for every service and the CLI (pydantic-settings, environment prefix ``TASMOE_``).

``TASMOE_DATABASE_URL`` selects PostgreSQL (cluster) or the default SQLite file (embedded);
``TASMOE_<SERVICE>_URL`` gives each service's base URL (``TASMOE_THERMAL_URL=http://thermal:8004``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared import DEFAULT_PORTS, SERVICES
from shared.errors import ConfigError, first_validation_error

Mode = Literal["embedded", "cluster"]


class Settings(BaseSettings):
    """One settings class for the whole project; each service reads the fields it needs."""

    model_config = SettingsConfigDict(env_prefix="TASMOE_", env_file=".env", extra="ignore")

    mode: Mode = Field(default="embedded", description="'embedded' (one process, SQLite, a worker pool) or "
                                                        "'cluster' (services on sockets, PostgreSQL, Celery)")
    results_dir: Path = Field(default=Path("results"),
                              description="where runs write CSVs, series, plots and run.log (and the embedded "
                                          "SQLite file)")
    # empty -> sqlite file under results_dir (see `effective_database_url`)
    database_url: str = Field(default="", description="the run-state database; empty: SQLite "
                                                      "<results_dir>/tasmoe.sqlite3; a postgresql:// URL gets the "
                                                      "psycopg v3 driver")
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", description="Celery broker and result backend")
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING, ERROR or CRITICAL")
    log_json: bool = Field(default=False, description="one JSON object per log line")

    orchestrator_url: str = Field(default=f"http://127.0.0.1:{DEFAULT_PORTS['orchestrator']}",
                                  description="base URL of the orchestrator")
    workload_url: str = Field(default=f"http://127.0.0.1:{DEFAULT_PORTS['workload']}",
                              description="base URL of the workload service (comma-separated: its replicas)")
    placement_url: str = Field(default=f"http://127.0.0.1:{DEFAULT_PORTS['placement']}",
                               description="base URL of the placement service (comma-separated: its replicas)")
    lowering_url: str = Field(default=f"http://127.0.0.1:{DEFAULT_PORTS['lowering']}",
                              description="base URL of the lowering service (comma-separated: its replicas)")
    thermal_url: str = Field(default=f"http://127.0.0.1:{DEFAULT_PORTS['thermal']}",
                             description="base URL of the thermal service (comma-separated: its replicas)")
    metrics_url: str = Field(default=f"http://127.0.0.1:{DEFAULT_PORTS['metrics']}",
                             description="base URL of the metrics service (comma-separated: its replicas)")

    http_connect_timeout_s: float = Field(default=3.0, gt=0, description="service-to-service connect timeout (s)")
    http_read_timeout_s: float = Field(default=60.0, gt=0, description="service-to-service read timeout (s)")
    http_retries: int = Field(default=4, ge=0, le=20,
                              description="retries after the first attempt (connect errors, timeouts, "
                                          "429/502/503/504 only)")
    http_backoff_s: float = Field(default=0.2, ge=0,
                                  description="exponential backoff multiplier between retries (s; capped at 5 s)")

    max_body_mb: float = Field(default=32.0, gt=0, le=4096,
                               description="largest request body a service reads (MiB); larger ones get 413")
    max_json_depth: int = Field(default=64, ge=2, le=512,
                                description="deepest nesting of arrays and objects in a JSON request body; deeper "
                                            "ones get 422 before they are parsed")
    max_json_keys: int = Field(default=2**20, ge=1,
                               description="object keys one JSON request body may hold; more get 422 before the "
                                           "body is parsed (a key costs ~100 bytes parsed)")
    max_json_values: int = Field(default=2**21, ge=1,
                                 description="values (numbers, strings, arrays, objects, ...) one JSON request body "
                                             "may hold; more get 422 before the body is parsed (a number costs "
                                             "~40-60 bytes parsed and validated)")
    cache_size: int = Field(default=32, ge=1, description="LRU entries for content-hashed models/traces per service")
    thermal_cache_size: int = Field(default=8, ge=1, le=1024,
                                    description="stack models (and their solvers and influence matrices) a thermal "
                                                "process keeps; each can hold hundreds of MB")
    state_cache_size: int = Field(default=64, ge=2, le=100_000,
                                  description="window states (thermal field, physicalizer queues, replica state; "
                                              "0.03-0.5 MB each on the default chip) a "
                                              "thermal or lowering process keeps for requests that name them by "
                                              "hash (state_ref)")
    blas_threads: int = Field(default=1, ge=0, description="BLAS threads per process; 0 keeps the library's default")
    configs_dir: Path = Field(default=Path("configs"), description="where the default config files live")
    traces_dir: Path | None = Field(default=None, description="recorded traces a workload may name: routing "
                                                               "(routing.trace) and request arrivals "
                                                               "(serving.trace); default <configs_dir>/traces")
    models_dir: Path | None = Field(default=None, description="registered models (POST /v1/models), one JSON file "
                                                               "each; default <results_dir>/models")

    auth: Literal["off", "keys"] = Field(
        default="off",
        description="'keys': every request but /healthz and the docs needs 'Authorization: Bearer <key>' "
                    "(tasmoe keys create); 'off': no check, and the services listen on loopback only")
    keys_file: Path | None = Field(default=None, description="the API key file (hashes only); default "
                                                             "<results_dir>/keys.json")
    service_key: str = Field(default="", repr=False,
                             description="the key services send to each other (an admin key; TASMOE_AUTH=keys)")

    quota_milp_jobs: int = Field(default=4, ge=1, le=1024,
                                 description="queued + running MILP placement jobs one principal may have (429 beyond)")
    milp_time_limit_max_s: float = Field(default=600.0, gt=0, le=3600.0,
                                         description="cap on a MILP placement job's HiGHS time limit (s)")

    replica: int = Field(default=0, ge=0, le=1023,
                         description="this process's replica number: its calls to peers whose URLs list several "
                                     "replicas go to this one of each (modulo their number)")

    def effective_keys_file(self) -> Path:
        return self.keys_file if self.keys_file is not None else self.results_dir / "keys.json"

    def effective_models_dir(self) -> Path:
        return self.models_dir if self.models_dir is not None else self.results_dir / "models"

    def effective_traces_dir(self) -> Path:
        return self.traces_dir if self.traces_dir is not None else self.configs_dir / "traces"

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return v

    def service_url(self, service: str, replica: int = 0) -> str:
        """The base URL of ``service``; a ``TASMOE_<SERVICE>_URL`` may list several replicas, comma-separated, and a
        client keeps to one of them (``replica`` modulo their number): the window states a run names by hash
        (``state_ref``) live in the replica that made them, so the calls of one worker process go to one replica
        (`ServiceClients`; another replica answers ``unknown_*_state`` and the run rebuilds the state)."""
        urls = self.service_urls(service)
        return urls[replica % len(urls)]

    def service_urls(self, service: str) -> list[str]:
        """Every replica URL of ``service`` (``TASMOE_<SERVICE>_URL``, comma-separated)."""
        if service not in SERVICES:
            raise KeyError(f"unknown service {service!r}; known: {', '.join(SERVICES)}")
        return [u.strip().rstrip("/") for u in str(getattr(self, f"{service}_url")).split(",") if u.strip()]

    @field_validator(*(f"{name}_url" for name in SERVICES))
    @classmethod
    def _urls(cls, v: str) -> str:
        urls = [u.strip() for u in v.split(",")]
        if not all(urls) or not all(u.lower().startswith(("http://", "https://")) for u in urls):
            raise ValueError("must be one http(s):// URL, or several separated by commas (the service's replicas)")
        return v

    @property
    def effective_database_url(self) -> str:
        """The SQLAlchemy URL: ``TASMOE_DATABASE_URL`` when set (a bare ``postgresql://`` / ``postgres://`` is given
        the psycopg v3 driver the project ships; SQLAlchemy's default would be psycopg2), else a SQLite file under
        ``results_dir``."""
        if not self.database_url:
            return f"sqlite:///{(self.results_dir / 'tasmoe.sqlite3').as_posix()}"
        return sqlalchemy_url(self.database_url)


def sqlalchemy_url(url: str) -> str:
    """``postgresql://`` / ``postgres://`` -> ``postgresql+psycopg://`` (the driver the project ships); else as is."""
    for bare in ("postgresql://", "postgres://"):
        if url.startswith(bare):
            return "postgresql+psycopg://" + url[len(bare):]
    return url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Process-wide settings read from the environment once (tests build their own `Settings`)."""
    return Settings()


def load_settings() -> Settings:
    """`get_settings()` for entry points: a bad ``TASMOE_*`` value raises `ConfigError` naming the variable
    (``TASMOE_LOG_LEVEL: must be one of ...``) instead of a pydantic traceback."""
    try:
        return get_settings()
    except ValidationError as exc:
        field, message = first_validation_error(exc)
        raise ConfigError(f"environment variable TASMOE_{field.upper()}: {message}", field=field) from None
