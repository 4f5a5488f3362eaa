"""Chip geometry seen by the placer: cores, vaults, banks, hops, adjacency, and an analytic thermal kernel.

Conventions (ARCHITECTURE §5.2, ``shared/contracts/ids.py``):
- core id is row-major, ``core = y·X + x`` for ``mesh.cores = [X, Y]``;
- the vault of core (cx, cy) is the ``BX/X × BY/Y`` banks above it on every DRAM layer;
- ``hops(a, b)`` is the Manhattan distance on the core mesh.

Banks are indexed internally by a flat *bank slot* ``(core, slot)`` with ``slot ∈ [0, vault_banks)``; the slot order
cycles the DRAM layers first and then the (x, y) positions inside the vault, so consecutive shards of one expert land on
different dies and different positions (spreading their heat and bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from shared.chip import Chip
from shared.configs import ArchConfig
from shared.contracts.ids import bank_id, parse_bank_id

MIB = 1 << 20


@dataclass(frozen=True)
class ChipGeometry:
    """The placer's view of the chip (`shared.chip.Chip`, the one owner of the geometry) plus its bank slots."""

    chip: Chip

    @classmethod
    def of(cls, arch: ArchConfig) -> ChipGeometry:
        return cls(Chip.from_arch(arch))

    @property
    def mesh_x(self) -> int:
        return self.chip.X

    @property
    def mesh_y(self) -> int:
        return self.chip.Y

    @property
    def banks_x(self) -> int:
        return self.chip.BX

    @property
    def banks_y(self) -> int:
        return self.chip.BY

    @property
    def n_dram_layers(self) -> int:
        return self.chip.L

    @property
    def n_cores(self) -> int:
        return self.chip.n_cores

    @property
    def vault_x(self) -> int:
        return self.chip.bpx

    @property
    def vault_y(self) -> int:
        return self.chip.bpy

    @property
    def vault_banks(self) -> int:
        """Banks in one vault (all DRAM layers)."""
        return self.vault_x * self.vault_y * self.n_dram_layers

    def core_xy(self) -> tuple[np.ndarray, np.ndarray]:
        c = np.arange(self.n_cores)
        return c % self.mesh_x, c // self.mesh_x

    def slot_bank(self, core: int, slot: int) -> tuple[int, int, int]:
        """(bx, by, layer) of vault slot ``slot`` of ``core``: layers cycle fastest, then x, then y in the vault."""
        layer = slot % self.n_dram_layers
        pos = slot // self.n_dram_layers
        ox, oy = pos % self.vault_x, pos // self.vault_x
        cx, cy = core % self.mesh_x, core // self.mesh_x
        return cx * self.vault_x + ox, cy * self.vault_y + oy, layer

    def slot_bank_id(self, core: int, slot: int) -> str:
        return bank_id(*self.slot_bank(core, slot))

    def bank_core_slot(self, bank: str) -> tuple[int, int]:
        """Inverse of `slot_bank_id`: (vault core, slot). Raises ValueError for a bank outside the chip."""
        bx, by, layer = parse_bank_id(bank)
        if not (0 <= bx < self.banks_x and 0 <= by < self.banks_y and 0 <= layer < self.n_dram_layers):
            raise ValueError(f"bank {bank} is outside the {self.banks_x}x{self.banks_y}x{self.n_dram_layers} bank grid")
        cx, ox = divmod(bx, self.vault_x)
        cy, oy = divmod(by, self.vault_y)
        return cy * self.mesh_x + cx, (oy * self.vault_x + ox) * self.n_dram_layers + layer


@lru_cache(maxsize=16)
def hops_matrix(mesh_x: int, mesh_y: int) -> np.ndarray:
    """(n, n) int Manhattan distances between cores (read-only)."""
    c = np.arange(mesh_x * mesh_y)
    x, y = c % mesh_x, c // mesh_x
    h: np.ndarray = np.abs(x[:, None] - x[None, :]) + np.abs(y[:, None] - y[None, :])
    h.setflags(write=False)
    return h


@lru_cache(maxsize=16)
def adjacent_pairs(mesh_x: int, mesh_y: int) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays (i, j), i < j, of mesh-adjacent cores (Manhattan distance 1)."""
    h = hops_matrix(mesh_x, mesh_y)
    i, j = np.nonzero(np.triu(h == 1))
    return i, j


@lru_cache(maxsize=16)
def vault_order(mesh_x: int, mesh_y: int) -> np.ndarray:
    """(n, n): row c lists every core's vault by increasing hops from c (ties by core id): spill order."""
    h = hops_matrix(mesh_x, mesh_y)
    n = h.shape[0]
    key = h * n + np.arange(n)[None, :]
    out: np.ndarray = np.argsort(key, axis=1, kind="stable")
    out.setflags(write=False)
    return out


