"""Per-window metrics records and the unified result row (seed 001 §3.6, ARCHITECTURE §5.5).

Owner: metrics service. The orchestrator builds one `WindowMetrics` per committed window from the thermal snapshot
and the physicalizer's timing; `POST /v1/reduce` turns a run's windows into one `ResultRow` (one line of
``results/<scenario>/<workload>.csv``). Definitions of every column: ``services/metrics/reduce.py``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field

from shared.contracts.columnar import Columnar
from shared.contracts.events import MAX_REQUEST_COUNT, RequestCount, RequestsDone, TimeNs
from shared.contracts.thermal import PowerBreakdown

RESULT_COLUMNS: tuple[str, ...] = (
    "scenario", "workload", "T_peak_logic", "T_peak_dram", "T_avg", "ips", "lat_ms", "bw_util", "refresh_mhz",
    "noc_load",
)
# "unthrottled": the reference, baseline on the same chip with its DVFS trips and DTM limit taken away (the throttling
# loss is what baseline serves less than it)
SCENARIOS: tuple[str, ...] = ("baseline", "taps", "tacs", "tas", "unthrottled")
Scenario = Literal["baseline", "taps", "tacs", "tas", "unthrottled"]
POLICIES: tuple[str, ...] = SCENARIOS[:4]  # the four policies, without the reference

# Columns after RESULT_COLUMNS, in this order (units in the name or in services/metrics/reduce.py).
EXTRA_COLUMNS: tuple[str, ...] = (
    "lat_p50_ms", "lat_p99_ms", "energy_j", "power_avg_w", "migrations", "time_above_thot_ms", "thot_c",
    "T_var_logic", "T_mean_logic", "T_mean_dram", "freq_avg_ghz", "queue_delay_ms", "noc_load_max",
    "bw_util_raw", "tokens", "windows", "sim_time_ms", "lat_censored",
    "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "requests_done", "tokens_offered", "tokens_served",
    "tokens_queued", "tokens_shed", "goodput_tok_s", "slo_met", "tokens_unbalanced",
    "time_throttled_ms", "time_emergency_ms",
)
ALL_COLUMNS: tuple[str, ...] = RESULT_COLUMNS + EXTRA_COLUMNS

_WORKLOAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_workload_name(v: str) -> str:
    """A workload name becomes a file name (``results/<scenario>/<workload>.csv``): letters, digits, ``._-``."""
    if not _WORKLOAD_NAME.match(v):
        raise ValueError("must be 1-128 characters of letters, digits, '.', '_' or '-' (it names a file)")
    return v


WorkloadName = Annotated[str, AfterValidator(check_workload_name)]


class WindowMetrics(BaseModel):
    window: int = Field(ge=0)
    t_start_ms: float
    dt_ms: float = Field(gt=0)
    temps_core_c: list[float]  # per core, row-major on the mesh (core = y * X + x)
    temps_bank_c: list[list[float]] = Field(default_factory=list)  # [vault][dram layer]
    T_peak_logic: float
    T_peak_dram: float
    T_mean_logic: float
    T_mean_dram: float
    power_w: float = Field(ge=0)
    freq_ghz: list[float] = Field(default_factory=list)  # per core
    refresh_mhz: float = Field(ge=0)
    bytes_moved: float = Field(ge=0)
    bw_eff_gbps: float = Field(gt=0)  # effective DRAM bandwidth of the chip over the window
    noc_link_util: list[float] = Field(default_factory=list)
    tokens_completed: int = Field(ge=0)
    latencies_ms: list[float] = Field(default_factory=list)  # latency samples of tokens completed in the window
    queue_delay_ms: float = Field(default=0.0, ge=0)
    migrations: int = Field(default=0, ge=0)
    # age at the window end of the oldest admitted token not yet completed (ms): a lower bound on its latency
    oldest_inflight_ms: float = Field(default=0.0, ge=0)
    # Thermal-grid cells of the logic layer and of all DRAM layers together (weights of T_mean_* in T_avg).
    # None: counted from the shapes above (cores, vaults × DRAM layers), i.e. equal cells per layer.
    cells_logic: int | None = Field(default=None, gt=0)
    cells_dram: int | None = Field(default=None, gt=0)
    # the window's mean power by component (W) and by die ("logic", "dram_1" ...); None / {}: not reported
    power: PowerBreakdown | None = None
    power_layer_w: dict[str, float] = Field(default_factory=dict)
    # the window's mean power of each core's area of the logic die (W: its compute, scratchpad, DRAM controller share,
    # NoC routing and leakage); []: not reported
    power_core_w: list[float] = Field(default_factory=list)
    # Served requests (`WindowTiming`'s fields of the same names, copied by the orchestrator): empty / 0 in a
    # fixed-arrival run. tokens_completed above are the output tokens generated in the window.
    requests_done: RequestsDone = Field(default_factory=RequestsDone.empty)  # requests finished in the window
    requests_arrived: RequestCount = 0
    requests_shed: RequestCount = 0  # refused by the full request queue
    tokens_offered: RequestCount = 0  # output tokens of the requests that arrived in the window
    tokens_shed: RequestCount = 0  # output tokens of the refused requests
    requests_waiting: RequestCount = 0  # at the window end
    requests_running: RequestCount = 0  # at the window end
    tokens_queued: RequestCount = 0  # at the window end: not yet generated, of admitted requests
    # The thermal snapshot's throttling in the window (copied by the orchestrator): cores below their top DVFS step,
    # cores in emergency clock modulation, and whether the hard limit (arch.dtm) could not be guaranteed
    cores_throttled: int = Field(default=0, ge=0)
    cores_emergency: int = Field(default=0, ge=0)
    limit_unheld: bool = False


class ResultRow(BaseModel):
    """One line of ``results/<scenario>/<workload>.csv``: the seed's ten columns, then the extras (EXTRA_COLUMNS)."""

    scenario: Scenario
    workload: WorkloadName
    T_peak_logic: float  # °C
    T_peak_dram: float  # °C
    T_avg: float  # °C
    ips: float  # completed tokens per second of simulated time
    lat_ms: float  # ms
    bw_util: float  # fraction of effective bandwidth
    refresh_mhz: float  # MHz
    noc_load: float  # fraction of link capacity
    lat_p50_ms: float
    lat_p99_ms: float
    energy_j: float
    power_avg_w: float
    migrations: int
    time_above_thot_ms: float
    thot_c: float
    T_var_logic: float  # °C²
    T_mean_logic: float
    T_mean_dram: float
    freq_avg_ghz: float
    queue_delay_ms: float
    noc_load_max: float
    bw_util_raw: float | None = None  # only when the raw bandwidth was given
    tokens: int
    windows: int
    sim_time_ms: float
    lat_censored: int = 0  # 1: no token completed; lat_ms/p50/p99 are the lower bound oldest_inflight_ms
    # Serving columns (definitions in services/metrics/reduce.py). A run whose windows report no request (fixed
    # arrival) has the counts 0 and the rest empty; the defaults also read a CSV written before these columns.
    ttft_p50_ms: float | None = None  # time to first token over the requests that finished; empty: none did
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None  # time per output token after the first, requests of >= 2 output tokens
    tpot_p99_ms: float | None = None
    requests_done: int = 0
    tokens_offered: int = 0
    tokens_served: int = 0
    tokens_queued: int = 0  # at the run's end
    tokens_shed: int = 0
    goodput_tok_s: float | None = None  # output tokens/s of the finished requests within both SLO limits
    slo_met: int | None = None  # 1: the run meets the SLO (shared/slo.py); empty: no SLO given
    tokens_unbalanced: int = 0  # Σ over windows of |token balance error|; 0: every window balances
    # Σ dt over windows in which a core ran below its top DVFS step / in emergency clock modulation (arch.dtm); the
    # defaults also read a CSV written before these columns
    time_throttled_ms: float = 0.0
    time_emergency_ms: float = 0.0


