"""HotSpot interop ("file mode", seed §4.5/§11): run HotSpot's own inputs through our network and write HotSpot's
outputs, so ``hotspot ...`` becomes ``tasmoe hotspot ...`` with the same arguments.

Supported: the grid model (``-model_type grid``) with a layer configuration file (``-grid_layer_file``) or the
default 2-layer chip (``-f`` floorplan + ``t_chip``/``t_interface``), ``-detailed_3D on|off``, ``-init_file`` /
``-init_temp``, ``-steady_file``, ``-grid_steady_file``, ``-o`` (transient trace), ``-grid_rows/-grid_cols``,
``-grid_map_mode avg|min|max|center`` and every package option. Steady results use the power averaged over the
trace (as HotSpot does); the transient takes one constant-power interval of ``sampling_intvl`` per trace line.
Anything else (block model, secondary path, leakage, package model, DTM clipping, materials files, microchannels,
``-d``, ``-grid_transient_file``) is refused with an error naming the option.

Beyond HotSpot: layers smaller than the die with a filler around them (``-k_filler``, ``-p_filler``), per-block
materials with ``-detailed_3D on``, any grid size; batch mode and ``--compare`` (``services/thermal/cli.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from services.thermal import solvers
from services.thermal.hotspot_io import (
    BlockMap,
    Floorplan,
    block_map,
    format_block_steady,
    format_grid_steady,
    format_ttrace,
    parse_config_pairs,
    parse_lcf,
    parse_ptrace,
    parse_temp_file,
    read_flp,
)
from services.thermal.network import N_RING, LayerSpec, NetworkSpec, PackageSpec, RCNetwork, build_network
from shared.configs.arch import MAX_GRID_SIDE, MAX_THERMAL_NODES
from shared.errors import BadInput

# HotSpot 7 defaults (temperature.c: default_thermal_config)
DEFAULTS: dict[str, str] = {
    "t_chip": "0.15e-3", "k_chip": "100.0", "p_chip": "1.75e6", "thermal_threshold": "355.0",
    "c_convec": "140.4", "r_convec": "0.1", "s_sink": "0.06", "t_sink": "6.9e-3", "k_sink": "400.0",
    "p_sink": "3.55e6", "s_spreader": "0.03", "t_spreader": "1e-3", "k_spreader": "400.0", "p_spreader": "3.55e6",
    "t_interface": "20e-6", "k_interface": "4.0", "p_interface": "4.0e6", "model_secondary": "0",
    "ambient": "318.15", "init_temp": "333.15", "sampling_intvl": "3.333e-6", "base_proc_freq": "3e9",
    "dtm_used": "0", "model_type": "block", "leakage_used": "0", "leakage_mode": "0", "package_model_used": "0",
    "block_omit_lateral": "0", "grid_rows": "64", "grid_cols": "64", "grid_map_mode": "center",
    "detailed_3D": "off",
}
_IGNORED = {  # accepted, no effect on the grid model without the secondary path / DTM / leakage / package model
    "thermal_threshold", "base_proc_freq", "leakage_mode", "block_omit_lateral", "package_config_file",
    "r_convec_sec", "c_convec_sec", "n_metal", "t_metal", "t_c4", "s_c4", "n_c4", "s_sub", "t_sub", "s_solder",
    "t_solder", "s_pcb", "t_pcb",
    # the floorplanner's (hotfloorplan, flp.c) and the microchannel model's options, which HotSpot's shipped
    # template.config and examples carry; `hotspot` itself never reads them (microchannels stay refused below)
    "wrap_l2", "l2_label", "model_rim", "rim_thickness", "compact_ratio", "n_orients", "P0", "Davg", "Kmoves",
    "Rcool", "Rreject", "Nmax", "lambdaA", "lambdaT", "lambdaW", "use_microfluidic_cooling", "pumping_pressure",
    "pump_internal_res", "inlet_temperature", "coolant_material", "wall_material", "htc",
}
_FILES = {"f", "p", "o", "c", "init_file", "steady_file", "grid_layer_file", "grid_steady_file"}
_ZERO_ONLY = {  # options whose feature is not modelled: only 0 (off) is accepted
    "model_secondary": "the secondary heat path", "leakage_used": "temperature-dependent leakage",
    "package_model_used": "the natural/forced convection package model", "dtm_used": "DTM clipping",
    "use_microchannels": "microchannels",
}
# ours, beyond HotSpot: the material around a layer smaller than the die (see _layer_materials)
_EXTENSIONS = {"k_filler", "p_filler"}
KNOWN = set(DEFAULTS) | _IGNORED | _FILES | set(_ZERO_ONLY) | _EXTENSIONS
TRANSIENT_MAX_SUBSTEP_S = 1e-4  # TR-BDF2 sub-step for -o: 0.007 K from the exact network solution (solvers.py)


@dataclass
class HotspotOptions:
    values: dict[str, str]

    def number(self, name: str) -> float:
        raw = self.values.get(name, DEFAULTS.get(name, ""))
        try:
            v = float(raw)
        except ValueError:
            raise BadInput(f"option -{name}: expected a number, got {raw!r}", field=name) from None
        if not math.isfinite(v):
            raise BadInput(f"option -{name}: expected a finite number, got {raw!r}", field=name)
        return v

    def integer(self, name: str) -> int:
        v = self.number(name)
        if v != int(v):
            raise BadInput(f"option -{name}: expected an integer, got {self.values.get(name)!r}", field=name)
        return int(v)

    def text(self, name: str) -> str | None:
        return self.values.get(name, DEFAULTS.get(name))

    def path(self, name: str) -> Path | None:
        v = self.values.get(name)
        return Path(v) if v else None


def parse_options(args: Sequence[str], *, need_trace: bool = True) -> HotspotOptions:
    """HotSpot's command line: ``-name value`` pairs; command line overrides the ``-c`` config file. ``need_trace``:
    ``-p`` is required (the Python API builds a stack without one)."""
    if len(args) % 2:
        raise BadInput(f"options come in '-name value' pairs; {args[-1]!r} has no value", field=args[-1].lstrip("-"))
    cmd: list[tuple[str, str]] = []
    for k in range(0, len(args), 2):
        name = args[k]
        if not name.startswith("-"):
            raise BadInput(f"expected an option '-name', got {name!r}", field=name)
        cmd.append((name[1:], args[k + 1]))
    values: dict[str, str] = {}
    origin: dict[str, str] = {}  # where an option came from: "<config file>:<line>: " (the command line: "")
    cfg = dict(cmd).get("c")
    if cfg:
        try:
            text = Path(cfg).read_text()
        except OSError as exc:
            raise BadInput(f"cannot read config file {cfg}: {exc.strerror}", field="c") from None
        for name, val, no in parse_config_pairs(text, cfg):
            values[name] = val
            origin[name] = f"{cfg}:{no}: "
    values.update(cmd)  # command line has priority
    for name, _ in cmd:
        origin[name] = ""
    for name, val in values.items():
        if name not in KNOWN:
            raise BadInput(f"{origin[name]}unsupported option -{name}", field=name)
        if name in _ZERO_ONLY and val.strip() not in ("0", "0.0"):
            raise BadInput(f"{origin[name]}unsupported option -{name} {val}: {_ZERO_ONLY[name]} is not modelled",
                           field=name)
    opts = HotspotOptions(values)
    if (opts.text("model_type") or "").lower() != "grid":
        raise BadInput(f"unsupported option -model_type {opts.text('model_type')}: only the grid model is "
                       "supported (-model_type grid)", field="model_type")
    if (opts.text("detailed_3D") or "off") not in ("on", "off"):
        raise BadInput("option -detailed_3D: expected 'on' or 'off'", field="detailed_3D")
    if (opts.text("grid_map_mode") or "").lower() not in ("avg", "min", "max", "center"):
        raise BadInput("option -grid_map_mode: expected avg, min, max or center", field="grid_map_mode")
    if need_trace and "p" not in values:
        raise BadInput("required option -p <power trace> missing", field="p")
    if "grid_layer_file" not in values and "f" not in values:
        raise BadInput("required option -f <floorplan> missing (or give -grid_layer_file)", field="f")
    return opts


def _resolve(name: str, base: Path) -> Path:
    """A floorplan named in a layer file: beside the layer file when it is there, else as given (from the cwd)."""
    p = Path(name)
    if not p.is_absolute() and (base / p).exists():
        return base / p
    return p


@dataclass
class HotspotCase:
    """A HotSpot input set turned into our network: per layer its floorplan and block maps."""

    net: RCNetwork
    floorplans: list[Floorplan]  # all layers incl. spreader and sink (which reuse the last chip layer's)
    maps: list[BlockMap]
    has_power: list[bool]
    prefixes: list[str]
    map_mode: str = "avg"
    _cell_count: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._cell_count = self.net.rows * self.net.cols

    @property
    def power_layers(self) -> list[int]:
        return [n for n, hp in enumerate(self.has_power) if hp]

    def node_power(self, block_power: dict[int, np.ndarray]) -> np.ndarray:
        """Node power (W) from per-layer block power vectors (floorplan order)."""
        P = np.zeros(self.net.n_nodes)
        nrc = self._cell_count
        for n, pw in block_power.items():
            P[n * nrc:(n + 1) * nrc] += self.maps[n].power @ pw
        return P

    def block_temps(self, T: np.ndarray, layer: int) -> np.ndarray:
        nrc = self._cell_count
        cells = T[layer * nrc:(layer + 1) * nrc]
        bm = self.maps[layer]
        if self.map_mode == "avg":
            out: np.ndarray = bm.avg @ cells
            return out
        grid = cells.reshape(self.net.rows, self.net.cols)
        vals = []
        for i1, i2, j1, j2 in bm.boxes:
            if self.map_mode == "center":
                ci1, cj1 = (i1 + i2) // 2, (j1 + j2) // 2
                ci2, cj2 = ci1 - (1 - (i2 - i1) % 2), cj1 - (1 - (j2 - j1) % 2)
                vals.append((grid[ci1, cj1] + grid[ci2, cj1] + grid[ci1, cj2] + grid[ci2, cj2]) / 4)
            else:
                box = grid[i1:i2, j1:j2]
                vals.append(box.min() if self.map_mode == "min" else box.max())
        return np.array(vals)

    def init_field(self, temps: dict[str, float], source: str) -> np.ndarray:
        """HotSpot ``read_temp_grid`` + ``xlate_vector_b2g``: every block of every layer and ``inode_0..11``."""
        T = np.zeros(self.net.n_nodes)
        nrc = self._cell_count
        for n, (pre, flp) in enumerate(zip(self.prefixes, self.floorplans, strict=True)):
            vals = np.empty(flp.n_units)
            for u, name in enumerate(flp.names):
                key = pre + name
                if key not in temps:
                    raise BadInput(f"{source}: no temperature for {key}", field=key)
                vals[u] = temps[key]
            occ = self.maps[n].occ
            cover = occ.row_sums()
            cell = occ @ vals
            T[n * nrc:(n + 1) * nrc] = np.where(cover > 0, cell / np.where(cover > 0, cover, 1), self.net.ambient)
        for i in range(N_RING):
            key = f"inode_{i}"
            if key not in temps:
                raise BadInput(f"{source}: no temperature for {key}", field=key)
            T[self.net.n_cells + i] = temps[key]
        return T

    def block_steady_text(self, T: np.ndarray) -> str:
        temps = [self.block_temps(T, n) for n in range(self.net.n_layers)]
        return format_block_steady(self.prefixes, self.floorplans, temps, T[self.net.n_cells:])

    def grid_steady_text(self, T: np.ndarray) -> str:
        return format_grid_steady(T[:self.net.n_cells].reshape(self.net.n_layers, self.net.rows, self.net.cols))


def _footprint_share(flp: Floorplan, width: float, height: float, rows: int, cols: int) -> np.ndarray:
    """(rows·cols,) share of each cell inside the layer's footprint (its floorplan's bounding box): the block map of
    a one-block floorplan that is that box."""
    x0, y0 = float(flp.leftx.min()), float(flp.bottomy.min())
    box = Floorplan(("footprint",), np.array([flp.total_width()]), np.array([flp.total_height()]), np.array([x0]),
                    np.array([y0]), flp.source)
    share: np.ndarray = block_map(box, width, height, rows, cols).occ.toarray().ravel()
    return share


def _layer_materials(opts: HotspotOptions, lay: LayerSpec, flp: Floorplan, bm: BlockMap, width: float,
                     height: float, rows: int, cols: int) -> LayerSpec:
    """The layer as given, or laterally non-uniform: a footprint smaller than the die (the rest of each cell is the
    filler, ``-k_filler`` W/(m·K) and ``-p_filler`` J/(m³·K)), and with ``-detailed_3D on`` the blocks' own materials
    (the floorplan's ``<specific-heat> <resistivity>`` columns). A cell's conductivity and heat capacity are the
    area-weighted means of what covers it (our rule: HotSpot itself refuses both cases)."""
    share = _footprint_share(flp, width, height, rows, cols)
    smaller = bool((share < 1 - 1e-9).any())
    materials = opts.text("detailed_3D") == "on" and flp.has_materials
    if not smaller and not materials:
        return lay
    k = np.full(rows * cols, lay.k)
    rc = np.full(rows * cols, lay.rho_c)
    if smaller:
        missing = [n for n in ("k_filler", "p_filler") if n not in opts.values]
        if missing:
            raise BadInput(f"{flp.source}: layer {lay.name} is {flp.total_width() * 1e3:g} mm x "
                           f"{flp.total_height() * 1e3:g} mm on a {width * 1e3:g} mm x {height * 1e3:g} mm die (layer "
                           "0's size): HotSpot wants every layer that size; for a smaller layer give the material "
                           "around it with -k_filler <W/(m K)> and -p_filler <J/(m^3 K)>", field=missing[0])
        kf, pf = opts.number("k_filler"), opts.number("p_filler")
        if kf <= 0 or pf <= 0:
            raise BadInput("-k_filler and -p_filler must be > 0", field="k_filler" if kf <= 0 else "p_filler")
        k = share * k + (1 - share) * kf
        rc = share * rc + (1 - share) * pf
    if materials:
        assert flp.rho_c is not None and flp.resistivity is not None
        has = np.isfinite(flp.rho_c)
        occ = bm.occ.columns(np.flatnonzero(has))  # (cells, blocks with materials) covered share
        covered = occ.row_sums()
        k = (1 - covered) * k + occ @ (1.0 / flp.resistivity[has])
        rc = (1 - covered) * rc + occ @ flp.rho_c[has]
    return replace(lay, k_cells=tuple(k.tolist()), rho_c_cells=tuple(rc.tolist()))


def load_case(opts: HotspotOptions) -> HotspotCase:
    """A HotSpot case: its layer stack (a layer file, or ``-f``'s silicon and interface), the die they sit on, the
    package, built into the thermal network with each layer's block map."""
    rows, cols = opts.integer("grid_rows"), opts.integer("grid_cols")
    for name, n in (("grid_rows", rows), ("grid_cols", cols)):  # the arch config's bounds on a thermal grid
        if not 2 <= n <= MAX_GRID_SIDE:
            raise BadInput(f"option -{name}: {n}, expected 2 to {MAX_GRID_SIDE}", field=name)
    layers, flps, prefixes = _layer_stack(opts)
    flps, width, height = _die(opts, flps)
    maps = [block_map(flp, width, height, rows, cols, layer=lay.name) for flp, lay in zip(flps, layers, strict=True)]
    layers = [_layer_materials(opts, lay, flp, bm, width, height, rows, cols)
              for lay, flp, bm in zip(layers, flps, maps, strict=True)]
    pkg = _package(opts, width, height)
    nodes = rows * cols * (len(layers) + 3)  # the layers' grids, the spreader's and the sink's (+ their rings)
    if nodes > MAX_THERMAL_NODES:
        raise BadInput(f"{rows} x {cols} grid on {len(layers)} layers: ~{nodes} nodes, at most {MAX_THERMAL_NODES} "
                       "(a coarser -grid_rows / -grid_cols)", field="grid_rows")
    spec = NetworkSpec(tuple(layers), pkg, width, height, rows, cols, opts.number("ambient"), "hotspot",
                       opts.text("detailed_3D") == "on")
    net = build_network(spec)
    all_flps = [*flps, flps[-1], flps[-1]]
    all_maps = [*maps, maps[-1], maps[-1]]
    return HotspotCase(net, all_flps, all_maps, [x.has_power for x in layers] + [False, False],
                       [*prefixes, "hsp_", "hsink_"], (opts.text("grid_map_mode") or "avg").lower())


def _layer_stack(opts: HotspotOptions) -> tuple[list[LayerSpec], list[Floorplan], list[str]]:
    """(layers, their floorplans, their block-name prefixes): the layer file's (``-grid_layer_file``), else HotSpot's
    default stack of ``-f``'s floorplan: silicon (``-t_chip``, ``-k_chip``, ``-p_chip``) under the interface."""
    layers: list[LayerSpec] = []
    flps: list[Floorplan] = []
    prefixes: list[str] = []
    lcf_path = opts.path("grid_layer_file")
    f_path = opts.path("f")
    if lcf_path is not None and f_path is not None:
        read_flp(f_path)  # HotSpot reads -f even when the layer file overrides it: a bad one is still an error
    if lcf_path is not None:
        try:
            text = lcf_path.read_text()
        except OSError as exc:
            raise BadInput(f"cannot read layer file {lcf_path}: {exc.strerror}", field="grid_layer_file") from None
        for lay in parse_lcf(text, str(lcf_path)):
            flp = read_flp(_resolve(lay.flp_file, lcf_path.parent))
            layers.append(LayerSpec(f"layer_{lay.no}", 1.0 / lay.resistivity, lay.rho_c, lay.thickness,
                                    lay.lateral, lay.power))
            flps.append(flp)
            prefixes.append(f"layer_{lay.no}_")
        return layers, flps, prefixes
    f = opts.path("f")
    assert f is not None
    flp = read_flp(f)
    for name, t, k, p, power, pre in (("silicon", "t_chip", "k_chip", "p_chip", True, ""),
                                      ("interface", "t_interface", "k_interface", "p_interface", False, "iface_")):
        if opts.number(t) <= 0:
            raise BadInput(f"layer {name}: thickness -{t} must be > 0", field=t)
        layers.append(LayerSpec(name, opts.number(k), opts.number(p), opts.number(t), True, power))
        flps.append(flp)
        prefixes.append(pre)
    return layers, flps, prefixes


def _die(opts: HotspotOptions, flps: list[Floorplan]) -> tuple[list[Floorplan], float, float]:
    """(the floorplans in the die's coordinates, die width m, die height m). With ``-k_filler``/``-p_filler`` the die
    is the bounding box of every layer; else HotSpot's rule: layer 0's floorplan, which every block must lie in."""
    if "k_filler" in opts.values or "p_filler" in opts.values:
        # layers of different sizes (a chiplet on a larger die, a die on an interposer), in the floorplans' common
        # coordinates: the die is the bounding box of them all, and a smaller layer is surrounded by the filler
        x0 = min(float(f.leftx.min()) for f in flps)
        y0 = min(float(f.bottomy.min()) for f in flps)
        width = max(float((f.leftx + f.width).max()) for f in flps) - x0
        height = max(float((f.bottomy + f.height).max()) for f in flps) - y0
        if x0 or y0:
            flps = [replace(f, leftx=f.leftx - x0, bottomy=f.bottomy - y0) for f in flps]
        return flps, width, height
    width, height = flps[0].total_width(), flps[0].total_height()
    tol = 1e-9 * max(width, height)
    for flp in flps:
        out = np.flatnonzero((flp.leftx < -tol) | (flp.bottomy < -tol) | (flp.leftx + flp.width > width + tol)
                             | (flp.bottomy + flp.height > height + tol))
        if out.size:
            u = int(out[0])
            raise BadInput(f"{flp.where(u)}: block {flp.names[u]} lies outside the die ({width * 1e3:g} mm x "
                           f"{height * 1e3:g} mm, layer 0's floorplan); a stack of layers of different sizes "
                           "needs -k_filler and -p_filler", field=flp.names[u])
    return flps, width, height


def _package(opts: HotspotOptions, width: float, height: float) -> PackageSpec:
    """The spreader, the sink and the convection, each dimension > 0 and the die on the spreader."""
    pkg = PackageSpec(
        s_spreader=opts.number("s_spreader"), t_spreader=opts.number("t_spreader"),
        k_spreader=opts.number("k_spreader"),
        p_spreader=opts.number("p_spreader"), s_sink=opts.number("s_sink"), t_sink=opts.number("t_sink"),
        k_sink=opts.number("k_sink"), p_sink=opts.number("p_sink"), r_convec=opts.number("r_convec"),
        c_convec=opts.number("c_convec"))
    for name in ("s_spreader", "t_spreader", "k_spreader", "p_spreader", "s_sink", "t_sink", "k_sink", "p_sink",
                 "r_convec"):
        if opts.number(name) <= 0:
            raise BadInput(f"option -{name} must be > 0", field=name)
    if width > pkg.s_spreader or height > pkg.s_spreader:
        raise BadInput(f"die {width * 1e3:g} mm x {height * 1e3:g} mm does not fit on the "
                       f"{pkg.s_spreader * 1e3:g} mm spreader", field="s_spreader")
    return pkg


@dataclass
class HotspotResult:
    steady: np.ndarray  # node temperatures, K
    trace_names: tuple[str, ...]
    transient: np.ndarray | None  # (steps, blocks) K, ptrace column order
    case: HotspotCase


SolverFactory = Callable[[RCNetwork], solvers.Solver]


def _trace_layout(case: HotspotCase, names: tuple[str, ...], where: str) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(layer, column indices in the trace, block indices in the floorplan) per power layer, HotSpot's rule: the
    trace's names are taken layer by layer in layer order. ``where``: the header's ``file:line`` for errors."""
    layout = []
    count = 0
    total = sum(case.floorplans[n].n_units for n in case.power_layers)
    if len(names) != total:
        header = set(names)
        missing = [(n, b) for n in case.power_layers for b in case.floorplans[n].names if b not in header]
        if missing:
            n, b = missing[0]
            raise BadInput(f"{where}: block {b} of {case.floorplans[n].source} (power layer {n}) has no column in "
                           f"the trace ({len(names)} blocks in the trace, {total} in the power layers' floorplans)",
                           field=b)
        known = {b for n in case.power_layers for b in case.floorplans[n].names}
        extra = next((b for b in names if b not in known), names[-1])
        raise BadInput(f"{where}: block {extra} of the header is in no power layer's floorplan ({len(names)} blocks "
                       f"in the trace, {total} in the power layers' floorplans)", field=extra)
    for n in case.power_layers:
        flp = case.floorplans[n]
        cols = np.arange(count, count + flp.n_units)
        lookup = {b: i for i, b in enumerate(flp.names)}
        wrong = [names[c] for c in cols if names[c] not in lookup]
        if wrong:
            raise BadInput(f"{where}: block {wrong[0]} is not in {flp.source}, the floorplan of power layer {n} "
                           f"(HotSpot reads the header layer by layer: columns {cols[0] + 1}-{cols[-1] + 1} are its "
                           "blocks)", field=wrong[0])
        idx = np.array([lookup[names[c]] for c in cols])
        layout.append((n, cols, idx))
        count += flp.n_units
    return layout


def run(opts: HotspotOptions, make_solver: SolverFactory | None = None, *,
        max_substeps: int | None = None) -> HotspotResult:
    """Solve one HotSpot input set: steady (average power) and, with ``-o``, the transient trace (at most
    ``max_substeps`` sub-steps: the service's file mode bounds it; the local command does not)."""
    case = load_case(opts)
    solver = (make_solver or default_solver)(case.net)
    p_path = opts.path("p")
    assert p_path is not None
    return solve_trace(opts, case, solver, p_path, max_substeps=max_substeps)


def solve_trace(opts: HotspotOptions, case: HotspotCase, solver: solvers.Solver, p_path: Path, *,
                max_substeps: int | None = None) -> HotspotResult:
    """One power trace on a built case and solver (the factorisation is reused across traces: ``run_batch``);
    a transient of more than ``max_substeps`` sub-steps is a 422 naming ``sampling_intvl`` (None: no bound)."""
    try:
        ptext = p_path.read_text()
    except OSError as exc:
        raise BadInput(f"cannot read power trace {p_path}: {exc.strerror}", field="p") from None
    trace = parse_ptrace(ptext, str(p_path))
    layout = _trace_layout(case, trace.names, f"{p_path}:{trace.header_line}")

    def node_power(row: np.ndarray) -> np.ndarray:
        per_layer = {}
        for n, cols, idx in layout:
            pw = np.zeros(case.floorplans[n].n_units)
            pw[idx] = row[cols]
            per_layer[n] = pw
        return case.node_power(per_layer)

    T_steady = solvers.steady(solver, node_power(trace.values.mean(axis=0)))
    transient = None
    if opts.path("o") is not None:
        init_file = opts.path("init_file")
        if init_file is not None:
            try:
                temps = parse_temp_file(init_file.read_text(), str(init_file))
            except OSError as exc:
                raise BadInput(f"cannot read init file {init_file}: {exc.strerror}", field="init_file") from None
            T = case.init_field(temps, str(init_file))
        else:
            T = np.full(case.net.n_nodes, opts.number("init_temp"))
        dt = opts.number("sampling_intvl")
        if dt <= 0:
            raise BadInput("option -sampling_intvl must be > 0", field="sampling_intvl")
        n_sub = max(1, math.ceil(dt / TRANSIENT_MAX_SUBSTEP_S - 1e-9))
        if max_substeps is not None and n_sub * len(trace.values) > max_substeps:
            raise BadInput(f"-o: {len(trace.values)} trace lines of -sampling_intvl {dt:g} s in "
                           f"{TRANSIENT_MAX_SUBSTEP_S:g} s sub-steps is {n_sub * len(trace.values)} sub-steps, at most "
                           f"{max_substeps} a request "
                           "(fewer lines or a shorter interval)", field="sampling_intvl")
        rows = []
        for row in trace.values:
            T = solvers.step(solver, T, node_power(row), dt, n_sub)
            out = np.empty(len(trace.names))
            for n, cols, idx in layout:
                out[cols] = case.block_temps(T, n)[idx]
            rows.append(out)
        transient = np.vstack(rows)
    if not np.isfinite(T_steady).all() or (transient is not None and not np.isfinite(transient).all()):
        raise BadInput(f"{p_path}: the temperatures are not finite numbers (powers or temperatures beyond what a float "
                       "holds)", field="p")
    return HotspotResult(T_steady, trace.names, transient, case)


@dataclass(frozen=True)
class CommandLine:
    """``tasmoe hotspot``'s words: HotSpot's own options, plus ours (``-p`` may repeat, ``--batch DIR``,
    ``--compare HOTSPOT_OUTPUT``)."""

    options: list[str]  # HotSpot's '-name value' pairs, without -p
    traces: list[Path]  # every -p, in order
    batch_dirs: list[Path]
    compare: Path | None

    @property
    def is_batch(self) -> bool:
        return bool(self.batch_dirs) or len(self.traces) > 1


def split_command_line(args: Sequence[str]) -> CommandLine:
    options: list[str] = []
    traces: list[Path] = []
    dirs: list[Path] = []
    compare: Path | None = None
    for k in range(0, len(args), 2):
        pair = list(args[k:k + 2])
        if len(pair) < 2:
            options.extend(pair)  # parse_options names the option without a value
        elif pair[0] == "-p":
            traces.append(Path(pair[1]))
        elif pair[0] == "--batch":
            dirs.append(Path(pair[1]))
        elif pair[0] == "--compare":
            if compare is not None:
                raise BadInput("--compare is given twice", field="compare")
            compare = Path(pair[1])
        else:
            options.extend(pair)
    cl = CommandLine(options, traces, dirs, compare)
    if cl.is_batch and compare is not None:
        raise BadInput("--compare takes one power trace (-p), not a batch", field="compare")
    return cl


# -- batch mode: many power traces, one model build and one factorisation -------------------------------------------
BATCH_SUFFIX = {"steady_file": ".steady", "grid_steady_file": ".grid.steady", "o": ".ttrace"}


def batch_traces(paths: Sequence[Path], dirs: Sequence[Path]) -> list[Path]:
    """The power traces of a batch: the ``-p`` files in order, then every ``*.ptrace`` of each ``--batch`` folder
    (sorted by name). Two traces with one file stem would write the same outputs: refused."""
    traces = list(paths)
    for d in dirs:
        if not d.is_dir():
            raise BadInput(f"--batch {d}: not a directory", field="batch")
        found = sorted(d.glob("*.ptrace"))
        if not found:
            raise BadInput(f"--batch {d}: no *.ptrace file in it", field="batch")
        traces.extend(found)
    stems: dict[str, Path] = {}
    for t in traces:
        if t.stem in stems:
            raise BadInput(f"power traces {stems[t.stem]} and {t} have the same name {t.stem!r}: their outputs "
                           "would overwrite each other", field="p")
        stems[t.stem] = t
    return traces


def case_options(opts: HotspotOptions, trace: Path) -> HotspotOptions:
    """A batch case's options: ``-p`` is the trace, each output option names a folder and the case writes
    ``<folder>/<trace stem><suffix>`` (``.steady``, ``.grid.steady``, ``.ttrace``)."""
    values = dict(opts.values, p=str(trace))
    for name, suffix in BATCH_SUFFIX.items():
        if name in values:
            values[name] = str(Path(values[name]) / f"{trace.stem}{suffix}")
    return HotspotOptions(values)


def run_batch(opts: HotspotOptions, traces: Sequence[Path], make_solver: SolverFactory | None = None,
              ) -> list[tuple[Path, HotspotResult]]:
    """Solve every trace on one case and one solver: N steady cases cost one model build, one factorisation and N
    solves (the transient's shifted factorisations are cached by the solver too). Writes each case's outputs."""
    for name in BATCH_SUFFIX:
        if name in opts.values:
            Path(opts.values[name]).mkdir(parents=True, exist_ok=True)
    case = load_case(opts)
    solver = (make_solver or default_solver)(case.net)
    out = []
    for trace in traces:
        copts = case_options(opts, trace)
        res = solve_trace(copts, case, solver, trace)
        write_outputs(copts, res)
        out.append((trace, res))
    return out


def steady_blocks(res: HotspotResult) -> dict[str, float]:
    """The steady block temperatures (K) under HotSpot's names (``<layer prefix><block>``, ``inode_<i>``), at full
    precision: what ``-steady_file`` prints with two decimals."""
    case, T = res.case, res.steady
    out: dict[str, float] = {}
    for n, (pre, flp) in enumerate(zip(case.prefixes, case.floorplans, strict=True)):
        for name, t in zip(flp.names, case.block_temps(T, n), strict=True):
            out[pre + name] = float(t)
    for i, t in enumerate(T[case.net.n_cells:]):
        out[f"inode_{i}"] = float(t)
    return out


def default_solver(net: RCNetwork) -> solvers.Solver:
    """The spectral solver when every layer is laterally uniform, else the sparse direct one (``solver_note``)."""
    if not net.uniform:
        return solvers.SparseSolver(net)
    from services.thermal.spectral import make_solver

    return make_solver(net)


def solver_note(net: RCNetwork) -> str | None:
    """What ``default_solver`` chose when it is not the spectral solver (the CLI prints it)."""
    if net.uniform:
        return None
    odd = [lay.name for lay in net.spec.layers if not lay.uniform]
    return (f"layers {', '.join(odd)} are laterally non-uniform: solved with the sparse direct solver (SuperLU); "
            "the spectral solver needs uniform layers")


def write_outputs(opts: HotspotOptions, res: HotspotResult) -> list[Path]:
    written = []
    steady_file = opts.path("steady_file")
    if steady_file is not None:
        steady_file.write_text(res.case.block_steady_text(res.steady))
        written.append(steady_file)
    grid_file = opts.path("grid_steady_file")
    if grid_file is not None:
        grid_file.write_text(res.case.grid_steady_text(res.steady))
        written.append(grid_file)
    out = opts.path("o")
    if out is not None and res.transient is not None:
        out.write_text(format_ttrace(res.trace_names, res.transient))
        written.append(out)
    return written


def main(args: Sequence[str], make_solver: SolverFactory | None = None) -> HotspotResult:
    opts = parse_options(args)
    res = run(opts, make_solver)
    write_outputs(opts, res)
    return res
