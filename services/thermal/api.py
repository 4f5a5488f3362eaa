"""The thermal model as a Python library: build a stack, solve steady states and transients, read its influence
matrix, with no service, HTTP or settings behind it. Kelvin, watts, seconds, metres throughout.

A stack is built from HotSpot's files (``Stack.from_hotspot``: a layer configuration file or a floorplan, a
``hotspot.config``, any HotSpot option) or from the simulator's arch config (``Stack.from_arch``). Its *blocks* are
what dissipates power: the floorplan blocks of the power layers in HotSpot's trace order (layer by layer), or the
arch's cores (``core_<i>``) and DRAM banks (``bank_<die>_<k>``). Power is a mapping ``{block: W}`` (missing blocks
dissipate nothing) or a vector in ``Stack.blocks`` order. The solvers are the ones ``tasmoe hotspot`` and the thermal
service run (the spectral solver: DCT per layer + tridiagonal sweeps + the package ring by Woodbury).
Examples: ``services/thermal/README.md`` ("Python API"), run by ``tests/thermal/test_api_python.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from services.thermal import solvers
from services.thermal.hotspot import HotspotCase, default_solver, load_case, parse_options
from services.thermal.network import RCNetwork
from shared.errors import BadInput

Power = Mapping[str, float] | Sequence[float] | np.ndarray


@dataclass(frozen=True)
class Field:
    """Temperatures (K) of every node of a stack: cells layer by layer (row 0 = north edge), then the package ring."""

    stack: Stack
    nodes: np.ndarray

    def blocks(self) -> dict[str, float]:
        """Temperature (K) of every power block: the mean of its cells."""
        return dict(zip(self.stack.blocks, self.stack._to_blocks(self.nodes).tolist(), strict=True))

    def block(self, name: str) -> float:
        return float(self.stack._to_blocks(self.nodes)[self.stack._index(name)])

    def layer(self, n: int) -> np.ndarray:
        """Layer ``n``'s cells (rows, cols), K; layers as in ``Stack.layers`` (the spreader and sink last)."""
        net = self.stack.net
        if not 0 <= n < net.n_layers:
            raise BadInput(f"layer {n}: the stack has layers 0..{net.n_layers - 1}", field="layer")
        nrc = net.rows * net.cols
        return self.nodes[n * nrc:(n + 1) * nrc].reshape(net.rows, net.cols)

    @property
    def max(self) -> float:
        """The hottest grid cell (K)."""
        return float(self.nodes[:self.stack.net.n_cells].max())


