"""config.json per family (issue 18): per-layer structure, validation that names the config.json key, models
registered through POST /v1/models and persisted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.cli import main
from services.workload import zoo
from services.workload.app import create_app
from services.workload.ir import SUPPORTED, build_ir, from_hf_config
from shared.errors import BadInput, Conflict
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]

TINY: dict[str, dict[str, Any]] = {
    "qwen2_moe": {"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 4,
                  "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32, "shared_expert_intermediate_size": 96, "vocab_size": 100,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
    "qwen3_moe": {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 6,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "vocab_size": 100,
                  "decoder_sparse_step": 2, "mlp_only_layers": [3]},
    "llama4": {"model_type": "llama4", "text_config": {
        "model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 128,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "vocab_size": 100,
        "attention_chunk_size": 64}},
    "jamba": {"model_type": "jamba", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
              "attn_layer_period": 4, "attn_layer_offset": 2, "expert_layer_period": 2, "expert_layer_offset": 1,
              "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": "auto", "vocab_size": 100},
    "dbrx": {"model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 512, "vocab_size": 100,
             "attn_config": {"kv_n_heads": 2}, "ffn_config": {"ffn_hidden_size": 96, "moe_num_experts": 4,
                                                             "moe_top_k": 2}},
    "mistral": {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "sliding_window": 256},
    "gpt_oss": {"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": 128, "vocab_size": 100,
                "layer_types": ["sliding_attention", "full_attention"] * 2},
}


def _mc(family: str, **patch: Any) -> Any:
    return from_hf_config({**TINY[family], **patch}, name=f"tiny-{family}")


def test_qwen2_moe_counts_its_shared_expert_and_gate() -> None:
    """The issue's example: shared_expert_intermediate_size 0 and 96 gave the same model."""
    with_shared, without = build_ir(_mc("qwen2_moe")), build_ir(_mc("qwen2_moe", shared_expert_intermediate_size=0))
    h, layers = 64, 4
    assert with_shared.params_total - without.params_total == layers * 3 * h * 96
    assert with_shared.params_active - without.params_active == layers * 3 * h * 96
    assert with_shared.flops_by_role()["shared"] > without.flops_by_role()["shared"] > 0  # the gate stays


def test_qwen3_moe_layer_pattern() -> None:
    mc = _mc("qwen3_moe")  # (i+1) % 2 == 0 and i not in [3]
    assert mc.moe_layers == [1, 5] and mc.layer_mlps.count("dense") == 4


def test_llama4_interleaved_moe_dense_widths_and_chunked_attention() -> None:
    mc = _mc("llama4")
    assert mc.moe_layers == [1, 3, 5, 7] and mc.intermediate_size == 128
    assert mc.moe is not None and mc.moe.shared_width == 32 and mc.moe.moe_intermediate_size == 32
    assert mc.layer_mixers == ("chunked_attention",) * 3 + ("full_attention",) + ("chunked_attention",) * 3 + (
        "full_attention",)
    assert mc.keys_per_query(0, 100) == 100 - 64 and mc.keys_per_query(3, 100) == 100


def test_llama4_as_the_hub_publishes_it_no_rope_layers_empty() -> None:
    """The hub's Llama-4 config.json has ``no_rope_layers: []``; transformers reads an empty list as its default
    (every ``no_rope_layer_interval``-th layer without RoPE), and so do we: the same model as with the key missing."""
    missing = {k: v for k, v in TINY["llama4"].items() if k != "no_rope_layers"}
    a, b = from_hf_config({**missing, "no_rope_layers": []}, name="a"), from_hf_config(missing, name="a")
    assert a == b and a.layer_mixers == _mc("llama4").layer_mixers


