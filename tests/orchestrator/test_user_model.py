"""A user's own model drives an experiment end to end (issue 18, item 4): a checkpoint's config.json that is not in
the zoo (``tests/fixtures/user_models``: a small Qwen2-MoE with a shared expert and a dense first layer), named by
the workload config as ``model: {config: <path>}``, goes through traces, placement, lowering and thermal with the real
services in process; the results CSV carries its name."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from services.orchestrator.local import run_local
from services.orchestrator.worker import compute_clients
from services.workload.zoo import known_models
from shared.settings import Settings
from tests.conftest import CONFIGS, FIXTURES


def test_an_experiment_on_a_users_config_json(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "user_models" / "tiny-qwen2-moe.json", tmp_path / "my_moe.json")
    wl = tmp_path / "workload.yaml"
    wl.write_text("model: {config: my_moe.json}\n"
                  "routing: {topk: 2, seed: 7, zipf_s: 1.0}\n"
                  "sequence: {tokens: 256, micro_batch: 4, steps: 2, step_interval_ms: 3.0}\n")
    assert "my-moe" not in known_models()  # not in the zoo, not registered
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
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
