"""TAS hyper-parameters (seed 001 §2.3): TAPS offline placement and TACS online balancing."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from shared.configs.base import StrictModel


class TapsObjective(StrictModel):
    w_peak: float = Field(default=1.0, ge=0)
    w_var: float = Field(default=0.2, ge=0)
    w_smooth: float = Field(default=0.1, ge=0)


class TapsCapacity(StrictModel):
    core_flops_tps: PositiveFloat = 5e12  # FLOP/s one core sustains
    bank_bw_gbps: PositiveFloat = 25.0


class TapsParams(StrictModel):
    objective: TapsObjective = TapsObjective()
    capacity: TapsCapacity = TapsCapacity()
    replicate_hot_k: int = Field(default=1, ge=0)
    method: Literal["heuristic", "milp"] = "heuristic"
    milp_time_limit_s: float = Field(default=20.0, gt=0, le=3600.0)  # a job runs at most an hour
    local_search_iters: int = Field(default=2000, ge=0)


class TacsThresholds(StrictModel):
    Thot: float = 80.0
    Temg: float = 90.0


class TacsCost(StrictModel):
    lambda_hops: float = Field(default=1.0, ge=0)
    mu_noc: float = Field(default=2.0, ge=0)
    eta_temp: float = Field(default=1.5, ge=0)


class TacsParams(StrictModel):
    window_ms: float = Field(default=3.0, ge=0.01, le=1e4)  # 10 µs .. 10 s per window
    thresholds: TacsThresholds = TacsThresholds()
    q_target: float = Field(default=0.7, gt=0, le=1)
    gamma: float = Field(default=1.0, ge=0)
    cost: TacsCost = TacsCost()
    max_parallel_migrations: int = Field(default=4, ge=0)
    min_residency_ms: float = Field(default=15.0, ge=0)
    undo_cooldown_ms: float = Field(default=30.0, ge=0)
    top_k_hot: PositiveInt = 4
    hop_radius: PositiveInt = 2
    noc_guard: float = Field(default=0.8, gt=0, le=1)  # no migration while NoC load is above this
    smoothing_alpha: float = Field(default=0.5, ge=0.4, le=0.6)
    # look-ahead: 0 = the reactive benefit-versus-cost rule; N > 0 = pick the move (or none) with the lowest
    # predicted peak of the core temperatures over the next N windows, from the thermal model's pulse responses
    lookahead_windows: int = Field(default=0, ge=0, le=64)
    # the time the pending window's energy is spread over to give the power a move shifts (a sensitivity
    # setting): "residency" = max(min_residency_ms, window), the default (a 3 ms burst is not sustained power);
    # "window" = the window itself (the work goes on at the pending window's rate for as long as the move holds).
    # Without a pending window (power from utilisation) it has no effect.
    power_over: Literal["residency", "window"] = "residency"

    @model_validator(mode="after")
    def _check(self) -> TacsParams:
        if self.thresholds.Temg <= self.thresholds.Thot:
            raise ValueError("thresholds.Temg must be > thresholds.Thot")
        return self


class TasParams(StrictModel):
    taps: TapsParams = TapsParams()
    tacs: TacsParams = TacsParams()
