"""Thermal step contract (seed 001 §4.5 "API mode", §4.6).

Owner: thermal service. The temperature field and DVFS state travel as a value (`ThermalState`), so the service keeps
no run state and replaying a step gives the same answer.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ThermalState(BaseModel):
    t_ns: int = 0
    field_b64: str | None = None  # float32 little-endian temperatures in K, model node order; None = ambient
    dvfs_level: list[int] = Field(default_factory=list)  # per core: index into the domain's steps_ghz
    window: int = -1  # last window stepped (out-of-order steps are refused with 409)


class PowerBreakdown(BaseModel):
    """Watts averaged over the window."""

    logic_dynamic: float = 0.0
    logic_leakage: float = 0.0
    dram_dynamic: float = 0.0
    dram_refresh: float = 0.0
    dram_leakage: float = 0.0
    noc: float = 0.0

    @property
    def total(self) -> float:
        return (self.logic_dynamic + self.logic_leakage + self.dram_dynamic + self.dram_refresh + self.dram_leakage
                + self.noc)


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
    freq_ghz: list[float] = Field(default_factory=list)  # per core, for the NEXT window
    refresh: RefreshReport = Field(default_factory=RefreshReport)
