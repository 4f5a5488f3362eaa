"""Recorded routing traces: expert selections captured from a real model, replayed instead of Zipf draws.

**The format** (one row per token and MoE layer):

| column | type | meaning |
|---|---|---|
| ``token`` | int ≥ 0 | the token's position in arrival order |
| ``layer`` | int ≥ 0 | the model's layer index (an MoE layer of the model the workload names) |
| ``experts`` | k distinct ints ≥ 0 | the selected routed experts |
| ``gates`` | k floats ≥ 0, optional | their gate weights |

- CSV: header ``token,layer,experts[,gates]``; lists space-separated in the cell: ``3,1,5 17,0.61 0.39``.
- JSONL: one object per line, ``{"token": 3, "layer": 1, "experts": [5, 17], "gates": [0.61, 0.39]}``.
- Parquet: columns ``token``, ``layer`` (integers), ``experts`` (list of integers), ``gates`` (list of floats).

Every (token, layer) pair appears once and every token has a row for every layer in the file (tokens × layers is a
full rectangle); k is the same on every row. Tokens are renumbered in ascending order (gaps allowed).

**Importers** for the shapes people publish:
- ``ids-json``: ``{"layers": [l0, l1, ...] (optional, default 0..L-1), "tokens": [[[e, ...] per layer] per token]}``
  (per-token expert ids per layer; a bare list of tokens is accepted too);
- ``topk-parquet``: one row per token with ``topk_ids_<layer>`` / ``topk_probs_<layer>`` list columns, or a long
  table with ``token_id``, ``layer_id``, ``topk_ids`` and optional ``topk_probs`` (a ``.parquet`` file without a
  ``token`` column and with ``topk_ids`` columns is read with this importer).

Errors are ``BadInput`` naming the file, the row (1-based data row; the line for CSV/JSONL) and the column (an id
past the model's experts: the token, the layer and the column). A trace holds at most ``MAX_IDS`` expert ids
(documented bound: 2·10⁸, 1.6 GB as int64); a token, layer or expert number beyond ``MAX_INT`` (2⁶² − 1), a null inside
a Parquet list and a row with more cells than the CSV header are refused. A UTF-8 byte-order mark is ignored.

**Replay**: micro-batch ``m`` slot ``i`` uses trace token ``(m·T + i) mod N`` (the trace wraps when the run is longer;
``ReplayStream.wraps_after_mb``). **Statistics** (``routing_stats``), per layer over the tokens: tokens per expert
``c_e``; ``skew = max c / mean c``; ``cv = std c / mean c``; reuse at lag ``d`` = mean over tokens ``t`` of
``|S_t ∩ S_{t+d}| / k`` (``S_t`` the experts of token ``t``: the expert-reuse rate of consecutive tokens for ``d = 1``).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.errors import BadInput

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
MAX_IDS = 200_000_000
MAX_INT = (1 << 62) - 1  # token, layer and expert numbers (int64 with room): a larger one is refused, not wrapped
FORMATS = ("csv", "jsonl", "parquet", "ids-json", "topk-parquet")


@dataclass(frozen=True)
class RecordedRouting:
    layers: IntArray  # (L,) model layer indices, ascending, distinct
    experts: IntArray  # (N, L, k) expert ids, each row sorted ascending
    gates: FloatArray | None  # (N, L, k) gate weights aligned with ``experts``, or None
    source: str

    @property
    def n_tokens(self) -> int:
        return int(self.experts.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.experts.shape[1])

    @property
    def topk(self) -> int:
        return int(self.experts.shape[2])


def _bad(src: str, where: str, problem: str) -> BadInput:
    return BadInput(f"{src}: {where}: {problem}", field="routing.trace")


# --- assembling rows into the rectangle ------------------------------------------------------------------------
def _assemble(src: str, token: IntArray, layer: IntArray, experts: IntArray, gates: FloatArray | None,
              row_label: str = "row") -> RecordedRouting:
    """(rows,) token/layer + (rows, k) experts/gates -> the (N, L, k) rectangle, checked."""
    n = len(token)
    if n == 0:
        raise _bad(src, "file", "no rows")
    if experts.size > MAX_IDS:
        raise _bad(src, "file", f"{experts.size} expert ids; at most {MAX_IDS}")
    for name, col in (("token", token), ("layer", layer)):
        neg = np.flatnonzero(col < 0)
        if neg.size:
            raise _bad(src, f"{row_label} {int(neg[0]) + 1}", f"column {name}: must be >= 0, got {int(col[neg[0]])}")
    neg = np.flatnonzero((experts < 0).any(axis=1))
    if neg.size:
        raise _bad(src, f"{row_label} {int(neg[0]) + 1}", "column experts: ids must be >= 0")
    order = np.argsort(experts, axis=1, kind="stable")
    experts = np.take_along_axis(experts, order, axis=1)
    dup = np.flatnonzero((np.diff(experts, axis=1) == 0).any(axis=1)) if experts.shape[1] > 1 else np.empty(0, int)
    if dup.size:
        raise _bad(src, f"{row_label} {int(dup[0]) + 1}", "column experts: an expert is selected twice")
    if gates is not None:
        if not np.isfinite(gates).all() or (gates < 0).any():
            r = int(np.flatnonzero(~(np.isfinite(gates) & (gates >= 0)).all(axis=1))[0])
            raise _bad(src, f"{row_label} {r + 1}", "column gates: must be finite and >= 0")
        gates = np.take_along_axis(gates, order, axis=1)
    layers, l_idx = np.unique(layer, return_inverse=True)
    tokens, t_idx = np.unique(token, return_inverse=True)
    N, L, k = len(tokens), len(layers), experts.shape[1]
    cell = t_idx.astype(np.int64) * L + l_idx
    seen = np.zeros(N * L, dtype=np.int64)
    np.add.at(seen, cell, 1)
    if (seen > 1).any():
        c = int(np.flatnonzero(seen > 1)[0])
        r = int(np.flatnonzero(cell == c)[1])
        raise _bad(src, f"{row_label} {r + 1}", f"token {int(tokens[c // L])} layer {int(layers[c % L])} appears "
                                                "twice")
    if (seen == 0).any():
        c = int(np.flatnonzero(seen == 0)[0])
        raise _bad(src, "file", f"token {int(tokens[c // L])} has no row for layer {int(layers[c % L])} (every "
                                "token needs a row for every layer in the file)")
    out = np.empty((N * L, k), dtype=np.int64)
    out[cell] = experts
    g3: FloatArray | None = None
    if gates is not None:
        g = np.empty((N * L, k), dtype=np.float64)
        g[cell] = gates
        g3 = g.reshape(N, L, k)
    return RecordedRouting(layers=layers.astype(np.int64), experts=out.reshape(N, L, k), gates=g3, source=src)


def _ragged(src: str, lists: Sequence[Any], column: str, row_label: str, first_row: int = 1,
            as_float: bool = False) -> npt.NDArray[Any]:
    """A list of equal-length lists -> (rows, k) array; errors name the row."""
    if not lists:
        return np.empty((0, 0), dtype=np.float64 if as_float else np.int64)
    k = len(lists[0]) if isinstance(lists[0], (list, tuple)) else -1
    for i, row in enumerate(lists):
        if isinstance(row, (list, tuple)) and not row:
            raise _bad(src, f"{row_label} {i + first_row}", f"column {column}: no values (an empty list)")
        if not isinstance(row, (list, tuple)) or len(row) != k:
            if k < 0:
                raise _bad(src, f"{row_label} {i + first_row}", f"column {column}: a list expected, got "
                                                                f"{type(row).__name__}")
            got = len(row) if isinstance(row, (list, tuple)) else type(row).__name__
            raise _bad(src, f"{row_label} {i + first_row}", f"column {column}: {k} values expected (the first "
                                                            f"row's), got {got}")
        for v in row:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            if not ok or (not as_float and not (math.isfinite(v) and float(v).is_integer())):
                raise _bad(src, f"{row_label} {i + first_row}",
                           f"column {column}: {'numbers' if as_float else 'integers'} expected, got {v!r}")
            if not as_float and abs(v) > MAX_INT:
                raise _bad(src, f"{row_label} {i + first_row}", f"column {column}: {v!r} is too large")
    return np.asarray(lists, dtype=np.float64 if as_float else np.int64)


# --- canonical readers -----------------------------------------------------------------------------------------
def _read_csv(p: Path) -> RecordedRouting:
    src = p.name
    text = p.read_text(encoding="utf-8-sig")  # a spreadsheet's byte-order mark is not part of the header
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise _bad(src, "file", "empty")
    header = [h.strip() for h in header]
    for col in ("token", "layer", "experts"):
        if col not in header:
            raise _bad(src, "line 1", f"missing column {col!r} (header: {','.join(header)})")
    it, il, ie = header.index("token"), header.index("layer"), header.index("experts")
    ig = header.index("gates") if "gates" in header else None
    tok: list[int] = []
    lay: list[int] = []
    exp: list[list[int]] = []
    gat: list[list[float]] = []
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        try:
            if len(row) != len(header):
                raise ValueError(f"{len(header)} columns expected (the header's), got {len(row)}")
            tok.append(_int(row[it], "token"))
            lay.append(_int(row[il], "layer"))
            exp.append([_int(x, "experts") for x in row[ie].split()])
            if ig is not None:
                gat.append([_float(x, "gates") for x in row[ig].split()])
        except ValueError as exc:
            raise _bad(src, f"line {line}", str(exc)) from None
    experts = _ragged(src, exp, "experts", "line", 2)
    gates = _ragged(src, gat, "gates", "line", 2, as_float=True) if ig is not None else None
    _same_width(src, experts, gates, "line", 2)
    return _assemble(src, np.asarray(tok, dtype=np.int64), np.asarray(lay, dtype=np.int64), experts, gates,
                     "data row")


def _int(text: str, column: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"column {column}: integer expected, got {text!r}") from None
    if abs(v) > MAX_INT:
        raise ValueError(f"column {column}: {text.strip()} is too large")
    return v


def _float(text: str, column: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"column {column}: number expected, got {text!r}") from None


def _same_width(src: str, experts: npt.NDArray[Any], gates: npt.NDArray[Any] | None, label: str,
                first: int) -> None:
    if gates is not None and gates.shape != experts.shape:
        raise _bad(src, f"{label} {first}", f"column gates: {gates.shape[1] if gates.ndim == 2 else 0} values, "
                                            f"experts has {experts.shape[1]}")


def _read_jsonl(p: Path) -> RecordedRouting:
    src = p.name
    tok: list[int] = []
    lay: list[int] = []
    exp: list[Any] = []
    gat: list[Any] = []
    has_gates: bool | None = None
    with p.open(encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise _bad(src, f"line {line}", f"malformed JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise _bad(src, f"line {line}", "a JSON object expected")
            for col in ("token", "layer", "experts"):
                if col not in obj:
                    raise _bad(src, f"line {line}", f"missing column {col!r}")
            for col in ("token", "layer"):
                v = obj[col]
                if not isinstance(v, int) or isinstance(v, bool):
                    raise _bad(src, f"line {line}", f"column {col}: integer expected, got {v!r}")
                if abs(v) > MAX_INT:
                    raise _bad(src, f"line {line}", f"column {col}: {v} is too large")
            if has_gates is None:
                has_gates = "gates" in obj
            if ("gates" in obj) != has_gates:
                raise _bad(src, f"line {line}", "column gates: given on some rows only")
            tok.append(obj["token"])
            lay.append(obj["layer"])
            exp.append(obj["experts"])
            if has_gates:
                gat.append(obj["gates"])
    experts = _ragged(src, exp, "experts", "data row")
    gates = _ragged(src, gat, "gates", "data row", as_float=True) if has_gates else None
    _same_width(src, experts, gates, "data row", 1)
    return _assemble(src, np.asarray(tok, dtype=np.int64), np.asarray(lay, dtype=np.int64), experts, gates,
                     "data row")


def _parquet_table(p: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(p)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise _bad(p.name, "file", f"not a readable Parquet file ({type(exc).__name__}: {exc})") from None


def _list_column(src: str, table: Any, name: str, *, as_float: bool) -> npt.NDArray[Any]:
    import pyarrow as pa

    col = table.column(name).combine_chunks()
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        raise _bad(src, "file", f"column {name}: a list column expected, got {col.type}")
    values = col.values
    want = pa.types.is_floating(values.type) or pa.types.is_integer(values.type) if as_float else \
        pa.types.is_integer(values.type)
    if not want:
        raise _bad(src, "file", f"column {name}: {'numbers' if as_float else 'integers'} expected, got "
                                f"{values.type}")
    if col.null_count:
        raise _bad(src, f"row {int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0]) + 1}",
                   f"column {name}: empty (null)")
    offsets = np.asarray(col.offsets)
    if values.null_count:  # a null inside a list (pyarrow would hand it over as NaN, then a garbage integer)
        inner = values.slice(offsets[0], offsets[-1] - offsets[0]).is_null().to_numpy(zero_copy_only=False)
        first = int(np.flatnonzero(inner)[0]) + int(offsets[0])
        r = int(np.searchsorted(offsets, first, side="right")) - 1
        raise _bad(src, f"row {r + 1}", f"column {name}: empty (null) value in the list")
    lengths = np.diff(offsets)
    if len(lengths) and (lengths != lengths[0]).any():
        r = int(np.flatnonzero(lengths != lengths[0])[0])
        raise _bad(src, f"row {r + 1}", f"column {name}: {lengths[0]} values expected (the first row's), got "
                                        f"{lengths[r]}")
    k = int(lengths[0]) if len(lengths) else 0
    if k == 0 and len(lengths):
        raise _bad(src, "row 1", f"column {name}: empty list")
    arr = np.asarray(values.slice(offsets[0], offsets[-1] - offsets[0]).to_numpy(zero_copy_only=False))
    if not as_float and arr.size and arr.dtype.kind == "u" and int(arr.max()) > MAX_INT:
        r = int(np.flatnonzero(arr > MAX_INT)[0]) // k
        raise _bad(src, f"row {r + 1}", f"column {name}: {int(arr.max())} is too large")
    return arr.astype(np.float64 if as_float else np.int64).reshape(len(lengths), k)


def _int_column(src: str, table: Any, name: str) -> IntArray:
    import pyarrow as pa

    col = table.column(name).combine_chunks()
    if not pa.types.is_integer(col.type):
        raise _bad(src, "file", f"column {name}: integers expected, got {col.type}")
    if col.null_count:
        raise _bad(src, "file", f"column {name}: has empty (null) cells")
    arr = np.asarray(col.to_numpy(zero_copy_only=False))
    if arr.size and arr.dtype.kind == "u" and int(arr.max()) > MAX_INT:
        raise _bad(src, f"row {int(np.argmax(arr)) + 1}", f"column {name}: {int(arr.max())} is too large")
    return arr.astype(np.int64)


def _read_parquet(p: Path) -> RecordedRouting:
    src, t = p.name, _parquet_table(p)
    for col in ("token", "layer", "experts"):
        if col not in t.column_names:
            raise _bad(src, "file", f"missing column {col!r} (columns: {', '.join(t.column_names)})")
    experts = _list_column(src, t, "experts", as_float=False)
    gates = _list_column(src, t, "gates", as_float=True) if "gates" in t.column_names else None
    _same_width(src, experts, gates, "row", 1)
    return _assemble(src, _int_column(src, t, "token"), _int_column(src, t, "layer"), experts, gates)


# --- importers -------------------------------------------------------------------------------------------------
def _import_ids_json(p: Path) -> RecordedRouting:
    src = p.name
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise _bad(src, f"line {exc.lineno}", f"malformed JSON: {exc.msg}") from None
    if isinstance(doc, list):
        doc = {"tokens": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), list):
        raise _bad(src, "file", "expected {\"tokens\": [[[expert ids] per layer] per token]} or that list")
    tokens = doc["tokens"]
    if not tokens:
        raise _bad(src, "file", "no tokens")
    if not isinstance(tokens[0], list):
        raise _bad(src, "token 0", f"a list of per-layer expert id lists expected, got {type(tokens[0]).__name__}")
    L = len(tokens[0])
    layers = doc.get("layers", list(range(L)))
    if not isinstance(layers, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_INT
                                               for x in layers):
        raise _bad(src, "layers", "a list of layer indices (integers >= 0) expected")
    flat: list[Any] = []
    for t, per_layer in enumerate(tokens):
        if not isinstance(per_layer, list) or len(per_layer) != len(layers):
            raise _bad(src, f"token {t}", f"{len(layers)} layers expected (the layers list), got "
                                          f"{len(per_layer) if isinstance(per_layer, list) else 'no list'}")
        flat.extend(per_layer)
    experts = _ragged(src, flat, "experts", "entry")
    N = len(tokens)
    token = np.repeat(np.arange(N, dtype=np.int64), len(layers))
    layer = np.tile(np.asarray(layers, dtype=np.int64), N)
    return _assemble(src, token, layer, experts, None, "entry")


def _import_topk_parquet(p: Path) -> RecordedRouting:
    src, t = p.name, _parquet_table(p)
    names = t.column_names
    if "topk_ids" in names:  # the long shape
        for col in ("token_id", "layer_id"):
            if col not in names:
                raise _bad(src, "file", f"missing column {col!r} (columns: {', '.join(names)})")
        experts = _list_column(src, t, "topk_ids", as_float=False)
        gates = _list_column(src, t, "topk_probs", as_float=True) if "topk_probs" in names else None
        _same_width(src, experts, gates, "row", 1)
        return _assemble(src, _int_column(src, t, "token_id"), _int_column(src, t, "layer_id"), experts, gates)
    id_cols = sorted((c for c in names if c.startswith("topk_ids_")), key=lambda c: int(c.rsplit("_", 1)[1])
                     if c.rsplit("_", 1)[1].isdigit() else -1)
    if not id_cols:
        raise _bad(src, "file", "no topk_ids column (a long table: token_id, layer_id, topk_ids[, topk_probs]; or "
                                f"wide: topk_ids_<layer>[, topk_probs_<layer>]); columns: {', '.join(names)}")
    layers: list[int] = []
    exps: list[npt.NDArray[Any]] = []
    gts: list[npt.NDArray[Any]] = []
    for c in id_cols:
        suffix = c.rsplit("_", 1)[1]
        if not suffix.isdigit():
            raise _bad(src, "file", f"column {c}: the suffix must be a layer index")
        layers.append(int(suffix))
        e = _list_column(src, t, c, as_float=False)
        _check_rows(src, c, e, as_float=False)  # here, where the row and the column are known
        exps.append(e)
        pc = f"topk_probs_{suffix}"
        if pc in names:
            g = _list_column(src, t, pc, as_float=True)
            _check_rows(src, pc, g, as_float=True)
            gts.append(g)
    if gts and len(gts) != len(exps):
        raise _bad(src, "file", "topk_probs_<layer> columns are given for some layers only")
    k = exps[0].shape[1]
    for c, e in zip(id_cols, exps, strict=True):
        if e.shape[1] != k:
            raise _bad(src, "row 1", f"column {c}: {e.shape[1]} values, {id_cols[0]} has {k}")
    N = t.num_rows
    experts = np.stack(exps, axis=1).reshape(N * len(layers), k)
    gates = np.stack(gts, axis=1).reshape(N * len(layers), -1) if gts else None
    if gates is not None and gates.shape != experts.shape:
        raise _bad(src, "row 1", "topk_probs columns: as many values as topk_ids expected")
    token = np.repeat(np.arange(N, dtype=np.int64), len(layers))
    layer = np.tile(np.asarray(layers, dtype=np.int64), N)
    return _assemble(src, token, layer, experts, gates)


def _check_rows(src: str, column: str, a: npt.NDArray[Any], *, as_float: bool) -> None:
    """Per-row checks of one (rows, k) list column (the wide top-k table: one column per layer)."""
    bad = ~(np.isfinite(a) & (a >= 0)) if as_float else (a < 0)
    if bad.any():
        r = int(np.flatnonzero(bad.any(axis=1))[0])
        raise _bad(src, f"row {r + 1}", f"column {column}: {'gates must be finite and' if as_float else 'ids must be'}"
                                        " >= 0")
    if not as_float and a.shape[1] > 1:
        srt = np.sort(a, axis=1)
        dup = np.flatnonzero((np.diff(srt, axis=1) == 0).any(axis=1))
        if dup.size:
            raise _bad(src, f"row {int(dup[0]) + 1}", f"column {column}: an expert is selected twice")


_READERS = {"csv": _read_csv, "jsonl": _read_jsonl, "parquet": _read_parquet, "ids-json": _import_ids_json,
            "topk-parquet": _import_topk_parquet}
_BY_SUFFIX = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet", ".json": "ids-json"}


def read_routing(path: str | Path, fmt: str | None = None) -> RecordedRouting:
    """Read a recorded routing trace in the canonical format or an importer's shape (``fmt``; default by suffix)."""
    p = Path(path)
    fmt = fmt or _BY_SUFFIX.get(p.suffix.lower())
    if fmt == "parquet" and p.is_file():  # a published top-k table: no token column, topk_ids columns
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(p).names
        except Exception:  # unreadable: the reader below says so, naming the file
            names = []
        if "token" not in names and any(n.startswith("topk_ids") for n in names):
            fmt = "topk-parquet"
    if fmt not in _READERS:
        raise BadInput(f"{p.name}: unknown trace format {fmt or p.suffix!r}; one of {', '.join(FORMATS)}",
                       field="routing.trace_format")
    if not p.is_file():
        raise BadInput(f"{p.name}: file not found", field="routing.trace")
    try:
        return _READERS[fmt](p)
    except UnicodeDecodeError:
        raise _bad(p.name, "file", "not UTF-8 text") from None