class RequestSamples(Columnar):
    """Per finished request, what the serving columns need (ns, exact integers): time to first token, time from
    the first to the last output token, and its output tokens."""

    ttft_ns: list[TimeNs]
    decode_ns: list[TimeNs]
    output_tokens: list[Annotated[int, Field(ge=1, le=MAX_REQUEST_COUNT)]]


class ReducePartial(BaseModel):
    """A run's windows folded so far (``POST /v1/reduce/fold``): sums and extremes from which `ResultRow` follows
    (services/metrics/reduce.py). A long run is reduced chunk by chunk, so no request carries all its windows.
    ``s_*`` are time-weighted sums ``Σ_w dt_w · x_w`` (ms · unit)."""

    windows: int = Field(default=0, ge=0)
    last_window: int = -1
    last_end_ms: float | None = None
    first_start_ms: float | None = None
    thot_c: float
    n_cores: int | None = None
    n_vault_layers: int | None = None
    n_links: int | None = None
    cells_logic: int | None = None
    cells_dram: int | None = None
    t_ms: float = Field(default=0.0, ge=0)
    peak_logic: float | None = None
    peak_dram: float | None = None
    s_t_avg: float = 0.0
    s_refresh: float = 0.0
    s_noc: float = 0.0
    noc_max: float | None = None
    s_var_logic: float = 0.0
    s_mean_logic: float = 0.0
    s_mean_dram: float = 0.0
    s_freq: float = 0.0
    s_queue: float = 0.0
    energy_j: float = 0.0
    bytes_moved: float = 0.0
    cap_eff_bytes: float = 0.0
    tokens: int = 0
    migrations: int = 0
    above_thot_ms: float = 0.0
    oldest_inflight_ms: float = 0.0
    latencies_ms: list[float] = Field(default_factory=list)
    # serving (services/metrics/reduce.py): whether any window reported requests, every finished request's samples
    # (all kept, as the token latencies are), the token counts and the last window's tokens_queued
    serving: bool = False
    requests: RequestSamples = Field(default_factory=RequestSamples.empty)
    tokens_offered: int = Field(default=0, ge=0)
    tokens_shed: int = Field(default=0, ge=0)
    tokens_queued: RequestCount = 0
    tokens_unbalanced: int = Field(default=0, ge=0)
    # power report (services/metrics/reduce.py): energy (J) and peak window power (W) per component and per die,
    # over the windows that report power (all of them, or the report is left out)
    power_windows: int = Field(default=0, ge=0)
    energy_by: dict[str, float] = Field(default_factory=dict)
    peak_by: dict[str, float] = Field(default_factory=dict)
    energy_layer: dict[str, float] = Field(default_factory=dict)
    peak_layer: dict[str, float] = Field(default_factory=dict)
    # Σ dt (ms) over the windows with a core below its top DVFS step, and with a core in emergency throttle
    throttled_ms: float = Field(default=0.0, ge=0)
    emergency_ms: float = Field(default=0.0, ge=0)


