"""Arrivals of a serving workload (``WorkloadConfig.serving``): the request traces (`services.workload.arrival_files`:
named by ``serving.trace``, names only, never paths) and the requests one run is offered: the trace from
``serving.start_s`` on, its arrival times divided by one factor (``rate_factor``) so that the first
``round(rate_rps · duration)`` of them fall in ``[0, duration)`` and the next later arrival at its end (the run's mean
rate is ``rate_rps`` up to that rounding, its shape the trace's); without ``rate_rps`` the trace's own times. Prompt
and output lengths are the trace's. Nothing here is random: the same config gives the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from services.workload.arrival_files import SERVING_TRACES_DIR, ArrivalFiles, ArrivalTrace
from services.workload.routing import IntArray
from shared.configs import ServingConfig
from shared.contracts.workload import Requests
from shared.errors import BadInput

__all__ = ["SERVING_TRACES_DIR", "ArrivalTrace", "OfferedRequests", "load_arrival_trace", "offered_requests",
           "requests_between"]


@cache
def _packaged() -> ArrivalFiles:
    return ArrivalFiles()


def load_arrival_trace(name: str) -> ArrivalTrace:
    """The packaged trace ``name`` (``serving_traces/``); `BadInput` (field ``serving.trace``) naming the available
    ones otherwise. A workload service looks in its traces folder first (`WorkloadSources.arrivals`)."""
    return _packaged().load(name)


@dataclass(frozen=True)
class OfferedRequests:
    """The requests of one serving run, in arrival order (request id = rank)."""

    t_arrival_ns: IntArray  # simulated arrival, ns in [0, duration_ns)
    prompt_tokens: IntArray
    output_tokens: IntArray
    duration_ns: int
    rate_factor: float  # simulated arrival = (trace arrival - start_s) / rate_factor

    @property
    def n(self) -> int:
        return len(self.t_arrival_ns)

    @property
    def offered_rate_rps(self) -> float:
        return self.n * 1e9 / self.duration_ns


def offered_requests(sv: ServingConfig, trace: ArrivalTrace | None = None) -> OfferedRequests:
    """The requests arriving in ``[0, duration_ms)`` of the run (module docstring), from ``trace`` (default: the
    packaged trace ``sv.trace`` names); `BadInput` naming the ``serving.*`` field when the trace cannot give them
    (``start_s`` past its end, a run longer than what follows ``start_s``, a rate asking for more requests than follow
    it, or for none, or for all the requests that follow it)."""
    tr = trace if trace is not None else load_arrival_trace(sv.trace)
    start_ns = round(sv.start_s * 1e9)
    D = round(sv.duration_ms * 1e6)
    if D < 1:
        raise BadInput("serving.duration_ms must be at least 1 ns", field="serving.duration_ms")
    span_s = tr.t_ns[-1] / 1e9
    i0 = int(np.searchsorted(tr.t_ns, start_ns, side="left"))
    if i0 >= len(tr.t_ns):
        raise BadInput(f"serving.start_s {sv.start_s:g} s is past the last arrival of {sv.trace} ({span_s:.1f} s)",
                       field="serving.start_s")
    tau = tr.t_ns[i0:] - start_ns
    if sv.rate_rps is None:
        if start_ns + D > tr.t_ns[-1]:
            raise BadInput(f"serving.duration_ms {sv.duration_ms:g} runs past the end of {sv.trace}: it has "
                           f"{(tr.t_ns[-1] - start_ns) / 1e9:.1f} s of arrivals after start_s (a shorter run, an "
                           "earlier start, or rate_rps)", field="serving.duration_ms")
        n = int(np.searchsorted(tau, D, side="left"))
        t, factor = tau[:n].copy(), 1.0
    else:
        n = round(sv.rate_rps * D * 1e-9)
        if n < 1:
            raise BadInput(f"serving.rate_rps {sv.rate_rps:g} offers no request in {sv.duration_ms:g} ms "
                           "(rate x duration < 0.5)", field="serving.rate_rps")
        if n >= len(tau):
            raise BadInput(f"serving.rate_rps {sv.rate_rps:g} over {sv.duration_ms:g} ms asks for {n} requests; "
                           f"{sv.trace} has {len(tau) - 1} after start_s {sv.start_s:g} s (and the next one to end "
                           "the slice)", field="serving.rate_rps")
        # the first arrival after request n - 1 falls at the end of the run: request n, or with repeated times (a
        # trace of whole seconds) the first later one, so that no request of the slice is pushed to its end
        j = int(np.searchsorted(tau, tau[n - 1], side="right"))
        if j >= len(tau):
            raise BadInput(f"serving.rate_rps {sv.rate_rps:g} over {sv.duration_ms:g} ms asks for {n} requests; in "
                           f"{sv.trace} no request arrives after the last of them to end the slice (fewer requests, "
                           "or an earlier start_s)", field="serving.rate_rps")
        factor = float(tau[j]) / D
        # floored, and below the end even where the float product rounds up to it
        t = np.minimum(np.floor(tau[:n] / factor), D - 1).astype(np.int64)
    return OfferedRequests(t_arrival_ns=t, prompt_tokens=tr.prompt_tokens[i0:i0 + n].copy(),
                           output_tokens=tr.output_tokens[i0:i0 + n].copy(), duration_ns=D, rate_factor=factor)


def requests_between(offered: OfferedRequests, t0_ns: int, t1_ns: int) -> Requests:
    """The offered requests arriving in ``[t0_ns, t1_ns)`` (request id = rank in arrival order)."""
    t = offered.t_arrival_ns
    a = int(np.searchsorted(t, t0_ns, side="left"))
    b = int(np.searchsorted(t, t1_ns, side="left"))
    return Requests.model_construct(request_id=list(range(a, b)), t_arrival_ns=t[a:b].tolist(),
                                    prompt_tokens=offered.prompt_tokens[a:b].tolist(),
                                    output_tokens=offered.output_tokens[a:b].tolist())
