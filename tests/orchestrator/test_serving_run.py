"""A served run through the orchestrator on the real services: the epochs hand ``workload.serving`` to the
physicalizer (which asks the workload service for its micro-batches' rows), the placement is planned on the routing
law's expected expert load, the reduction gets the SLO, the result row has the serving columns with a balanced token
count, and the capacity estimate is skipped with its reason (services/orchestrator/capacity.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.orchestrator import repository as repo
from services.orchestrator.capacity import SERVING_NOTE, estimate_capacity, first_token_window, serving_note
from services.orchestrator.pipeline_clients import Pipeline
from services.orchestrator.schemas import ExperimentRequest
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.window_loop import run_scenario
from services.orchestrator.worker import compute_clients
from shared.configs import WorkloadConfig
from shared.contracts.events import PhysicalizeEpochRequest
from shared.contracts.metrics import ReduceRequest
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator.conftest import Db
from tests.orchestrator.test_contract_bodies import Recording, body_model

# a small Mixtral-shaped model: a micro-batch takes well under a window, so the run makes one iteration a window
SMALL_MOE = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 512,
             "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
             "head_dim": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 1000,
             "max_position_embeddings": 4096, "tie_word_embeddings": False}


def serving_request(**kw: Any) -> ExperimentRequest:
    wl = WorkloadConfig.model_validate({
        "model": {"config": SMALL_MOE, "name": "small-moe"}, "sequence": {"micro_batch": 8},
        "serving": {"duration_ms": 600.0, "rate_rps": 20.0, "slo": {"ttft_p99_ms": 50.0, "tpot_p99_ms": 5.0}}})
    return ExperimentRequest(workload=wl, scenarios=["baseline"], plots=False, **kw)


def test_a_served_run_end_to_end(sqlite: Db, settings: Settings, tmp_path: Path) -> None:
    spec = resolve_spec(serving_request(), configs_dir=CONFIGS)
    exp, _ = create_experiment(sessions=sqlite.sessions, spec=spec, settings=settings, out_dir=tmp_path / "run")
    apps: dict[str, Recording] = {}

    def record(name: str, app: Any) -> Recording:
        apps[name] = Recording(app)
        return apps[name]

    with compute_clients(settings, wrap=record) as clients:
        assert run_scenario(repo.run_id_for(exp, "baseline"), clients, sqlite.sessions).status == "succeeded"
        pipe = Pipeline(clients, run_key="capacity")
        assert estimate_capacity(pipe, spec) is None and first_token_window(pipe, spec, max_windows=10,
                                                                            deadline_s=1.0) is None
    assert serving_note(spec) == SERVING_NOTE
    with sqlite.sessions() as s:
        row = next(r for r in repo.runs_of(session=s, exp_id=exp)).result_row
    assert row is not None
    assert int(row["requests_done"]) >= 3 and int(row["tokens_unbalanced"]) == 0
    assert int(row["tokens_offered"]) == int(row["tokens_served"]) + int(row["tokens_queued"]) + int(
        row["tokens_shed"])
    assert row["ttft_p99_ms"] not in (None, "") and row["goodput_tok_s"] not in (None, "")
    paths: dict[str, list[Any]] = {}
    for name, rec in apps.items():
        for scope, raw in rec.requests:
            key = f"{name} {scope['method']} {scope['path'].rsplit('/', 1)[-1]}"
            model = body_model(scope)
            paths.setdefault(key, []).append((scope, model.model_validate_json(raw) if model and raw else None))
    phys = [m for _, m in paths["lowering POST epoch"]]
    assert phys and all(isinstance(m, PhysicalizeEpochRequest) and m.serving == spec.workload.serving for m in phys)
    assert int(row["tokens_served"]) > 0  # the physicalizer had its micro-batches' rows (through its own peers)
    loads = paths["workload GET expert-load"]
    assert loads and all(b"expected=true" in scope["query_string"] for scope, _ in loads)
    reduce = [m for _, m in paths["metrics POST reduce"]]
    assert len(reduce) == 1 and isinstance(reduce[0], ReduceRequest)
    assert (reduce[0].slo_ttft_p99_ms, reduce[0].slo_tpot_p99_ms) == (50.0, 5.0)
    assert json.loads(json.dumps(row))  # the row is plain JSON