def test_jamba_mamba_and_expert_layers() -> None:
    mc = _mc("jamba")
    assert [i for i, m in enumerate(mc.layer_mixers) if m != "mamba"] == [2, 6]
    assert mc.moe_layers == [1, 3, 5, 7]
    ir = build_ir(mc, batch=2, seq_len=1000)
    mamba = [la for la in ir.layers if la.op_type == "mamba"]
    assert len(mamba) == 6
    di, ds, R = 128, 8, 4  # dt_rank auto = ceil(64 / 16)
    expected = (64 * 2 * di) + (di * 4 + di) + di * (R + 2 * ds) + (R + 2 * ds) + (R * di + di) + (di * ds + di) + \
        di * 64 + 64
    assert mamba[0].params_total == expected
    # A Mamba layer keeps a fixed state per sequence instead of a KV cache that grows with the context
    fp = ir.get_memory_footprint()
    assert fp.kv_cache_bytes == 2 * (2 * 1000 * 2 * 2 * 16 * 2 + 6 * di * (ds + 3) * 2)


def test_dbrx_nested_config_is_a_moe() -> None:
    mc = _mc("dbrx")
    assert mc.moe is not None and mc.moe.num_routed_experts == 4 and mc.moe.num_activated_experts == 2
    assert mc.num_key_value_heads == 2 and mc.norm == "layernorm_nobias" and mc.moe_layers == [0, 1]
    with pytest.raises(BadInput) as exc:
        _mc("dbrx", ffn_config={"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 5})
    assert exc.value.field == "ffn_config.moe_top_k"


def test_sliding_window_bounds_kv_cache_and_attention() -> None:
    slid, full = _mc("mistral"), _mc("mistral", sliding_window=None)
    a, b = build_ir(slid, seq_len=4096), build_ir(full, seq_len=4096)
    assert a.get_memory_footprint().kv_cache_bytes * 16 == b.get_memory_footprint().kv_cache_bytes
    assert a.flops_by_role()["attn"] < b.flops_by_role()["attn"]
    assert a.params_total == b.params_total
    oss = _mc("gpt_oss")
    assert oss.layer_mixers == ("sliding_attention", "full_attention") * 2 and oss.keys_per_query(0, 4096) == 128


def test_every_supported_family_is_listed_in_the_error() -> None:
    with pytest.raises(BadInput) as exc:
        from_hf_config({**TINY["mistral"], "model_type": "falcon_mamba"}, name="x")
    assert exc.value.field == "model_type"
    assert all(f in exc.value.message for f in SUPPORTED) and "generic" in exc.value.message
    mc = from_hf_config({**TINY["mistral"], "model_type": "falcon_mamba"}, name="x", generic=True)
    assert mc.family == "generic"


BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("mixtral-negative-experts", {"model_type": "mixtral", "num_local_experts": -8}, "num_local_experts", ">= 1"),
    ("qwen3-negative-experts", {"model_type": "qwen3_moe", "num_experts": -8}, "num_experts", ">= 0"),
    ("string-int", {"hidden_size": "abc"}, "hidden_size", "integer"),
    ("fractional", {"hidden_size": 2048.7}, "hidden_size", "integer"),
    ("bool-int", {"num_hidden_layers": True}, "num_hidden_layers", "integer"),
    ("string-bool", {"tie_word_embeddings": "false"}, "tie_word_embeddings", "true or false"),
    ("topk", {"num_experts_per_tok": 9}, "num_experts_per_tok", "<= num_local_experts"),
    ("heads", {"num_attention_heads": 5}, "num_key_value_heads", "multiple"),
    ("zero-heads", {"num_key_value_heads": 0}, "num_key_value_heads", ">= 1"),
    ("pattern", {"model_type": "qwen3_moe", "num_experts": 8, "mlp_only_layers": [7]}, "mlp_only_layers",
     "outside"),
    ("layer-types", {"layer_types": ["full_attention"]}, "layer_types", "lists 1 layers"),
    ("layer-type-name", {"layer_types": ["full_attention", "linear"]}, "layer_types", "linear"),
    ("jamba-offset", {"model_type": "jamba", "num_experts": 4, "attn_layer_period": 2, "attn_layer_offset": 2},
     "attn_layer_offset", "< attn_layer_period"),
    ("nested-text", {"model_type": "llama4", "text_config": "x"}, "text_config", "JSON object"),
]


@pytest.mark.parametrize(("patch", "field", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_validation_names_the_config_key(patch: dict[str, Any], field: str, words: str) -> None:
    base = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "vocab_size": 100}
    with pytest.raises(BadInput) as exc:
        from_hf_config({**base, **patch}, name="bad")
    assert exc.value.field == field, exc.value.message
    assert field in exc.value.message and words in exc.value.message


# A missing or out-of-range key must not silently turn a MoE family into a dense model, and a pattern must select
# layers that exist (each used to load with no MoE layer at all).
SILENT: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("qwen3-moe-no-experts", "qwen3_moe", {"num_experts": None}, "num_experts", "is required"),
    ("qwen2-moe-no-shared-width", "qwen2_moe", {"shared_expert_intermediate_size": None},
     "shared_expert_intermediate_size", "is required"),
    ("sparse-step-past-the-layers", "qwen3_moe", {"decoder_sparse_step": 7}, "decoder_sparse_step",
     "<= num_hidden_layers (6)"),
    ("llama4-step-past-the-layers", "llama4", {"text_config": {**TINY["llama4"]["text_config"],
                                                               "interleave_moe_layer_step": 9}},
     "text_config.interleave_moe_layer_step", "<= text_config.num_hidden_layers (8)"),
    ("jamba-expert-offset-past-the-layers", "jamba", {"num_hidden_layers": 2, "expert_layer_period": 4,
                                                      "expert_layer_offset": 3, "attn_layer_offset": 0},
     "expert_layer_offset", "outside the 2 layers"),
    ("jamba-attn-offset-past-the-layers", "jamba", {"num_hidden_layers": 2}, "attn_layer_offset",
     "outside the 2 layers"),  # offset 2 of a 2-layer Jamba: no attention layer at all
]


@pytest.mark.parametrize(("family", "patch", "field", "words"), [c[1:] for c in SILENT], ids=[c[0] for c in SILENT])
def test_no_silent_dense_model_and_patterns_within_the_layers(family: str, patch: dict[str, Any], field: str,
                                                              words: str) -> None:
    with pytest.raises(BadInput) as exc:
        _mc(family, **patch)
    assert exc.value.field == field, exc.value.message
    assert exc.value.message.startswith(f"config.json {field}: ") and words in exc.value.message


K2 = {"num_experts_per_tok": 2}
DEEPSEEK_V3 = json.loads((REPO / "tests" / "fixtures" / "hf_models" / "deepseek-v3.json").read_text())


@pytest.mark.parametrize(("patch", "field", "words"), [
    ({"n_routed_experts": None}, "n_routed_experts", "is required"),  # V3 is a MoE: missing is not "dense"
    ({"topk_method": "abc"}, "topk_method", "one of greedy"),
    ({"moe_layer_freq": 62}, "moe_layer_freq", "<= num_hidden_layers (61)"),
    ({"model_type": 3}, "model_type", "must be a string"),
])
def test_deepseek_v3_validation(patch: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(BadInput) as exc:
        from_hf_config({**DEEPSEEK_V3, **patch}, name="v3")
    assert exc.value.field == field and words in exc.value.message, exc.value.message


def test_an_explicit_zero_experts_is_still_transformers_dense_switch() -> None:
    mc = _mc("qwen2_moe", num_experts=0, shared_expert_intermediate_size=None)
    assert mc.moe is None and mc.moe_layers == []


@pytest.mark.parametrize(("patch", "field"), [({}, "num_experts_per_tok"),
                                              ({"num_experts_per_tok": 8}, "num_experts_per_tok"),
                                              ({"hidden_size": "x"}, "hidden_size"),
                                              # these used to surface internal names (moe.*, mla.*) or no field
                                              ({**K2, "num_key_value_heads": 3}, "num_key_value_heads"),
                                              ({**K2, "hidden_size": 66}, "num_attention_heads"),
                                              ({**K2, "first_k_dense_replace": 3}, "first_k_dense_replace"),
                                              ({**K2, "n_dense_layers": 3}, "n_dense_layers"),
                                              ({**K2, "moe_layer_freq": 3}, "moe_layer_freq"),
                                              ({**K2, "n_group": 2}, "topk_group"),
                                              ({**K2, "n_group": 3, "topk_group": 1}, "n_group"),
                                              ({**K2, "n_group": 2, "topk_group": 4}, "topk_group"),
                                              ({**K2, "scoring_func": "relu"}, "scoring_func"),
                                              ({**K2, "kv_lora_rank": 16}, "qk_nope_head_dim")])
def test_the_generic_mapping_names_the_key_too(patch: dict[str, Any], field: str) -> None:
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10,
            "intermediate_size": 8, "num_local_experts": 4}
    with pytest.raises(BadInput) as exc:
        from_hf_config({**base, **patch}, name="g", generic=True)
    assert exc.value.field == field, exc.value.message
    assert exc.value.message.startswith(f"config.json {field}: ") or f"has no {field}" in exc.value.message


def test_integral_floats_are_integers() -> None:
    mc = from_hf_config({**TINY["mistral"], "hidden_size": 64.0}, name="f")
    assert mc.hidden_size == 64 and isinstance(mc.hidden_size, int)


def test_cli_bad_config_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**TINY["mistral"], "hidden_size": "abc"}))
    assert main(["ir", "--config", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hidden_size" in err and "Traceback" not in err


# --- POST /v1/models -------------------------------------------------------------------------------------------
@pytest.fixture()
def models_client(tmp_path: Path) -> Any:
    models = tmp_path / "models"
    with TestClient(create_app(Settings(results_dir=tmp_path / "results", models_dir=models))) as c:
        yield c, models


def test_each_app_has_its_own_registry(tmp_path: Path) -> None:
    """Two workload apps in one process with other models folders (issue 21: no module-level registry): a model
    registered through one is unknown to the other, and a model registered without persisting stays in its zoo."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    with TestClient(create_app(Settings(results_dir=tmp_path, models_dir=a_dir))) as a, \
            TestClient(create_app(Settings(results_dir=tmp_path, models_dir=b_dir))) as b:
        assert a.post("/v1/models", json={"name": "only-a", "config": TINY["dbrx"]}).status_code == 201
        assert a.get("/v1/models/only-a").status_code == 200
        r = b.get("/v1/models/only-a")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"
        assert (a_dir / "only-a.json").is_file() and not b_dir.exists()
    mine = zoo.ModelZoo(a_dir)
    mine.register_model("in-memory", TINY["dbrx"], persist=False)
    assert "in-memory" in mine.known_models() and not (a_dir / "in-memory.json").exists()
    assert "in-memory" not in zoo.ModelZoo(a_dir).known_models() and "only-a" in zoo.ModelZoo(a_dir).known_models()


def test_register_list_use_and_conflicts(models_client: Any) -> None:
    client, models = models_client
    body = {"name": "My_Jamba", "config": TINY["jamba"]}
    r = client.post("/v1/models", json=body)
    assert r.status_code == 201, r.text
    s = r.json()
    assert s["name"] == "my-jamba" and s["registered"] and len(s["sha256"]) == 64
    assert s["mixers"] == {"mamba": 6, "full_attention": 2}
    assert client.post("/v1/models", json=body).status_code == 200  # same content: a no-op
    r = client.post("/v1/models", json={"name": "my-jamba", "config": {**TINY["jamba"], "num_experts": 8}})
    assert r.status_code == 409 and r.json()["error"]["field"] == "name"
    assert client.post("/v1/models", json={"name": "mixtral-8x7b", "config": TINY["mistral"]}).status_code == 409
    names = [m["name"] for m in client.get("/v1/models").json()["models"]]
    assert "my-jamba" in names and "mixtral-8x7b" in names
    assert (models / "my-jamba.json").is_file()
    # the workload service builds a trace for it, like a zoo model
    wl = {"model": "my-jamba", "routing": {"topk": 2}, "sequence": {"tokens": 64, "micro_batch": 2, "steps": 2}}
    r = client.post("/v1/traces", json={"workload": wl, "window_ms": 3})
    assert r.status_code == 200 and r.json()["moe_layers"] == [1, 3, 5, 7]


def test_a_workload_without_routing_topk_routes_as_its_model(models_client: Any) -> None:
    """``routing.topk`` left out is the model's own ``num_experts_per_tok`` (a brought top-8 model is not run top-2):
    the trace's experts per token, its expert work and the recorded rows; a given top-k still wins."""
    client, _ = models_client
    cfg = {**TINY["qwen3_moe"], "num_experts": 8, "num_experts_per_tok": 4}
    assert client.post("/v1/models", json={"name": "top4", "config": cfg}).status_code == 201
    seq = {"tokens": 64, "micro_batch": 2, "steps": 2}
    own = client.post("/v1/traces", json={"workload": {"model": "top4", "sequence": seq}, "window_ms": 3})
    two = client.post("/v1/traces", json={"workload": {"model": "top4", "sequence": seq, "routing": {"topk": 2}},
                                          "window_ms": 3})
    assert own.status_code == two.status_code == 200, (own.text, two.text)
    assert own.json()["topk"] == 4 and two.json()["topk"] == 2
    expert_tokens = []
    for r in (own, two):
        w = client.get(f"/v1/traces/{r.json()['trace_id']}/windows/0").json()["compute"]
        expert_tokens.append(sum(t for t, op in zip(w["tokens"], w["op_type"], strict=True) if op == "fc"))
    assert expert_tokens[0] == 2 * expert_tokens[1] > 0  # micro-batch x layers x top-k token-expert pairs


def test_bad_registration_stores_nothing(models_client: Any) -> None:
    client, models = models_client
    r = client.post("/v1/models", json={"name": "broken", "config": {**TINY["qwen3_moe"], "num_experts": -8}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "num_experts"
    r = client.post("/v1/models", json={"name": "../etc", "config": TINY["mistral"]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "name"
    assert not models.exists() or not any(models.iterdir())
    assert "broken" not in zoo.ModelZoo(models).known_models()


def test_a_model_name_is_never_a_path(models_client: Any, tmp_path: Path) -> None:
    """A file of the registered models' shape outside the models folder is not a model, whatever path the name
    spells (relative, absolute, through the folder): 404 unknown_model on ``model``, by /v1/ir, /v1/traces and
    the models' lookup."""
    client, models = models_client
    assert client.post("/v1/models", json={"name": "inside", "config": TINY["dbrx"]}).status_code == 201
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text((models / "inside.json").read_text(), encoding="utf-8")
    (models / "sub").mkdir()
    (models / "sub" / "nested.json").write_text((models / "inside.json").read_text(), encoding="utf-8")
    rel = os.path.relpath(outside / "secret", models)
    for name in (str(outside / "secret"), rel, "../outside/secret", "sub/nested"):
        for r in (client.post("/v1/ir", json={"model": name}),
                  client.post("/v1/traces", json={"workload": {"model": name}, "window_ms": 3})):
            assert r.status_code in (404, 422), (name, r.status_code, r.text[:200])
            err = r.json()["error"]
            assert err["field"] in ("model", "workload.model") and err["code"] != "ok", (name, err)
        assert client.get(f"/v1/models/{name}").status_code in (404, 422)
    assert client.post("/v1/ir", json={"model": "inside"}).status_code == 200  # the folder's own model still is


def test_a_registered_model_survives_a_restart_and_is_seen_by_another_process(models_client: Any) -> None:
    client, models = models_client
    assert client.post("/v1/models", json={"name": "shared-moe", "config": TINY["dbrx"]}).status_code == 201
    assert zoo.ModelZoo(models).get_model_config("shared-moe").moe is not None  # a restarted service
    code = ("from services.workload.sources import WorkloadSources; from shared.settings import get_settings; "
            "print(WorkloadSources.from_settings(get_settings()).zoo.get_model_config('shared-moe')"
            ".moe.num_routed_experts)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "TASMOE_MODELS_DIR": str(models)})
    assert out.stdout.strip() == "4"


def test_register_model_refuses_another_config_under_a_taken_name(tmp_path: Path) -> None:
    z = zoo.ModelZoo(tmp_path / "models")
    z.register_model("x-moe", TINY["dbrx"])
    with pytest.raises(Conflict):
        z.register_model("x-moe", {**TINY["dbrx"], "vocab_size": 101})
    with pytest.raises(Conflict):  # another service on the same folder
        zoo.ModelZoo(tmp_path / "models").register_model("x-moe", {**TINY["dbrx"], "vocab_size": 101})


def test_a_registration_race_is_decided_by_the_file_that_won(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Two replicas register one name at once: the second's link fails and the winner's content decides."""
    models = tmp_path / "models"
    zoo.ModelZoo(models).register_model("raced", TINY["dbrx"])
    other = zoo.ModelZoo(models)
    monkeypatch.setattr(other, "_persisted", lambda name: None)  # this replica checked before the other one wrote
    other.register_model("raced", TINY["dbrx"])  # same content: fine
    with pytest.raises(Conflict):
        zoo.ModelZoo(models).register_model("raced", {**TINY["dbrx"], "vocab_size": 101})
    monkeypatch.setattr(other, "_registered", {})
    with pytest.raises(Conflict):
        other.register_model("raced", {**TINY["dbrx"], "vocab_size": 101})
    assert json.loads((models / "raced.json").read_text())["config"]["vocab_size"] == 100
    assert not list(models.glob(".*.tmp"))  # no temporary file left behind


def test_a_hostile_users_model_is_bounded_before_anything_is_built() -> None:
    """A registered or inline config may have any size the config keys allow: a trace of one whose event table
    would not fit is refused naming the knob (it used to be unreachable: only zoo models made traces)."""
    from services.workload.traces import make_plan
    from shared.configs import WorkloadConfig

    big = {"model_type": "mixtral", "hidden_size": 1 << 20, "intermediate_size": 1 << 20, "num_hidden_layers": 1024,
           "num_attention_heads": 8, "num_key_value_heads": 8, "num_local_experts": 4096, "num_experts_per_tok": 2,
           "vocab_size": 100}
    with pytest.raises(BadInput) as exc:
        make_plan(WorkloadConfig.model_validate({"model": {"config": big}, "routing": {"topk": 2}}))
    assert exc.value.field == "tensors.weight_shard_mb" and "memory rows per micro-batch" in exc.value.message
    with pytest.raises(BadInput) as exc:  # a per-layer list longer than any model
        from_hf_config({**TINY["qwen3_moe"], "mlp_only_layers": list(range(5000))}, name="x")
    assert exc.value.field == "mlp_only_layers"


def test_an_inline_model_in_a_workload_names_its_own_key(models_client: Any) -> None:
    """POST /v1/traces with model: {config: ...}: a bad config.json key is workload.model.config.<key> (as the
    orchestrator's submission check names it; it was workload.<key>), a mistake in the inline entry itself is
    workload.model (it was 'workload.model.str: Input should be a valid string', whatever the mistake)."""
    client, _ = models_client
    seq = {"tokens": 64, "micro_batch": 2, "steps": 2}

    def post(model: Any) -> Any:
        return client.post("/v1/traces", json={"workload": {"model": model, "routing": {"topk": 2}, "sequence": seq},
                                               "window_ms": 3})

    r = post({"config": {**TINY["qwen2_moe"], "num_experts": "8"}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "workload.model.config.num_experts", r.text
    r = post({"config": {**TINY["llama4"], "text_config": {**TINY["llama4"]["text_config"], "num_local_experts": 0}}})
    assert r.json()["error"]["field"] == "workload.model.config.text_config.num_local_experts", r.text
    for bad, words in (({"config": TINY["qwen2_moe"], "name": "../x"}, "name: "), ({"conf": TINY["qwen2_moe"]},
                       "config: required"), (5, "a model name or an object with a config")):
        r = post(bad)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["field"] == "workload.model" and words in err["message"], err
    assert post({"config": TINY["qwen2_moe"], "name": "mine"}).status_code == 200
