"""The chip's capacity for a workload, from the cycle model (Science II).

One micro-batch of the workload, alone on an idle chip at the top DVFS step, under the default placement: the
physicalizer's schedule (the same services and cost model as a run, no thermal) gives its makespan ``L`` (arrival to
completion, ms). The chip serves at most ``open_limit`` micro-batches at once (``arch.schedule.open_limit``: 1 for
``attention: all``, where each micro-batch's stages occupy every core), so its capacity is

    capacity = open_limit · micro_batch / L            [tokens/s]

exact for ``open_limit`` 1 (micro-batches are served one after the other and each takes ``L``), an upper bound
otherwise (concurrent micro-batches share the experts' cores and the vaults). The physical limit beside it is the
DRAM-bandwidth roofline at the same batch:

    roofline = micro_batch · n_vaults · vault_bw / bytes_mb            [tokens/s]

with ``bytes_mb`` the DRAM bytes the lone micro-batch moved (the physicalizer's ``bytes_moved``: its weight and KV
reads and its KV writes) and the vaults' raw bandwidth (refresh takes a share of it in a run, ``bw_util`` against
the bandwidth left): no schedule serves micro-batches that move as much faster than the vaults deliver the bytes.
It is one micro-batch's routing (another touches other experts) and never below the exact capacity (the lone
micro-batch moved ``bytes_mb`` in ``L``). With ``open_limit`` > 1 the capacity is the lower of the two bounds. The
offered load is ``micro_batch / step_interval_ms``; a run is sustainable when ``offered / capacity < 1``.

A serving workload (``workload.serving``) has no fixed micro-batch to time alone: the physicalizer's scheduler forms
each one at run time from the requests it holds (prompt chunks and decode steps of any mix), so neither the capacity
nor the first token's window is estimated (`serving_note` says so); the run's own TTFT/TPOT percentiles, goodput
and token balance tell whether the chip keeps up with the offered rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from services.orchestrator.epochs import initial_freqs, initial_replicas
from services.orchestrator.pipeline_clients import EMPTY_OVERLAYS, Pipeline, RunData
from services.orchestrator.schemas import ExperimentSpec
from shared.chip import vault_bw_raw_gbps
from shared.contracts.events import PhysicalState, WindowTiming

MAX_MAKESPAN_S = 60.0  # simulated: a micro-batch that has not finished by then is reported as such
SERVING_NOTE = ("capacity: not estimated for a serving workload (its micro-batches are formed at run time from the "
                "requests, there is no fixed micro-batch to time alone); the run's TTFT/TPOT p99, goodput and token "
                "balance say whether the chip keeps up")


def serving_note(spec: ExperimentSpec) -> str | None:
    """Why the capacity is not estimated for ``spec`` (a serving workload), or None (it is)."""
    return SERVING_NOTE if spec.workload.serving is not None else None


@dataclass(frozen=True)
class Capacity:
    makespan_ms: float  # one micro-batch alone on the chip, arrival to its last token
    open_limit: int  # micro-batches the chip serves at once
    capacity_tok_s: float  # min(open_limit · micro_batch / makespan, roofline); exact: the first alone
    offered_tok_s: float  # micro_batch / step_interval
    load: float  # offered / capacity
    exact: bool  # open_limit == 1: the capacity is exact, else an upper bound
    bytes_mb: float = 0.0  # DRAM bytes the lone micro-batch moved
    roofline_tok_s: float = math.inf  # micro_batch · raw vault bandwidth / bytes_mb

    def to_json(self) -> dict[str, Any]:
        """As a JSON object: a bound that is not finite (no micro-batch finished, no byte moved) is null."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}

    def line(self) -> str:
        bound = "" if self.exact else " (upper bound)"
        roof = ""
        if math.isfinite(self.roofline_tok_s):
            binds = ", the bound that binds" if not self.exact and self.capacity_tok_s == self.roofline_tok_s else ""
            roof = (f"; DRAM roofline {self.roofline_tok_s:.1f} tok/s ({self.bytes_mb / 1e9:.2f} GB moved per "
                    f"micro-batch{binds})")
        return (f"capacity {self.capacity_tok_s:.1f} tok/s{bound} (one micro-batch takes {self.makespan_ms:.1f} ms, "
                f"{self.open_limit} at once){roof}; offered {self.offered_tok_s:.1f} tok/s = {100 * self.load:.0f} % "
                "of it")


