"""HotSpot file formats: floorplans (.flp), layer configuration (.lcf), power traces (.ptrace), config files and
temperature files (``-init_file`` / ``-steady_file``), plus the writers of HotSpot's outputs.

Formats as HotSpot 7 reads and writes them (``flp.c: read_flp``, ``temperature_grid.c: parse_layer_file,
read_temp_grid, dump_temp_grid, dump_steady_temp_grid``, ``hotspot.c: read_names / read_vals / write_vals``).
Every parse error is a ``BadInput`` naming the file, line, block or layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shared.errors import BadInput

DELTA = 1.0e-6  # HotSpot util.h: tolerance of eq()


@dataclass(frozen=True)
class Floorplan:
    """Blocks of one layer: name, width, height, left x, bottom y (m)."""

    names: tuple[str, ...]
    width: np.ndarray
    height: np.ndarray
    leftx: np.ndarray
    bottomy: np.ndarray
    source: str = ""
    has_materials: bool = False  # extra columns (per-block heat capacity / resistivity, used by -detailed_3D)
    # per block, NaN where the line has no material columns: volumetric heat capacity J/(m³·K), resistivity m·K/W
    rho_c: np.ndarray | None = None
    resistivity: np.ndarray | None = None
    lines: tuple[int, ...] = ()  # the line of each block in its file (error messages name it)

    def where(self, u: int) -> str:
        """``file:line`` of block ``u`` (the file alone when the floorplan was not read from one)."""
        return f"{self.source}:{self.lines[u]}" if self.lines else self.source

    @property
    def n_units(self) -> int:
        return len(self.names)

    def total_width(self) -> float:
        return float(np.max(self.leftx + self.width) - np.min(self.leftx))

    def total_height(self) -> float:
        return float(np.max(self.bottomy + self.height) - np.min(self.bottomy))

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise BadInput(f"{self.source}: unit {name!r} not found in the floorplan", field=name) from None


def _data_lines(text: str) -> list[tuple[int, list[str]]]:
    out = []
    for no, line in enumerate(text.splitlines(), start=1):
        tok = line.split()
        if not tok or tok[0].startswith("#"):
            continue
        out.append((no, tok))
    return out


def parse_flp(text: str, source: str = "<flp>") -> Floorplan:
    names: list[str] = []
    vals: list[list[float]] = []
    mats: list[tuple[float, float]] = []
    lines: list[int] = []
    extra = False
    for no, tok in _data_lines(text):
        extra = extra or len(tok) > 5
        if len(tok) not in (5, 7):  # HotSpot's read_flp: 5 fields, or 7 with <specific-heat> <resistivity>
            raise BadInput(f"{source}:{no}: expected <name> <width> <height> <left-x> <bottom-y> "
                           "[<specific-heat> <resistivity>]", field=source)
        mat = (math.nan, math.nan)
        if len(tok) == 7:
            try:
                mat = (float(tok[5]), float(tok[6]))
            except ValueError:
                raise BadInput(f"{source}:{no}: block {tok[0]}: non-numeric material", field=tok[0]) from None
            if not all(math.isfinite(x) and x > 0 for x in mat):
                raise BadInput(f"{source}:{no}: block {tok[0]}: specific heat and resistivity must be finite and "
                               "> 0", field=tok[0])
        mats.append(mat)
        try:
            v = [float(x) for x in tok[1:5]]
        except ValueError:
            raise BadInput(f"{source}:{no}: block {tok[0]}: non-numeric dimension", field=tok[0]) from None
        if not all(math.isfinite(x) for x in v):
            raise BadInput(f"{source}:{no}: block {tok[0]}: non-finite dimension", field=tok[0])
        if v[0] <= 0 or v[1] <= 0:
            raise BadInput(f"{source}:{no}: block {tok[0]}: width and height must be > 0", field=tok[0])
        if tok[0] in names:
            raise BadInput(f"{source}:{no}: block {tok[0]} defined twice", field=tok[0])
        names.append(tok[0])
        vals.append(v)
        lines.append(no)
    if not names:
        raise BadInput(f"{source}: no blocks in floorplan", field=source)
    a = np.array(vals)
    m = np.array(mats)
    flp = Floorplan(tuple(names), a[:, 0], a[:, 1], a[:, 2], a[:, 3], source, extra,
                    m[:, 0] if extra else None, m[:, 1] if extra else None, tuple(lines))
    check_overlaps(flp)
    return flp


def check_overlaps(flp: Floorplan) -> None:
    """Two blocks of one layer may touch but not overlap (HotSpot warns "overlap of functional blocks?")."""
    x0, x1 = flp.leftx, flp.leftx + flp.width
    y0, y1 = flp.bottomy, flp.bottomy + flp.height
    ow = np.minimum(x1[:, None], x1[None, :]) - np.maximum(x0[:, None], x0[None, :])
    oh = np.minimum(y1[:, None], y1[None, :]) - np.maximum(y0[:, None], y0[None, :])
    area = np.clip(ow, 0, None) * np.clip(oh, 0, None)
    np.fill_diagonal(area, 0.0)
    small = np.minimum.outer(flp.width * flp.height, flp.width * flp.height)
    bad = np.argwhere(np.triu(area > DELTA * small))
    if bad.size:
        a, b = bad[0]
        line_a = f" (line {flp.lines[a]})" if flp.lines else ""
        raise BadInput(f"{flp.where(b)}: blocks {flp.names[a]}{line_a} and {flp.names[b]} overlap", field=flp.names[a])


def read_flp(path: Path) -> Floorplan:
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInput(f"cannot read floorplan {path}: {exc.strerror}", field=str(path)) from None
    return parse_flp(text, str(path))


@dataclass(frozen=True)
class LcfLayer:
    no: int
    lateral: bool
    power: bool
    rho_c: float  # J/(m^3 K)
    resistivity: float  # (m K)/W
    thickness: float  # m
    flp_file: str


def parse_lcf(text: str, source: str = "<lcf>") -> list[LcfLayer]:
    """Layers in groups of 7 fields (HotSpot ``parse_layer_file``), sorted by layer number."""
    lines = _data_lines(text)
    if len(lines) % 7:
        raise BadInput(f"{source}: {len(lines)} fields, expected 7 per layer", field=source)
    layers: list[LcfLayer] = []
    for g in range(0, len(lines), 7):
        grp = lines[g:g + 7]
        no_line = grp[0][0]
        tok = [t[1][0] for t in grp]
        where = f"{source}:{no_line}"
        try:
            no = int(tok[0])
        except ValueError:
            raise BadInput(f"{where}: invalid layer number {tok[0]!r}", field="layer") from None
        flags = []
        for k in (1, 2):
            c = tok[k][:1].upper()
            if c not in ("Y", "N"):
                raise BadInput(f"{where}: layer {no}: expected Y or N, got {tok[k]!r}", field=f"layer {no}")
            flags.append(c == "Y")
        try:
            rho_c, res, thick = float(tok[3]), float(tok[4]), float(tok[5])
        except ValueError:
            raise BadInput(f"{where}: layer {no}: material names are not supported; give heat capacity, "
                           "resistivity and thickness as numbers", field=f"layer {no}") from None
        for label, v in (("heat capacity", rho_c), ("resistivity", res), ("thickness", thick)):
            if not (math.isfinite(v) and v > 0):
                raise BadInput(f"{where}: layer {no}: {label} must be > 0 (got {v:g})", field=f"layer {no}")
        layers.append(LcfLayer(no, flags[0], flags[1], rho_c, res, thick, tok[6]))
    nos = sorted(x.no for x in layers)
    if nos != list(range(len(layers))):
        raise BadInput(f"{source}: layer numbers must be unique and run from 0 to {len(layers) - 1}, got {nos}",
                       field="layer")
    if not layers:
        raise BadInput(f"{source}: no layers", field=source)
    return sorted(layers, key=lambda x: x.no)


def parse_config_pairs(text: str, source: str = "<config>") -> list[tuple[str, str, int]]:
    """``-name value`` lines (HotSpot ``read_str_pairs``) with their line numbers; comments start with ``#``."""
    out = []
    for no, tok in _data_lines(text):
        if len(tok) < 2:
            raise BadInput(f"{source}:{no}: expected '-name value'", field=tok[0])
        out.append((tok[0].lstrip("-"), tok[1], no))
    return out


