"""Coarsen a run's per-window metrics to at most N windows, for figures (one owner: the orchestrator calls it before
it sends a long run's series to the metrics service's plots; ``GET /windows`` pages instead).

A run of 10^4 windows is ~150 MB of JSON: more than a request may carry (``TASMOE_MAX_BODY_MB``) and more points
than a figure shows. Consecutive windows are merged in blocks of ``k = ceil(n / N)``; a merged window keeps what a
figure reads from it:

- ``t_start_ms`` of the block's first window, ``dt_ms`` = the block's total;
- ``T_peak_*`` = max over the block; ``T_mean_*``, ``power_w``, ``refresh_mhz``, ``bw_eff_gbps``,
  ``queue_delay_ms``, ``freq_ghz`` and ``noc_link_util`` (per core / link) = time-weighted means;
- ``temps_core_c``, ``temps_bank_c`` = those of the block's hottest window (max ``T_peak_logic``, first on ties), so
  the heat map of the hottest window is the run's own;
- ``bytes_moved``, ``tokens_completed``, ``migrations`` = sums; ``latencies_ms`` = all samples; ``oldest_inflight_ms``
  = max; the power breakdown and per-layer power (when present) = time-weighted means;
- the served requests (when present): ``requests_done`` = all of them, ``requests_arrived``, ``requests_shed``,
  ``tokens_offered``, ``tokens_shed`` = sums, ``requests_waiting``, ``requests_running``, ``tokens_queued`` = the
  block's last window's (at its end), so the merged windows keep the token balance.

The reduction of the merged windows gives the run's own row for every column except ``T_var_logic`` (the spatial
variance is taken on the hottest window's map) and ``noc_load_max`` (the busiest link of a block's mean): the
orchestrator sends figures the run's real rows, never rows reduced from merged windows.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

# <out>/<scenario>/<workload>.windows.jsonl.gz: one WindowMetrics JSON per line, gzip-compressed (a merged window
# of the default run is ~14 kB of JSON, mostly the per-vault maps: 4.3 MB per scenario, 1.7 MB compressed); readers
# also take an uncompressed ``.windows.jsonl`` (PLAIN_WINDOWS_SUFFIX: folders written before, a user's own file)
WINDOWS_SUFFIX = ".windows.jsonl.gz"
PLAIN_WINDOWS_SUFFIX = ".windows.jsonl"
# <out>/plots/figure_args.json: what a figure needs beside the rows and windows (workload, mesh, thot_c, warmup_ms)
FIGURE_ARGS_FILE = "plots/figure_args.json"


def window_json_line(w: dict[str, Any]) -> str:
    """One line of a ``.windows.jsonl`` file: compact JSON with sorted keys (same window, same bytes)."""
    return json.dumps(w, sort_keys=True, separators=(",", ":")) + "\n"


def write_windows_jsonl(path: Path, windows: Iterable[dict[str, Any]]) -> int:
    """Write windows (JSON form of `WindowMetrics`) to a ``.windows.jsonl.gz`` file (or an uncompressed
    ``.windows.jsonl``) atomically; the count written. No name and time 0 in the gzip header: the same windows give
    the same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "wb") as raw:
        out: gzip.GzipFile | BinaryIO = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) \
            if path.name.endswith(".gz") else raw
        for w in windows:
            out.write(window_json_line(w).encode("utf-8"))
            n += 1
        if out is not raw:
            out.close()  # the gzip trailer; the raw file is closed by its own block
    tmp.replace(path)
    return n


_WEIGHTED = ("T_mean_logic", "T_mean_dram", "power_w", "refresh_mhz", "bw_eff_gbps", "queue_delay_ms")
_VECTORS = ("freq_ghz", "noc_link_util", "power_core_w")
_REQUEST_SUMS = ("requests_arrived", "requests_shed", "tokens_offered", "tokens_shed")
_REQUEST_AT_END = ("requests_waiting", "requests_running", "tokens_queued")


def block_size(n_windows: int, max_windows: int) -> int:
    """Windows merged into one: ``ceil(n / max)`` (1 when the run is short enough)."""
    return max(1, math.ceil(n_windows / max(1, max_windows)))


def merge(block: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One window (JSON form of `WindowMetrics`) from consecutive windows (see the module docstring)."""
    if len(block) == 1:
        return dict(block[0])
    dt = np.array([float(w["dt_ms"]) for w in block])
    wt = dt / dt.sum()
    hot = block[int(np.argmax([float(w["T_peak_logic"]) for w in block]))]
    out: dict[str, Any] = dict(hot)
    out.update(window=block[0]["window"], t_start_ms=block[0]["t_start_ms"], dt_ms=float(dt.sum()),
               T_peak_logic=max(float(w["T_peak_logic"]) for w in block),
               T_peak_dram=max(float(w["T_peak_dram"]) for w in block),
               bytes_moved=float(sum(float(w["bytes_moved"]) for w in block)),
               tokens_completed=int(sum(int(w["tokens_completed"]) for w in block)),
               migrations=int(sum(int(w.get("migrations", 0)) for w in block)),
               latencies_ms=[x for w in block for x in w.get("latencies_ms", [])],
               oldest_inflight_ms=max(float(w.get("oldest_inflight_ms", 0.0)) for w in block))
    for name in _WEIGHTED:
        out[name] = float(wt @ np.array([float(w.get(name, 0.0)) for w in block]))
    for name in _VECTORS:
        rows = [w.get(name) or [] for w in block]
        if rows[0] and all(len(r) == len(rows[0]) for r in rows):
            out[name] = (wt @ np.asarray(rows, dtype=np.float64)).tolist()
    if any("requests_done" in w or "tokens_offered" in w for w in block):
        out.update({k: int(sum(int(w.get(k, 0)) for w in block)) for k in _REQUEST_SUMS})
        out.update({k: int(block[-1].get(k, 0)) for k in _REQUEST_AT_END})
        done = [w.get("requests_done") or {} for w in block]
        names = next((list(d) for d in done if d), [])
        if names:
            out["requests_done"] = {k: [x for d in done for x in d.get(k, [])] for k in names}
    if all(isinstance(w.get("power"), dict) for w in block):
        keys = block[0]["power"].keys()
        out["power"] = {k: float(wt @ np.array([float(w["power"][k]) for w in block])) for k in keys}
    if all(isinstance(w.get("power_layer_w"), dict) and w["power_layer_w"] for w in block):
        keys = block[0]["power_layer_w"].keys()
        out["power_layer_w"] = {k: float(wt @ np.array([float(w["power_layer_w"].get(k, 0.0)) for w in block]))
                                for k in keys}
    return out


def coarsen(chunks: Iterable[Sequence[dict[str, Any]]], *, n_windows: int, max_windows: int
            ) -> Iterator[dict[str, Any]]:
    """Merged windows of a run streamed in chunks (window order) of ``n_windows`` windows in all: at most
    ``max_windows`` of them."""
    k = block_size(n_windows, max_windows)
    block: list[dict[str, Any]] = []
    for chunk in chunks:
        for w in chunk:
            block.append(w)
            if len(block) == k:
                yield merge(block)
                block = []
    if block:
        yield merge(block)
