"""``tasmoe ir`` / ``tasmoe trace``: output shape and one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from services.cli import main
from services.workload.ir import build_ir
from services.workload.zoo import ModelZoo
from shared.settings import load_settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_ir_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["ir", "--model", "mixtral-8x7b", "--phase", "decode", "--batch", "1", "--seq-len", "2048", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    ir = build_ir(ModelZoo().get_model_config("mixtral-8x7b"))
    assert out["params_total"] == ir.params_total and out["params_active"] == ir.params_active
    assert out["flops_per_token"] == ir.get_ops_breakdown().total and out["bytes_per_token"] > 0
    assert len(out["layers"]) == 66 and {"name", "flops", "read_bytes"} <= set(out["layers"][1])


def test_ir_from_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
                               "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
                               "num_local_experts": 4, "num_experts_per_tok": 2}))
    assert main(["ir", "--model", "my-moe", "--config", str(cfg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "my-moe" and out["num_routed_experts"] == 4
    # --config describes the file; it registers nothing (in the models folder the environment names)
    assert "my-moe" not in ModelZoo.from_settings(load_settings()).known_models()


def test_ir_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ir", "--model", "gpt-9"]) == 2
    err = capsys.readouterr().err
    assert "unknown model" in err and "mixtral-8x7b" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        main(["ir", "--model", "mixtral-8x7b", "--batch", "0"])
    assert exc.value.code == 2


def test_trace_writes_csvs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load((CONFIGS / "workload_mixtral_8x7b.yaml").read_text())
    data["sequence"]["steps"] = 5
    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump(data))
    out = tmp_path / "traces"
    assert main(["trace", "--workload", str(wl), "--out", str(out), "--window-ms", "2"]) == 0
    printed = capsys.readouterr().out
    assert str(out / "logical_compute.csv") in printed
    lines = (out / "logical_compute.csv").read_text().splitlines()
    assert lines[0] == "event_id,t_gen_ns,mb_id,token_id,experts_json,flops_json,op_type"
    assert {ln.split(",")[2] for ln in lines[1:]} == {"0", "1", "2", "3", "4"}


def test_trace_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load((CONFIGS / "workload_mixtral_8x7b.yaml").read_text())
    data["routing"]["topk"] = 9
    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump(data))
    assert main(["trace", "--workload", str(wl), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip()
    assert "routing.topk" in err and len(err.splitlines()) == 1
