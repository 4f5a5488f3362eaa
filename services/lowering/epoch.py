"""A control epoch (``POST /v1/physicalize/epoch``): the windows of a run in which the overlays, the clocks and the
refresh factor do not change, physicalized one after another in one call.

Each window is ``physical.step_window`` on the state the previous one left, kept in memory as columns
(``physical.carry.Carry``): the state is converted from its wire form once before the first window and once after
the last, so the epoch answers what ``/v1/physicalize`` called window after window answers (every window's events,
deposit and timing, and the last state, byte for byte: tests/lowering/test_epoch.py), at a fraction of the cost.
"""

from __future__ import annotations

from services.lowering.physical import step_window
from services.lowering.physical.carry import Carry, Context
from services.lowering.physical.serving import MicroBatchFn
from services.lowering.service import DEFAULT_ARCH, RunData, default_freqs, named_replicas
from shared.content import object_or_hash
from shared.contracts.events import (
    PhysicalizeEpochRequest,
    PhysicalizeEpochResponse,
    PhysicalState,
    PhysicalWindow,
)
from shared.contracts.placement import Overlays, check_cores_in_mesh
from shared.errors import BadInput

NO_OVERLAYS = Overlays()


def physicalize_epoch(req: PhysicalizeEpochRequest, data: RunData | None = None,
                      microbatches: MicroBatchFn | None = None) -> PhysicalizeEpochResponse:
    """Windows ``req.window .. req.window + len(req.logical) − 1``. ``data``: the registered run data the request's
    hashes name; ``microbatches``: the workload service's rows of serving micro-batches (``req.serving``). A bad
    field of window k's logical events is named ``logical[k]....``."""
    data = data or RunData.of(1)
    placement = object_or_hash(req.placement, req.placement_hash, data.placements, field="placement")
    arch = object_or_hash(req.arch, req.arch_hash, data.archs, field="arch", default=DEFAULT_ARCH)
    freq = req.freq_ghz if req.freq_ghz is not None else default_freqs(arch)
    state = req.state if req.state is not None else PhysicalState()
    if req.replicas is not None:
        state = state.model_copy(update={"replicas": req.replicas})
        check_cores_in_mesh({k: e.cores for k, e in state.replicas.experts.items()}, arch.mesh.n_cores,
                            "replicas.experts", nonempty=True)
    elif req.state is not None:
        check_cores_in_mesh({k: e.cores for k, e in state.replicas.experts.items()}, arch.mesh.n_cores,
                            "state.replicas.experts", nonempty=True)
    windows: list[PhysicalWindow] = []
    try:
        ctx = Context.of(placement, arch, freq, req.window_ms, req.bw_eff_factor, n_layers=req.n_layers,
                         serving=req.serving, microbatches=microbatches)
        ctx.many_windows = len(req.logical) > 1
        carry = Carry.from_state(state, ctx)
        for k, logical in enumerate(req.logical):
            try:
                res = step_window(ctx, carry, logical, req.overlays if k == 0 else NO_OVERLAYS)
                deposit = res.deposit()
            except BadInput as exc:
                raise _in_window(exc, k) from None
            carry = res.carry
            windows.append(PhysicalWindow.model_construct(
                compute=res.compute_events() if req.events else None,
                memory=res.memory_events() if req.events else None, deposit=deposit, timing=res.timing))
    except BadInput as exc:
        raise named_replicas(exc, req.replicas is not None) from None
    return PhysicalizeEpochResponse.model_construct(windows=windows,
                                                    state=carry.to_state(ctx) if req.return_state else None)


def _in_window(exc: BadInput, k: int) -> BadInput:
    """A field of the window's logical events, or of the events it emits, named with the window's index."""
    if exc.field and exc.field.startswith("logical."):
        exc.field = f"logical[{k}]" + exc.field[len("logical"):]
    elif exc.field and exc.field.startswith(("compute_events.", "memory_events.")):
        exc.field = f"windows[{k}].{exc.field}"
    return exc
