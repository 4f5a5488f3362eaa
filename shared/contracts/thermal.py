"""Thermal step contract (seed 001 §4.5 "API mode", §4.6).

Owner: thermal service. The temperature field and DVFS state travel as a value (`ThermalState`), so the service keeps
no run state and replaying a step gives the same answer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.configs.arch import ArchConfig
from shared.contracts.events import ComputeEvents, EnergyDeposit, MemoryEvents
from shared.contracts.registry import ContentHash
from shared.limits import MAX_EPOCH_WINDOWS

# Bounds of a state's integers (a larger one would overflow the int64 arrays they become: a 422, not a 500)
MAX_T_NS = 1 << 62  # ~146 years of simulated time
MAX_WINDOW = 1 << 40
MAX_DVFS_LEVEL = 1 << 16  # an index into a domain's steps (levels past the last step are its last step)


class ThermalState(BaseModel):
    t_ns: int = Field(default=0, ge=0, le=MAX_T_NS)
    field_b64: str | None = None  # float32 little-endian temperatures in K, model node order; None = ambient
    # The state proper of a spectral model's run (what the next window starts from, when present): θ = T − T_amb in
    # the solver's modes (orthonormal 2-D DCT-II of each layer's cells, layer-major, then the 12 package-ring nodes'
    # θ), float32 little-endian, K. field_b64 is then that state's field rounded to float32, for readers.
    modes_b64: str | None = None
    dvfs_level: list[Annotated[int, Field(ge=0, le=MAX_DVFS_LEVEL)]] = Field(
        default_factory=list)  # per core: index into the domain's steps_ghz
    window: int = Field(default=-1, ge=-1, le=MAX_WINDOW)  # last window stepped (out-of-order steps: 409)
    # Warm-up pass only (thermal.init "steady", warmup_ms > 0; services/thermal/service.py warm_state): the energy
    # dissipated so far per core then per bank (float64 little-endian, J, base64) and the time it covers (s).
    warm_energy_b64: str | None = None
    warm_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)


class PowerBreakdown(BaseModel):
    """Watts averaged over the window."""

    logic_dynamic: float = 0.0  # the MAC arrays (and vector ops): compute events' energy minus their scratchpad part
    spm: float = 0.0  # scratchpad accesses of the compute events
    logic_leakage: float = 0.0
    dram_dynamic: float = 0.0
    dram_refresh: float = 0.0
    dram_leakage: float = 0.0
    noc: float = 0.0
    dram_controller: float = 0.0  # the DRAM access energy's controller share, dissipated on the logic die

    @property
    def total(self) -> float:
        return (self.logic_dynamic + self.spm + self.logic_leakage + self.dram_dynamic + self.dram_refresh
                + self.dram_leakage + self.noc + self.dram_controller)


class RefreshReport(BaseModel):
    multiplier: list[float] = Field(default_factory=list)  # per DRAM layer
    trefi_us: list[float] = Field(default_factory=list)
    busy_fraction: list[float] = Field(default_factory=list)
    refresh_mhz: float = 0.0  # refresh commands per second over all banks, in MHz
    bw_eff_factor: float = 1.0  # BW_eff / BW_raw, averaged over vaults


class ThermalSnapshot(BaseModel):
    """Temperatures in °C after the step."""

    window: int
    temps_core_c: list[float]  # per core (block mean over its cells)
    temps_core_max_c: list[float] = Field(default_factory=list)
    temps_bank_c: list[list[float]] = Field(default_factory=list)  # [vault/core][dram layer]
    peak_c: dict[str, float] = Field(default_factory=dict)  # per layer name
    mean_c: dict[str, float] = Field(default_factory=dict)
    power_w: PowerBreakdown = Field(default_factory=PowerBreakdown)
    power_core_w: list[float] = Field(default_factory=list)
    power_layer_w: dict[str, float] = Field(default_factory=dict)  # per die: "logic", "dram_1" .. "dram_n"
    freq_ghz: list[float] = Field(default_factory=list)  # per core, for the NEXT window
    refresh: RefreshReport = Field(default_factory=RefreshReport)
    # Throttling in THIS window (the levels it ran at): cores below their DVFS domain's top step (emergency levels
    # included), and cores in the emergency clock modulation of arch.dtm below the last DVFS step.
    cores_throttled: int = Field(default=0, ge=0)
    cores_emergency: int = Field(default=0, ge=0)
    # arch.dtm's hard limit could not be guaranteed: even at the deepest levels the bound on the next window's peak
    # (at a run's start, also this window's) exceeds dtm.limit_c; the run goes on at the deepest levels.
    limit_unheld: bool = False


class ModelInfo(BaseModel):
    """``POST /v1/models`` answer: the stack model built (and cached) for an arch config."""

    model: str  # content hash of the ArchConfig
    nodes: int
    layers: list[str]
    grid: list[int]  # [nx, ny]
    variant: str
    cores: int
    dram_layers: int
    ambient_c: float


class StepResult(BaseModel):
    """``POST /v1/step`` answer: the state to pass to the next window (unless the request said ``return_state:
    false``), its name ``state_ref`` (the next request may carry that instead) and what the window did."""

    state: ThermalState | None = None
    state_ref: ContentHash | None = None
    snapshot: ThermalSnapshot


class SolveResult(BaseModel):
    """``POST /v1/solve`` answer: block temperatures (°C) of a one-off steady or transient solve."""

    model: str
    mode: str  # "steady" | "transient"
    temps_core_c: list[float]
    temps_bank_c: list[list[float]] = Field(default_factory=list)  # [vault/core][dram layer]
    peak_c: dict[str, float] = Field(default_factory=dict)
    mean_c: dict[str, float] = Field(default_factory=dict)
    state: ThermalState | None = None  # transient only: the field at the end


class ModelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    arch: ArchConfig


class WarmStartRequest(BaseModel):
    """``POST /v1/warm_start``: the state after the warm-up pass's last window (it carries the warm-up's energy);
    the answer is the state window 0 starts from: the steady state of the warm-up's mean power map. The arch inline
    or its ``model`` (the hash ``POST /v1/models`` answered): exactly one."""

    model_config = ConfigDict(extra="forbid")

    arch: ArchConfig | None = None
    model: ContentHash | None = None
    state: ThermalState | None = None
    state_ref: ContentHash | None = None  # the state by the name a step answered (exactly one of the two)


class StepRequest(BaseModel):
    """``POST /v1/step``: one window. ``state`` is the previous answer's state (None = ambient, all cores at the top
    DVFS step), or ``state_ref`` its name; its ``window`` must be ``window - 1`` (409 otherwise). The window's work:
    ``compute_events`` + ``memory_events``, or their ``deposit`` (what ``POST /v1/physicalize`` answers beside them;
    the same power to the last bit). The arch inline or its ``model`` (the hash
    ``POST /v1/models`` answered; 404 ``unknown_model`` when this replica does not have it: post the arch again):
    exactly one."""

    model_config = ConfigDict(extra="forbid")

    arch: ArchConfig | None = None
    model: ContentHash | None = None
    window: int = Field(ge=0, le=MAX_WINDOW)
    window_ms: float = Field(gt=0, le=1e6, allow_inf_nan=False)  # up to 1000 s of simulated time in one step
    state: ThermalState | None = None
    state_ref: ContentHash | None = None  # or the previous state by the name its step answered (404 unknown_...)
    return_state: bool = True  # false: answer only ``state_ref`` (the caller names the state next window)
    compute_events: ComputeEvents | None = None
    memory_events: MemoryEvents | None = None
    deposit: EnergyDeposit | None = None  # the events' energy deposit in their place (lowering's physicalize)


class StepEpochRequest(BaseModel):
    """``POST /v1/step/epoch``: windows ``window .. window + len(deposits) - 1`` in one call (a control epoch),
    ``deposits[j]`` the energy deposit of window ``window + j``. Every window and the final state are bit for bit what
    ``POST /v1/step`` answers window after window (each with the previous answer's state). ``state``: the state after
    ``window - 1``, whole (None: the run's start, as ``/v1/step``). ``bw_eff_factor``: the refresh factor these
    windows' events were physicalized with (None: refresh changes are no event). ``until_event``: stop after the
    first window whose successor's inputs change (its DVFS clocks, or its refresh factor when ``bw_eff_factor`` is
    given); without, step every deposit. The arch inline or its ``model`` hash: exactly one."""

    model_config = ConfigDict(extra="forbid")

    arch: ArchConfig | None = None
    model: ContentHash | None = None
    window: int = Field(ge=0, le=MAX_WINDOW)  # the first window
    window_ms: float = Field(gt=0, le=1e6, allow_inf_nan=False)
    state: ThermalState | None = None
    deposits: list[EnergyDeposit] = Field(min_length=1, max_length=MAX_EPOCH_WINDOWS)
    bw_eff_factor: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    until_event: bool = True
    return_state: bool = True


class StepEpochResult(BaseModel):
    """``POST /v1/step/epoch`` answer: one snapshot per window stepped, in order (fewer than the deposits when it
    stopped at an event), the state after the last of them (None when the request said ``return_state: false``),
    and the first event met among them: ``"dvfs"`` (the next window's clocks differ from the ones this window ran
    at) or ``"refresh"`` (this window's ``refresh.bw_eff_factor`` differs from the request's), or None."""

    snapshots: list[ThermalSnapshot]
    state: ThermalState | None
    event: Literal["dvfs", "refresh"] | None


class SolveRequest(BaseModel):
    """``POST /v1/solve``: a power map in W (``core_w`` per core in the logic layer, ``bank_w`` [DRAM die][bank])."""

    model_config = ConfigDict(extra="forbid")

    arch: ArchConfig
    core_w: list[float]
    bank_w: list[list[float]] | None = None
    mode: Literal["steady", "transient"] = "steady"
    duration_ms: float = Field(default=0.0, ge=0, le=1e9, allow_inf_nan=False)
    state: ThermalState | None = None


class InfluenceMatrix(BaseModel):
    """``GET /v1/models/{hash}/influence``: ``H[i][j]`` K/W = steady rise at core i per W at core j."""

    model: str
    cores: int
    H: list[list[float]]
    H_vault: list[list[float]] = Field(default_factory=list)  # [core i][vault j] K/W per W spread over vault j
    vault_dies: list[float] | None = None  # the share of a vault's watt per DRAM die H_vault is for (None: evenly)


class PulseResponse(BaseModel):
    """``GET /v1/models/{hash}/pulse-response``: short-time responses for placement (K/W). ``core[j][i][c]``: rise
    of core i at the end of slot j after 1 W in core c during slot 0 only (slots of ``slot_ms``); ``vault[j][i][c]``:
    the same for 1 W spread over vault c's banks (empty without DRAM dies)."""

    model: str
    cores: int
    slot_ms: float
    lags: int
    core: list[list[list[float]]]
    vault: list[list[list[float]]] = Field(default_factory=list)
    vault_dies: list[float] | None = None  # the share of a vault's watt per DRAM die ``vault`` is for (None: evenly)


class HotspotExportRequest(BaseModel):
    """``POST /v1/hotspot/export``: our stack and one power map (W) as HotSpot input files."""

    model_config = ConfigDict(extra="forbid")

    arch: ArchConfig
    core_w: list[float]
    bank_w: list[list[float]] | None = None
    run_hotspot: bool = False  # also run a `hotspot` binary on PATH on the files and return its steady temperatures


class HotspotFiles(BaseModel):
    files: dict[str, str]  # file name -> text
    hotspot_steady_k: dict[str, float] | None = None  # block -> K from a real HotSpot run (export with run_hotspot)


class HotspotImportRequest(BaseModel):
    """``POST /v1/hotspot/import``: HotSpot input files and HotSpot's command line (plain file names), solved like
    ``tasmoe hotspot``; the answer's ``files`` are the output files it wrote."""

    model_config = ConfigDict(extra="forbid")

    files: dict[str, str]
    args: list[str]

