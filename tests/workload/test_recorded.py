"""Recorded routing traces (issue 18, item 5): the format, the importers, malformed files, replay in a workload, and
the skew/locality statistics."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from services.workload import recorded_files
from services.workload.recorded import (
    RecordedRouting,
    ReplayStream,
    check_against_model,
    read_routing,
    routing_stats,
    write_routing,
)
from services.workload.sources import WorkloadSources
from services.workload.traces import iter_windows, make_plan, route_counts, routing_summary, trace_id_of
from services.workload.zoo import ModelZoo
from shared.configs import WorkloadConfig
from shared.errors import BadInput

SAMPLES = Path(__file__).resolve().parents[2] / "services" / "workload" / "samples"
SAMPLE = "mixtral-8x7b-synthetic"


def _small(gates: bool = True) -> RecordedRouting:
    rng = np.random.default_rng(3)
    ex = np.sort(np.stack([rng.permutation(8)[:2] for _ in range(5 * 3)]).reshape(5, 3, 2), axis=2)
    g = rng.random((5, 3, 2)).round(4) if gates else None
    return RecordedRouting(layers=np.array([0, 2, 5]), experts=ex, gates=g, source="t")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
@pytest.mark.parametrize("gates", [True, False])
def test_round_trip_in_every_canonical_format(tmp_path: Path, suffix: str, gates: bool) -> None:
    rec = _small(gates)
    p = tmp_path / f"t{suffix}"
    write_routing(rec, p)
    back = read_routing(p)
    assert np.array_equal(back.layers, rec.layers) and np.array_equal(back.experts, rec.experts)
    if gates:
        assert back.gates is not None and rec.gates is not None
        assert np.allclose(back.gates, rec.gates, atol=1e-6)
    else:
        assert back.gates is None


def test_importers_read_the_shipped_sample_as_the_canonical_file() -> None:
    canon = read_routing(SAMPLES / f"{SAMPLE}.csv")
    assert canon.experts.shape == (1024, 32, 2) and canon.gates is not None
    ids = read_routing(SAMPLES / f"{SAMPLE}.ids.json")
    topk = read_routing(SAMPLES / f"{SAMPLE}.topk.parquet")  # detected: no token column, topk_ids_<layer>
    assert np.array_equal(ids.experts, canon.experts) and ids.gates is None
    assert np.array_equal(topk.experts, canon.experts) and topk.gates is not None
    assert np.allclose(topk.gates, canon.gates, atol=1e-6)


def test_the_long_topk_parquet_shape(tmp_path: Path) -> None:
    rec = _small()
    N, L, k = rec.experts.shape
    assert rec.gates is not None
    t = pa.table({"token_id": np.repeat(np.arange(N), L), "layer_id": np.tile(rec.layers, N),
                  "topk_ids": pa.array(list(rec.experts.reshape(N * L, k)), pa.list_(pa.int64())),
                  "topk_probs": pa.array(list(rec.gates.reshape(N * L, k)), pa.list_(pa.float64()))})
    pq.write_table(t, tmp_path / "long.parquet")
    back = read_routing(tmp_path / "long.parquet", "topk-parquet")
    assert np.array_equal(back.experts, rec.experts) and np.array_equal(back.layers, rec.layers)


CSV_BAD: list[tuple[str, str, str]] = [
    ("bad-type", "token,layer,experts\n0,0,1 x\n", "line 2"),
    ("negative-id", "token,layer,experts\n0,0,1 -3\n", "must be >= 0"),
    ("duplicate-id", "token,layer,experts\n0,0,4 4\n", "selected twice"),
    ("ragged-k", "token,layer,experts\n0,0,1 2\n1,0,1 2 3\n", "line 3"),
    ("missing-pair", "token,layer,experts\n0,0,1 2\n0,1,1 2\n1,0,1 2\n", "token 1 has no row for layer 1"),
    ("duplicate-pair", "token,layer,experts\n0,0,1 2\n0,0,3 2\n", "appears twice"),
    ("missing-column", "token,experts\n0,1 2\n", "missing column 'layer'"),
    ("gates-length", "token,layer,experts,gates\n0,0,1 2,0.5\n", "gates"),
    ("empty", "", "empty"),
    ("header-only", "token,layer,experts\n", "no rows"),
    # hostile numbers and shapes (each used to crash with OverflowError, pass silently or say something odd)
    ("huge-token", "token,layer,experts\n99999999999999999999,0,1 2\n", "line 2: column token: 99999999999999999999 "
                                                                        "is too large"),
    ("huge-id", "token,layer,experts\n0,0,1 99999999999999999999\n", "line 2: column experts: "),
    ("extra-cell", "token,layer,experts\n0,0,1 2,oops\n", "line 2: 3 columns expected"),
    ("no-ids", "token,layer,experts\n0,0,\n", "line 2: column experts: no values"),
    ("nan-gate", "token,layer,experts,gates\n0,0,1 2,nan 0.5\n", "column gates: must be finite and >= 0"),
    ("negative-gate", "token,layer,experts,gates\n0,0,1 2,-0.1 0.5\n", "column gates: must be finite and >= 0"),
]


@pytest.mark.parametrize(("text", "words"), [c[1:] for c in CSV_BAD], ids=[c[0] for c in CSV_BAD])
def test_malformed_csv_names_the_file_and_the_row(tmp_path: Path, text: str, words: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(BadInput) as exc:
        read_routing(p)
    assert "bad.csv" in exc.value.message and words in exc.value.message, exc.value.message
    assert exc.value.field == "routing.trace"


@pytest.mark.parametrize(("lines", "words"), [
    (['{"token":0,"layer":0,"experts":[1,2]}', "{oops"], "line 2"),
    (['{"token":0,"layer":0,"experts":[1,2]}', '{"token":"a","layer":0,"experts":[1,2]}'], "line 2"),
    (['{"token":0,"layer":0,"experts":[1,2],"gates":[0.5,0.5]}', '{"token":1,"layer":0,"experts":[1,2]}'],
     "some rows only"),
    (['{"token":0,"experts":[1,2]}'], "missing column 'layer'"),
    (['{"token":0,"layer":0,"experts":[1,1e30]}'], "data row 1: column experts: 1e+30 is too large"),
    (['{"token":123456789012345678901234,"layer":0,"experts":[1,2]}'], "line 1: column token"),
    (['{"token":0,"layer":0,"experts":"1 2"}'], "column experts: a list expected, got str"),
    (['{"token":0,"layer":0,"experts":[1,2],"gates":[0.5,NaN]}'], "column gates: must be finite"),
])
def test_malformed_jsonl(tmp_path: Path, lines: list[str], words: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadInput) as exc:
        read_routing(p)
    assert "bad.jsonl" in exc.value.message and words in exc.value.message, exc.value.message


@pytest.mark.parametrize(("doc", "words"), [
    ({"tokens": [[[1, 2], [3, 4]], [[1, 2]]]}, "token 1"),
    ({"tokens": [[[1, 2]], [[1, "x"]]]}, "entry 2"),
    ({"layers": [0, 1], "tokens": [[[1, 2]]]}, "token 0"),
    ({"nothing": []}, "expected"),
    ({"layers": [0, 10 ** 30], "tokens": [[[1, 2], [1, 2]]]}, "layers: a list of layer indices"),
    ({"tokens": [5]}, "token 0: a list of per-layer expert id lists expected"),
])
def test_malformed_ids_json(tmp_path: Path, doc: Any, words: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(BadInput) as exc:
        read_routing(p)
    assert "bad.json" in exc.value.message and words in exc.value.message, exc.value.message


def test_malformed_parquet(tmp_path: Path) -> None:
    p = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"topk_ids_0": pa.array([[1, 2], [1, 2, 3]], pa.list_(pa.int64()))}), p)
    with pytest.raises(BadInput, match=re.escape("bad.parquet: row 2: column topk_ids_0")):
        read_routing(p)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(BadInput, match=re.escape("junk.parquet: file: not a readable Parquet file")):
        read_routing(tmp_path / "junk.parquet")


def test_replay_wraps_and_matches_the_trace() -> None:
    rec = _small()
    s = ReplayStream(rec, moe_layers=[0, 2, 5], n_experts=8, topk=2, tokens=2)
    picks = s.take(4)  # 8 tokens of a 5-token trace: tokens 0..4, 0..2
    assert picks.shape == (4, 3, 2, 2) and s.wraps_after_mb == 2
    order = [0, 1, 2, 3, 4, 0, 1, 2]
    for m in range(4):
        for i in range(2):
            assert np.array_equal(picks[m, :, i, :], rec.experts[order[m * 2 + i]])
    assert np.allclose(s.probabilities().sum(axis=1), 1.0)


def test_check_against_model_names_the_problem() -> None:
    rec = _small()
    with pytest.raises(BadInput, match="layer 5 is not an MoE layer"):
        check_against_model(rec, moe_layers=[0, 1, 2], n_experts=8, topk=2)
    with pytest.raises(BadInput, match="no selections for MoE layer 7"):
        check_against_model(rec, moe_layers=[0, 2, 5, 7], n_experts=8, topk=2)
    with pytest.raises(BadInput, match=re.escape("2 experts per token, routing.topk is 3")):
        check_against_model(rec, moe_layers=[0, 2, 5], n_experts=8, topk=3)
    with pytest.raises(BadInput, match=re.escape(">= the model's 4 routed experts")):
        check_against_model(rec, moe_layers=[0, 2, 5], n_experts=4, topk=2)


def test_stats_by_hand() -> None:
    # one layer, 4 experts, k=2; tokens {0,1} {0,1} {0,2} {3,2}
    ex = np.array([[[0, 1]], [[0, 1]], [[0, 2]], [[2, 3]]])
    st = routing_stats(ex, 4, lag=1)
    # loads 3,2,2,1: mean 2 -> skew 1.5; std sqrt(0.5) -> cv 0.3536; reuse (2/2 + 1/2 + 1/2) / 3 = 2/3
    assert st["skew"] == [1.5]
    assert st["cv"][0] == pytest.approx(np.sqrt(0.5) / 2)
    assert st["reuse"][0] == pytest.approx(2 / 3)
    assert routing_stats(ex, 4, lag=2)["reuse"][0] == pytest.approx((1 / 2 + 0 / 2) / 2)


def _replay_cfg(**routing: Any) -> WorkloadConfig:
    return WorkloadConfig.model_validate({
        "model": "mixtral-8x7b", "routing": {"topk": 2, "trace": f"{SAMPLE}.csv", **routing},
        "sequence": {"tokens": 256, "micro_batch": 32, "steps": 40, "step_interval_ms": 1.0}})


def test_a_workload_replays_the_sample() -> None:
    cfg = _replay_cfg()
    plan = make_plan(cfg)
    counts = route_counts(plan)  # (steps, 32 layers, 8 experts)
    rec = read_routing(SAMPLES / f"{SAMPLE}.csv")
    tokens = (np.arange(40 * 32) % 1024)
    for layer in (0, 17, 31):
        want = np.bincount(rec.experts[tokens, layer, :].ravel(), minlength=8)
        assert np.array_equal(counts[:, layer, :].sum(axis=0), want)
    # the seed and the Zipf knobs do not matter when replaying
    other = make_plan(_replay_cfg(seed=999, zipf_s=0.0))
    assert np.array_equal(route_counts(other), counts)
    stats = routing_summary(plan)
    assert stats is not None and stats.tokens == 40 * 32 and stats.skew[31] > stats.skew[0]
    windows = list(iter_windows(cfg, 3.0))
    assert sum(len(w.compute) for w in windows) > 0


def test_replay_errors_name_routing_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(BadInput) as exc:
        make_plan(_replay_cfg(trace="nope.csv"))
    assert exc.value.field == "routing.trace" and SAMPLE in exc.value.message  # lists what is available
    with pytest.raises(BadInput, match=r"3 experts per token|routing.topk is 3"):
        make_plan(_replay_cfg(topk=3))
    with pytest.raises(ValueError):
        _replay_cfg(trace="../../etc/passwd")  # names only
    cfg = WorkloadConfig.model_validate({"model": "deepseek-v2", "routing": {"topk": 6, "trace": f"{SAMPLE}.csv"}})
    with pytest.raises(BadInput, match="not an MoE layer"):  # DeepSeek-V2's first layer is dense
        make_plan(cfg)


def test_trace_id_follows_the_file_content(tmp_path: Path) -> None:
    sources = WorkloadSources(ModelZoo(), recorded_files.RecordedFiles(tmp_path))
    shutil.copy(SAMPLES / f"{SAMPLE}.csv", tmp_path / "mine.csv")
    cfg = _replay_cfg(trace="mine.csv")
    first = trace_id_of(cfg, 3.0, sources)
    rows = (tmp_path / "mine.csv").read_text().splitlines()
    token, layer, experts, gates = rows[1].split(",")
    rows[1] = ",".join([token, layer, "6 7" if experts != "6 7" else "0 1", gates])  # one selection changed
    (tmp_path / "mine.csv").write_text("\n".join(rows) + "\n")
    assert trace_id_of(cfg, 3.0, sources) != first
    assert not np.array_equal(make_plan(cfg, sources).recorded.experts[0, 0],  # type: ignore[union-attr]
                              read_routing(SAMPLES / f"{SAMPLE}.csv").experts[0, 0])
    assert "mine.csv" in sources.recorded.available()
    with pytest.raises(BadInput) as exc:  # the traces folder is the sources' own: the packaged ones lack it
        make_plan(cfg)
    assert exc.value.field == "routing.trace"


@pytest.mark.parametrize(("table", "words"), [
    # a null inside a list used to become NaN, then a garbage negative id ("ids must be >= 0", wrong row/column)
    ({"token": [0, 0], "layer": [0, 1], "experts": pa.array([[1, 2], [1, None]], pa.list_(pa.int64()))},
     "row 2: column experts: empty (null) value"),
    ({"topk_ids_0": pa.array([[1, 2]], pa.list_(pa.int64())),
      "topk_ids_1": pa.array([[1, None]], pa.list_(pa.int64()))}, "row 1: column topk_ids_1: empty (null) value"),
    # the wide shape names its own column and row (it used to say "row 2: column experts")
    ({"topk_ids_0": pa.array([[1, 2]], pa.list_(pa.int64())), "topk_ids_1": pa.array([[1, 1]], pa.list_(pa.int64()))},
     "row 1: column topk_ids_1: an expert is selected twice"),
    ({"topk_ids_0": pa.array([[1, 2]], pa.list_(pa.int64())), "topk_probs_0": pa.array([[0.5, -1.0]], pa.list_(
        pa.float64()))}, "row 1: column topk_probs_0: gates must be finite and >= 0"),
    # an unsigned id past int64 used to wrap to a negative number
    ({"token": [0], "layer": [0], "experts": pa.array([[1, 2 ** 63 + 5]], pa.list_(pa.uint64()))},
     "row 1: column experts: 9223372036854775813 is too large"),
])
def test_malformed_parquet_rows_and_columns(tmp_path: Path, table: dict[str, Any], words: str) -> None:
    p = tmp_path / "bad.parquet"
    pq.write_table(pa.table(table), p)
    with pytest.raises(BadInput) as exc:
        read_routing(p)
    assert f"bad.parquet: {words}" in exc.value.message, exc.value.message


def test_a_spreadsheets_byte_order_mark_is_not_part_of_the_header(tmp_path: Path) -> None:
    p = tmp_path / "excel.csv"
    p.write_text("\ufefftoken,layer,experts\n0,0,1 2\n", encoding="utf-8")
    assert read_routing(p).experts.tolist() == [[[1, 2]]]


def test_an_expert_id_past_the_model_names_the_token_layer_and_column() -> None:
    rec = RecordedRouting(layers=np.array([0, 1]), experts=np.array([[[0, 1], [1, 2]], [[0, 1], [2, 9]]]), gates=None,
                          source="mine.csv")
    with pytest.raises(BadInput) as exc:
        check_against_model(rec, moe_layers=[0, 1], n_experts=8, topk=2)
    assert exc.value.field == "routing.trace"
    assert "mine.csv: token 1 layer 1: column experts: expert id 9 >= the model's 8 routed experts" in \
        exc.value.message
    with pytest.raises(BadInput, match=re.escape("mine.csv: column layer: layer 1 is not an MoE layer")):
        check_against_model(rec, moe_layers=[0], n_experts=16, topk=2)
