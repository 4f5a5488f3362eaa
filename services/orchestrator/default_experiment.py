"""The lab's experiments by name: the default one (``make run``, ``tasmoe run``), its quick look (``--quick``) and
the reference chip's, the one place that says which configs each runs.

- **default**: the hot chip (``configs/arch_hbm_on_logic.yaml``: an H100-class logic die under four HBM3E stacks,
  cooled from the top, with a DTM limit) serving the Azure conversation trace (``configs/workload_serving.yaml``),
  the four policies and the ``unthrottled`` reference, so that the throttling loss and what each policy recovers of
  it are numbers.
- **quick**: the default cut to one second of arrivals with a 300 ms warm-up: a check that everything runs, not a
  result.
- **reference**: the calibrated 45 nm chip with the seed's Mixtral workload (one micro-batch every 3 ms), the four
  policies; kept with its finding (on 45 nm at this area heat never binds).
- **flatout**: the default chip offered about nine times what it serves within the SLO, so that DTM binds: the
  throttling loss and what each policy recovers of it where they exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.orchestrator.schemas import ALL_SCENARIOS, POLICY_SCENARIOS, Scenario
from shared.configs import WorkloadConfig, load_workload


@dataclass(frozen=True)
class Experiment:
    arch: str
    workload: str
    tas: str
    out: str
    scenarios: tuple[Scenario, ...]
    arrivals_ms: float | None = None  # serving: replaces workload.serving.duration_ms (None: the config's)
    drain_ms: float | None = None  # serving: replaces workload.serving.drain_ms (None: the config's)
    warmup_ms: float | None = None  # replaces arch.thermal.warmup_ms (None: the config's)
    rate_rps: float | None = None  # serving: replaces workload.serving.rate_rps (None: the config's)

    def workload_config(self, path: str | Path | None = None) -> WorkloadConfig:
        """The workload this experiment runs: ``path`` (default: its own config) with a serving workload's arrivals,
        drain and offered rate replaced by the experiment's where it sets them (the quick look's second of arrivals,
        the flat-out rate). One owner for ``tasmoe run``
        and for the results page, which checks that a results folder ran these configs."""
        workload = load_workload(path or self.workload)
        if workload.serving is None or (self.arrivals_ms is None and self.drain_ms is None and self.rate_rps is None):
            return workload
        sv = workload.serving
        return workload.model_copy(update={"serving": sv.model_copy(update={
            "duration_ms": self.arrivals_ms if self.arrivals_ms is not None else sv.duration_ms,
            "drain_ms": self.drain_ms if self.drain_ms is not None else sv.drain_ms,
            "rate_rps": self.rate_rps if self.rate_rps is not None else sv.rate_rps})})


DEFAULT = Experiment(arch="configs/arch_hbm_on_logic.yaml", workload="configs/workload_serving.yaml",
                     tas="configs/tas_params_hbm_on_logic.yaml", out="results/default/", scenarios=ALL_SCENARIOS)
QUICK = Experiment(arch=DEFAULT.arch, workload=DEFAULT.workload, tas=DEFAULT.tas, out="results/quick/",
                   scenarios=ALL_SCENARIOS, arrivals_ms=1000.0, drain_ms=0.0, warmup_ms=300.0)
REFERENCE = Experiment(arch="configs/arch_8x8_32x32x8.yaml", workload="configs/workload_mixtral_8x7b.yaml",
                       tas="configs/tas_params.yaml", out="results/mixtral/", scenarios=POLICY_SCENARIOS)
# The default chip flat out: 20 requests/s, about nine times the rate it serves within the SLO (the default's offered
# rate), so that DTM binds and the throttling loss, and what each policy recovers of it, are measured where they
# exist; a warm start at that load (1 s) and 3 s of arrivals with no drain (the queue only grows: served tokens per
# second is the measure).
FLAT_OUT = Experiment(arch=DEFAULT.arch, workload=DEFAULT.workload, tas=DEFAULT.tas, out="results/flatout/",
                      scenarios=ALL_SCENARIOS, arrivals_ms=3000.0, drain_ms=0.0, warmup_ms=1000.0, rate_rps=20.0)
EXPERIMENTS: dict[str, Experiment] = {"default": DEFAULT, "quick": QUICK, "reference": REFERENCE,
                                      "flatout": FLAT_OUT}