class ReduceRequest(BaseModel):
    scenario: Scenario
    workload: WorkloadName
    thot_c: float
    bw_raw_gbps: float | None = Field(default=None, gt=0)
    windows: list[WindowMetrics]
    # the windows before these, folded by POST /v1/reduce/fold (None: these are all the run's windows)
    partial: ReducePartial | None = None
    # the serving SLO (ms), both or neither: goodput_tok_s counts the requests within both limits, slo_met is the
    # run's verdict against them (shared/slo.py); None: no SLO, those two columns are empty
    slo_ttft_p99_ms: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    slo_tpot_p99_ms: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class FoldRequest(BaseModel):
    thot_c: float
    windows: list[WindowMetrics] = Field(min_length=1)
    partial: ReducePartial | None = None


# Components of the power report, in this order: the access energy of DRAM counts wherever it is dissipated (array and
# TSV/IO in the DRAM dies, the controller share on the logic die).
POWER_COMPONENTS: tuple[str, ...] = ("logic_dynamic", "spm", "noc", "logic_leakage", "dram_access", "dram_refresh",
                                     "dram_leakage")


class PowerStat(BaseModel):
    energy_j: float  # Σ_w P_w · dt_w
    mean_w: float  # energy / run time
    peak_w: float  # max over windows of the window's mean power


