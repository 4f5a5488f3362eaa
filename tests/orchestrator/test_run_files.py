"""The appended files: one copy of the logical trace per experiment (its first scenario writes it), gzip members per
window (the same bytes whatever the epochs) that truncate back to a frontier, the physical events only on request,
and the window store with its index."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path
from typing import Any

from services.orchestrator import window_store
from services.orchestrator.run_files import EVENT_FILES, LOGICAL_FILES, OVERLAY_FILES, RunFiles, WindowRows
from shared import gz_text
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


def _events(k: int) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    compute: dict[str, list[Any]] = {
        "evt_id": [k], "t_start_ns": [1000 * k], "core_id": [k % 4], "duration_cycles": [10], "flops": [2.0e6],
        "op": ["moe_ffn"], "dvfs_domain": ["d0"], "power_hint": [0.5], "energy_j": [1e-6]}
    memory: dict[str, list[Any]] = {
        "evt_id": [k], "t_start_ns": [1000 * k], "src_core": [0], "dst_bank": ["B(0,1,5)"], "bytes": [64.0],
        "rw": ["r"], "hops": [1], "noc_qos": ["normal"]}
    assert list(compute) == ComputeEvents.columns() and list(memory) == MemoryEvents.columns()
    return compute, memory


def _rows(k: int) -> WindowRows:
    w = _window(k)
    compute, memory = _events(k)
    return WindowRows(logical_compute=w["compute"], logical_memory=w["memory"],
                      overlays=Overlays().model_dump(mode="json"), compute=compute, memory=memory,
                      metrics_line=f'{{"window":{k},"T_peak_logic":{50 + k / 3!r}}}\n'.encode())


def _append(files: RunFiles, *ks: int) -> None:
    """Windows ``ks`` as one epoch."""
    files.append_windows([_rows(k) for k in ks])


def _read_csv(path: Path) -> list[dict[str, str]]:
    """A compressed trace file read as a researcher would (gzip.open reads every member as one stream)."""
    with gzip.open(path, "rt", encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_one_logical_trace_per_experiment_and_events_on_request(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = RunFiles(out, "baseline", logical=True)
    second = RunFiles(out, "tas", logical=False, events=True)
    for f in (first, second):
        f.start_fresh()
    for k in range(3):
        _append(first, k)
        _append(second, k)
    files = set(_tree(out))
    store = (window_store.WINDOWS_FILE, window_store.INDEX_FILE)
    assert files == {*LOGICAL_FILES, *(f"runs/{s}/{rel}" for s in ("baseline", "tas") for rel in OVERLAY_FILES),
                     *(f"runs/tas/{rel}" for rel in EVENT_FILES),
                     *(f"runs/{s}/{rel}" for s in ("baseline", "tas") for rel in store)}
    text = gz_text.read_text(out / "traces/logical_compute.csv.gz")
    assert text.count("\n") == 1 + 3 * 5  # the header once, every window's rows once (not once per scenario)
    assert '"[""L1E0""]"' in text  # csv quoting of the JSON column
    memory = _read_csv(out / "traces/logical_memory.csv.gz")
    assert list(memory[0]) == list(LOGICAL_FILES["traces/logical_memory.csv.gz"]) and len(memory) == 15
    assert memory[1]["tensor_id"] == "w,1" and memory[0]["locality_hint"] == 'say "near"'
    events = _read_csv(out / "runs/tas/traces/physical/memory_events.csv.gz")
    assert [e["evt_id"] for e in events] == ["0", "1", "2"] and events[0]["dst_bank"] == "B(0,1,5)"
    # the same rows give the same bytes (gzip headers carry no time)
    again = RunFiles(tmp_path / "again", "baseline", logical=True)
    again.start_fresh()
    for k in range(3):
        _append(again, k)
    assert _tree(tmp_path / "again") == {k: v for k, v in _tree(out).items() if "runs/tas" not in k}


def test_truncating_to_the_frontier_sizes_drops_an_uncommitted_window(tmp_path: Path) -> None:
    ref, crash = (RunFiles(tmp_path / name, "tas", events=True) for name in ("ref", "crash"))
    for f in (ref, crash):
        f.start_fresh()
    for k in range(4):
        _append(ref, k)
    for k in range(2):
        _append(crash, k)
    sizes = crash.sizes()
    assert set(sizes) == {*LOGICAL_FILES, *(f"runs/tas/{rel}" for rel in (*OVERLAY_FILES, *EVENT_FILES,
                                                                         window_store.WINDOWS_FILE,
                                                                         window_store.INDEX_FILE))}
    _append(crash, 2)  # written, never committed ...
    with open(tmp_path / "crash/runs/tas/traces/physical/compute_events.csv.gz", "ab") as fh:
        fh.write(gzip.compress(b"999,garbage\n")[:7])  # ... and a torn write
    resumed = RunFiles(tmp_path / "crash", "tas", events=True)
    resumed.truncate_to(sizes)
    for k in range(2, 4):
        _append(resumed, k)
    assert _tree(tmp_path / "crash") == _tree(tmp_path / "ref")


def test_no_traces_writes_no_trace_file_but_the_window_store(tmp_path: Path) -> None:
    files = RunFiles(tmp_path, "tas", traces=False)
    files.start_fresh()
    _append(files, 0)
    assert set(files.sizes()) == set(_tree(tmp_path)) == {f"runs/tas/{window_store.WINDOWS_FILE}",
                                                          f"runs/tas/{window_store.INDEX_FILE}"}


def test_epochs_append_the_bytes_windows_would(tmp_path: Path) -> None:
    """Windows appended as epochs of any size give the bytes of window-by-window appends; the store reads a page
    back by its index."""
    by_window, by_epoch = (RunFiles(tmp_path / name, "tas", events=True) for name in ("w", "e"))
    for f in (by_window, by_epoch):
        f.start_fresh()
    for k in range(6):
        _append(by_window, k)
    _append(by_epoch, 0, 1, 2)
    _append(by_epoch, 3)
    _append(by_epoch, 4, 5)
    assert _tree(tmp_path / "w") == _tree(tmp_path / "e")
    rd = tmp_path / "e" / "runs" / "tas"
    assert window_store.count(rd) == 6
    assert [w["window"] for w in window_store.read(rd, 2, 3)] == [2, 3, 4]
    assert window_store.read(rd, 5, 10)[0]["T_peak_logic"] == 50 + 5 / 3  # floats round-trip
    assert window_store.read(rd, 6) == []
    assert [len(c) for c in window_store.iter_chunks(rd, 4)] == [4, 2]


def test_sizes_kept_from_the_writes_are_the_files_sizes(tmp_path: Path) -> None:
    """`sizes()` counts what the object wrote (no stat per window): after the headers, each append and a truncation
    it equals the file system's sizes; a new object that wrote nothing reads them from the file system."""
    files = RunFiles(tmp_path, "tas", events=True)

    def on_disk() -> dict[str, int]:
        return {rel: (tmp_path / rel).stat().st_size for rel in files.appended()}

    files.start_fresh()
    assert files.sizes() == on_disk()
    for k in range(3):
        _append(files, k)
        assert files.sizes() == on_disk()
    at_one = RunFiles(tmp_path, "tas", events=True).sizes()
    assert at_one == on_disk()
    _append(files, 3)
    assert files.sizes() != at_one
    files.truncate_to(at_one)
    assert files.sizes() == at_one == on_disk()
