"""Arrival traces of a serving workload (services.workload.arrival_files): the published formats read as published
(Azure 2023 and 2024, BurstGPT 1.1 and 2.0, Mooncake, the lab's own CSV), a researcher's trace named from the traces
folder, the packaged trace read as before, and every bad file a clear error naming ``serving.trace``."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from services.workload import service
from services.workload.app import create_app
from services.workload.arrival_files import SERVING_TRACES_DIR, ArrivalFiles, read_arrival_trace
from services.workload.arrivals import load_arrival_trace, offered_requests
from services.workload.sources import WorkloadSources
from services.workload.traces import trace_id_of
from shared.configs import ServingConfig, WorkloadConfig
from shared.contracts.workload import TraceSummary
from shared.errors import BadInput
from shared.settings import Settings

PACKAGED = "azure_llm_inference_2023_conv"


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("name", "lines", "fmt", "t_ns", "prompt", "output", "dropped"), [
    ("azure.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.6805900,374,44",
                   "2023-11-16 18:15:50.9951690,396,109"],
     "azure", [0, 4_314_579_000], [374, 396], [44, 109], 0),
    # the 2024 trace's rows carry a UTC offset; another offset is the same instant in UTC
    ("azure2024.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2024-05-10 00:00:00.009930+00:00,2162,5",
                       "2024-05-10 02:00:01.5+02:00,10,7"],
     "azure", [0, 1_490_070_000], [2162, 10], [5, 7], 0),
    # BurstGPT 1.1: whole seconds (ties), failed requests (Response tokens 0) left out
    ("burst.csv", ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                   "5,ChatGPT,472,18,490,Conversation log", "5,GPT-4,1087,230,1317,Conversation log",
                   "1106,ChatGPT,0,0,0,Conversation log", "1129,ChatGPT,1305,477,1782,API log"],
     "burstgpt", [0, 0, 1_124_000_000_000], [472, 1087, 1305], [18, 230, 477], 1),
    # BurstGPT 2.0: the same three columns among more
    ("burst2.csv", ["Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type",
                    "0.5,17,3.2,ChatGPT,12,34,46,Conversation log", "2.25,,1.0,GPT-4,56,78,134,API log"],
     "burstgpt", [0, 1_750_000_000], [12, 56], [34, 78], 0),
    # Mooncake: JSON lines, milliseconds, ties, other keys ignored
    ("kimi.jsonl", ['{"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1]}',
                    '{"timestamp": 0, "input_length": 7319, "output_length": 490, "hash_ids": [0, 14]}', "",
                    '{"timestamp": 3052, "input_length": 7234, "output_length": 794, "hash_ids": [0, 28]}'],
     "mooncake", [0, 0, 3_052_000_000], [6755, 7319, 7234], [500, 490, 794], 0),
    ("lab.csv", ["arrival_s,prompt_tokens,output_tokens", "10.0,1,1", "10.000000001,2048,3"],
     "lab", [0, 1], [1, 2048], [1, 3], 0),
    # a byte-order mark, Windows line ends, spaces and quotes around the header's names
    ("spaced.csv", ['\ufeff"Timestamp", Model, Request tokens , Response tokens,Total tokens,Log Type\r',
                    "3,ChatGPT,4,5,9,API log\r", "4,ChatGPT,6,7,13,API log\r"],
     "burstgpt", [0, 1_000_000_000], [4, 6], [5, 7], 0),
    ("bom.jsonl", ['\ufeff{"timestamp": 1.5, "input_length": 2, "output_length": 3.0}',
                   '{"timestamp": 2, "input_length": 4, "output_length": 5}'],
     "mooncake", [0, 500_000], [2, 4], [3, 5], 0),
])
def test_each_published_format_is_read_as_published(tmp_path: Path, name: str, lines: list[str], fmt: str,
                                                    t_ns: list[int], prompt: list[int], output: list[int],
                                                    dropped: int) -> None:
    tr = read_arrival_trace(_write(tmp_path / name, lines), "mine")
    assert (tr.fmt, tr.dropped) == (fmt, dropped)
    assert tr.t_ns.tolist() == t_ns and tr.prompt_tokens.tolist() == prompt and tr.output_tokens.tolist() == output


def test_the_packaged_trace_reads_as_numpy_parses_it() -> None:
    """An independent parse of the shipped file (numpy's ISO 8601 reading, to the nanosecond)."""
    rows = [ln.split(",") for ln in (SERVING_TRACES_DIR / f"{PACKAGED}.csv").read_text().splitlines()[1:]]
    stamps = np.asarray([r[0] for r in rows]).astype("datetime64[ns]").astype(np.int64)
    tr = load_arrival_trace(PACKAGED)
    assert tr.fmt == "azure" and tr.dropped == 0 and np.array_equal(tr.t_ns, stamps - stamps[0])
    assert tr.prompt_tokens.tolist() == [int(r[1]) for r in rows]
    assert tr.output_tokens.tolist() == [int(r[2]) for r in rows]


@pytest.mark.parametrize(("name", "n", "span_s", "prompt_mean", "output_mean"), [
    (PACKAGED, 19_366, 3501.7, 1155, 211), ("azure_llm_inference_2023_code", 8_819, 3435.9, 2048, 28)])
def test_the_packaged_traces_are_the_published_samples(name: str, n: int, span_s: float, prompt_mean: int,
                                                       output_mean: int) -> None:
    """Each packaged trace is its published file, unchanged: the README's SHA-256 and figures."""
    tr = load_arrival_trace(name)
    readme = (SERVING_TRACES_DIR / "README.md").read_text(encoding="utf-8")
    assert f"`{tr.sha256[:8]}…{tr.sha256[-8:]}`" in readme or f"`{tr.sha256[:8]}…{tr.sha256[-6:]}`" in readme
    assert len(tr.t_ns) == n and round(tr.t_ns[-1] / 1e9, 1) == span_s and (np.diff(tr.t_ns) > 0).all()
    assert round(tr.prompt_tokens.mean()) == prompt_mean and round(tr.output_tokens.mean()) == output_mean


@pytest.mark.parametrize(("name", "lines", "words"), [
    ("odd.csv", ["time,in,out", "1,2,3", "2,3,4"], "unknown CSV header 'time,in,out'"),
    ("back.csv", ["arrival_s,prompt_tokens,output_tokens", "1,2,3", "0.5,2,3"],
     "arrival times must not decrease (request 1 of the file's 2)"),
    ("empty_prompt.csv", ["arrival_s,prompt_tokens,output_tokens", "1,2,3", "2,0,3"],
     "every prompt needs at least one token (request 2"),
    ("no_output.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46,3,0", "2023-11-16 18:15:47,3,1"],
     "every output needs at least one token (request 1"),
    ("text.csv", ["arrival_s,prompt_tokens,output_tokens", "1,two,3", "2,3,4"], "cannot read it"),
    ("short_row.csv", ["arrival_s,prompt_tokens,output_tokens", "1,2,3", "2,3"], "cannot read it"),
    ("empty_cell.csv", ["arrival_s,prompt_tokens,output_tokens", "1,2,3", "2,,4"],
     "prompt_tokens: request 2: no value"),
    ("empty_time.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", ",3,1", "2023-11-16 18:15:47,3,1"],
     "TIMESTAMP: request 1: no value"),
    ("nan.csv", ["arrival_s,prompt_tokens,output_tokens", "nan,2,3", "2,3,4"],
     "arrival_s: request 1: no value (an empty cell, or NaN"),
    ("far.csv", ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "1,M,1,1,2,L",
                 "1e300,M,1,1,2,L"], "Timestamp: request 2: 1e+300 is not a time in seconds"),
    ("inf.csv", ["arrival_s,prompt_tokens,output_tokens", "1,2,3", "inf,3,4"],
     "arrival_s: request 2: inf is not a time in seconds"),
    ("mixed.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2024-05-10 00:00:00+00:00,1,1",
                   "2024-05-10 00:00:01,1,1"],
     "each with or each without a UTC offset"),
    ("one.csv", ["arrival_s,prompt_tokens,output_tokens", "1,2,3"], "needs at least two requests, has 1"),
    ("all_failed.csv", ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                        "1,ChatGPT,0,0,0,API log", "2,ChatGPT,5,7,12,API log"], "needs at least two requests, has 1"),
    ("bad.jsonl", ['{"timestamp": 0, "input_length": 1, "output_length": 1}', '{"timestamp": 1, "input_len": 1}'],
     "line 2: needs a JSON object with numbers timestamp, input_length, output_length"),
    ("broken.jsonl", ['{"timestamp": 0,'], "line 1:"),
    ("text.jsonl", ['{"timestamp": "5", "input_length": 1, "output_length": 1}'], "line 1: needs a JSON object"),
    ("bool.jsonl", ['{"timestamp": true, "input_length": 1, "output_length": 1}'], "line 1: needs a JSON object"),
    ("half.jsonl", ['{"timestamp": 0, "input_length": 3.9, "output_length": 1}'], "whole numbers of tokens"),
    ("huge.jsonl", ['{"timestamp": 0, "input_length": 100000000000000000000000, "output_length": 1}'], "line 1:"),
    ("far.jsonl", ['{"timestamp": 1e300, "input_length": 1, "output_length": 1}'], "line 1:"),
    ("list.jsonl", ['[0, 1, 1]'], "line 1: needs a JSON object"),
])
def test_a_bad_file_is_an_error_naming_the_field_and_the_file(tmp_path: Path, name: str, lines: list[str],
                                                              words: str) -> None:
    with pytest.raises(BadInput) as exc:
        read_arrival_trace(_write(tmp_path / name, lines), "mine")
    assert exc.value.field == "serving.trace" and name in exc.value.message and words in exc.value.message