class PowerReport(BaseModel):
    """A run's energy and power by component (`POWER_COMPONENTS` + ``total``) and by die (services/metrics/reduce.py);
    ``interval_ms``: the simulated time it covers (first window start, last window end)."""

    interval_ms: tuple[float, float]
    components: dict[str, PowerStat]
    layers: dict[str, PowerStat]


class PowerTableRequest(BaseModel):
    reports: dict[Scenario, PowerReport] = Field(min_length=1)


class PowerTableResponse(BaseModel):
    markdown: str


class ReduceResponse(BaseModel):
    row: ResultRow
    csv: str
    power: PowerReport | None = None  # when every window reports its power


class CompareRequest(BaseModel):
    rows: list[ResultRow] = Field(min_length=1)


class CompareResponse(BaseModel):
    csv: str
    markdown: str


PlotKind = Literal["temperature", "performance", "heatmap", "power"]


class PlotRequest(BaseModel):
    """What a plot needs: result rows (bars) and/or per-window series (time series, heat maps) per scenario."""

    workload: str = Field(max_length=200)  # a label in the titles
    rows: list[ResultRow] = Field(default_factory=list)
    windows: dict[Scenario, list[WindowMetrics]] = Field(default_factory=dict)
    dram_layer: int | None = Field(default=None, ge=0)  # heat map; None = the hottest DRAM layer
    mesh: tuple[int, int] | None = None  # (X, Y) cores; None = square mesh from the core count
    thot_c: float | None = None  # drawn as a line on the temperature time series
    # the warm-up before window 0 that the metrics exclude (ms; arch thermal.warmup_ms with init steady), for titles
    warmup_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)


# --- a sweep's figure (``POST /v1/plots/sweep/{kind}``): the rows of a sweep's table, not one run's windows ---------

SweepPlotKind = Literal["pareto"]
# the grid keys the Pareto figure is drawn against by default: the cold plate's heat transfer coefficient and the DTM
# hard limit (configs/sweep_cooling_limit.yaml)
COOLING_KEY = "arch.geometry.cooling.h_wmk2k"
LIMIT_KEY = "arch.dtm.limit_c"
# a sweep has at most 256 points (orchestrator) of at most five scenarios
MAX_SWEEP_ROWS = 256 * len(SCENARIOS)
ParamValue = bool | float | str | None


class SweepRow(BaseModel):
    """One row of a sweep's table (orchestrator ``GET /v1/sweeps/{id}``: ``experiment``, ``param:<key>`` columns and
    the result row): the grid point's values by dotted key, and one scenario's result at that point."""

    experiment: str = Field(default="", max_length=64)
    params: dict[Annotated[str, Field(max_length=200)], ParamValue] = Field(default_factory=dict, max_length=32)
    row: ResultRow


class SweepPlotRequest(BaseModel):
    """What the sweep figure needs: the table's rows and which grid keys are its two axes. ``at_cooling`` /
    ``at_limit``: the value of the other key each slice is drawn at (one of the swept values; None: the upper
    median of the swept values)."""

    label: str = Field(default="sweep", max_length=200)  # the sweep's name, in the title
    rows: list[SweepRow] = Field(min_length=1, max_length=MAX_SWEEP_ROWS)
    cooling_key: str = Field(default=COOLING_KEY, min_length=1, max_length=200)
    limit_key: str = Field(default=LIMIT_KEY, min_length=1, max_length=200)
    at_cooling: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    at_limit: float | None = Field(default=None, allow_inf_nan=False)