def first_token_window(pipe: Pipeline, spec: ExperimentSpec, *, max_windows: int,
                       deadline_s: float) -> int | None:
    """The window (1-based count) in which the first micro-batch, alone on the idle chip, completes: no token of a
    run can complete before it (the first micro-batch is the first to arrive, and alone it is at its fastest). None
    when it is not found within ``max_windows`` windows or ``deadline_s`` seconds of wall time, or for a serving
    workload (not known)."""
    if serving_note(spec) is not None:
        return None
    t_end = time.monotonic() + deadline_s
    for k, timing in _one_micro_batch(pipe, spec):
        if _completed(timing, spec.workload.sequence.micro_batch):
            return k + 1
        if k + 1 >= max_windows or time.monotonic() > t_end:
            return None
    return None


def _completed(timing: WindowTiming, micro_batch: int) -> bool:
    return bool(timing.latencies_ms) and timing.tokens_completed >= micro_batch


CAPACITY_EPOCH = 64  # windows physicalized per call while one micro-batch runs alone


def _one_micro_batch(pipe: Pipeline, spec: ExperimentSpec) -> Iterator[tuple[int, WindowTiming]]:
    """Window by window, the timing of one micro-batch of ``spec.workload`` alone on the idle chip (two steps
    MAX_MAKESPAN_S apart: the trace has windows for the first one's whole makespan, the second arrives after it),
    physicalized `CAPACITY_EPOCH` windows a call."""
    arch, wl = spec.arch, spec.workload
    window_ms = spec.tas.tacs.window_ms
    one = wl.model_copy(update={"sequence": wl.sequence.model_copy(
        update={"steps": 2, "step_interval_ms": MAX_MAKESPAN_S * 1e3})})
    trace = pipe.create_trace(one, window_ms)
    load = pipe.expert_load(trace, workload=one, window_ms=window_ms)
    plc = pipe.placement(arch=arch, workload=one, tas=spec.tas, method="default", trace=trace, expert_load=load,
                         H=None)
    run = RunData.of(arch=arch, placement=plc).lowering
    pipe.register_all(run.values())
    state: dict[str, Any] = PhysicalState(replicas=initial_replicas(plc)).model_dump(mode="json")
    freqs = initial_freqs(arch)
    k = 0
    while k < trace.n_windows:
        logical = pipe.logical_windows(trace, k, min(CAPACITY_EPOCH, trace.n_windows - k), workload=one,
                                       window_ms=window_ms)
        P = pipe.physicalize_epoch(window=k, logical=logical, run=run, overlays=EMPTY_OVERLAYS, state=state,
                                   replicas=None, freq_ghz=freqs, window_ms=window_ms, bw_eff_factor=1.0,
                                   n_layers=trace.n_layers, return_state=True, events=False, tag="capacity")
        assert P.state is not None
        state = P.state
        for w in P.windows:
            yield k, w.timing
            k += 1


def estimate_capacity(pipe: Pipeline, spec: ExperimentSpec) -> Capacity | None:
    """Physicalize one micro-batch of ``spec.workload`` alone (see the module docstring); None for a serving
    workload (`serving_note`)."""
    if serving_note(spec) is not None:
        return None
    arch, wl = spec.arch, spec.workload
    makespan, bytes_mb = math.inf, 0.0
    for _, timing in _one_micro_batch(pipe, spec):
        bytes_mb += timing.bytes_moved  # the first micro-batch's alone: the second arrives MAX_MAKESPAN_S later
        if _completed(timing, wl.sequence.micro_batch):
            makespan = max(timing.latencies_ms)
            break
    open_limit = arch.schedule.open_limit(arch.mesh.n_cores)
    mb = wl.sequence.micro_batch
    bw_raw = vault_bw_raw_gbps(arch) * 1e9  # B/s
    roofline = mb * bw_raw / bytes_mb if math.isfinite(makespan) and bytes_mb > 0 else math.inf
    cap = min(open_limit * mb / (makespan * 1e-3), roofline) if math.isfinite(makespan) else 0.0
    offered = mb / (wl.sequence.step_interval_ms * 1e-3)
    return Capacity(makespan_ms=makespan, open_limit=open_limit, capacity_tok_s=cap, offered_tok_s=offered,
                    load=offered / cap if cap > 0 else math.inf, exact=open_limit == 1, bytes_mb=bytes_mb,
                    roofline_tok_s=roofline)
