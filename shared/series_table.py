"""A run's per-window series as one table: ``<out>/<scenario>/<workload>.series.csv.gz`` (one owner: the orchestrator
writes it when an experiment finishes, ``tasmoe`` and a researcher's own tools read it).

Every window of the run, in window order, one row each; gzip-compressed CSV with a header (pandas:
``pd.read_csv(path)``; numpy: `read_series_table`). The warm-up pass is not in it: window 0 is the first measured
window. Columns, in this order (SI-derived units in the names; temperatures in °C):

========================================  ==========================================================================
``window``, ``t_start_ms``, ``dt_ms``      the window and its interval of simulated time
``T_peak_logic``, ``T_peak_dram``          the hottest thermal-grid cell of the logic die / of all DRAM dies
``T_mean_logic``, ``T_mean_dram``          cell means
``power_w``                                mean chip power over the window (W)
``refresh_mhz``, ``bytes_moved``,          DRAM refresh rate, bytes moved to and from DRAM, effective bandwidth
``bw_eff_gbps``
``tokens_completed``, ``lat_count``,       tokens completed in the window and their latencies (count, mean, max;
``lat_mean_ms``, ``lat_max_ms``            every sample is in the run database and in the reduced result row)
``queue_delay_ms``, ``migrations``,        mean queueing delay, TACS migrations started, age of the oldest token
``oldest_inflight_ms``                     in flight
``freq_mean_ghz``, ``freq_min_ghz``        core clock over the cores
``noc_util_mean``, ``noc_util_max``        NoC link utilisation over the links
``requests_arrived``, ``requests_shed``,   served requests (0 in a fixed-arrival run): arrived in the window, of
``requests_done``                          those refused by the full queue, finished in the window
``requests_waiting``, ``requests_running`` admitted requests at the window end, before / after their first token
``tokens_offered``, ``tokens_shed``,       output tokens of the requests that arrived, of the refused ones, and not
``tokens_queued``                          yet generated of the admitted requests at the window end (with
                                           ``tokens_completed``: the token balance, shared/token_balance.py)
``ttft_p99_ms``, ``tpot_p99_ms``           p99 time to first token / per output token (>= 2 tokens) of the requests
                                           finished in the window (services/metrics/reduce.py); empty: none
``power_<component>_w``                    mean power by component (`PowerBreakdown`: logic_dynamic, spm,
                                           logic_leakage, dram_dynamic, dram_refresh, dram_leakage, noc,
                                           dram_controller), when the run reports it
``power_die_<die>_w``                      mean power by die (logic, dram_1 ...), when reported
``T_core_<i>``                             per core (row-major on the mesh: core = y * X + x), the core's mean
``P_core_<i>_w``                           per core, the mean power of its area of the logic die (W), when reported
``T_dram_<l>_max``, ``T_dram_<l>_mean``    per DRAM layer l (0 = next to the logic die): hottest and mean vault
========================================  ==========================================================================

Numbers are written with 7 significant digits (``%.7g``: 1e-5 K at 50 °C); an absent value is an empty field.
The same windows give the same bytes (the gzip header carries no name and no time).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shared.contracts.thermal import PowerBreakdown
from shared.errors import BadInput, NotFound

SUFFIX = ".series.csv.gz"
SCALARS: tuple[str, ...] = ("window", "t_start_ms", "dt_ms", "T_peak_logic", "T_peak_dram", "T_mean_logic",
                            "T_mean_dram", "power_w", "refresh_mhz", "bytes_moved", "bw_eff_gbps", "tokens_completed",
                            "lat_count", "lat_mean_ms", "lat_max_ms", "queue_delay_ms", "migrations",
                            "oldest_inflight_ms", "freq_mean_ghz", "freq_min_ghz", "noc_util_mean", "noc_util_max",
                            "requests_arrived", "requests_shed", "requests_done", "requests_waiting",
                            "requests_running", "tokens_offered", "tokens_shed", "tokens_queued", "ttft_p99_ms",
                            "tpot_p99_ms")
_COUNTS = ("requests_arrived", "requests_shed", "requests_waiting", "requests_running", "tokens_offered",
           "tokens_shed", "tokens_queued")
POWER_COMPONENTS: tuple[str, ...] = tuple(PowerBreakdown.model_fields)


def series_path(out_dir: Path, scenario: str, workload: str) -> Path:
    return Path(out_dir) / scenario / f"{workload}{SUFFIX}"


def columns_for(first: Mapping[str, Any]) -> list[str]:
    """The header for a run whose first window (JSON form of `WindowMetrics`) is ``first``."""
    cols = list(SCALARS)
    if isinstance(first.get("power"), dict):
        cols += [f"power_{c}_w" for c in POWER_COMPONENTS]
    cols += [f"power_die_{d}_w" for d in sorted(first.get("power_layer_w") or {}, key=_die_order)]
    cols += [f"T_core_{i}" for i in range(len(first.get("temps_core_c") or []))]
    cols += [f"P_core_{i}_w" for i in range(len(first.get("power_core_w") or []))]
    banks = first.get("temps_bank_c") or []
    n_layers = len(banks[0]) if banks else 0
    for layer in range(n_layers):
        cols += [f"T_dram_{layer}_max", f"T_dram_{layer}_mean"]
    return cols


def _die_order(name: str) -> tuple[int, str]:
    """logic first, then dram_1, dram_2 ... in numeric order."""
    head, _, tail = name.rpartition("_")
    return (0, name) if name == "logic" else (int(tail) if tail.isdigit() else 10**6, head or name)


def _num(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool | int | np.integer):
        return str(int(v))
    f = float(v)
    return "" if not math.isfinite(f) else f"{f:.7g}"


def _request_p99_ms(done: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(p99 TTFT, p99 TPOT) in ms of a window's finished requests (JSON form of `RequestsDone`); None: none."""
    arrival = np.asarray(done.get("t_arrival_ns") or [], dtype=np.int64)
    if not arrival.size:
        return None, None
    first = np.asarray(done["t_first_token_ns"], dtype=np.int64)
    tokens = np.asarray(done["output_tokens"], dtype=np.int64)
    multi = tokens >= 2
    tpot_ms = (np.asarray(done["t_done_ns"], dtype=np.int64) - first)[multi] / (tokens[multi] - 1) / 1e6
    return (float(np.percentile((first - arrival) / 1e6, 99.0)),
            float(np.percentile(tpot_ms, 99.0)) if tpot_ms.size else None)