def test_names_are_looked_up_in_the_traces_folder_then_the_packaged_ones(tmp_path: Path) -> None:
    files = ArrivalFiles(tmp_path)
    _write(tmp_path / "burst.csv", ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                                    "5,ChatGPT,1,2,3,API log", "6,ChatGPT,1,2,3,API log"])
    _write(tmp_path / "kimi.jsonl", ['{"timestamp": 0, "input_length": 1, "output_length": 1}',
                                     '{"timestamp": 9, "input_length": 1, "output_length": 1}'])
    assert files.available() == ["azure_llm_inference_2023_code", PACKAGED, "burst", "kimi"]
    assert files.load("burst").fmt == "burstgpt" and files.load("burst.csv").fmt == "burstgpt"
    assert files.load("kimi").fmt == "mooncake" and files.load(PACKAGED).sha256 == load_arrival_trace(PACKAGED).sha256
    for bad in ("../burst", "sub/burst", ".hidden", ""):
        with pytest.raises(BadInput) as exc:
            files.path(bad)
        assert exc.value.field == "serving.trace" and "no path" in exc.value.message
    for missing in ("nope", "n" * 300):  # a name too long for the file system is no file either
        with pytest.raises(BadInput) as exc:
            files.load(missing)
        assert exc.value.field == "serving.trace" and f"{PACKAGED}, burst, kimi" in exc.value.message
    with pytest.raises(BadInput):  # the packaged set alone does not see the folder
        load_arrival_trace("burst")


