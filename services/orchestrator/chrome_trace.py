"""A window range of a run's physical events as a Chrome trace (the JSON trace-event format that Perfetto, and
``chrome://tracing``, open): each logic core and each DRAM vault channel a track, as schedules are looked at.

- compute events (``traces/physical/compute_events.csv.gz``): a complete event (``ph: X``) on its core's track, from
  ``t_start_ns`` for ``duration_cycles`` at the core's clock in that window (``freq_ghz`` of the window's metrics);
- memory events (``memory_events.csv.gz``): a complete event on the track of the vault holding the bank (the
  vault's channel), lasting ``bytes / vault_bw_gbps`` (the bank's share of its vault's bandwidth is not modelled
  per access); core-to-core traffic (``dispatch``, ``combine``: no bank) on the source core's NoC track;
- per window, counters (``ph: C``) of the logic and DRAM peak temperatures and the chip's power.

Times are microseconds (the format's unit) from the run's start. The event files are one gzip member per window
that had events, without an index: the members before the range are decompressed (not parsed) to be skipped, so a
range late in a long run costs the decompression of what precedes it (~1 s per 400 MB of CSV)."""

from __future__ import annotations

import csv
import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.orchestrator import window_store
from shared.configs import ArchConfig
from shared.contracts.events import NOC_ONLY_QOS
from shared.contracts.ids import parse_bank_id

MAX_TRACE_WINDOWS = 50  # windows of one trace answer
MAX_TRACE_EVENTS = 250_000  # events of one trace answer (the rest is cut, and the answer says so)
COMPUTE_FILE = "traces/physical/compute_events.csv.gz"
MEMORY_FILE = "traces/physical/memory_events.csv.gz"
_PID_CORES, _PID_VAULTS, _PID_NOC, _PID_CHIP = 1, 2, 3, 0


def has_events(run_dir: Path) -> bool:
    return (run_dir / COMPUTE_FILE).is_file() and (run_dir / MEMORY_FILE).is_file()