def write_routing(rec: RecordedRouting, path: str | Path) -> None:
    """Write ``rec`` in the canonical format chosen by the suffix (.csv, .jsonl, .parquet)."""
    p = Path(path)
    N, L, k = rec.experts.shape
    token = np.repeat(np.arange(N), L)
    layer = np.tile(rec.layers, N)
    ex = rec.experts.reshape(N * L, k)
    g = rec.gates.reshape(N * L, k) if rec.gates is not None else None
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols: dict[str, Any] = {"token": pa.array(token, pa.int64()), "layer": pa.array(layer, pa.int64()),
                                "experts": pa.array(list(ex), pa.list_(pa.int32()))}
        if g is not None:
            cols["gates"] = pa.array(list(g), pa.list_(pa.float32()))
        pq.write_table(pa.table(cols), p, compression="zstd")
        return
    if suffix == ".jsonl":
        with p.open("w", encoding="utf-8") as f:
            for i in range(N * L):
                obj: dict[str, Any] = {"token": int(token[i]), "layer": int(layer[i]), "experts": ex[i].tolist()}
                if g is not None:
                    obj["gates"] = [round(float(x), 6) for x in g[i]]
                f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        return
    if suffix == ".csv":
        with p.open("w", encoding="utf-8", newline="") as f:
            f.write("token,layer,experts" + (",gates" if g is not None else "") + "\n")
            for i in range(N * L):
                row = f"{token[i]},{layer[i]}," + " ".join(map(str, ex[i].tolist()))
                if g is not None:
                    row += "," + " ".join(f"{x:.6g}" for x in g[i].tolist())
                f.write(row + "\n")
        return
    raise BadInput(f"{p.name}: write .csv, .jsonl or .parquet", field="path")