def test_repeated_times_are_rescaled_as_the_trace_has_them(tmp_path: Path) -> None:
    """Whole-second times (BurstGPT's): the first arrival after the slice's last request ends the run, so a tie at
    the cut is not pushed to the run's last nanosecond; a slice after which nothing arrives is refused."""
    rows = ["arrival_s,prompt_tokens,output_tokens"] + [f"{t},1,1" for t in (0, 1, 2, 3, 3, 3, 3, 4)]
    tr = read_arrival_trace(_write(tmp_path / "ties.csv", rows), "ties")
    off = offered_requests(ServingConfig(trace="ties", duration_ms=1_000.0, rate_rps=5.0), tr)
    assert off.rate_factor == pytest.approx(4.0) and off.t_arrival_ns.tolist() == [0, 250_000_000, 500_000_000,
                                                                                  750_000_000, 750_000_000]
    inside = offered_requests(ServingConfig(trace="ties", duration_ms=1_000.0, rate_rps=2.0, start_s=3.0), tr)
    assert inside.t_arrival_ns.tolist() == [0, 0] and inside.rate_factor == pytest.approx(1.0)  # 3 s -> 4 s
    with pytest.raises(BadInput) as exc:  # requests 3..6 and nothing later than 3 s within the slice's reach
        offered_requests(ServingConfig(trace="ties", duration_ms=1_000.0, rate_rps=1.0, start_s=4.0), tr)
    assert exc.value.field == "serving.rate_rps"
    rows = ["arrival_s,prompt_tokens,output_tokens"] + [f"{t},1,1" for t in (0, 5, 5, 5)]
    flat = read_arrival_trace(_write(tmp_path / "flat.csv", rows), "flat")
    with pytest.raises(BadInput) as exc:
        offered_requests(ServingConfig(trace="flat", duration_ms=1_000.0, rate_rps=2.0), flat)
    assert exc.value.field == "serving.rate_rps" and "no request arrives after the last of them" in exc.value.message
    assert offered_requests(ServingConfig(trace="flat", duration_ms=1_000.0, rate_rps=1.0), flat).n == 1


