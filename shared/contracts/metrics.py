"""Per-window metrics records and the unified result row (seed 001 §3.6, ARCHITECTURE §5.5).

Owner: metrics service. The orchestrator builds one `WindowMetrics` per committed window from the thermal snapshot
and the physicalizer's timing.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

RESULT_COLUMNS: tuple[str, ...] = (
    "scenario", "workload", "T_peak_logic", "T_peak_dram", "T_avg", "ips", "lat_ms", "bw_util", "refresh_mhz",
    "noc_load",
)
SCENARIOS: tuple[str, ...] = ("baseline", "taps", "tacs", "tas")


class WindowMetrics(BaseModel):
    window: int = Field(ge=0)
    t_start_ms: float
    dt_ms: float = Field(gt=0)
    temps_core_c: list[float]
    temps_bank_c: list[list[float]] = Field(default_factory=list)  # [vault][dram layer]
    T_peak_logic: float
    T_peak_dram: float
    T_mean_logic: float
    T_mean_dram: float
    power_w: float = Field(ge=0)
    freq_ghz: list[float] = Field(default_factory=list)
    refresh_mhz: float = Field(ge=0)
    bytes_moved: float = Field(ge=0)
    bw_eff_gbps: float = Field(gt=0)  # effective DRAM bandwidth of the chip over the window
    noc_link_util: list[float] = Field(default_factory=list)
    tokens_completed: int = Field(ge=0)
    latencies_ms: list[float] = Field(default_factory=list)
    queue_delay_ms: float = Field(default=0.0, ge=0)
    migrations: int = Field(default=0, ge=0)
