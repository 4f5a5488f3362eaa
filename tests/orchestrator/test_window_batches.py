"""The window loop reads the logical trace a batch at a time (`Pipeline.logical_windows`): the same windows, in
one workload call per `MAX_WINDOWS_PER_CALL` windows walked in order, from anywhere on a jump, and after the
service forgot the trace."""

from __future__ import annotations

import json
import math
from pathlib import Path

from services.orchestrator.boundary_bytes import Counting, counting
from services.orchestrator.pipeline_clients import Pipeline
from services.orchestrator.worker import compute_clients
from services.workload.service import TraceCache
from shared.configs import WorkloadConfig
from shared.contracts.workload import MAX_WINDOWS_PER_CALL as WINDOW_BATCH
from shared.settings import Settings
from tests.conftest import CONFIGS

WL = WorkloadConfig.model_validate({"model": "mixtral-8x7b", "routing": {"topk": 2, "seed": 3, "zipf_s": 1.1},
                                    "sequence": {"tokens": 128, "micro_batch": 4, "steps": 160,
                                                 "step_interval_ms": 1.0}})
WINDOW_MS = 1.0


def test_windows_read_in_batches(tmp_path: Path) -> None:
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    wrapped: dict[str, Counting] = {}
    with compute_clients(settings, wrap=counting(wrapped)) as clients:
        pipe = Pipeline(clients, run_key="batches")
        trace = pipe.create_trace(WL, WINDOW_MS)
        n = trace.n_windows
        assert n > 2 * WINDOW_BATCH  # the walk crosses batches, and ends inside one
        one = [json.loads(clients["workload"].request("GET", f"/v1/traces/{trace.trace_id}/windows/{k}").content)
               for k in range(n)]
        tally = wrapped["workload"].tally
        calls = tally.calls
        walked = [w for k in range(0, n, 7) for w in pipe.logical_windows(trace, k, min(7, n - k), workload=WL,
                                                                          window_ms=WINDOW_MS)]
        assert tally.calls - calls == math.ceil(n / WINDOW_BATCH)
        assert [w.data for w in walked] == one

        calls = tally.calls
        back = pipe.logical_windows(trace, 3, 2, workload=WL, window_ms=WINDOW_MS)  # a jump back
        assert [w.data for w in back] == one[3:5]
        assert tally.calls - calls == 1

        app = wrapped["workload"].app
        app.state.trace_cache = TraceCache(settings.cache_size)  # a restarted service: the trace is gone
        assert pipe.logical_windows(trace, 2 * WINDOW_BATCH, 1, workload=WL, window_ms=WINDOW_MS)[0].data \
            == one[2 * WINDOW_BATCH]
