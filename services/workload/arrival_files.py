"""Where a serving workload's arrival trace (``serving.trace``) comes from, and how its file is read.

A **name**, never a path (a request cannot make a service read an arbitrary file): looked up in ``TASMOE_TRACES_DIR``
(default ``<configs_dir>/traces``, the folder of the recorded routing traces) and then among the packaged traces
(``serving_traces/``), as the file itself when the name ends in ``.csv`` or ``.jsonl``, else as ``<name>.csv`` and
then ``<name>.jsonl``. The public LLM serving traces are read as they are published, told apart by their CSV header
or their JSON keys:

=============================================  ==============================================  ======================
format                                         columns (keys)                                  arrival time
=============================================  ==============================================  ======================
Azure LLM inference trace 2023 and 2024        ``TIMESTAMP,ContextTokens,GeneratedTokens``     date and time (ISO
(Patel et al., ISCA 2024; Stojkovic et al.,                                                    8601; a UTC offset,
HPCA 2025)                                                                                     if any, on every row)
BurstGPT (Wang et al., arXiv 2401.17644),      ``Timestamp``, ``Request tokens``,              seconds
releases 1.1 and 2.0                           ``Response tokens`` (other columns ignored)
Mooncake (Qin et al., FAST 2025), JSONL        ``timestamp``, ``input_length``,                milliseconds
                                               ``output_length`` (other keys ignored)
the lab's own CSV                              ``arrival_s,prompt_tokens,output_tokens``       seconds
=============================================  ==============================================  ======================

Rows are requests in arrival order: times may repeat (BurstGPT's are whole seconds, Mooncake's whole milliseconds) but
never decrease, and every prompt and output has at least one token. One exception, as BurstGPT documents it: a row
with ``Response tokens`` 0 is a request that failed in production, and is left out (counted in ``dropped``).
Times become integer nanoseconds since the trace's first request; lengths are never changed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from services.workload.routing import FloatArray, IntArray
from services.workload.trace_folders import is_plain_name, names_in
from shared.errors import BadInput
from shared.lru import LRU
from shared.settings import Settings

SERVING_TRACES_DIR = Path(__file__).resolve().parent / "serving_traces"
ARRIVAL_SUFFIXES = (".csv", ".jsonl")
FIELD = "serving.trace"
ARRIVAL_CACHE_MAX = 4  # parsed traces kept: a week of the 2024 Azure trace is ~10^7 requests, 3 int64 each

AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT = ("Timestamp", "Request tokens", "Response tokens")
LAB = ("arrival_s", "prompt_tokens", "output_tokens")
MOONCAKE = ("timestamp", "input_length", "output_length")


@dataclass(frozen=True)
class ArrivalTrace:
    """An arrival trace: one row per request in arrival order."""

    name: str
    t_ns: IntArray  # arrival, ns since the trace's first request (non-decreasing)
    prompt_tokens: IntArray
    output_tokens: IntArray
    sha256: str  # of the file's bytes (in the trace id)
    fmt: str = "azure"  # which published format the file was read as (module docstring)
    dropped: int = 0  # rows left out: BurstGPT's failed requests


def _bad(path: Path, why: str) -> BadInput:
    return BadInput(f"{FIELD}: {path.name}: {why}", field=FIELD)


MAX_TIME_S = 1e9  # ~32 years of trace: beyond it a time is not a trace's (and int64 ns would overflow)
MAX_TOKENS = (1 << 31) - 1


def _times_from_datetimes(path: Path, stamps: pa.ChunkedArray) -> IntArray:
    """ISO 8601 date-times to ns: naive ones as they are, ones with a UTC offset (every row, e.g. the 2024 Azure
    trace's ``+00:00``) in UTC."""
    for typ in (pa.timestamp("ns"), pa.timestamp("ns", tz="UTC")):
        try:
            return np.asarray(pc.cast(stamps, typ).to_numpy(), dtype="datetime64[ns]").astype(np.int64)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    raise _bad(path, f"{AZURE[0]}: not ISO 8601 date-times, each with or each without a UTC offset")


def _seconds_to_ns(path: Path, column: str, seconds: FloatArray) -> IntArray:
    bad = ~np.isfinite(seconds) | (np.abs(seconds) > MAX_TIME_S)
    if bad.any():
        i = int(np.argmax(bad))
        raise _bad(path, f"{column}: request {i + 1}: {float(seconds[i]):g} is not a time in seconds (finite, at "
                         f"most {MAX_TIME_S:g})")
    return np.rint(seconds * 1e9).astype(np.int64)


def _read_csv_columns(path: Path, data: bytes, header: list[str], columns: tuple[str, ...],
                      types: tuple[pa.DataType, ...]) -> list[pa.ChunkedArray]:
    """``columns`` of the CSV ``data`` (its header ``header``, cells stripped), each with a value in every row."""
    try:
        table = pa_csv.read_csv(pa.BufferReader(data), read_options=pa_csv.ReadOptions(
            skip_rows=1, column_names=header), convert_options=pa_csv.ConvertOptions(
            include_columns=list(columns), column_types=dict(zip(columns, types, strict=True)),
            strings_can_be_null=True))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowKeyError, UnicodeDecodeError) as exc:
        raise _bad(path, f"cannot read it: {str(exc).splitlines()[0]}") from None
    cols = [table.column(c) for c in columns]
    for c, col in zip(columns, cols, strict=True):
        if col.null_count:
            row = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
            raise _bad(path, f"{c}: request {row + 1}: no value (an empty cell, or NaN, NA, null)")
    return cols