# --- against a model, replay, statistics -----------------------------------------------------------------------
def check_against_model(rec: RecordedRouting, *, moe_layers: Sequence[int], n_experts: int, topk: int) -> None:
    """The trace fits the workload's model: its layers are exactly the model's MoE layers, ids < experts, k = top-k."""
    have, want = [int(x) for x in rec.layers], [int(x) for x in moe_layers]
    extra = sorted(set(have) - set(want))
    if extra:
        raise BadInput(f"routing.trace {rec.source}: column layer: layer {extra[0]} is not an MoE layer of the model "
                       f"(its MoE layers: {_short(want)})", field="routing.trace")
    missing = sorted(set(want) - set(have))
    if missing:
        raise BadInput(f"routing.trace {rec.source}: no selections for MoE layer {missing[0]} (the trace has "
                       f"layers {_short(have)}; the model's MoE layers are {_short(want)})", field="routing.trace")
    if rec.topk != topk:
        raise BadInput(f"routing.trace {rec.source}: column experts: {rec.topk} experts per token, routing.topk is "
                       f"{topk}", field="routing.trace")
    over = rec.experts >= n_experts
    if over.any():
        t, j, i = (int(x) for x in np.argwhere(over)[0])
        raise BadInput(f"routing.trace {rec.source}: token {t} layer {int(rec.layers[j])}: column experts: expert "
                       f"id {int(rec.experts[t, j, i])} >= the model's {n_experts} routed experts (ids 0.."
                       f"{n_experts - 1})", field="routing.trace")