def _serving(trace: str, **serving: float) -> WorkloadConfig:
    return WorkloadConfig.model_validate({"model": "mixtral-8x7b", "routing": {"seed": 5},
                                          "serving": {"trace": trace, "duration_ms": 2_000.0, **serving}})


def test_a_researchers_trace_is_offered_by_the_workload_service(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    lines = [f'{{"timestamp": {250 * i}, "input_length": {100 + i}, "output_length": {5 + i}}}' for i in range(12)]
    _write(traces / "kimi.jsonl", lines)
    client = TestClient(create_app(Settings(results_dir=tmp_path / "results", traces_dir=traces)))
    r = client.post("/v1/traces", json={"workload": _serving("kimi", rate_rps=4.0).model_dump(mode="json"),
                                        "window_ms": 250})
    assert r.status_code == 200, r.text
    s = TraceSummary.model_validate(r.json())
    assert s.serving and s.n_requests == 8 and s.offered_prompt_tokens == sum(100 + i for i in range(8))
    assert s.offered_output_tokens == sum(5 + i for i in range(8))
    r = client.post("/v1/traces", json={"workload": _serving("mine").model_dump(mode="json")})
    assert r.status_code == 422 and r.json()["error"]["field"] == "workload.serving.trace"
    assert "kimi" in r.json()["error"]["message"]
    _write(traces / "bad.csv", ["time,in,out", "1,2,3", "2,3,4"])
    r = client.post("/v1/traces", json={"workload": _serving("bad").model_dump(mode="json")})
    assert r.status_code == 422 and r.json()["error"]["field"] == "workload.serving.trace"
    assert "bad.csv: unknown CSV header" in r.json()["error"]["message"]


def test_the_trace_id_follows_the_arrival_files_content(tmp_path: Path) -> None:
    sources = WorkloadSources.from_settings(Settings(results_dir=tmp_path / "results", traces_dir=tmp_path))
    shutil.copy(SERVING_TRACES_DIR / f"{PACKAGED}.csv", tmp_path / "conv.csv")
    cfg = _serving("conv", rate_rps=2.0)
    first = trace_id_of(cfg, 3.0, sources)
    rows = (tmp_path / "conv.csv").read_text(encoding="utf-8").splitlines()
    stamp, prompt, out = rows[1].split(",")
    rows[1] = ",".join([stamp, str(int(prompt) + 1000), out])  # one prompt longer (and the file: not only its mtime)
    (tmp_path / "conv.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert trace_id_of(cfg, 3.0, sources) != first
    summary = service.create_trace(service.TraceCache(2), sources, cfg, 3.0)
    packaged = service.create_trace(service.TraceCache(2), WorkloadSources.packaged(), _serving(PACKAGED, rate_rps=2.0),
                                    3.0)
    assert summary.offered_prompt_tokens == packaged.offered_prompt_tokens + 1000
