"""The grid RC network of a 3D stack: ONE builder with two named variants.

Node order (HotSpot's): layer-major, then grid row ``i`` (0 = north edge, max y), then column ``j`` (0 = west edge);
``index = n·rows·cols + i·cols + j``; then the 12 package ring nodes in HotSpot's order
(``SP_W SP_E SP_N SP_S SINK_C_W SINK_C_E SINK_C_N SINK_C_S SINK_W SINK_E SINK_N SINK_S``).

Layers run from the one farthest from the heat sink (0) to the sink; the last two are always the heat spreader and
the heat sink, which use the die's grid over the die area (as in HotSpot); the parts of spreader and sink beyond the
die are the 12 ring nodes.

Variants (see ``../shared/reference/hotspot/README.md``):

- ``hotspot``: HotSpot 7's grid model exactly (``temperature_grid.c: populate_R_model_grid / populate_C_model_grid``,
  ``temperature.c: populate_package_R / populate_package_C``): every capacitance × C_FACTOR = 0.333, the vertical link
  between layer n and n+1 is the FULL rz of layer n, each sink cell reaches ambient through
  ``rz_sink + r_convec·s_sink²/(cw·ch)``. HotSpot's ``find_res`` uses rx for north/south neighbours and ry for
  east/west ones (identical for square cells); reproduced as is. ``detailed_3d`` gives ``-detailed_3D on``'s
  vertical links ``rz_n/2 + rz_{n+1}/2`` (``rz_0 + rz_1/2`` for layer 0).
- ``physical``: physical capacitances ``ρc·t·A`` (no fitting factor, c_convec share included only if given), vertical
  links as the series of two half cells ``rz_n/2 + rz_{n+1}/2``, sink cell to ambient ``rz_sink/2 + 1/(h·A_cell)``,
  lateral links along the physical direction. Package ring formulas as HotSpot's (without C_FACTOR).

Units: SI throughout (m, W/(m·K), J/(m³·K), K/W, W/K, J/K, K).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:  # imported where G is built: the spectral path never assembles it (scipy.sparse: ~0.1 s of start-up)
    import scipy.sparse as sp

C_FACTOR = 0.333  # HotSpot temperature.h: "fitting factor to match floworks (due to lumping)"
N_RING = 12
RING_NAMES = ("SP_W", "SP_E", "SP_N", "SP_S", "SINK_C_W", "SINK_C_E", "SINK_C_N", "SINK_C_S",
              "SINK_W", "SINK_E", "SINK_N", "SINK_S")
SP_W, SP_E, SP_N, SP_S, SINK_C_W, SINK_C_E, SINK_C_N, SINK_C_S, SINK_W, SINK_E, SINK_N, SINK_S = range(12)
LARGENUM = 1e40  # HotSpot's "positive infinity" resistance for layers without lateral heat flow

Variant = Literal["hotspot", "physical"]


@dataclass(frozen=True)
class LayerSpec:
    """One chip layer (die, TIM, ...): conductivity W/(m·K), volumetric heat capacity J/(m³·K), thickness m.

    ``k_cells`` / ``rho_c_cells`` (rows·cols values, row-major, row 0 = north edge): a laterally non-uniform layer,
    e.g. a chiplet smaller than the die with a filler around it, or HotSpot's ``-detailed_3D`` per-block materials.
    A network with such a layer is solved by the sparse direct solver (the spectral one needs uniform layers)."""

    name: str
    k: float
    rho_c: float
    thickness: float
    lateral: bool = True
    has_power: bool = True
    k_cells: tuple[float, ...] | None = None
    rho_c_cells: tuple[float, ...] | None = None

    @property
    def uniform(self) -> bool:
        return self.k_cells is None and self.rho_c_cells is None


@dataclass(frozen=True)
class PackageSpec:
    """HotSpot's package: square spreader and sink (side s, thickness t), convection r_convec (K/W over the whole
    sink top) and c_convec (J/K)."""

    s_spreader: float = 0.03
    t_spreader: float = 0.001
    k_spreader: float = 400.0
    p_spreader: float = 3.55e6
    s_sink: float = 0.06
    t_sink: float = 0.0069
    k_sink: float = 400.0
    p_sink: float = 3.55e6
    r_convec: float = 0.1
    c_convec: float = 140.4


@dataclass(frozen=True)
class NetworkSpec:
    layers: tuple[LayerSpec, ...]  # chip layers only, farthest from the sink first; spreader and sink are appended
    package: PackageSpec
    width: float  # die width (x), m
    height: float  # die height (y), m
    rows: int = 64
    cols: int = 64
    ambient: float = 318.15  # K
    variant: Variant = "hotspot"
    detailed_3d: bool = False

    def content_hash(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _getr(k: float, length: float, area: float) -> float:
    """HotSpot RCutil.c getr: R = length / (k·area)."""
    return length / (k * area)


@dataclass(frozen=True)
class PackageRC:
    """``populate_package_R`` / ``populate_package_C`` (temperature.c) for a die of ``width × height``."""

    r_sp1_x: float
    r_sp1_y: float
    r_hs1_x: float
    r_hs1_y: float
    r_hs2_x: float
    r_hs2_y: float
    r_hs: float
    r_sp_per_x: float
    r_sp_per_y: float
    r_hs_c_per_x: float
    r_hs_c_per_y: float
    r_hs_per: float
    r_amb_c_per_x: float
    r_amb_c_per_y: float
    r_amb_per: float
    c_sp_per_x: float
    c_sp_per_y: float
    c_hs_c_per_x: float
    c_hs_c_per_y: float
    c_hs_per: float
    c_amb_c_per_x: float
    c_amb_c_per_y: float
    c_amb_per: float

    @staticmethod
    def build(p: PackageSpec, width: float, height: float, c_factor: float) -> PackageRC:
        ssp, tsp, ssk, tsk = p.s_spreader, p.t_spreader, p.s_sink, p.t_sink
        ksp, ksk = p.k_spreader, p.k_sink
        w, h = width, height
        area_x = (ssp + h) * (ssp - w) / 4.0  # trapezoid of the spreader beyond the die, west/east
        area_y = (ssp + w) * (ssp - h) / 4.0  # north/south
        area_per = (ssk * ssk - ssp * ssp) / 4.0  # sink beyond the spreader, one side
        return PackageRC(
            r_sp1_x=_getr(ksp, (ssp - w) / 4.0, (ssp + 3 * h) / 4.0 * tsp),
            r_sp1_y=_getr(ksp, (ssp - h) / 4.0, (ssp + 3 * w) / 4.0 * tsp),
            r_hs1_x=_getr(ksk, (ssp - w) / 4.0, (ssp + 3 * h) / 4.0 * tsk),
            r_hs1_y=_getr(ksk, (ssp - h) / 4.0, (ssp + 3 * w) / 4.0 * tsk),
            r_hs2_x=_getr(ksk, (ssp - w) / 4.0, (3 * ssp + h) / 4.0 * tsk),
            r_hs2_y=_getr(ksk, (ssp - h) / 4.0, (3 * ssp + w) / 4.0 * tsk),
            r_hs=_getr(ksk, (ssk - ssp) / 4.0, (ssk + 3 * ssp) / 4.0 * tsk),
            r_sp_per_x=_getr(ksp, tsp, area_x),
            r_sp_per_y=_getr(ksp, tsp, area_y),
            r_hs_c_per_x=_getr(ksk, tsk, area_x),
            r_hs_c_per_y=_getr(ksk, tsk, area_y),
            r_hs_per=_getr(ksk, tsk, area_per),
            r_amb_c_per_x=p.r_convec * (ssk * ssk) / area_x,
            r_amb_c_per_y=p.r_convec * (ssk * ssk) / area_y,
            r_amb_per=p.r_convec * (ssk * ssk) / area_per,
            c_sp_per_x=c_factor * p.p_spreader * tsp * area_x,
            c_sp_per_y=c_factor * p.p_spreader * tsp * area_y,
            c_hs_c_per_x=c_factor * p.p_sink * tsk * area_x,
            c_hs_c_per_y=c_factor * p.p_sink * tsk * area_y,
            c_hs_per=c_factor * p.p_sink * tsk * area_per,
            c_amb_c_per_x=c_factor * p.c_convec / (ssk * ssk) * area_x,
            c_amb_c_per_y=c_factor * p.c_convec / (ssk * ssk) * area_y,
            c_amb_per=c_factor * p.c_convec / (ssk * ssk) * area_per,
        )


@dataclass(frozen=True)
class RingEdge:
    """Every cell on one edge of one layer links to one ring node with conductance ``g`` (W/K per cell)."""

    layer: int
    side: Literal["W", "E", "N", "S"]
    ring: int
    g: float


@dataclass(frozen=True)
class CellLinks:
    """Per-cell conductances and capacitances of a network with a laterally non-uniform layer (W/K, J/K)."""

    g_ns: np.ndarray  # (L, rows-1, cols) between rows i and i+1
    g_ew: np.ndarray  # (L, rows, cols-1) between columns j and j+1
    g_z: np.ndarray  # (L-1, rows, cols) between layer n and n+1
    cap: np.ndarray  # (L, rows·cols)


@dataclass(frozen=True)
class RCNetwork:
    """A grid network: per layer one lateral conductance per direction and one capacitance per cell, uniform vertical
    links, uniform sink-to-ambient links, plus the package ring (the only non-uniform part) — or, when a layer is
    laterally non-uniform, per-cell values in ``cells`` (the per-layer arrays then hold the layers' own materials)."""

    spec: NetworkSpec
    names: tuple[str, ...]  # layer names incl. "spreader", "sink"
    g_ns: np.ndarray  # (L,) W/K between north/south neighbours (rows i, i+1)
    g_ew: np.ndarray  # (L,) W/K between east/west neighbours (cols j, j+1)
    g_z: np.ndarray  # (L-1,) W/K between layer n and n+1, per cell
    g_amb_cell: float  # W/K from each sink cell to ambient
    cap: np.ndarray  # (L,) J/K per cell
    ring_edges: tuple[RingEdge, ...]
    ring_links: tuple[tuple[int, int, float], ...]  # (ring a, ring b, W/K)
    ring_g_amb: np.ndarray  # (12,) W/K to ambient
    ring_cap: np.ndarray  # (12,) J/K
    package_rc: PackageRC = field(repr=False)
    cells: CellLinks | None = field(default=None, repr=False)

    @property
    def uniform(self) -> bool:
        """Every layer laterally uniform (the spectral solver applies)."""
        return self.cells is None

    @property
    def n_layers(self) -> int:
        return len(self.names)

    @property
    def rows(self) -> int:
        return self.spec.rows

    @property
    def cols(self) -> int:
        return self.spec.cols

    @property
    def n_cells(self) -> int:
        return self.n_layers * self.rows * self.cols

    @property
    def n_nodes(self) -> int:
        return self.n_cells + N_RING

    @property
    def ambient(self) -> float:
        return self.spec.ambient

    @property
    def cell_area(self) -> float:
        return (self.spec.width / self.cols) * (self.spec.height / self.rows)

    def edge_cells(self, edge: RingEdge) -> np.ndarray:
        """Node indices of the cells on ``edge``."""
        r, c = self.rows, self.cols
        base = edge.layer * r * c
        if edge.side == "N":
            return base + np.arange(c)
        if edge.side == "S":
            return base + (r - 1) * c + np.arange(c)
        if edge.side == "W":
            return base + np.arange(r) * c
        return base + np.arange(r) * c + (c - 1)

    @cached_property
    def g_amb(self) -> np.ndarray:
        """(n_nodes,) conductance of each node to ambient, W/K."""
        g = np.zeros(self.n_nodes)
        sink = self.n_layers - 1
        nrc = self.rows * self.cols
        g[sink * nrc:(sink + 1) * nrc] = self.g_amb_cell
        g[self.n_cells:] = self.ring_g_amb
        return g

    @cached_property
    def capacitance(self) -> np.ndarray:
        """(n_nodes,) J/K."""
        nrc = self.rows * self.cols
        if self.cells is not None:
            return np.concatenate([self.cells.cap.reshape(-1), self.ring_cap])
        return np.concatenate([np.repeat(self.cap, nrc), self.ring_cap])

    @cached_property
    def conductance(self) -> sp.csr_matrix:
        """G (n_nodes × n_nodes, W/K): the weighted graph Laplacian of all links plus diag(g_amb); ``G·T = P +
        g_amb·T_amb`` in steady state."""
        L, r, c = self.n_layers, self.rows, self.cols
        idx = np.arange(L * r * c).reshape(L, r, c)
        a_list: list[np.ndarray] = []
        b_list: list[np.ndarray] = []
        g_list: list[np.ndarray] = []
        # north/south neighbours
        a, b = idx[:, :-1, :], idx[:, 1:, :]
        a_list.append(a.ravel())
        b_list.append(b.ravel())
        cl = self.cells
        g_list.append((cl.g_ns if cl is not None else np.broadcast_to(self.g_ns[:, None, None], a.shape)).ravel())
        a, b = idx[:, :, :-1], idx[:, :, 1:]
        a_list.append(a.ravel())
        b_list.append(b.ravel())
        g_list.append((cl.g_ew if cl is not None else np.broadcast_to(self.g_ew[:, None, None], a.shape)).ravel())
        a, b = idx[:-1], idx[1:]
        a_list.append(a.ravel())
        b_list.append(b.ravel())
        g_list.append((cl.g_z if cl is not None else np.broadcast_to(self.g_z[:, None, None], a.shape)).ravel())
        n0 = self.n_cells
        for e in self.ring_edges:
            cells = self.edge_cells(e)
            a_list.append(cells)
            b_list.append(np.full(cells.shape, n0 + e.ring))
            g_list.append(np.full(cells.shape, e.g))
        for ra, rb, g in self.ring_links:
            a_list.append(np.array([n0 + ra]))
            b_list.append(np.array([n0 + rb]))
            g_list.append(np.array([g]))
        A = np.concatenate(a_list)
        B = np.concatenate(b_list)
        Gv = np.concatenate(g_list)
        n = self.n_nodes
        diag = np.bincount(A, Gv, n) + np.bincount(B, Gv, n) + self.g_amb
        rows = np.concatenate([A, B, np.arange(n)])
        cols = np.concatenate([B, A, np.arange(n)])
        vals = np.concatenate([-Gv, -Gv, diag])
        import scipy.sparse as sp

        return sp.csr_matrix(sp.coo_matrix((vals, (rows, cols)), shape=(n, n)))

    def heat_to_ambient(self, T: np.ndarray) -> float:
        """W leaving the network to ambient for node temperatures ``T`` (K)."""
        return float(np.dot(self.g_amb, T - self.ambient))


def build_network(spec: NetworkSpec) -> RCNetwork:
    """Build the RC network of ``spec`` (both variants; see the module docstring)."""
    if spec.rows < 2 or spec.cols < 2:
        raise ValueError("grid must have at least 2 rows and 2 columns")
    p = spec.package
    if spec.width > p.s_spreader or spec.height > p.s_spreader or p.s_spreader > p.s_sink:
        raise ValueError("die must fit in the spreader and the spreader in the sink (inordinate floorplan size)")
    hotspot = spec.variant == "hotspot"
    cf = C_FACTOR if hotspot else 1.0
    cw = spec.width / spec.cols
    ch = spec.height / spec.rows
    layers = [*spec.layers,
              LayerSpec("spreader", p.k_spreader, p.p_spreader, p.t_spreader, True, False),
              LayerSpec("sink", p.k_sink, p.p_sink, p.t_sink, True, False)]
    for layer in layers:
        if not (layer.thickness > 0 and layer.k > 0 and layer.rho_c > 0):
            raise ValueError(f"layer {layer.name}: thickness, conductivity and heat capacity must be > 0")
    L = len(layers)
    rx = np.array([_getr(x.k, cw, ch * x.thickness) if x.lateral else LARGENUM for x in layers])
    ry = np.array([_getr(x.k, ch, cw * x.thickness) if x.lateral else LARGENUM for x in layers])
    rz = np.array([_getr(x.k, x.thickness, cw * ch) for x in layers])
    r_conv_cell = p.r_convec * (p.s_sink * p.s_sink) / (cw * ch)
    if hotspot:
        # find_res: i differs (north/south) -> rx/2 + rx/2; j differs (east/west) -> ry/2 + ry/2
        g_ns, g_ew = 1.0 / rx, 1.0 / ry
        g_amb_cell = 1.0 / (rz[-1] + r_conv_cell)  # the sink's rz includes its share of r_convec
    else:
        g_ns, g_ew = 1.0 / ry, 1.0 / rx  # physical: north/south spacing is ch
        g_amb_cell = 1.0 / (rz[-1] / 2 + r_conv_cell)
    r_link = _vertical_resistance(spec, rz, r_conv_cell)
    cap = _capacitance(np.array([x.rho_c for x in layers]), np.array([x.thickness for x in layers]), cf, cw, ch, p)

    pk = PackageRC.build(p, spec.width, spec.height, cf)
    sp_i, hs_i = L - 2, L - 1
    nr, nc = spec.rows, spec.cols
    edges = (
        RingEdge(sp_i, "N", SP_N, 1.0 / (ry[sp_i] / 2 + nc * pk.r_sp1_y)),
        RingEdge(sp_i, "S", SP_S, 1.0 / (ry[sp_i] / 2 + nc * pk.r_sp1_y)),
        RingEdge(sp_i, "W", SP_W, 1.0 / (rx[sp_i] / 2 + nr * pk.r_sp1_x)),
        RingEdge(sp_i, "E", SP_E, 1.0 / (rx[sp_i] / 2 + nr * pk.r_sp1_x)),
        RingEdge(hs_i, "N", SINK_C_N, 1.0 / (ry[hs_i] / 2 + nc * pk.r_hs1_y)),
        RingEdge(hs_i, "S", SINK_C_S, 1.0 / (ry[hs_i] / 2 + nc * pk.r_hs1_y)),
        RingEdge(hs_i, "W", SINK_C_W, 1.0 / (rx[hs_i] / 2 + nr * pk.r_hs1_x)),
        RingEdge(hs_i, "E", SINK_C_E, 1.0 / (rx[hs_i] / 2 + nr * pk.r_hs1_x)),
    )
    links = (
        (SP_W, SINK_C_W, 1.0 / pk.r_sp_per_x), (SP_E, SINK_C_E, 1.0 / pk.r_sp_per_x),
        (SP_N, SINK_C_N, 1.0 / pk.r_sp_per_y), (SP_S, SINK_C_S, 1.0 / pk.r_sp_per_y),
        (SINK_C_W, SINK_W, 1.0 / (pk.r_hs2_x + pk.r_hs)), (SINK_C_E, SINK_E, 1.0 / (pk.r_hs2_x + pk.r_hs)),
        (SINK_C_N, SINK_N, 1.0 / (pk.r_hs2_y + pk.r_hs)), (SINK_C_S, SINK_S, 1.0 / (pk.r_hs2_y + pk.r_hs)),
    )
    ring_g_amb = np.zeros(N_RING)
    ring_g_amb[[SINK_C_W, SINK_C_E]] = 1.0 / (pk.r_hs_c_per_x + pk.r_amb_c_per_x)
    ring_g_amb[[SINK_C_N, SINK_C_S]] = 1.0 / (pk.r_hs_c_per_y + pk.r_amb_c_per_y)
    ring_g_amb[[SINK_W, SINK_E, SINK_N, SINK_S]] = 1.0 / (pk.r_hs_per + pk.r_amb_per)
    ring_cap = np.zeros(N_RING)
    ring_cap[[SP_W, SP_E]] = pk.c_sp_per_x
    ring_cap[[SP_N, SP_S]] = pk.c_sp_per_y
    ring_cap[[SINK_C_W, SINK_C_E]] = pk.c_hs_c_per_x + pk.c_amb_c_per_x
    ring_cap[[SINK_C_N, SINK_C_S]] = pk.c_hs_c_per_y + pk.c_amb_c_per_y
    ring_cap[[SINK_W, SINK_E, SINK_N, SINK_S]] = pk.c_hs_per + pk.c_amb_per
    cells = None if all(x.uniform for x in layers) else _cell_links(spec, layers, cw, ch, cf, r_conv_cell, p)
    return RCNetwork(
        cells=cells,
        spec=spec,
        names=tuple(x.name for x in layers),
        g_ns=g_ns,
        g_ew=g_ew,
        g_z=1.0 / r_link,
        g_amb_cell=g_amb_cell,
        cap=cap,
        ring_edges=edges,
        ring_links=links,
        ring_g_amb=ring_g_amb,
        ring_cap=ring_cap,
        package_rc=pk,
    )


def _cell_links(spec: NetworkSpec, layers: list[LayerSpec], cw: float, ch: float, cf: float, r_conv_cell: float,
                p: PackageSpec) -> CellLinks:
    """Per-cell links of a stack with a laterally non-uniform layer, by the same rules as the uniform network with
    each cell's own material: a lateral link is the series of the two half cells (``rx_a/2 + rx_b/2``, which is the
    uniform network's ``rx`` for equal cells; HotSpot's variant keeps its north/south ``rx`` quirk), a vertical link
    follows the variant (HotSpot: the upper cell's full ``rz``, or ``rz_n/2 + rz_{n+1}/2`` with ``-detailed_3D``;
    physical: the two half cells), and a cell's capacitance is ``cf·ρc·t·A``. Equal cells give the uniform network
    exactly (tested)."""
    nrc = spec.rows * spec.cols
    shape = (spec.rows, spec.cols)
    k = np.stack([np.asarray(x.k_cells if x.k_cells is not None else np.full(nrc, x.k), float) for x in layers])
    rc = np.stack([np.asarray(x.rho_c_cells if x.rho_c_cells is not None else np.full(nrc, x.rho_c), float)
                   for x in layers])
    if k.shape != (len(layers), nrc) or rc.shape != (len(layers), nrc):
        raise ValueError(f"per-cell materials must have rows·cols = {nrc} values per layer")
    if not (np.isfinite(k).all() and np.isfinite(rc).all() and (k > 0).all() and (rc > 0).all()):
        raise ValueError("per-cell conductivity and heat capacity must be finite and > 0")
    t = np.array([x.thickness for x in layers])[:, None]
    lateral = np.array([x.lateral for x in layers])[:, None, None]
    k3 = k.reshape(len(layers), *shape)
    rx = np.where(lateral, cw / (k3 * ch * t[:, :, None]), LARGENUM)  # per cell, K/W
    ry = np.where(lateral, ch / (k3 * cw * t[:, :, None]), LARGENUM)
    rz = (t / (k * cw * ch)).reshape(len(layers), *shape)
    r_ns, r_ew = (rx, ry) if spec.variant == "hotspot" else (ry, rx)
    g_ns = 1.0 / (r_ns[:, :-1, :] / 2 + r_ns[:, 1:, :] / 2)
    g_ew = 1.0 / (r_ew[:, :, :-1] / 2 + r_ew[:, :, 1:] / 2)
    r_link = _vertical_resistance(spec, rz, r_conv_cell)
    return CellLinks(g_ns, g_ew, 1.0 / r_link, _capacitance(rc, t, cf, cw, ch, p))


def _vertical_resistance(spec: NetworkSpec, rz: np.ndarray, r_conv_cell: float) -> np.ndarray:
    """K/W between layer n and n+1 (``rz``: each layer's cell resistance, (L,) or per cell (L, rows, cols)).
    HotSpot: the full rz of the upper layer n (the sink's rz includes its share of r_convec), or with
    ``-detailed_3D`` ``rz_n/2 + rz_{n+1}/2`` (layer 0: ``rz_0 + rz_1/2``); physical: the two half cells."""
    if spec.variant != "hotspot":
        out: np.ndarray = rz[:-1] / 2 + rz[1:] / 2
        return out
    rz_eff = rz.copy()
    rz_eff[-1] += r_conv_cell
    if spec.detailed_3d:
        r_link: np.ndarray = rz_eff[:-1] / 2 + rz_eff[1:] / 2
        r_link[0] = rz_eff[0] + rz_eff[1] / 2
        return r_link
    return rz_eff[:-1].copy()


def _capacitance(rho_c: np.ndarray, thickness: np.ndarray, cf: float, cw: float, ch: float,
                 p: PackageSpec) -> np.ndarray:
    """J/K per cell, ``cf·ρc·t·A``, the sink with its share of c_convec (``rho_c`` (L,) or (L, cells) with
    ``thickness`` broadcasting against it)."""
    cap: np.ndarray = cf * rho_c * thickness * cw * ch
    cap[-1] += cf * p.c_convec * (cw * ch) / (p.s_sink * p.s_sink)
    return cap
