"""Orchestrator request/response bodies (HTTP) and the resolved experiment spec stored with each experiment."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from shared.configs import ArchConfig, TasParams, WorkloadConfig
from shared.configs.arch import unthrottled
from shared.contracts.placement import Placement
from shared.contracts.thermal import ThermalState

Scenario = Literal["baseline", "taps", "tacs", "tas", "unthrottled"]
# the four policies (what an experiment runs unless it says otherwise); "unthrottled" is the reference run: baseline
# with the chip's DVFS trips and DTM limit taken away (`shared.configs.arch.unthrottled`), asked for by name
POLICY_SCENARIOS: tuple[Scenario, ...] = ("baseline", "taps", "tacs", "tas")
ALL_SCENARIOS: tuple[Scenario, ...] = (*POLICY_SCENARIOS, "unthrottled")
ConfigRef = str  # a file name under configs/ (``arch_8x8_32x32x8.yaml`` or ``arch_8x8_32x32x8``)


def _utc(t: datetime) -> datetime:
    """The database keeps naive UTC (models.py); on the wire every time carries its zone (RFC 3339 ``date-time``)."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_utc)]


class ExperimentRequest(BaseModel):
    """``POST /v1/experiments``: configs inline (objects) or as names of files under ``configs/``."""

    # the documented example (Swagger UI's "Try it out" body) must succeed as written: the quick workload on the
    # default chip, baseline against tas (tests/platform/test_docs_browser.py posts it)
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"workload": "workload_quick.yaml", "scenarios": ["baseline", "tas"], "name": "quick look"}]})

    arch: ArchConfig | ConfigRef = "arch_8x8_32x32x8.yaml"
    workload: WorkloadConfig | ConfigRef = "workload_mixtral_8x7b.yaml"
    tas: TasParams | ConfigRef = "tas_params.yaml"
    scenarios: list[Scenario] = Field(default_factory=lambda: list(POLICY_SCENARIOS), min_length=1, max_length=5)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1,
                             description="routing seed; default: the workload config's routing.seed")
    windows: int | None = Field(default=None, ge=1, le=100_000, description="run only the first N windows")
    name: str | None = Field(default=None, max_length=200)
    traces: bool = Field(default=True, description="write the per-window trace files: the experiment's logical trace "
                                                   "(traces/logical_*.csv.gz, one copy) and each run's overlays "
                                                   "(ARCHITECTURE §6)")
    events: bool = Field(default=False, description="also write each run's physical events "
                                                    "(runs/<scenario>/traces/physical/*_events.csv.gz; the default "
                                                    "experiment's are ~100 MB per scenario, compressed)")
    plots: bool = Field(default=True, description="draw the plots when the last scenario finished")
    placement: Placement | None = Field(
        default=None, description="a hand-made mapping used instead of the default or TAPS one (every scenario)")


class ExperimentSpec(BaseModel):
    """The resolved, self-contained experiment (stored in the database, read by workers)."""

    arch: ArchConfig
    workload: WorkloadConfig
    tas: TasParams
    scenarios: list[Scenario]
    seed: int
    windows: int | None = None
    name: str = ""
    traces: bool = True
    events: bool = False
    plots: bool = True
    placement: Placement | None = None
    # the state named by arch.thermal.init "<name>.json", loaded from the configs directory at submission
    thermal_init: ThermalState | None = None

    def for_scenario(self, scenario: str) -> ExperimentSpec:
        """The spec a run of ``scenario`` runs (and its run log records): this one, on the chip without DVFS trips
        and DTM limit for the ``unthrottled`` reference (`shared.configs.arch.unthrottled`)."""
        if scenario != "unthrottled":
            return self
        return self.model_copy(update={"arch": unthrottled(self.arch)})


class RunProgress(BaseModel):
    scenario: str
    run_id: str
    status: str
    window: int
    n_windows: int | None
    progress: str
    attempts: int
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    compute_s: float
    error: str | None
    waiting: str | None = Field(default=None, description="status 'waiting': the outage the run waits out (a service "
                                                          "it cannot reach); it resumes at its frontier")


class ExperimentView(BaseModel):
    id: str
    name: str
    status: str
    seed: int
    created_at: UtcDatetime
    updated_at: UtcDatetime
    out_dir: str
    error: str | None
    sweep_id: str | None = None
    runs: list[RunProgress]


class ExperimentAccepted(BaseModel):
    id: str
    status: str
    location: str
    created: bool


class LinkToken(BaseModel):
    """``GET /v1/experiments/{id}/token``: read access to one experiment as ``?token=`` (``shared.link_tokens``)."""

    token: str
    experiment: str
    expires_at: int = Field(description="Unix seconds")
    ttl_s: int


class ExperimentPage(BaseModel):
    items: list[ExperimentView]
    total: int
    limit: int
    offset: int


class SweepRequest(BaseModel):
    """``POST /v1/sweeps``: a grid over dotted config keys, e.g. ``{"tas.tacs.thresholds.Thot": [75, 80, 85]}``.

    Keys start with ``arch.``, ``workload.``, ``tas.`` or are ``seed``; every combination is one experiment."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"base": {"workload": "workload_quick.yaml", "scenarios": ["baseline"]},
         "grid": {"tas.tacs.thresholds.Thot": [75, 85]}, "name": "Thot sweep"}]})

    base: ExperimentRequest = Field(default_factory=ExperimentRequest)
    grid: dict[str, list[Any]] = Field(min_length=1)
    name: str | None = Field(default=None, max_length=200)


class SweepView(BaseModel):
    id: str
    status: str
    experiments: list[str]
    points: list[dict[str, Any]]
    table: list[dict[str, Any]]