def _read_csv(path: Path, data: bytes) -> tuple[str, IntArray, IntArray, IntArray]:
    first = data.split(b"\n", 1)[0].decode("utf-8-sig", errors="replace")
    header = [c.strip().strip('"').strip() for c in first.rstrip("\r").split(",")]
    ints = (pa.int64(), pa.int64())
    if tuple(header) == AZURE:
        stamps, prompt, output = _read_csv_columns(path, data, header, AZURE, (pa.string(), *ints))
        t = _times_from_datetimes(path, stamps)
        fmt = "azure"
    elif all(c in header for c in BURSTGPT) or all(c in header for c in LAB):
        columns, fmt = (BURSTGPT, "burstgpt") if all(c in header for c in BURSTGPT) else (LAB, "lab")
        secs, prompt, output = _read_csv_columns(path, data, header, columns, (pa.float64(), *ints))
        t = _seconds_to_ns(path, columns[0], np.asarray(secs.to_numpy(), dtype=np.float64))
    else:
        raise _bad(path, f"unknown CSV header {','.join(header)[:120]!r}; the formats read: {','.join(AZURE)} "
                         f"(Azure), {', '.join(BURSTGPT)} among BurstGPT's columns, {','.join(LAB)}")
    return fmt, t, np.asarray(prompt.to_numpy(), dtype=np.int64), np.asarray(output.to_numpy(), dtype=np.int64)


def _number(value: object, *, whole: bool, top: float) -> float | None:
    """A JSON number (never a bool or a string), whole if asked, of at most ``top`` in size; None otherwise."""
    if type(value) not in (int, float):
        return None
    v = float(value)  # type: ignore[arg-type]
    if not np.isfinite(v) or abs(v) > top or (whole and not v.is_integer()):
        return None
    return v


