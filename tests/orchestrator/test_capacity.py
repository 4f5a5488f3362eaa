"""The default experiment is a sustainable load: its offered load is below the chip's capacity (derived from the cycle
model, services/orchestrator/capacity.py) and its backlog stays bounded (Science II, issue 15)."""

from __future__ import annotations

import math

from services.orchestrator.capacity import estimate_capacity
from services.orchestrator.epochs import initial_freqs, initial_replicas
from services.orchestrator.pipeline_clients import EMPTY_OVERLAYS, Pipeline, RunData
from services.orchestrator.schemas import ExperimentRequest
from services.orchestrator.service import resolve_spec
from services.orchestrator.worker import compute_clients
from shared.chip import vault_bw_raw_gbps
from shared.configs import load_arch, load_tas, load_workload
from shared.contracts.events import PhysicalState
from shared.settings import Settings
from tests.conftest import CONFIGS

SIMULATED_MS = 2400.0  # eight arrivals of the default workload


def test_default_load_is_below_capacity_and_the_backlog_stays_bounded(settings: Settings) -> None:
    req = ExperimentRequest(arch=load_arch(CONFIGS / "arch_8x8_32x32x8.yaml"),
                            workload=load_workload(CONFIGS / "workload_mixtral_8x7b.yaml"),
                            tas=load_tas(CONFIGS / "tas_params.yaml"))
    spec = resolve_spec(req, configs_dir=CONFIGS)
    arch, wl = spec.arch, spec.workload
    window_ms = spec.tas.tacs.window_ms
    with compute_clients(settings) as cc:
        pipe = Pipeline(cc, run_key="cap-test")
        cap = estimate_capacity(pipe, spec)
        assert cap is not None  # a fixed-arrival workload has one
        assert cap.exact and cap.open_limit == 1
        assert 0 < cap.makespan_ms < wl.sequence.step_interval_ms
        assert cap.offered_tok_s == wl.sequence.micro_batch / (wl.sequence.step_interval_ms * 1e-3)
        assert cap.load < 1.0, cap.line()
        # the DRAM roofline: the lone micro-batch's bytes over the vaults' raw bandwidth; never below the exact capacity
        assert cap.bytes_mb > 0 and "DRAM roofline" in cap.line()
        bw_raw = vault_bw_raw_gbps(arch) * 1e9
        assert cap.roofline_tok_s == wl.sequence.micro_batch * bw_raw / cap.bytes_mb
        assert cap.capacity_tok_s == wl.sequence.micro_batch / (cap.makespan_ms * 1e-3) <= cap.roofline_tok_s
        # the run itself, scheduled 50 windows a call (no thermal: the top DVFS step, as in the capacity)
        trace = pipe.create_trace(wl, window_ms)
        load = pipe.expert_load(trace, workload=wl, window_ms=window_ms)
        plc = pipe.placement(arch=arch, workload=wl, tas=spec.tas, method="default", trace=trace, expert_load=load,
                             H=None)
        run = RunData.of(arch=arch, placement=plc).lowering
        pipe.register_all(run.values())
        state = PhysicalState(replicas=initial_replicas(plc)).model_dump(mode="json")
        completed, latencies = 0, []
        n = math.ceil(SIMULATED_MS / window_ms)
        timings = []
        for k0 in range(0, n, 50):
            logical = pipe.logical_windows(trace, k0, min(50, n - k0), workload=wl, window_ms=window_ms)
            P = pipe.physicalize_epoch(window=k0, logical=logical, run=run, overlays=EMPTY_OVERLAYS, state=state,
                                       replicas=None, freq_ghz=initial_freqs(arch), window_ms=window_ms,
                                       bw_eff_factor=1.0, n_layers=trace.n_layers, return_state=True, events=False)
            assert P.state is not None
            state = P.state
            timings += [w.timing for w in P.windows]
        for k, t in enumerate(timings):
            assert t.tokens_dropped == 0, f"window {k}: admission shed tokens"
            assert t.open_mbs <= cap.open_limit, f"window {k}: {t.open_mbs} micro-batches open"
            # nothing waits: the oldest token in flight is younger than one micro-batch's makespan
            assert t.oldest_inflight_ms <= cap.makespan_ms + window_ms, f"window {k}: {t.oldest_inflight_ms} ms"
            completed += t.tokens_completed
            latencies += t.latencies_ms
    arrivals = math.ceil(SIMULATED_MS / wl.sequence.step_interval_ms)
    assert completed >= (arrivals - 1) * wl.sequence.micro_batch  # all but the one still in flight
    assert max(latencies) <= cap.makespan_ms + window_ms
