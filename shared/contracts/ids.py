"""Identifier conventions shared by every service.

- expert instance: ``L{layer}E{expert}`` (the unit of placement, ARCHITECTURE §5.2)
- weight shard tensor: ``W_L{layer}E{expert}_{shard}``
- DRAM bank: ``B(x,y,layer)`` with x, y bank coordinates on the bank grid and ``layer`` the DRAM die (0-based)
- core id: row-major on the mesh, ``core = y * X + x`` for ``mesh.cores = [X, Y]``
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

_EXPERT = re.compile(r"^L(\d+)E(\d+)$")
_BANK = re.compile(r"^B\((\d{1,9}),(\d{1,9}),(\d{1,9})\)$")  # at most 9 digits: an int64 array holds it
_WEIGHT = re.compile(r"^W_L(0|[1-9]\d*)E(0|[1-9]\d*)_(0|[1-9]\d*)$")  # canonical: no leading zeros


def expert_id(layer: int, expert: int) -> str:
    return f"L{layer}E{expert}"


def parse_expert_id(s: str) -> tuple[int, int]:
    m = _EXPERT.match(s)
    if not m:
        raise ValueError(f"not an expert instance id (L<layer>E<expert>): {s!r}")
    return int(m.group(1)), int(m.group(2))


def weight_tensor_id(layer: int, expert: int, shard: int) -> str:
    return f"W_L{layer}E{expert}_{shard}"


def parse_weight_tensor_id(s: str) -> tuple[int, int, int]:
    """(layer, expert, shard) of ``W_L{layer}E{expert}_{shard}`` as `weight_tensor_id` writes it (no leading zeros:
    the id is a name, ``W_L01E2_0`` is not ``W_L1E2_0``'s); ValueError for anything else."""
    m = _WEIGHT.match(s)
    if not m:
        raise ValueError(f"not a weight shard id (W_L<layer>E<expert>_<shard>): {s!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def bank_id(x: int, y: int, layer: int) -> str:
    return f"B({x},{y},{layer})"


def parse_bank_id(s: str) -> tuple[int, int, int]:
    m = _BANK.match(s.replace(" ", ""))
    if not m:
        raise ValueError(f"not a bank id (B(x,y,layer)): {s!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


_BANK_IN_LIST = re.compile(r"(?:^|;)B\((\d{1,9}),(\d{1,9}),(\d{1,9})\)(?=;|$)")


def parse_bank_ids(banks: Sequence[str]) -> NDArray[np.int64]:
    """``(n, 3)`` int64 ``(x, y, layer)`` of many bank ids at once: one regex pass over the joined ids when every id
    is exactly ``B(x,y,layer)`` (no spaces, no ``;``), else id by id. Raises ValueError naming the first bad id's
    position as ``[i]``. Bounds (the chip's bank grid) are the caller's to check."""
    if not banks:
        return np.zeros((0, 3), dtype=np.int64)
    joined = ";".join(banks)
    if joined.count(";") == len(banks) - 1 and " " not in joined:
        found = _BANK_IN_LIST.findall(joined)
        if len(found) == len(banks):
            return np.asarray(found, dtype=np.int64).reshape(-1, 3)
    out = np.empty((len(banks), 3), dtype=np.int64)
    for i, s in enumerate(banks):
        try:
            out[i] = parse_bank_id(s)
        except ValueError as exc:
            raise ValueError(f"[{i}] {exc}") from None
    return out


def core_xy(core: int, mesh_x: int) -> tuple[int, int]:
    return core % mesh_x, core // mesh_x


def core_index(x: int, y: int, mesh_x: int) -> int:
    return y * mesh_x + x


def vault_core(bx: int, by: int, banks_x: int, banks_y: int, mesh_x: int, mesh_y: int) -> int:
    """The core under bank (bx, by): its vault owner."""
    return core_index(bx // (banks_x // mesh_x), by // (banks_y // mesh_y), mesh_x)


def hops(core_a: int, core_b: int, mesh_x: int) -> int:
    """Manhattan distance on the core mesh."""
    ax, ay = core_xy(core_a, mesh_x)
    bx, by = core_xy(core_b, mesh_x)
    return abs(ax - bx) + abs(ay - by)
