"""What the dashboard draws of a run, read from the files the run writes (nothing is recomputed): its window series
summarised and decimated for the timelines, the newest window as a live frame (heat maps), and the expert map with
TACS's moves.

A run's window store holds ~17 kB of JSON per window; a 30 s run has 10^4 windows, too many to send to a page or to
parse again at every look. `SummaryCache` keeps, per run, a few numbers per window (peaks, tokens, latency sums,
power by component, clocks, refresh), read once from the store and extended by the windows committed since; a
timeline is then at most ``points`` buckets of it (`decimate`: the peaks are each bucket's maximum with the window it
was reached in, so the series' peak is the result CSV's peak at its window; the rest are time-weighted means or sums).
A live frame is one window's temperature maps, never the windows in between.

Only committed windows are read (a run's ``next_window`` in the database: an epoch appended but not committed is not
shown). A resumed run's store is truncated back to its frontier and rewritten with the same bytes, so the cached
windows stay valid; a store shorter than the cache (a run restarted from window 0) resets it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.orchestrator import window_store
from services.orchestrator.run_files import PLACEMENT_FILE
from shared.configs import ArchConfig
from shared.contracts.ids import parse_bank_id

POWER_PARTS: tuple[str, ...] = ("logic_dynamic", "spm", "logic_leakage", "noc", "dram_controller", "dram_dynamic",
                                "dram_refresh", "dram_leakage")
# per window: what the timelines and the colour scale need
_COLUMNS: tuple[str, ...] = ("t_ms", "dt_ms", "T_peak_logic", "T_peak_dram", "T_map_min", "T_map_max", "tokens",
                             "lat_sum_ms", "lat_n", "power_w", *(f"p_{p}" for p in POWER_PARTS), "freq_mean_ghz",
                             "freq_min_ghz", "refresh_mhz", "migrations", "cores_throttled")
MAX_POINTS = 2000  # buckets of one timeline answer (GET /v1/experiments/{id}/series)
MAX_MOVES = 500  # TACS moves in one map answer or one live frame (the newest kept; the total is counted)


def _summary_row(w: dict[str, Any]) -> list[float]:
    temps = list(w.get("temps_core_c") or [])
    banks = [t for vault in (w.get("temps_bank_c") or []) for t in vault]
    cells = temps + banks or [float(w["T_peak_logic"])]
    lats = w.get("latencies_ms") or []
    freq = w.get("freq_ghz") or []
    power = w.get("power") or {}
    return [float(w["t_start_ms"]), float(w["dt_ms"]), float(w["T_peak_logic"]), float(w["T_peak_dram"]),
            float(min(cells)), float(max(cells)), float(w.get("tokens_completed", 0)), float(sum(lats)),
            float(len(lats)), float(w.get("power_w", 0.0)), *(float(power.get(p, math.nan)) for p in POWER_PARTS),
            float(sum(freq) / len(freq)) if freq else math.nan, float(min(freq)) if freq else math.nan,
            float(w.get("refresh_mhz", 0.0)), float(w.get("migrations", 0)), float(w.get("cores_throttled", 0))]


@dataclass
class RunSummary:
    """One run's per-window summary columns (`_COLUMNS`), windows 0 .. n-1."""

    cols: dict[str, array[float]] = field(default_factory=lambda: {c: array("d") for c in _COLUMNS})
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def n(self) -> int:
        return len(self.cols["t_ms"])

    def extend(self, run_dir: Path, upto: int, chunk: int = 500) -> None:
        """Read the committed windows ``n .. upto-1`` from the run's store (fewer when the store holds fewer)."""
        stored = window_store.count(run_dir)
        if stored < self.n:  # the run started over: its store is shorter than what we read
            for col in self.cols.values():
                del col[:]
        upto = min(upto, stored)
        while self.n < upto:
            part = window_store.read(run_dir, self.n, min(chunk, upto - self.n))
            if not part:
                return
            for w in part:
                for name, v in zip(_COLUMNS, _summary_row(w), strict=True):
                    self.cols[name].append(v)


class SummaryCache:
    """`RunSummary` per run folder, the ``size`` most recently used kept (a 10^4-window run's summary is ~2 MB)."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._runs: OrderedDict[str, RunSummary] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_dir: Path, upto: int) -> RunSummary:
        """The run's summary up to window ``upto`` (exclusive), read from its store as far as needed."""
        key = str(run_dir)
        with self._lock:
            run = self._runs.pop(key, None) or RunSummary()
            self._runs[key] = run
            while len(self._runs) > self.size:
                self._runs.popitem(last=False)
        with run.lock:
            run.extend(run_dir, upto)
        return run