def _read_jsonl(path: Path, data: bytes) -> tuple[str, IntArray, IntArray, IntArray]:
    rows: list[tuple[float, float, float]] = []
    limits = ((False, MAX_TIME_S * 1e3), (True, MAX_TOKENS), (True, MAX_TOKENS))
    for i, line in enumerate(data.removeprefix(b"\xef\xbb\xbf").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        vals = [_number(obj.get(k), whole=w, top=top) for k, (w, top) in zip(MOONCAKE, limits, strict=True)] \
            if isinstance(obj, dict) else [None]
        if any(v is None for v in vals):
            raise _bad(path, f"line {i}: needs a JSON object with numbers {', '.join(MOONCAKE)} (Mooncake's format: "
                             f"timestamp in ms, whole numbers of tokens)")
        rows.append((vals[0], vals[1], vals[2]))  # type: ignore[arg-type]
    if not rows:
        raise _bad(path, "no requests")
    arr = np.asarray(rows, dtype=np.float64)
    return "mooncake", np.rint(arr[:, 0] * 1e6).astype(np.int64), arr[:, 1].astype(np.int64), \
        arr[:, 2].astype(np.int64)


def read_arrival_trace(path: Path, name: str, data: bytes | None = None) -> ArrivalTrace:
    """The arrival trace in ``path`` (its bytes ``data`` if read already; module docstring for the formats);
    `BadInput` (field ``serving.trace``) naming the file and what is wrong with it."""
    data = path.read_bytes() if data is None else data
    fmt, t, prompt, output = _read_jsonl(path, data) if path.suffix == ".jsonl" else _read_csv(path, data)
    dropped = 0
    if fmt == "burstgpt":  # its failed requests: "Response tokens are 0s" (BurstGPT's README)
        keep = output != 0
        dropped = int((~keep).sum())
        t, prompt, output = t[keep], prompt[keep], output[keep]
    if len(t) < 2:
        raise _bad(path, f"needs at least two requests, has {len(t)}")
    for what, bad in (("arrival times must not decrease", np.diff(t) < 0),
                      ("every prompt needs at least one token", prompt < 1),
                      ("every output needs at least one token", output < 1)):
        if bad.any():
            raise _bad(path, f"{what} (request {int(np.argmax(bad)) + 1} of the file's {len(t)})")
    return ArrivalTrace(name=name, t_ns=t - t[0], prompt_tokens=prompt, output_tokens=output,
                        sha256=hashlib.sha256(data).hexdigest(), fmt=fmt, dropped=dropped)


class ArrivalFiles:
    """The arrival traces one workload service can offer: names in ``traces_dir`` (None: only the packaged ones),
    then in ``serving_traces/``; parsed traces in an LRU keyed by path, size and mtime (a trace is parsed once however
    many runs offer it; editing the file gives new trace ids, its SHA-256 being in them)."""

    def __init__(self, traces_dir: Path | None = None, cache_size: int = 8) -> None:
        self.traces_dir = traces_dir
        self._cache: LRU[tuple[str, int, int], ArrivalTrace] = LRU(max(1, int(cache_size)))

    @classmethod
    def from_settings(cls, settings: Settings) -> ArrivalFiles:
        """``TASMOE_TRACES_DIR`` (default ``<configs_dir>/traces``) and ``TASMOE_CACHE_SIZE`` of ``settings``."""
        return cls(settings.effective_traces_dir(), min(settings.cache_size, ARRIVAL_CACHE_MAX))

    def dirs(self) -> list[Path]:
        return [self.traces_dir, SERVING_TRACES_DIR] if self.traces_dir is not None else [SERVING_TRACES_DIR]

    def available(self) -> list[str]:
        """The names a config may give (file names without their suffix), of every folder."""
        return names_in(self.dirs(), ARRIVAL_SUFFIXES, stem=True)

    def path(self, name: str) -> Path:
        """The file ``name`` names; `BadInput` (field ``serving.trace``) listing the available ones otherwise."""
        if not is_plain_name(name):
            raise BadInput(f"serving.trace {name!r}: give a trace name (no path) in TASMOE_TRACES_DIR or a packaged "
                           "one", field=FIELD)
        files = [name] if name.endswith(ARRIVAL_SUFFIXES) else [name + s for s in ARRIVAL_SUFFIXES]
        for d in self.dirs():
            for f in files:
                try:
                    if (d / f).is_file():
                        return d / f
                except OSError:  # a name the file system cannot hold (too long for it): no such file
                    continue
        raise BadInput(f"serving.trace {name!r}: no such arrival trace in {', '.join(str(d) for d in self.dirs())}; "
                       f"available: {', '.join(self.available()) or 'none'}", field=FIELD)

    def load(self, name: str) -> ArrivalTrace:
        """The parsed trace ``name`` (cached by the size and mtime of the file as it was read)."""
        p = self.path(name)
        with p.open("rb") as fh:
            st = os.fstat(fh.fileno())
            key = (str(p), st.st_size, st.st_mtime_ns)
            hit = self._cache.get(key)
            if hit is None:
                hit = read_arrival_trace(p, name, fh.read())
                self._cache.put(key, hit)
        return hit
