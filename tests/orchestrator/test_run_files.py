"""The appended trace files: the logical-trace CSV text shared by the runs of one process is the text each run would
format itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.orchestrator import run_files
from services.orchestrator.run_files import RunFiles
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.contracts.placement import Overlays


def _window(k: int) -> dict[str, Any]:
    n = 5
    return {"compute": {"event_id": [10 * k + i for i in range(n)], "t_gen_ns": [1000 * k + i for i in range(n)],
                        "mb_id": [k] * n, "layer": [i % 2 for i in range(n)], "op_type": ["moe_ffn"] * n,
                        "expert": [i - 1 for i in range(n)], "tokens": [3] * n,
                        "flops": [1.5e9 / (i + 1) for i in range(n)]},
            "memory": {"event_id": [10 * k + i for i in range(n)], "tensor_id": [f"w,{i}" for i in range(n)],
                       "access": ["read"] * n, "bytes": [4096 * i for i in range(n)],
                       "locality_hint": ['say "near"'] * n}}


def _append(files: RunFiles, w: dict[str, Any], raw: str | None) -> None:
    files.append_window(logical_compute=w["compute"], logical_memory=w["memory"],
                        overlays=Overlays().model_dump(mode="json"),
                        compute={c: [] for c in ComputeEvents.columns()},
                        memory={c: [] for c in MemoryEvents.columns()}, logical_raw=raw)


def _texts(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*.csv"))}


def test_shared_logical_text_is_what_each_run_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_files, "LOGICAL_TEXT", run_files._LogicalText(max_chars=10_000))
    dirs = {name: tmp_path / name for name in ("plain", "first", "second")}
    for d in dirs.values():
        RunFiles(d).start_fresh()
    for k in range(3):
        w = _window(k)
        raw = json.dumps(w)
        _append(RunFiles(dirs["plain"]), w, None)  # formatted here, no cache
        _append(RunFiles(dirs["first"]), w, raw)  # formatted, cached
        _append(RunFiles(dirs["second"]), w, raw)  # from the cache
    plain = _texts(dirs["plain"])
    assert plain == _texts(dirs["first"]) == _texts(dirs["second"])
    assert plain["traces/logical_compute.csv"].count(b"\n") == 1 + 3 * 5
    assert b'"[""L1E0""]"' in plain["traces/logical_compute.csv"]  # csv quoting of the JSON column
    assert len(run_files.LOGICAL_TEXT._items) == 3


def test_logical_text_cache_is_bounded_and_keyed_by_content() -> None:
    cache = run_files._LogicalText(max_chars=10)
    cache.put(b"a", ("1234", "5"))
    cache.put(b"b", ("1234", "5"))
    assert cache.get(b"a") == ("1234", "5") and cache.get(b"b") == ("1234", "5")
    cache.put(b"c", ("12", "3"))  # over the bound: the oldest goes
    assert cache.get(b"a") is None and cache.get(b"c") == ("12", "3")
    cache.put(b"d", ("x" * 11, ""))  # larger than the bound: not kept
    assert cache.get(b"d") is None
