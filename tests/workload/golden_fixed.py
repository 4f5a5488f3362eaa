"""SHA-256 of what the workload service answers for a few fixed-arrival workloads: the trace summary, every window's
JSON (``GET .../windows``), the streamed windows and the CSVs. `test_serving.py` compares them with
``tests/fixtures/workload_fixed_golden.json``, made from the code before serving mode existed, so a workload without
a ``serving`` section answers byte for byte as it did. To remake the file from a given commit (its own code, this
script copied beside it)::

    git archive <commit> | tar -x -C /tmp/ref && cp tests/workload/golden_fixed.py /tmp/ref/tests/workload/
    cd /tmp/ref && PYTHONPATH=. <repo>/.venv/bin/python -m tests.workload.golden_fixed > <repo>/tests/fixtures/...

Uses only functions both sides have.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from services.workload import service
from services.workload.sources import WorkloadSources
from services.workload.traces import generate_logical_traces, iter_windows
from shared.configs import WorkloadConfig
from shared.contracts.workload import LogicalWindows

WORKLOADS: dict[str, tuple[dict[str, Any], float]] = {
    "mixtral_locality": ({"model": "mixtral-8x7b",
                          "routing": {"topk": 2, "seed": 3, "zipf_s": 1.1, "locality": 0.2},
                          "sequence": {"tokens": 128, "micro_batch": 4, "steps": 10, "step_interval_ms": 1.0}}, 3.0),
    "deepseek_v2_groups": ({"model": "deepseek-v2",
                            "sequence": {"tokens": 64, "micro_batch": 2, "steps": 3, "step_interval_ms": 2.0}}, 3.0),
    "mixtral_replay": ({"model": "mixtral-8x7b", "routing": {"trace": "mixtral-8x7b-synthetic.csv"},
                        "sequence": {"tokens": 512, "micro_batch": 8, "steps": 6, "step_interval_ms": 0.5}}, 1.0),
    "llama_prefill": ({"model": "llama-3-8b", "phase": "prefill",
                       "sequence": {"tokens": 256, "micro_batch": 16, "steps": 3, "step_interval_ms": 4.0}}, 5.0),
}


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def golden() -> dict[str, str]:
    """``{"<workload>.<what>": sha256}`` of every answer listed in the module docstring."""
    out: dict[str, str] = {"default_config.canonical_json": _sha(WorkloadConfig().canonical_json())}
    sources = WorkloadSources.packaged()
    for name, (raw, window_ms) in WORKLOADS.items():
        cfg = WorkloadConfig.model_validate(raw)
        out[f"{name}.canonical_json"] = _sha(cfg.canonical_json())
        cache = service.TraceCache(4)
        summary = service.create_trace(cache, sources, cfg, window_ms)
        out[f"{name}.summary"] = _sha(summary.model_dump_json())
        entry = cache.get(summary.trace_id)
        windows = service.get_windows(entry, 0, summary.n_windows)
        out[f"{name}.windows"] = _sha(LogicalWindows(windows=windows).model_dump_json())
        streamed = "\n".join(w.model_dump_json() for w in iter_windows(cfg, window_ms, sources=sources))
        out[f"{name}.iter_windows"] = _sha(streamed)
        with tempfile.TemporaryDirectory() as d:
            cpath, mpath = generate_logical_traces(cfg, d, window_ms=window_ms, sources=sources)
            out[f"{name}.csv"] = _sha(Path(cpath).read_bytes() + Path(mpath).read_bytes())
    return out


if __name__ == "__main__":
    print(json.dumps(golden(), indent=1, sort_keys=True))