def analytic_influence(arch: ArchConfig) -> np.ndarray:
    """Fallback thermal influence matrix H (cores × cores, K/W) when the thermal service's is not available.

    A one-node-per-core resistor network: every core is a cell of the die (``die_mm / mesh.cores``) connected
    - laterally to its mesh neighbours through the lumped sheet conductance of the whole stack,
      ``g_lat = Σ_layers k·t · (w_perp / d)`` (W/K), and
    - vertically to the spreader through the layers between the logic die and the sink, ``g_v = A / Σ t/k`` (W/K);
    the spreader, sink and convection add one uniform resistance ``R_pkg = t_sp/(k_sp A_sp) + t_sk/(k_sk A_sk)
    + 1/(h A_sk)`` (K/W) shared by all the power. ``H = (g_lat·L + g_v·I)^{-1} + R_pkg·11ᵀ`` with ``L`` the mesh
    graph Laplacian (adiabatic die edges). Symmetric, positive, diagonally largest. This is a documented
    approximation for tests and for use before the thermal service's `influence_matrix` is reachable.
    """
    X, Y = arch.mesh.cores
    dx = arch.geometry.die_mm[0] * 1e-3 / X
    dy = arch.geometry.die_mm[1] * 1e-3 / Y
    area = dx * dy
    stack = arch.geometry.expanded_stack()
    logic_idx = next(i for i, layer in enumerate(stack) if layer.kind == "logic")
    sheet = sum(layer.k_wmk * layer.thickness_um * 1e-6 for layer in stack)  # W/K per square
    r_vert = sum(layer.thickness_um * 1e-6 / layer.k_wmk for layer in stack[logic_idx + 1:])  # m²K/W
    g_v = area / max(r_vert, 1e-12)
    cool = arch.geometry.cooling
    a_sp = (cool.spreader.side_mm * 1e-3) ** 2
    a_sk = (cool.sink.side_mm * 1e-3) ** 2
    r_pkg = (cool.spreader.thickness_mm * 1e-3 / (cool.spreader.k_wmk * a_sp)
             + cool.sink.thickness_mm * 1e-3 / (cool.sink.k_wmk * a_sk) + 1.0 / (cool.h_wmk2k * a_sk))
    n = X * Y
    c = np.arange(n)
    x, y = c % X, c // X
    G = np.zeros((n, n))
    gx = sheet * dy / dx
    gy = sheet * dx / dy
    for (di, dj, g) in ((1, 0, gx), (0, 1, gy)):
        ok = (x + di < X) & (y + dj < Y)
        a = c[ok]
        b = (y[ok] + dj) * X + (x[ok] + di)
        G[a, b] -= g
        G[b, a] -= g
        G[a, a] += g
        G[b, b] += g
    G[c, c] += g_v
    H = np.linalg.inv(G) + r_pkg
    return np.asarray(0.5 * (H + H.T))


def check_h(H: np.ndarray, n_cores: int, field: str = "H") -> np.ndarray:
    """Validate a user-supplied influence matrix: (n, n), finite, non-negative."""
    from shared.errors import BadInput

    H = np.asarray(H, dtype=float)
    if H.shape != (n_cores, n_cores):
        raise BadInput(f"{field} must be {n_cores}x{n_cores} (cores x cores), got {'x'.join(map(str, H.shape))}",
                       field=field)
    if not np.all(np.isfinite(H)) or np.any(H < 0):
        raise BadInput(f"{field} must be finite and non-negative (K/W)", field=field)
    return H


def synthetic_diffusion_kernel(mesh_x: int, mesh_y: int, *, self_kw: float = 2.0, length: float = 1.0,
                               base_kw: float = 0.05) -> np.ndarray:
    """A symmetric synthetic kernel ``H_ij = self_kw·exp(-d_ij/length) + base_kw`` (K/W), d = Euclidean distance
    in core pitches. For tests and benchmarks that must not depend on the thermal model."""
    c = np.arange(mesh_x * mesh_y)
    x, y = c % mesh_x, c // mesh_x
    d = np.hypot(x[:, None] - x[None, :], y[:, None] - y[None, :])
    return np.asarray(self_kw * np.exp(-d / length) + base_kw)