def row_of(w: Mapping[str, Any], cols: Sequence[str]) -> list[str]:
    """One table row of a window (JSON form of `WindowMetrics`) under the header ``cols``."""
    lat = [float(x) for x in w.get("latencies_ms") or []]
    freq = [float(x) for x in w.get("freq_ghz") or []]
    noc = [float(x) for x in w.get("noc_link_util") or []]
    vals: dict[str, Any] = {k: w.get(k) for k in SCALARS if k in w}
    vals.update(migrations=w.get("migrations", 0), lat_count=len(lat),
                lat_mean_ms=sum(lat) / len(lat) if lat else None, lat_max_ms=max(lat) if lat else None,
                freq_mean_ghz=sum(freq) / len(freq) if freq else None, freq_min_ghz=min(freq) if freq else None,
                noc_util_mean=sum(noc) / len(noc) if noc else None, noc_util_max=max(noc) if noc else None)
    done = w.get("requests_done") or {}
    vals.update({c: w.get(c, 0) for c in _COUNTS})
    vals["requests_done"] = len(done.get("request_id") or [])
    vals["ttft_p99_ms"], vals["tpot_p99_ms"] = _request_p99_ms(done)
    power = w.get("power")
    if isinstance(power, dict):
        vals.update({f"power_{c}_w": power.get(c) for c in POWER_COMPONENTS})
    vals.update({f"power_die_{d}_w": p for d, p in (w.get("power_layer_w") or {}).items()})
    vals.update({f"T_core_{i}": t for i, t in enumerate(w.get("temps_core_c") or [])})
    vals.update({f"P_core_{i}_w": p for i, p in enumerate(w.get("power_core_w") or [])})
    banks = np.asarray(w.get("temps_bank_c") or [], dtype=np.float64)
    if banks.ndim == 2 and banks.size:
        for layer in range(banks.shape[1]):
            vals[f"T_dram_{layer}_max"] = banks[:, layer].max()
            vals[f"T_dram_{layer}_mean"] = banks[:, layer].mean()
    return [_num(vals.get(c)) for c in cols]


class SeriesTableWriter:
    """Writes windows (JSON form of `WindowMetrics`, in window order) to a ``.series.csv.gz`` file as they come:
    ``add(chunk)`` any number of times, then ``close()``, which renames the temporary file over ``path`` (atomic;
    no window: no file). A context manager closes it; an exception inside drops the temporary file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._raw = self._tmp.open("wb")
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0)
        self._text = io.TextIOWrapper(self._gz, encoding="utf-8", newline="")
        self._out = csv.writer(self._text, lineterminator="\n")
        self._cols: list[str] | None = None
        self.n = 0

    def add(self, chunk: Iterable[Mapping[str, Any]]) -> None:
        for w in chunk:
            if self._cols is None:
                self._cols = columns_for(w)
                self._out.writerow(self._cols)
            self._out.writerow(row_of(w, self._cols))
            self.n += 1

    def _shut(self) -> None:
        self._text.close()  # closes the gzip stream, which does not close the raw file it was given
        self._raw.close()

    def close(self) -> int:
        self._shut()
        if self.n == 0:
            self._tmp.unlink()
        else:
            self._tmp.replace(self.path)
        return self.n

    def __enter__(self) -> SeriesTableWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._shut()
            self._tmp.unlink(missing_ok=True)


def write_series_table(path: Path, chunks: Iterable[Sequence[Mapping[str, Any]]]) -> int:
    """Write the windows (JSON form of `WindowMetrics`, streamed in chunks in window order) to ``path``, atomically.
    Returns the number of windows; no window writes no file."""
    with SeriesTableWriter(path) as w:
        for chunk in chunks:
            w.add(chunk)
    return w.n


def read_series_table(path: Path) -> dict[str, np.ndarray]:
    """Column name -> float64 array (NaN where a field is empty) of a ``.series.csv.gz`` file."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"{path}: no such file", field="series")
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise BadInput(f"{path}: empty series table", field="series")
            rows = [[float(x) if x else math.nan for x in r] for r in reader]
    except (OSError, EOFError, ValueError) as exc:
        raise BadInput(f"{path}: not a series table ({exc})", field="series") from None
    if any(len(r) != len(header) for r in rows):
        raise BadInput(f"{path}: rows of different widths than the header", field="series")
    data = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(header))
    return {c: data[:, i] for i, c in enumerate(header)}