def _short(xs: Sequence[int]) -> str:
    return ", ".join(map(str, xs)) if len(xs) <= 8 else f"{', '.join(map(str, xs[:6]))}, ... {xs[-1]}"


class ReplayStream:
    """The recorded selections as a ``RoutingStream``: ``take(n_mb)`` -> (n_mb, n_layers, T, k), rows sorted."""

    def __init__(self, rec: RecordedRouting, *, moe_layers: Sequence[int], n_experts: int, topk: int,
                 tokens: int) -> None:
        check_against_model(rec, moe_layers=moe_layers, n_experts=n_experts, topk=topk)
        order = np.searchsorted(rec.layers, np.asarray(moe_layers, dtype=np.int64))
        self._experts = np.ascontiguousarray(rec.experts[:, order, :])  # (N, L, k) in the model's layer order
        self.E, self.k, self.T = n_experts, topk, tokens
        self.n_layers = len(moe_layers)
        self.position = 0
        self.wraps_after_mb = rec.n_tokens // tokens  # micro-batches before the trace repeats

    def take(self, n_mb: int) -> IntArray:
        N = self._experts.shape[0]
        idx = (np.arange(self.position * self.T, (self.position + n_mb) * self.T, dtype=np.int64)) % N
        out = self._experts[idx].reshape(n_mb, self.T, self.n_layers, self.k).transpose(0, 2, 1, 3)
        self.position += n_mb
        return np.ascontiguousarray(out)

    def tokens_at(self, offset: int, n: int) -> IntArray:
        """The recorded choices of the tokens at positions ``[offset, offset + n)`` of the replay (the file's tokens
        in order, repeated from its start past its end), (n_layers, n, k): what `take` gives those slots."""
        if offset < 0 or n < 0:
            raise ValueError(f"tokens_at: offset ({offset}) and n ({n}) must be >= 0")
        idx = (offset + np.arange(n, dtype=np.int64)) % self._experts.shape[0]
        return np.ascontiguousarray(self._experts[idx].transpose(1, 0, 2))

    def probabilities(self) -> FloatArray:
        """(n_layers, E) share of each expert's selections over the whole trace."""
        N, L, k = self._experts.shape
        counts = np.zeros((L, self.E), dtype=np.float64)
        for j in range(L):
            counts[j] = np.bincount(self._experts[:, j, :].ravel(), minlength=self.E)
        out: FloatArray = counts / (N * k)
        return out


def routing_stats(experts: IntArray, n_experts: int, *, lag: int = 1) -> dict[str, list[float]]:
    """Per layer of an (N, L, k) selection array: ``skew`` (max/mean tokens per expert), ``cv`` (std/mean) and
    ``reuse`` (mean |S_t ∩ S_{t+lag}| / k over t; 0 when N <= lag)."""
    N, L, k = experts.shape
    skew, cv, reuse = [], [], []
    for j in range(L):
        c = np.bincount(experts[:, j, :].ravel(), minlength=n_experts).astype(np.float64)
        mean = c.mean()
        skew.append(float(c.max() / mean) if mean > 0 else 0.0)
        cv.append(float(c.std() / mean) if mean > 0 else 0.0)
        if lag < N:
            a, b = experts[:-lag, j, :], experts[lag:, j, :]
            common = (a[:, :, None] == b[:, None, :]).any(axis=2).sum(axis=1)
            reuse.append(float(common.mean() / k))
        else:
            reuse.append(0.0)
    return {"skew": skew, "cv": cv, "reuse": reuse}