SUMMARIES = SummaryCache()


def _round(x: float, nd: int = 4) -> float | None:
    return None if math.isnan(x) else round(x, nd)


def bucket(cols: dict[str, array[float]], a: int, b: int) -> dict[str, Any]:
    """Windows ``a .. b-1`` as one point of the timelines: peaks as the maximum and its window, throughput as tokens
    over the simulated time, latency as the mean over the tokens completed, the rest time-weighted means (power W,
    clock GHz, refresh MHz) or sums (migrations)."""
    dt = cols["dt_ms"][a:b]
    span = sum(dt)

    def tmean(c: str) -> float | None:
        xs = cols[c][a:b]
        good = [(x, d) for x, d in zip(xs, dt, strict=True) if not math.isnan(x)]
        if not good:
            return None
        return _round(sum(x * d for x, d in good) / sum(d for _, d in good))

    def peak(c: str) -> tuple[float, int]:
        xs = cols[c][a:b]
        i = max(range(len(xs)), key=xs.__getitem__)  # the first window of the maximum
        return xs[i], a + i

    pl, pl_w = peak("T_peak_logic")
    pd, pd_w = peak("T_peak_dram")
    lat_n = sum(cols["lat_n"][a:b])
    fmin = [x for x in cols["freq_min_ghz"][a:b] if not math.isnan(x)]
    return {"w0": a, "w1": b - 1, "t0_ms": _round(cols["t_ms"][a]), "t1_ms": _round(cols["t_ms"][b - 1] + dt[-1]),
            "T_peak_logic": _round(pl), "T_peak_logic_w": pl_w, "T_peak_dram": _round(pd), "T_peak_dram_w": pd_w,
            "T_map_min": _round(min(cols["T_map_min"][a:b])), "T_map_max": _round(max(cols["T_map_max"][a:b])),
            "tokens": int(sum(cols["tokens"][a:b])), "ips": _round(1e3 * sum(cols["tokens"][a:b]) / span),
            "lat_ms": _round(sum(cols["lat_sum_ms"][a:b]) / lat_n) if lat_n else None,
            "power_w": tmean("power_w"), **{f"power_{p}_w": tmean(f"p_{p}") for p in POWER_PARTS},
            "freq_ghz": tmean("freq_mean_ghz"), "freq_min_ghz": _round(min(fmin)) if fmin else None,
            "refresh_mhz": tmean("refresh_mhz"), "migrations": int(sum(cols["migrations"][a:b])),
            "cores_throttled": _round(max(cols["cores_throttled"][a:b]), 0)}


def decimate(run: RunSummary, start: int, stop: int | None, points: int) -> dict[str, Any]:
    """Windows ``start .. stop-1`` in at most ``points`` buckets of ``stride`` windows each (the last may be
    shorter), as columns (one list per key of `bucket`)."""
    n = run.n if stop is None else min(stop, run.n)
    start = min(start, n)
    stride = max(1, math.ceil((n - start) / max(1, points)))
    rows = [bucket(run.cols, a, min(a + stride, n)) for a in range(start, n, stride)]
    keys = list(rows[0]) if rows else []
    return {"n": run.n, "start": start, "stop": n, "stride": stride,
            "points": {k: [r[k] for r in rows] for k in keys}}


# --------------------------------------------------------------------------------------------------- live frames


def frame(run_dir: Path, window: int) -> dict[str, Any] | None:
    """One committed window's maps for the heat maps (temperatures to 0.01 °C, clocks) and its peaks; None when the
    store does not hold it."""
    got = window_store.read(run_dir, window, 1)
    if not got:
        return None
    w = got[0]
    return {"window": w["window"], "t_ms": w["t_start_ms"], "dt_ms": w["dt_ms"],
            "temps_core_c": [round(t, 2) for t in w["temps_core_c"]],
            "temps_bank_c": [[round(t, 2) for t in v] for v in w.get("temps_bank_c") or []],
            "freq_ghz": w.get("freq_ghz") or [], "T_peak_logic": w["T_peak_logic"], "T_peak_dram": w["T_peak_dram"],
            "migrations": w.get("migrations", 0)}


# ------------------------------------------------------------------------------------------------- map and moves


