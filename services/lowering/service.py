"""Plain functions behind the lowering endpoints (tests call these directly; the HTTP layer only parses)."""

from __future__ import annotations

from services.lowering.physical import physicalize_window
from shared.chip import Chip
from shared.contracts.events import PhysicalizeRequest, PhysicalizeResponse


def default_freqs(req: PhysicalizeRequest) -> list[float]:
    """Every core at the top step of its DVFS domain."""
    chip = Chip.from_arch(req.arch)
    steps = [d.steps_ghz[0] for d in req.arch.dvfs.domains]
    return [steps[d] for d in chip.core_domain]


def physicalize(req: PhysicalizeRequest) -> PhysicalizeResponse:
    freq = req.freq_ghz if req.freq_ghz is not None else default_freqs(req)
    c, m, st, tm = physicalize_window(req.window, req.logical, req.placement, req.overlays, req.state, req.arch,
                                      freq, req.window_ms, req.bw_eff_factor, n_layers=req.n_layers)
    return PhysicalizeResponse(compute=c, memory=m, state=st, timing=tm)