def _members(path: Path, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Each gzip member of ``path`` decompressed, in order (a window's rows; the first is the header)."""
    with open(path, "rb") as fh:
        d = zlib.decompressobj(wbits=31)
        parts: list[bytes] = []
        data = fh.read(chunk)
        while data:
            parts.append(d.decompress(data))
            if d.eof:
                yield b"".join(parts)
                parts = []
                data = d.unused_data
                d = zlib.decompressobj(wbits=31)
                if not data:
                    data = fh.read(chunk)
            else:
                data = fh.read(chunk)
        if any(parts):
            yield b"".join(parts)


def _rows_in(path: Path, t0_ns: int, t1_ns: int, slack_ns: int) -> Iterator[dict[str, str]]:
    """The rows of ``path`` with ``t0_ns <= t_start_ns < t1_ns``. A member is parsed only when its first row starts
    within ``slack_ns`` of the range, and the scan stops at the first member that starts ``slack_ns`` past its end
    (a member holds one window's events, which start near that window)."""
    header: list[str] | None = None
    for member in _members(path):
        if header is None:
            header = member.decode("utf-8").strip().split(",")
            continue
        first = member[: member.find(b"\n")].split(b",", 2)
        try:
            start = int(first[1])
        except (IndexError, ValueError):
            continue
        if start >= t1_ns + slack_ns:
            return
        if start < t0_ns - slack_ns:
            continue
        for row in csv.DictReader(io.StringIO(member.decode("utf-8")), fieldnames=header):
            t = int(row["t_start_ns"])
            if t0_ns <= t < t1_ns:
                yield row


def _meta(pid: int, name: str, sort: int, threads: dict[int, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}},
                                 {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": sort}}]
    for tid, tname in threads.items():
        out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": tname}})
        out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    return out


def chrome_trace(run_dir: Path, arch: ArchConfig, window_ms: float, start: int, count: int,
                 label: str) -> dict[str, Any]:
    """The trace of windows ``start .. start+count-1`` (the committed windows the caller allows)."""
    X, Y = arch.mesh.cores
    BX, BY, _ = arch.dram.banks
    bpx, bpy = max(1, BX // X), max(1, BY // Y)
    vault_bw = arch.dram.vault_bw_gbps  # GB/s = bytes per ns
    dt_ns = round(window_ms * 1e6)
    t0, t1 = start * dt_ns, (start + count) * dt_ns
    windows = window_store.read(run_dir, start, count)
    freq = {int(w["window"]): w.get("freq_ghz") or [] for w in windows}
    default_ghz = arch.dvfs.domains[0].steps_ghz[0] if arch.dvfs.domains else 1.0

    def ghz(core: int, t_ns: int) -> float:
        f = freq.get(t_ns // dt_ns) or []
        return float(f[core]) if 0 <= core < len(f) and f[core] > 0 else float(default_ghz)

    events: list[dict[str, Any]] = []
    cut = False
    used_cores: set[int] = set()
    used_vaults: set[int] = set()
    used_noc: set[int] = set()
    for row in _rows_in(run_dir / COMPUTE_FILE, t0, t1, 2 * dt_ns):
        if len(events) >= MAX_TRACE_EVENTS:
            cut = True
            break
        core, t = int(row["core_id"]), int(row["t_start_ns"])
        dur_ns = int(row["duration_cycles"]) / ghz(core, t)
        used_cores.add(core)
        events.append({"ph": "X", "pid": _PID_CORES, "tid": core, "name": row["op"], "cat": "compute",
                       "ts": t / 1e3, "dur": dur_ns / 1e3,
                       "args": {"evt_id": int(row["evt_id"]), "flops": float(row["flops"]),
                                "cycles": int(row["duration_cycles"]), "ghz": ghz(core, t),
                                "energy_j": float(row["energy_j"])}})
    for row in _rows_in(run_dir / MEMORY_FILE, t0, t1, 2 * dt_ns):
        if len(events) >= MAX_TRACE_EVENTS:
            cut = True
            break
        t, nbytes, src = int(row["t_start_ns"]), float(row["bytes"]), int(row["src_core"])
        args = {"evt_id": int(row["evt_id"]), "bytes": nbytes, "src_core": src, "bank": row["dst_bank"],
                "rw": row["rw"], "hops": int(row["hops"]), "qos": row["noc_qos"]}
        name = f"{'read' if row['rw'] == 'r' else 'write'} {row['noc_qos']}"
        if row["noc_qos"] in NOC_ONLY_QOS or not row["dst_bank"]:
            used_noc.add(src)
            events.append({"ph": "X", "pid": _PID_NOC, "tid": src, "name": row["noc_qos"], "cat": "noc",
                           "ts": t / 1e3, "dur": nbytes / vault_bw / 1e3, "args": args})
            continue
        x, y, _ = parse_bank_id(row["dst_bank"])
        vault = (y // bpy) * X + x // bpx
        used_vaults.add(vault)
        events.append({"ph": "X", "pid": _PID_VAULTS, "tid": vault, "name": name, "cat": "memory",
                       "ts": t / 1e3, "dur": nbytes / vault_bw / 1e3, "args": args})
    for w in windows:
        ts = float(w["t_start_ms"]) * 1e3
        events.append({"ph": "C", "pid": _PID_CHIP, "name": "peak temperature (°C)", "ts": ts,
                       "args": {"logic": w["T_peak_logic"], "dram": w["T_peak_dram"]}})
        events.append({"ph": "C", "pid": _PID_CHIP, "name": "power (W)", "ts": ts, "args": {"chip": w["power_w"]}})
    meta = (_meta(_PID_CHIP, "chip", 0, {})
            + _meta(_PID_CORES, "logic die: cores", 1, {c: f"core {c} ({c % X},{c // X})" for c in sorted(used_cores)})
            + _meta(_PID_VAULTS, "DRAM: vault channels", 2, {v: f"vault {v}" for v in sorted(used_vaults)})
            + _meta(_PID_NOC, "NoC: core-to-core traffic", 3, {c: f"from core {c}" for c in sorted(used_noc)}))
    return {"traceEvents": meta + events, "displayTimeUnit": "ns",
            "otherData": {"run": label, "windows": [start, start + len(windows) - 1], "window_ms": window_ms,
                          "truncated": cut, "max_events": MAX_TRACE_EVENTS}}