class Stack:
    """A stack's thermal RC network with named power blocks. Build with ``from_hotspot`` or ``from_arch``."""

    def __init__(self, net: RCNetwork, blocks: Sequence[str], to_nodes: Callable[[np.ndarray], np.ndarray],
                 to_blocks: Callable[[np.ndarray], np.ndarray], solver: solvers.Solver | None = None) -> None:
        self.net = net
        self.blocks: tuple[str, ...] = tuple(blocks)
        self._to_nodes = to_nodes
        self._to_blocks = to_blocks
        self._solver = solver
        self._where: dict[str, int] = {}
        self._twice: set[str] = set()  # names in several power layers: only a vector can address them
        for k, b in enumerate(self.blocks):
            if b in self._where:
                self._twice.add(b)
            self._where.setdefault(b, k)

    # -- construction ----------------------------------------------------------------------------------------------
    @classmethod
    def from_hotspot(cls, layer_file: str | Path | None = None, *, config: str | Path | None = None,
                     floorplan: str | Path | None = None, **options: str | float) -> Stack:
        """HotSpot's grid model of these inputs, exactly as ``tasmoe hotspot`` builds it. ``options`` are HotSpot
        options without the dash (``grid_rows=64``, ``r_convec=0.1``, ``detailed_3D="on"``); they override the
        ``config`` file, whose values override HotSpot's defaults. Floorplans named in the layer file are found
        beside it."""
        args = ["-model_type", "grid"]
        for flag, value in (("-grid_layer_file", layer_file), ("-c", config), ("-f", floorplan)):
            if value is not None:
                args += [flag, str(value)]
        for name, option in options.items():
            args += [f"-{name}", str(option)]
        case = load_case(parse_options(args, need_trace=False))
        return cls._of_case(case)

    @classmethod
    def _of_case(cls, case: HotspotCase) -> Stack:
        layers = case.power_layers
        sizes = [case.floorplans[n].n_units for n in layers]
        names = [name for n in layers for name in case.floorplans[n].names]
        bounds = np.cumsum([0, *sizes])

        def to_nodes(w: np.ndarray) -> np.ndarray:
            return case.node_power({n: w[bounds[k]:bounds[k + 1]] for k, n in enumerate(layers)})

        def to_blocks(T: np.ndarray) -> np.ndarray:
            return np.concatenate([case.block_temps(T, n) for n in layers]) if layers else np.zeros(0)

        return cls(case.net, names, to_nodes, to_blocks)

    @classmethod
    def from_arch(cls, arch: object) -> Stack:
        """The simulator's stack of an ``ArchConfig`` (or the path of an arch YAML): blocks ``core_<i>`` on the logic
        die, then ``bank_<die>_<k>`` per DRAM die (die 0 next to the logic die, bank ``k = by·BX + bx``)."""
        from services.thermal.model import build_model
        from shared.configs import ArchConfig, load_arch

        cfg = arch if isinstance(arch, ArchConfig) else load_arch(str(arch))
        model = build_model(cfg)
        nc, nd, nb = model.n_cores, len(model.dram_layers), model.n_banks_per_layer
        names = [f"core_{i}" for i in range(nc)] + [f"bank_{d}_{k}" for d in range(nd) for k in range(nb)]

        def to_nodes(w: np.ndarray) -> np.ndarray:
            return model.node_power(w[:nc], w[nc:].reshape(nd, nb))

        def to_blocks(T: np.ndarray) -> np.ndarray:
            return np.concatenate([model.core_temps(T), model.bank_temps(T).reshape(-1)])

        return cls(model.net, names, to_nodes, to_blocks, model.solver)

    # -- inputs ------------------------------------------------------------------------------------------------------
    @property
    def ambient(self) -> float:
        return float(self.net.ambient)

    @property
    def layers(self) -> tuple[str, ...]:
        return tuple(self.net.names)

    @cached_property
    def solver(self) -> solvers.Solver:
        if self._solver is None:  # spectral when every layer is laterally uniform, else sparse (solver_note)
            self._solver = default_solver(self.net)
        return self._solver

    def _index(self, name: str) -> int:
        if name in self._twice:
            raise BadInput(f"block {name!r} is in several power layers: give the power as a vector in "
                           "stack.blocks order", field=name)
        k = self._where.get(name)
        if k is None:
            raise BadInput(f"no power block {name!r} in this stack ({len(self.blocks)} blocks: "
                           f"{', '.join(self.blocks[:4])}, ...)", field=name)
        return k

    def power_vector(self, power: Power) -> np.ndarray:
        """Block powers (W) in ``blocks`` order from a mapping (missing blocks: 0 W) or a vector; finite and >= 0."""
        if isinstance(power, Mapping):
            w = np.zeros(len(self.blocks))
            for name, value in power.items():
                w[self._index(name)] = value
        else:
            w = np.asarray(power, dtype=np.float64).reshape(-1)
            if w.size != len(self.blocks):
                raise BadInput(f"power: {w.size} values for {len(self.blocks)} blocks", field="power")
        bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
        if bad.size:
            raise BadInput(f"power of block {self.blocks[bad[0]]}: {w[bad[0]]} W (must be finite and >= 0)",
                           field=self.blocks[bad[0]])
        return w

    # -- solves ------------------------------------------------------------------------------------------------------
    def steady(self, power: Power) -> Field:
        """The steady state of constant block power (W)."""
        return Field(self, solvers.steady(self.solver, self._to_nodes(self.power_vector(power))))

    def uniform(self, kelvin: float) -> Field:
        """Every node at one temperature (K), e.g. a transient's start."""
        return Field(self, np.full(self.net.n_nodes, float(kelvin)))

    def transient(self, power_steps: Sequence[Power] | np.ndarray, dt: float, start: Field | None = None,
                  ) -> tuple[np.ndarray, Field]:
        """Constant power per interval of ``dt`` seconds, one interval per element of ``power_steps``; from
        ``start`` (default: the ambient). Returns the block temperatures at the end of each interval (steps, blocks),
        K, and the last field. Each interval is the network's exact solution for its constant power with exp
        replaced by its degree-6 rational approximation (``solvers.step_exponential``; error <= 2e-6 of the distance
        to the interval's steady state), whatever ``dt``."""
        if not (math.isfinite(dt) and dt > 0):
            raise BadInput(f"dt: {dt} s (must be finite and > 0)", field="dt")
        T = (start or self.uniform(self.ambient)).nodes
        rows = []
        for p in power_steps:
            T = solvers.step_exponential(self.solver, T, self._to_nodes(self.power_vector(p)), dt)
            rows.append(self._to_blocks(T))
        return (np.vstack(rows) if rows else np.zeros((0, len(self.blocks)))), Field(self, T)

    def influence(self, of: Sequence[str] | None = None) -> np.ndarray:
        """Steady influence matrix (K/W): ``H[i, j]`` is the rise of block ``i`` over the ambient per W in block
        ``j`` (``of``: the blocks, default all; one solve per column). By superposition the steady block
        temperatures of power ``w`` are ``ambient + H·w``."""
        cols = [self._index(b) for b in (of if of is not None else self.blocks)]
        n = len(self.blocks)
        P = np.stack([self._to_nodes(np.eye(1, n, j).ravel()) for j in cols], axis=1)
        rise = self.solver.solve(0.0, P)  # G·θ = P: the rise over the ambient, per unit power
        H: np.ndarray = np.stack([self._to_blocks(rise[:, k]) for k in range(len(cols))], axis=1)
        return H[cols] if of is not None else H