def _vault_core(arch: ArchConfig) -> Callable[[str], int]:
    X, Y = arch.mesh.cores
    BX, BY, _ = arch.dram.banks
    bpx, bpy = max(1, BX // X), max(1, BY // Y)

    def core(bank: str) -> int:
        x, y, _ = parse_bank_id(bank)
        return (y // bpy) * X + x // bpx

    return core


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def moves(run_dir: Path, arch: ArchConfig, window_ms: float, upto: int) -> list[dict[str, Any]]:
    """TACS's moves of the run, committed windows only (``window < upto``), in order: each migration (an expert to
    another core; a weight shard to another bank, drawn between the vaults' cores) and each reroute, with the window
    from whose start it applies (its ``t_apply_ns``). A reroute made for a migration (reason ``migrate``) is kept:
    the page draws it with its migration."""
    vault = _vault_core(arch)
    dt_ns = window_ms * 1e6
    out: list[dict[str, Any]] = []
    for r in _read_csv(run_dir / "runtime/overlay_migrate.csv"):
        w = int(int(r["t_apply_ns"]) // dt_ns)
        if r["obj_type"] == "weight":
            src, dst, kind = vault(r["src"]), vault(r["dst"]), "shard"
        else:
            src, dst, kind = int(r["src"]), int(r["dst"]), "migrate"
        out.append({"window": w, "kind": kind, "obj": r["obj_id"], "from": src, "to": dst,
                    "bytes": int(float(r["size_bytes"] or 0)), "src": r["src"], "dst": r["dst"]})
    for r in _read_csv(run_dir / "runtime/overlay_reroute.csv"):
        w = int(int(r["t_apply_ns"]) // dt_ns)
        try:
            objs = json.loads(r["mb_ids_json"] or "[]")
        except ValueError:
            objs = []
        out.append({"window": w, "kind": "reroute", "obj": ",".join(str(o) for o in objs), "from": int(r["from_core"]),
                    "to": int(r["to_core"]), "reason": r["reason"], "scope": r["scope"]})
    out = [m for m in out if m["window"] < upto]
    out.sort(key=lambda m: (m["window"], m["kind"] != "migrate"))
    return out


def expert_map(run_dir: Path, arch: ArchConfig, window_ms: float, window: int, span: int,
               committed: int) -> dict[str, Any]:
    """The experts on each core and the weight shards in each vault as they are during ``window`` (the placement
    with every migration applied from window 0 through ``window``), and the moves of the ``span`` windows up to it.
    ``committed``: the run's committed windows (moves beyond are not shown)."""
    X, Y = arch.mesh.cores
    n_cores = X * Y
    placement_file = run_dir / PLACEMENT_FILE
    plc = json.loads(placement_file.read_text(encoding="utf-8")) if placement_file.is_file() else {"experts": {}}
    experts: dict[str, list[int]] = {e: list(p.get("cores") or []) for e, p in plc.get("experts", {}).items()}
    banks: dict[str, str] = {t: p["dram_bank"] for t, p in (plc.get("tensors") or {}).items() if "dram_bank" in p}
    all_moves = moves(run_dir, arch, window_ms, committed)
    for m in all_moves:
        if m["window"] > window:
            break
        if m["kind"] == "migrate":
            cores = experts.get(m["obj"], [])
            experts[m["obj"]] = [m["to"] if c == m["from"] else c for c in cores] if m["from"] in cores else [m["to"]]
        elif m["kind"] == "shard":
            banks[m["obj"]] = m["dst"]
    by_core: list[list[str]] = [[] for _ in range(n_cores)]
    for e, cores in experts.items():
        for c in cores:
            if 0 <= c < n_cores:
                by_core[c].append(e)
    vault = _vault_core(arch)
    shards = [0] * n_cores
    for b in banks.values():
        c = vault(b)
        if 0 <= c < n_cores:
            shards[c] += 1
    recent = [m for m in all_moves if window - span < m["window"] <= window]
    return {"window": window, "mesh": [X, Y], "experts": by_core, "shards": shards,
            "moves": recent[-MAX_MOVES:], "moves_shown_from": max(0, window - span + 1),
            "moves_total": sum(1 for m in all_moves if m["window"] <= window), "moves_dropped":
            max(0, len(recent) - MAX_MOVES)}


def moves_between(all_moves: Iterable[dict[str, Any]], a: int, b: int) -> list[dict[str, Any]]:
    """The moves applied from the start of windows ``a .. b-1``."""
    return [m for m in all_moves if a <= m["window"] < b]
