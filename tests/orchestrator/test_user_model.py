"""A user's own model drives an experiment end to end (issue 18, item 4): a checkpoint's config.json that is not in
the zoo (``tests/fixtures/user_models``: a small Qwen2-MoE with a shared expert and a dense first layer), named by
the workload config as ``model: {config: <path>}``, goes through traces, placement, lowering and thermal with the real
services in process; the results CSV carries its name. The other way in, a model registered through POST /v1/models
and named by the workload (``model: my-jamba``), runs the same way."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from services.orchestrator.local import run_local
from services.orchestrator.worker import compute_clients
from services.workload.zoo import ModelZoo
from shared.settings import Settings
from tests.conftest import CONFIGS, FIXTURES


def test_an_experiment_on_a_users_config_json(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "user_models" / "tiny-qwen2-moe.json", tmp_path / "my_moe.json")
    wl = tmp_path / "workload.yaml"
    wl.write_text("model: {config: my_moe.json}\n"
                  "routing: {topk: 2, seed: 7, zipf_s: 1.0}\n"
                  "sequence: {tokens: 256, micro_batch: 4, steps: 2, step_interval_ms: 3.0}\n")
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    assert "my-moe" not in ModelZoo.from_settings(settings).known_models()  # not in the zoo, not registered
    with compute_clients(settings) as clients:
        res = run_local(arch=CONFIGS / "arch_8x8_32x32x8.yaml", workload=wl, tas=CONFIGS / "tas_params.yaml",
                        out=tmp_path / "out", scenarios=["baseline", "tas"], windows=40, settings=settings,
                        clients=clients, traces=False, warmup_ms=3.0,
                        database_url=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert res.ok, res.errors
    for sc in ("baseline", "tas"):
        path = tmp_path / "out" / sc / "my-moe.csv"
        rows = list(csv.DictReader(path.open()))
        assert len(rows) == 1 and rows[0]["workload"] == "my-moe"
        assert float(rows[0]["ips"]) > 0, rows[0]  # tokens of the user's model completed
        assert float(rows[0]["T_peak_logic"]) > 20.0
    assert "my-moe" not in ModelZoo.from_settings(settings).known_models()  # an inline config registers nothing


def test_submission_checks_an_inline_config_json_naming_its_key(tmp_path: Path) -> None:
    import json

    from fastapi.testclient import TestClient

    from services.orchestrator.app import create_app
    from tests.orchestrator.fakes import RecordingDispatcher

    raw = json.loads((FIXTURES / "user_models" / "tiny-qwen2-moe.json").read_text())
    disp = RecordingDispatcher()
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    wl = {"routing": {"topk": 2}, "sequence": {"tokens": 256, "micro_batch": 4, "steps": 2}}
    with compute_clients(settings) as clients, \
            TestClient(create_app(settings, clients=clients, dispatcher=disp)) as c:
        bad = {**raw, "num_experts": -8}
        r = c.post("/v1/experiments", json={"workload": {**wl, "model": {"config": bad}}, "scenarios": ["baseline"]})
        assert r.status_code == 422 and r.json()["error"]["field"] == "workload.model.config.num_experts", r.text
        r = c.post("/v1/experiments", json={"workload": {**wl, "model": {"config": "/etc/passwd"}},
                                            "scenarios": ["baseline"]})
        assert r.status_code == 422 and r.json()["error"]["field"] == "workload.model.config", r.text
        r = c.post("/v1/experiments", json={"workload": {**wl, "model": {"config": raw, "name": "mine"}},
                                            "scenarios": ["baseline"]})
        assert r.status_code == 202, r.text
    assert len(disp.submitted) == 1


TINY_JAMBA = {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 512,
              "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
              "num_experts": 16, "num_experts_per_tok": 2, "attn_layer_period": 4, "attn_layer_offset": 2,
              "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 16, "mamba_d_conv": 4,
              "mamba_expand": 2, "mamba_dt_rank": "auto", "vocab_size": 32000}


def test_an_experiment_on_a_registered_model_by_name(tmp_path: Path) -> None:
    """The other way in: POST /v1/models registers a config.json (a small Jamba: Mamba and attention mixers, MoE every
    other layer; no zoo model has Mamba layers), a fresh process finds it in TASMOE_MODELS_DIR, and a workload that
    names it (`model: my-jamba`) runs through traces, placement, lowering and thermal."""
    from fastapi.testclient import TestClient

    from services.workload.app import create_app

    models = tmp_path / "models"
    with TestClient(create_app(Settings(results_dir=tmp_path / "results", models_dir=models))) as c:
        r = c.post("/v1/models", json={"name": "My_Jamba", "config": TINY_JAMBA})
        assert r.status_code == 201, r.text
        assert r.json()["mixers"] == {"mamba": 3, "full_attention": 1}
        assert c.post("/v1/models", json={"name": "half", "config": {**TINY_JAMBA, "num_experts": -2}}
                      ).status_code == 422
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["my-jamba.json"]  # nothing half-stored
    wl = tmp_path / "workload.yaml"
    wl.write_text("model: my-jamba\nrouting: {topk: 2, seed: 7, zipf_s: 1.0}\n"
                  "sequence: {tokens: 256, micro_batch: 4, steps: 2, step_interval_ms: 3.0}\n")
    # other apps (the run's own workload service) find it on disk, as another replica would
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS, models_dir=models)
    with compute_clients(settings) as clients:
        res = run_local(arch=CONFIGS / "arch_8x8_32x32x8.yaml", workload=wl, tas=CONFIGS / "tas_params.yaml",
                        out=tmp_path / "out", scenarios=["tas"], windows=40, settings=settings,
                        clients=clients, traces=False, warmup_ms=3.0,
                        database_url=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert res.ok, res.errors
    rows = list(csv.DictReader((tmp_path / "out" / "tas" / "my-jamba.csv").open()))
    assert len(rows) == 1 and rows[0]["workload"] == "my-jamba" and float(rows[0]["ips"]) > 0, rows