@dataclass(frozen=True)
class PowerTrace:
    names: tuple[str, ...]
    values: np.ndarray  # (steps, blocks) W
    header_line: int = 1  # the line of the block names


def parse_ptrace(text: str, source: str = "<ptrace>") -> PowerTrace:
    lines = _data_lines(text)
    if not lines:
        raise BadInput(f"{source}: empty power trace", field=source)
    header, names = lines[0][0], tuple(lines[0][1])
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise BadInput(f"{source}:{header}: block {dup} appears twice in the header", field=dup)
    rows = []
    for no, tok in lines[1:]:
        if len(tok) != len(names):
            raise BadInput(f"{source}:{no}: {len(tok)} values for {len(names)} blocks", field=f"line {no}")
        try:
            v = [float(x) for x in tok]
        except ValueError:
            raise BadInput(f"{source}:{no}: non-numeric power value", field=f"line {no}") from None
        arr = np.array(v)
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise BadInput(f"{source}:{no}: block {names[bad[0]]}: power is {tok[bad[0]]} (not a number)",
                           field=names[bad[0]])
        neg = np.flatnonzero(arr < 0)
        if neg.size:
            raise BadInput(f"{source}:{no}: block {names[neg[0]]}: negative power {arr[neg[0]]:g} W",
                           field=names[neg[0]])
        rows.append(arr)
    if not rows:
        raise BadInput(f"{source}: no power numbers in trace file", field=source)
    return PowerTrace(names, np.vstack(rows), header)


