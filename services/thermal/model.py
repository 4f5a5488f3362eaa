"""``StackModel``: the 3D stack of an ``ArchConfig`` as an RC network plus the core/bank <-> grid-cell maps.

Immutable and cached by the content hash of the ``ArchConfig`` (LRU). Layers come from
``arch.geometry.expanded_stack()`` (farthest from the sink first: logic, DRAM dies, TIM), then the heat spreader and
the heat sink of ``arch.geometry.cooling`` (HotSpot's package: the parts beyond the die are the 12 ring nodes). The grid
is ``arch.thermal.grid = (nx, ny)`` cells over ``arch.geometry.die_mm``; convection ``h`` over the whole sink top gives
``r_convec = 1/(h·s_sink²)``. ``arch.thermal.variant`` picks the network variant (``hotspot`` or ``physical``, see
``services/thermal/network.py``).

Geometry of cores and banks: core ``c = y·X + x`` covers grid rows ``[y·ny/Y, (y+1)·ny/Y)`` (row 0 = north edge) and
columns ``[x·nx/X, (x+1)·nx/X)`` of the logic layer; bank ``B(bx,by,d)`` covers its ``1/BX × 1/BY`` share of DRAM die
``d`` (``d = 0`` is ``dram_1``, the die nearest the logic). Block temperature = mean of its cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from services.thermal import solvers
from services.thermal.hotspot_io import BlockMap, CellMap, Floorplan, block_map
from services.thermal.network import LayerSpec, NetworkSpec, PackageSpec, RCNetwork, build_network
from services.thermal.spectral import SpectralSolver
from shared.configs import ArchConfig
from shared.configs.arch import MAX_TRANSIENT_SUBSTEPS
from shared.errors import BadInput
from shared.limits import over_thermal_budget
from shared.lru import LRU

KELVIN = 273.15
HOTSPOT_C_CONVEC = 140.4  # J/K, HotSpot's default convection capacitance (temperature.c), hotspot variant only


def network_spec(arch: ArchConfig) -> NetworkSpec:
    g = arch.geometry
    layers = tuple(
        LayerSpec(x.name, x.k_wmk, x.rho_c_jm3k, x.thickness_um * 1e-6, True, x.kind in ("logic", "dram"))
        for x in g.expanded_stack()
    )
    cool = g.cooling
    s_sink = cool.sink.side_mm * 1e-3
    pkg = PackageSpec(
        s_spreader=cool.spreader.side_mm * 1e-3, t_spreader=cool.spreader.thickness_mm * 1e-3,
        k_spreader=cool.spreader.k_wmk, p_spreader=cool.spreader.rho_c_jm3k,
        s_sink=s_sink, t_sink=cool.sink.thickness_mm * 1e-3, k_sink=cool.sink.k_wmk, p_sink=cool.sink.rho_c_jm3k,
        r_convec=1.0 / (cool.h_wmk2k * s_sink * s_sink),
        c_convec=HOTSPOT_C_CONVEC if arch.thermal.variant == "hotspot" else 0.0,
    )
    nx, ny = arch.thermal.grid
    return NetworkSpec(layers, pkg, g.die_mm[0] * 1e-3, g.die_mm[1] * 1e-3, rows=ny, cols=nx,
                       ambient=cool.ambient_c + KELVIN, variant=arch.thermal.variant)


def _tiles(nx: int, ny: int, width: float, height: float, prefix: str) -> Floorplan:
    """A regular nx × ny floorplan, block index ``y·nx + x`` with y = 0 along the north edge."""
    w, h = width / nx, height / ny
    x = np.tile(np.arange(nx), ny)
    y = np.repeat(np.arange(ny), nx)
    names = tuple(f"{prefix}{i}" for i in range(nx * ny))
    return Floorplan(names, np.full(nx * ny, w), np.full(nx * ny, h), x * w, height - (y + 1) * h, prefix)


@dataclass(frozen=True, eq=False)
class StackModel:
    key: str  # content hash of the ArchConfig
    arch: ArchConfig
    net: RCNetwork
    logic_layer: int
    dram_layers: tuple[int, ...]  # network layer of DRAM die d
    core_map: BlockMap
    bank_map: BlockMap

    @property
    def layer_names(self) -> tuple[str, ...]:
        return self.net.names

    @property
    def n_cores(self) -> int:
        return self.arch.mesh.n_cores

    @property
    def n_banks_per_layer(self) -> int:
        return self.arch.dram.banks[0] * self.arch.dram.banks[1]

    @cached_property
    def solver(self) -> solvers.Solver:
        if self.arch.thermal.solver == "sparse":
            return solvers.SparseSolver(self.net)
        return SpectralSolver(self.net)

    @cached_property
    def sparse_solver(self) -> solvers.SparseSolver:
        return solvers.SparseSolver(self.net)

    @cached_property
    def vault_of_bank(self) -> np.ndarray:
        """(banks per layer,) vault core of each bank (index by·BX + bx)."""
        bx_n, by_n, _ = self.arch.dram.banks
        cx, cy = self.arch.mesh.cores
        bx = np.tile(np.arange(bx_n), by_n)
        by = np.repeat(np.arange(by_n), bx_n)
        out: np.ndarray = (by // (by_n // cy)) * cx + bx // (bx_n // cx)
        return out

    def node_power(self, core_w: np.ndarray, bank_w: np.ndarray) -> np.ndarray:
        """Node power (W): ``core_w`` (cores,), ``bank_w`` (DRAM dies, banks per layer)."""
        node_w = np.zeros(self.net.n_nodes)
        nrc = self.net.rows * self.net.cols
        lo = self.logic_layer * nrc
        node_w[lo:lo + nrc] = self.core_map.power @ core_w
        for d, layer in enumerate(self.dram_layers):
            node_w[layer * nrc:(layer + 1) * nrc] = self.bank_map.power @ bank_w[d]
        return node_w

    @cached_property
    def _separable_power(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None:
        """Mode-space power maps of the cores and the banks, ``(Ay, Ax)`` each: a layer whose blocks (a uniform
        ``nby × nbx`` tiling) dissipate ``W`` (nby, nbx) W has cell modes ``Ay·W·Axᵀ`` with ``Ay = DR·Fy``,
        ``Ax = DC·Fx`` and ``power[(i, j), (y, x)] = Fy[i, y]·Fx[j, x]`` (the block map is separable: verified
        entry by entry). None when the solver is not spectral or a map is not separable (then ``step`` goes
        through node powers and a DCT)."""
        solver = self.solver
        if not isinstance(solver, SpectralSolver):
            return None
        cx, cy = self.arch.mesh.cores
        bx, by, _ = self.arch.dram.banks
        out = []
        for bmap, nbx, nby in ((self.core_map, cx, cy), (self.bank_map, bx, by)):
            f = _separable_factors(bmap.power, self.net.rows, self.net.cols, nby, nbx)
            if f is None:
                return None
            out.append((solver.dct_rows @ f[0], solver.dct_cols @ f[1]))
        return out[0], out[1]

    @cached_property
    def _ambient_source_modes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Modes of ``g_amb·T_amb``: the layers where they are nonzero (the sink: uniform, so only its mode 0),
        those rows (n, P), and the ring part (12,)."""
        assert isinstance(self.solver, SpectralSolver)
        amb_h, amb_r = self.solver.to_modes(self.net.g_amb * self.net.ambient)
        rows = np.flatnonzero(np.any(amb_h != 0.0, axis=1))
        return rows, amb_h[rows], amb_r

    def source_modes(self, core_w: np.ndarray, bank_w: np.ndarray,
                     with_ambient: bool = True) -> tuple[np.ndarray, np.ndarray] | None:
        """``P + g_amb·T_amb`` (``P`` alone when not ``with_ambient``) in the spectral solver's mode space (cell modes
        (L, P), ring (12,)) straight from the block powers, or None (see ``_separable_power``). Equals
        ``solver.to_modes(source(node_power(...)))`` to round-off at a fraction of a DCT's cost."""
        sep = self._separable_power
        if sep is None:
            return None
        (ay_c, ax_c), (ay_b, ax_b) = sep
        amb_rows, amb_h, amb_r = self._ambient_source_modes
        R, C = self.net.rows, self.net.cols
        bh = np.zeros((self.net.n_layers, R * C))
        if with_ambient:
            bh[amb_rows] = amb_h
        else:
            amb_r = np.zeros_like(amb_r)
        cx, cy = self.arch.mesh.cores
        bh[self.logic_layer] += (ay_c @ np.asarray(core_w, dtype=float).reshape(cy, cx) @ ax_c.T).reshape(R * C)
        nd = len(self.dram_layers)
        if nd:
            bx, by, _ = self.arch.dram.banks
            W = np.asarray(bank_w, dtype=float).reshape(nd * by, bx)
            dram = np.matmul(ay_b, (W @ ax_b.T).reshape(nd, by, C)).reshape(nd, R * C)
            lo = self.dram_layers[0]
            if self.dram_layers == tuple(range(lo, lo + nd)):
                bh[lo:lo + nd] += dram
            else:
                bh[list(self.dram_layers)] += dram
        return bh, amb_r.copy()

    def substeps(self, dt: float, field: str = "window_ms") -> int:
        """TR-BDF2 sub-steps for ``dt`` seconds: ``ceil(dt / arch.thermal.max_substep_ms)``; more than
        ``MAX_TRANSIENT_SUBSTEPS`` is a 422 naming ``field`` (the request's duration)."""
        ms = self.arch.thermal.max_substep_ms
        n = max(1, math.ceil(dt * 1e3 / ms - 1e-9))
        if n > MAX_TRANSIENT_SUBSTEPS:
            raise BadInput(f"{field}: {dt * 1e3:g} ms in TR-BDF2 sub-steps of arch.thermal.max_substep_ms = {ms:g} ms "
                           f"is {n} sub-steps, at most {MAX_TRANSIENT_SUBSTEPS} a request (a longer max_substep_ms, "
                           "the exponential integrator, or a shorter duration)", field=field)
        return n

    def step(self, T: np.ndarray, core_w: np.ndarray, bank_w: np.ndarray, dt: float,
             field: str = "window_ms") -> np.ndarray:
        """``dt`` seconds of transient from node temperatures ``T`` (K) at constant block powers (W), with the
        integrator of ``arch.thermal`` (``step_exponential`` or ``step_trbdf2``; ``field``: the request's duration,
        named by a 422 when the sub-steps exceed their bound)."""
        cfg = self.arch.thermal
        if cfg.integrator == "trbdf2":
            return self.step_trbdf2(T, core_w, bank_w, dt, self.substeps(dt, field))
        return self.step_exponential(T, core_w, bank_w, dt, cfg.exp_degree)

    def step_exponential(self, T: np.ndarray, core_w: np.ndarray, bank_w: np.ndarray, dt: float,
                         degree: int) -> np.ndarray:
        """``solvers.step_exponential``; on the spectral solver the power enters mode space separably, without a
        DCT."""
        modes = self.source_modes(core_w, bank_w, with_ambient=False)
        if modes is None:
            return solvers.step_exponential(self.solver, T, self.node_power(core_w, bank_w), dt, degree)
        assert isinstance(self.solver, SpectralSolver)
        return self.solver.step_exponential_modes(T, modes[0], modes[1], dt, degree)

    def step_trbdf2(self, T: np.ndarray, core_w: np.ndarray, bank_w: np.ndarray, dt: float, n_sub: int) -> np.ndarray:
        """``dt`` seconds with ``n_sub`` TR-BDF2 sub-steps (``solvers.step``); on the spectral solver the source enters
        mode space separably, without a DCT."""
        modes = self.source_modes(core_w, bank_w)
        if modes is None:
            return solvers.step(self.solver, T, self.node_power(core_w, bank_w), dt, n_sub)
        assert isinstance(self.solver, SpectralSolver)
        return self.solver.step_trbdf2_modes(T, modes[0], modes[1], dt, n_sub)

    # -- the state a run of windows carries (epoch.run_windows) ----------------------------------------------------
    @property
    def modal(self) -> bool:
        """Whether a run's state between windows is ``θ = T − T_amb`` in the spectral solver's modes (the cell modes,
        layer-major, then the 12 ring nodes' ``θ``), which the window step takes and returns without a DCT; else
        (the sparse solver) the node temperatures themselves."""
        return isinstance(self.solver, SpectralSolver)

    def state_of(self, T: np.ndarray) -> np.ndarray:
        """The state vector (n_nodes,) of node temperatures ``T`` (K): their ``θ`` modes (``modal``), else ``T``."""
        T = np.asarray(T, dtype=np.float64)
        if not isinstance(self.solver, SpectralSolver):
            return T.copy()
        theta, ring = self.solver.to_modes(T)  # the cells' modes, the ring's temperatures (K)
        theta[:, 0] -= self._amb0
        out: np.ndarray = np.concatenate([theta.reshape(-1), ring - self.net.ambient])
        return out

    @property
    def _amb0(self) -> float:
        """Mode (0, 0) of a layer uniformly at ``T_amb`` (orthonormal DCT: ``T_amb·√(rows·cols)``), K."""
        return float(self.net.ambient * np.sqrt(float(self.net.rows * self.net.cols)))

    def field_of(self, v: np.ndarray) -> np.ndarray:
        """Node temperatures (K) of a state vector (``state_of``'s inverse): the inverse DCT of the cell modes with
        ``T_amb`` added to mode (0, 0) of each layer (on a copy of those 12 values: ``v`` is not written), the ring's
        ``θ + T_amb``; ``v`` itself for the sparse solver."""
        if not isinstance(self.solver, SpectralSolver):
            return v
        n_layers, nc = self.net.n_layers, self.net.n_cells
        theta = v[:nc].reshape(n_layers, -1)
        keep = theta[:, 0].copy()
        theta[:, 0] += self._amb0
        try:
            return self.solver.from_modes(theta, v[nc:] + self.net.ambient)
        finally:
            theta[:, 0] = keep

    def step_state(self, v: np.ndarray, core_w: np.ndarray, bank_w: np.ndarray, dt: float,
                   field: str = "window_ms") -> np.ndarray:
        """``step`` on a state vector (``state_of``): the exponential step on the spectral solver goes from modes to
        modes without a DCT; the other integrators and solvers through the node temperatures."""
        cfg = self.arch.thermal
        modes = self.source_modes(core_w, bank_w, with_ambient=False) \
            if cfg.integrator == "exponential" and isinstance(self.solver, SpectralSolver) else None
        if modes is None:
            return self.state_of(self.step(self.field_of(v), core_w, bank_w, dt, field))
        assert isinstance(self.solver, SpectralSolver)
        nc = self.net.n_cells
        out, ring = self.solver.step_exponential_theta(v[:nc].reshape(self.net.n_layers, -1), v[nc:], modes[0],
                                                       modes[1], dt, cfg.exp_degree)
        res: np.ndarray = np.concatenate([out.reshape(-1), ring])
        return res

    def layer_cells(self, T: np.ndarray, layer: int) -> np.ndarray:
        nrc = self.net.rows * self.net.cols
        return T[layer * nrc:(layer + 1) * nrc]

    def core_temps(self, T: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.core_map.avg @ self.layer_cells(T, self.logic_layer)
        return out

    @cached_property
    def _core_cells(self) -> list[np.ndarray]:
        avg = self.core_map.avg
        return [avg.indices[avg.indptr[c]:avg.indptr[c + 1]] for c in range(avg.shape[0])]

    @cached_property
    def _core_cells_2d(self) -> np.ndarray | None:
        """(cores, cells per core) the logic-layer cells of every core when every core has as many, else None."""
        idx = self._core_cells
        return np.stack(idx) if len({i.size for i in idx}) == 1 else None

    def core_max_temps(self, T: np.ndarray) -> np.ndarray:
        """(cores,) hottest cell of each core, K."""
        cells = self.layer_cells(T, self.logic_layer)
        idx2 = self._core_cells_2d
        if idx2 is not None:
            out: np.ndarray = cells[idx2].max(axis=1)
            return out
        return np.array([cells[i].max() for i in self._core_cells])

    def bank_temps(self, T: np.ndarray) -> np.ndarray:
        """(DRAM dies, banks per layer) K."""
        return np.stack([self.bank_map.avg @ self.layer_cells(T, layer) for layer in self.dram_layers]) \
            if self.dram_layers else np.zeros((0, self.n_banks_per_layer))

    def vault_temps(self, T: np.ndarray) -> np.ndarray:
        """(cores, DRAM dies) mean bank temperature of each vault per die, K."""
        return self.vault_means(self.bank_temps(T))

    def vault_means(self, bank: np.ndarray) -> np.ndarray:
        """(..., cores, DRAM dies) the mean of each vault's banks per die from bank values (..., DRAM dies, banks per
        layer), any leading axes (e.g. one per window): one ``np.bincount`` over them all, each vault's banks summed
        in bank order (as a bincount per die would)."""
        b = np.asarray(bank, dtype=float)
        n, nd = self.n_cores, len(self.dram_layers)
        lead = b.shape[:-2]
        if not nd:
            return np.zeros((*lead, n, 0))
        rows = b.size // self.n_banks_per_layer  # (window, die) pairs
        bins = (np.arange(rows)[:, None] * n + self.vault_of_bank[None, :]).ravel()
        counts = np.bincount(self.vault_of_bank, minlength=n)
        sums = np.bincount(bins, weights=b.ravel(), minlength=rows * n).reshape(*lead, nd, n)
        return np.ascontiguousarray(np.swapaxes(sums / counts, -1, -2))

    @cached_property
    def _block_grids(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The averaging maps of the cores and of every DRAM die's banks for ``block_temps``: node indices and
        weights (cells per core, cores) and (cells per bank, DRAM dies · banks per layer), row k holding every
        block's k-th entry in ``CellMap``'s order (a pass over row k adds one term to every block: no add waits on
        the previous one). None when the blocks of a map do not all cover as many cells."""
        nrc = self.net.rows * self.net.cols
        out = []
        for cm, layers in ((self.core_map.avg, (self.logic_layer,)), (self.bank_map.avg, self.dram_layers)):
            counts = np.diff(cm.indptr)
            if counts.size == 0 or np.any(counts != counts[0]):
                return None
            k = int(counts[0])
            idx, w = cm.indices.reshape(-1, k).T, cm.data.reshape(-1, k).T  # entries are sorted by block
            out.append(np.ascontiguousarray(np.concatenate([layer * nrc + idx for layer in layers], axis=1)
                                            if layers else np.zeros((k, 0), dtype=np.intp)))
            out.append(np.ascontiguousarray(np.concatenate([w] * len(layers), axis=1) if layers else np.zeros((k, 0))))
        return out[0], out[1], out[2], out[3]

    def block_temps(self, T: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(core_temps(T), core_max_temps(T), bank_temps(T))`` bit for bit in one compiled pass over the blocks'
        cells (``window_kernels.block_sums``): each block's ``Σ w·T`` summed in ``CellMap``'s order from 0.0, as
        its ``np.bincount`` does."""
        grids = self._block_grids
        if grids is None:
            return self.core_temps(T), self.core_max_temps(T), self.bank_temps(T)
        # numba is imported on the first window step, not with the module (the CLI and the other services skip it)
        from services.thermal.window_kernels import block_sums

        core_nodes, core_w, bank_nodes, bank_w = grids
        core, core_max, bank = np.empty(self.n_cores), np.empty(self.n_cores), np.empty(bank_nodes.shape[1])
        block_sums(np.ascontiguousarray(T, dtype=np.float64), core_nodes, core_w, bank_nodes, bank_w, core, core_max,
                   bank)
        return core, core_max, bank.reshape(len(self.dram_layers), self.n_banks_per_layer)

    def summary(self) -> dict[str, object]:
        return {"model": self.key, "nodes": self.net.n_nodes, "layers": list(self.layer_names),
                "grid": [self.net.cols, self.net.rows], "variant": self.net.spec.variant,
                "cores": self.n_cores, "dram_layers": len(self.dram_layers),
                "ambient_c": self.net.ambient - KELVIN}


def _separable_factors(power: CellMap, rows: int, cols: int, nby: int,
                       nbx: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(Fy (rows, nby), Fx (cols, nbx))`` with ``power[(i·cols + j), (y·nbx + x)] = Fy[i, y]·Fx[j, x]`` for
    every entry, or None. The factors are the marginals of block column 0 and block row 0 (their product counts block
    (0, 0)'s total share twice, divided out once); the product is then checked against every stored entry and the
    entry count."""
    i, j = np.divmod(power.row, cols)
    y, x = np.divmod(power.indices, nbx)
    data = power.data
    Fy = np.zeros((rows, nby))
    Fx = np.zeros((cols, nbx))
    first_col, first_row = x == 0, y == 0
    np.add.at(Fy, (i[first_col], y[first_col]), data[first_col])
    np.add.at(Fx, (j[first_row], x[first_row]), data[first_row])
    s00 = float(data[power.indices == 0].sum())  # = Σ_i Fy[i, 0] · Σ_j Fx[j, 0], counted in both marginals
    if s00 <= 0.0:
        return None
    Fy /= s00
    pred = Fy[i, y] * Fx[j, x]
    scale = float(np.abs(data).max()) if data.size else 1.0
    if data.size != np.count_nonzero(Fy) * np.count_nonzero(Fx) or np.abs(pred - data).max() > 1e-12 * scale:
        return None
    return Fy, Fx


def build_model(arch: ArchConfig) -> StackModel:
    spec = network_spec(arch)
    net = build_network(spec)
    kinds = [x.kind for x in arch.geometry.expanded_stack()]
    logic = kinds.index("logic")
    dram = tuple(i for i, k in enumerate(kinds) if k == "dram")
    cx, cy = arch.mesh.cores
    bx, by, _ = arch.dram.banks
    W, H = spec.width, spec.height
    cores = block_map(_tiles(cx, cy, W, H, "core"), W, H, spec.rows, spec.cols, layer="logic")
    banks = block_map(_tiles(bx, by, W, H, "bank"), W, H, spec.rows, spec.cols, layer="dram")
    return StackModel(arch.content_hash(), arch, net, logic, dram, cores, banks)


# process-wide (a model of a large stack holds GBs; every app of the process shares it), bounded by the thermal budget
MODELS: LRU[str, StackModel] = LRU(over=over_thermal_budget)


def get_model(arch: ArchConfig) -> StackModel:
    """The cached ``StackModel`` of ``arch`` (LRU by content hash; built outside the cache's lock, the first copy
    kept)."""
    key = arch.content_hash()
    m = MODELS.get(key)
    return m if m is not None else MODELS.keep(key, build_model(arch))


def lookup_model(key: str) -> StackModel | None:
    return MODELS.get(key)