def parse_temp_file(text: str, source: str = "<temperatures>") -> dict[str, float]:
    """``<name>\\t<K>`` lines (a block steady file or an init file)."""
    out: dict[str, float] = {}
    for no, tok in _data_lines(text):
        if len(tok) < 2:
            raise BadInput(f"{source}:{no}: expected '<name> <temperature>'", field=f"line {no}")
        try:
            v = float(tok[1])
        except ValueError:
            raise BadInput(f"{source}:{no}: {tok[0]}: non-numeric temperature", field=tok[0]) from None
        if not (math.isfinite(v) and v > 0):
            raise BadInput(f"{source}:{no}: {tok[0]}: temperature must be a positive number of kelvin",
                           field=tok[0])
        out[tok[0]] = v
    return out


# ---------------------------------------------------------------------------------------------------------------
# block <-> grid maps (temperature_grid.c: set_bgmap, xlate_vector_b2g, xlate_temp_g2b)

def _tolerant_ceil(v: np.ndarray) -> np.ndarray:
    near = np.floor(v + 0.5)
    return np.where(np.abs(v - near) < DELTA, near, np.ceil(v)).astype(int)


def _tolerant_floor(v: np.ndarray) -> np.ndarray:
    near = np.floor(v + 0.5)
    return np.where(np.abs(v - near) < DELTA, near, np.floor(v)).astype(int)


class CellMap:
    """A sparse linear map between cells and blocks, held as CSR arrays (row pointers, column indices, values): what
    the block <-> cell maps need (``@`` on vectors, row sums, column selection, dense form) without importing
    scipy.sparse, whose import (~0.1 s) was a third of a whole ``tasmoe hotspot`` run. ``@``: ``y_r = sum_k v_k x_c``
    over the entries ``(r, c, v)`` of row ``r`` (np.bincount)."""

    def __init__(self, data: np.ndarray, rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int]) -> None:
        order = np.argsort(rows, kind="stable")
        self.shape = shape
        self.data = np.asarray(data, dtype=float)[order]
        self.indices = np.asarray(cols, dtype=np.intp)[order]
        self.row = np.asarray(rows, dtype=np.intp)[order]
        self.indptr = np.searchsorted(self.row, np.arange(shape[0] + 1))

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.bincount(self.row, weights=self.data * np.asarray(x)[self.indices],
                                      minlength=self.shape[0])
        return out

    def row_sums(self) -> np.ndarray:
        out: np.ndarray = np.bincount(self.row, weights=self.data, minlength=self.shape[0])
        return out

    def columns(self, keep: np.ndarray) -> CellMap:
        """The map restricted to the columns ``keep`` (renumbered 0..len(keep)-1 in that order)."""
        new = np.full(self.shape[1], -1, dtype=np.intp)
        new[keep] = np.arange(len(keep))
        sel = new[self.indices] >= 0
        return CellMap(self.data[sel], self.row[sel], new[self.indices[sel]], (self.shape[0], len(keep)))

    def scale_columns(self, s: np.ndarray) -> CellMap:
        return CellMap(self.data * np.asarray(s)[self.indices], self.row, self.indices, self.shape)

    def toarray(self) -> np.ndarray:
        out = np.zeros(self.shape)
        out[self.row, self.indices] = self.data
        return out


@dataclass(frozen=True)
class BlockMap:
    """Block <-> cell maps of one layer on a ``rows × cols`` grid over ``width × height``.

    ``occ`` (cells × blocks): fraction of each cell covered by each block. ``power`` (cells × blocks): W per cell
    per W of block power (area share). ``avg`` (blocks × cells): block temperature = mean of the cells its
    bounding grid box touches (HotSpot's ``grid_map_mode avg``). ``boxes`` (blocks × 4): i1, i2, j1, j2.
    """

    occ: CellMap
    power: CellMap
    avg: CellMap
    boxes: np.ndarray


def block_map(flp: Floorplan, width: float, height: float, rows: int, cols: int, layer: str = "") -> BlockMap:
    cw, ch = width / cols, height / rows
    lu, bu = flp.leftx, flp.bottomy
    ru, tu = lu + flp.width, bu + flp.height
    tol = DELTA * max(width, height)
    outside = np.flatnonzero((lu < -tol) | (bu < -tol) | (ru > width + tol) | (tu > height + tol))
    if outside.size:
        u = outside[0]
        raise BadInput(f"{flp.where(u)}: layer {layer}: block {flp.names[u]} lies outside the die "
                       f"({width * 1e3:g} mm x {height * 1e3:g} mm)", field=flp.names[u])
    i1 = rows - _tolerant_ceil(tu / ch)
    i2 = rows - _tolerant_floor(bu / ch)
    j1 = _tolerant_floor(lu / cw)
    j2 = _tolerant_ceil(ru / cw)
    i1, j1 = np.maximum(i1, 0), np.maximum(j1, 0)
    i2, j2 = np.minimum(i2, rows), np.minimum(j2, cols)
    # every block's bounding box of cells, all blocks at once: entry k of block u is cell (i1 + k // nj, j1 + k % nj)
    ni, nj = np.maximum(i2 - i1, 0), np.maximum(j2 - j1, 0)
    counts = ni * nj
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        u = empty[0]
        raise BadInput(f"{flp.where(u)}: block {flp.names[u]} covers no grid cell", field=flp.names[u])
    U = np.repeat(np.arange(flp.n_units), counts)
    k = np.arange(U.size) - np.repeat(np.cumsum(counts) - counts, counts)
    ii, jj = i1[U] + k // nj[U], j1[U] + k % nj[U]
    lc, rc = jj * cw, (jj + 1) * cw
    tc, bc = height - ii * ch, height - (ii + 1) * ch
    oh = np.minimum(tu[U], tc) - np.maximum(bu[U], bc)
    ow = np.minimum(ru[U], rc) - np.maximum(lu[U], lc)
    oh = np.where(np.abs(oh / ch) < DELTA, 0.0, np.where(np.abs(oh / ch - 1) < DELTA, ch, oh))
    ow = np.where(np.abs(ow / cw) < DELTA, 0.0, np.where(np.abs(ow / cw - 1) < DELTA, cw, ow))
    occ = np.clip(oh, 0, None) * np.clip(ow, 0, None) / (ch * cw)
    R = ii * cols + jj
    occ_m = CellMap(occ, R, U, (rows * cols, flp.n_units))
    block_area = flp.width * flp.height
    pw = occ_m.scale_columns((cw * ch) / block_area)
    avg = CellMap(1.0 / counts[U], U, R, (flp.n_units, rows * cols))
    return BlockMap(occ_m, pw, avg, np.stack([i1, i2, j1, j2], axis=1))


# ---------------------------------------------------------------------------------------------------------------
# writers

def format_block_steady(layer_prefixes: Sequence[str], floorplans: Sequence[Floorplan],
                        block_temps: Sequence[np.ndarray], ring: np.ndarray) -> str:
    """``dump_temp_grid``: ``<prefix><block>\\t%.2f`` per layer and block, then ``inode_<i>``."""
    out: list[str] = []
    for pre, flp, temps in zip(layer_prefixes, floorplans, block_temps, strict=True):
        out.extend(f"{pre}{n}\t{t:.2f}" for n, t in zip(flp.names, temps, strict=True))
    out.extend(f"inode_{i}\t{t:.2f}" for i, t in enumerate(ring))
    return "\n".join(out) + "\n"


def format_grid_steady(cells: np.ndarray) -> str:
    """``dump_steady_temp_grid``: ``Layer n:`` then ``<i·cols+j>\\t%.2f`` for every cell of every layer."""
    L = cells.shape[0]
    flat = cells.reshape(L, -1)
    out = []
    idx = np.arange(flat.shape[1])
    for n in range(L):
        out.append(f"Layer {n}:")
        out.extend(f"{i}\t{t:.2f}" for i, t in zip(idx, flat[n], strict=True))
    return "\n".join(out) + "\n"


def format_ttrace(names: Sequence[str], rows: np.ndarray) -> str:
    """Header of block names, then one line of block temperatures (K, %.2f) per step."""
    out = ["\t".join(names)]
    out.extend("\t".join(f"{v:.2f}" for v in row) for row in rows)
    return "\n".join(out) + "\n"


def parse_ttrace(text: str, source: str = "<ttrace>") -> tuple[tuple[str, ...], np.ndarray]:
    lines = _data_lines(text)
    names = tuple(lines[0][1])
    vals = np.array([[float(x) for x in tok] for _, tok in lines[1:]])
    return names, vals


def parse_grid_steady(text: str) -> np.ndarray:
    """(layers, cells) from a grid steady file."""
    layers: list[list[float]] = []
    for line in text.splitlines():
        if line.startswith("Layer"):
            layers.append([])
        elif line.strip():
            layers[-1].append(float(line.split()[1]))
    return np.array(layers)
