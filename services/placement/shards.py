"""Weight shards and the bank book: where each ``W_L{l}E{e}_{k}`` lives and how full/busy every bank is.

Thermal choice of banks (Science III): the array share of a DRAM read (60 %, ``dram.energy_split``) heats the bank
read, and the banks at one position of a vault on every DRAM die form a column above one spot of its core. Decode
streams an expert's whole copy of the weights per micro-batch, shard after shard; with its shards stacked in one
column (the default mapping's slot order: dies first) that spot takes the whole ~7 ms burst and becomes the chip's
hottest cell. TAPS spreads them: a shard goes to the vault position (column) with the least read demand so far, then
the least busy bank in it, and among banks alike, the one on the DRAM die nearest the heat sink. The heat of a bank
read leaves through the dies between it and the sink, and every layer on the far side of it (the logic die, the dies
under it) warms by that heat times that resistance (1-D: ``ΔT = P·R(die → sink)``), so the die nearest the sink
warms the chip least; the thermal model agrees on both shipped chips (``tests/placement/test_taps.py``). Bank layer
``d`` is the ``d``-th DRAM die of ``arch.geometry.stack``, which lists the layers farthest from the sink first: layer
``L − 1`` is the die nearest the sink. With the dies taken in slot order instead (the lowest layer, next to the logic
die, first), TAPS put the most-read shards of every vault on die 1: on the seed's chip (DRAM at 2 W/(m·K)) its logic
peak was 4.8 K above baseline's (measured with ``tasmoe run --quick --arch configs/arch_seed.yaml``).

Units: bytes and bytes/s inside; ``weight_shard_mb`` and ``bank_capacity_mb`` are MiB (2^20 bytes), ``bank_bw_gbps``
is GB/s (1e9 bytes/s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from services.placement.geometry import MIB, ChipGeometry, vault_order
from shared.errors import BadInput

MAX_SHARDS = 1 << 20  # shards one placement lists (DeepSeek-V3: 58 x 256 experts of one 64 MiB shard each)


def check_shards(experts: int, expert_bytes: float, weight_shard_mb: float) -> None:
    """A 422 naming ``expert_bytes`` when ``experts`` experts in shards of ``weight_shard_mb`` MiB would be more than
    `MAX_SHARDS` shards (the placement lists each, with its bank)."""
    n = experts * math.ceil(max(expert_bytes, 0.0) / max(1, int(weight_shard_mb * MIB)))
    if n > MAX_SHARDS:
        raise BadInput(f"expert_bytes: {experts} experts of {expert_bytes:g} bytes in shards of "
                       f"workload.tensors.weight_shard_mb = {weight_shard_mb:g} MiB are {n} shards, at most "
                       f"{MAX_SHARDS} (larger shards)", field="expert_bytes")


def shard_sizes(expert_bytes: int, weight_shard_mb: float) -> list[int]:
    """Split an expert's weights into ``weight_shard_mb`` shards; the last one holds the remainder."""
    if expert_bytes <= 0:
        return []
    shard = max(1, int(weight_shard_mb * MIB))
    n = math.ceil(expert_bytes / shard)
    return [shard] * (n - 1) + [expert_bytes - shard * (n - 1)]


def pack_banks(sizes: Sequence[int], copies: int, cap: float) -> float:
    """Banks that ``copies`` copies of one expert's shards (``sizes``, bytes) take when packed first-fit decreasing
    into banks of ``cap`` bytes (a bank holds as many shards as fit; a shard is never split); ``math.inf`` when a
    shard is larger than a bank. Exact first-fit, in closed form per size: banks alike (the same free bytes, in the
    order they were opened) are kept as one group, so the work is a few groups per distinct size, not per shard.
    The fill the capacity checks assume: with shards the size of a bank it is one bank per shard and the smaller
    remainders packed together; with small shards ``floor(cap / size)`` per bank."""
    counts: dict[int, int] = {}
    for z in sizes:
        counts[int(z)] = counts.get(int(z), 0) + int(copies)
    groups: list[tuple[int, float]] = []  # (banks, free bytes of each), in the order they were opened
    opened = 0
    for z in sorted(counts, reverse=True):
        left = counts[z]
        if left == 0 or z <= 0:
            continue
        if z > cap + 1e-6:
            return math.inf
        out: list[tuple[int, float]] = []
        for nb, free in groups:
            per = int((free + 1e-6) // z)
            take = min(left, nb * per) if per else 0
            if take == 0:
                out.append((nb, free))
                continue
            full, part = divmod(take, per)
            out.extend(g for g in ((full, free - per * z), (1 if part else 0, free - part * z),
                                   (nb - full - (1 if part else 0), free)) if g[0])
            left -= take
        k = int((cap + 1e-6) // z)
        if left:
            full, part = divmod(left, k)
            out.extend(g for g in ((full, cap - k * z), (1 if part else 0, cap - part * z)) if g[0])
            opened += full + (1 if part else 0)
        groups = out
    return float(opened)


def vault_copies(sizes: Sequence[int], cap: float, banks: int) -> int:
    """The most copies of one expert's shards (``sizes``) that `pack_banks` fits in ``banks`` banks of ``cap``
    bytes: TAPS's capacity of one vault, in expert copies (every copy has the same shards)."""
    total = sum(int(z) for z in sizes)
    if total <= 0:
        return MAX_SHARDS
    lo, hi = 0, int(banks * cap // total) + 1  # hi: more bytes than the banks hold, never fits
    while lo < hi:  # the largest q with pack_banks(q) <= banks (monotone in q)
        mid = (lo + hi + 1) // 2
        if pack_banks(sizes, mid, cap) <= banks:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_fits(copies: int, sizes: Sequence[int], cap: float, geom: ChipGeometry) -> None:
    """A 422 naming ``expert_bytes`` when ``copies`` copies of an expert's shards (``sizes``, bytes) do not fit the
    chip's banks of ``cap`` bytes, packed by bytes (`pack_banks`): the numbers, and what would make them fit."""
    banks = geom.n_cores * geom.vault_banks
    need = pack_banks(sizes, copies, cap)
    if need <= banks:
        return
    total = copies * sum(int(z) for z in sizes)
    shards = " + ".join(f"{n} x {z / MIB:.4g} MiB" for z, n in sorted(_size_counts(sizes, copies).items(),
                                                                     reverse=True))
    why = (f"{_gib(total)} GiB is more than the chip's {_gib(banks * cap)} GiB" if total > banks * cap else
           f"{_gib(total)} GiB would fit, but a shard is never split across banks: a smaller "
           "workload.tensors.weight_shard_mb packs tighter")
    raise BadInput(f"the model does not fit the chip's DRAM: {copies} expert copies in shards of {shards} take "
                   f"{need:.0f} banks packed by bytes (a bank holds as many shards as fit), the chip has {banks} "
                   f"({geom.n_cores} vaults x {geom.vault_banks} banks of {cap / MIB:.4g} MiB): {why}",
                   field="expert_bytes")


def _size_counts(sizes: Sequence[int], copies: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for z in sizes:
        out[int(z)] = out.get(int(z), 0) + copies
    return out


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f}"


def spread_pick(load: np.ndarray, used: np.ndarray, mask: np.ndarray, n_dram_layers: int) -> int:
    """The slot of one vault (``mask``: the allowed ones) for a new shard: least ``load`` in the slot's column (the
    banks at its position on every DRAM die, slots ``pos·L .. pos·L + L − 1``: their array energy heats the same spot
    of the logic die), then least ``load`` in the bank, then least used, then the die nearest the heat sink (layer
    ``slot mod L``, highest first: see the module docstring), then lowest slot (deterministic). ``load``: read demand
    (TAPS's bank book) or, where demand is not known, the bytes held (TACS)."""
    idx = np.flatnonzero(mask)
    col = load.reshape(-1, n_dram_layers).sum(axis=1)[idx // n_dram_layers]
    sink_first = -(idx % n_dram_layers)  # layer L − 1, the die nearest the heat sink, first
    key = np.lexsort((idx, sink_first, used[idx], load[idx], col))
    return int(idx[key[0]])


def read_die_profile(geom: ChipGeometry, shards_per_vault: float) -> np.ndarray:
    """(DRAM dies,) the share of a vault's weight reads on each die (bank layer order), when the book fills an empty
    vault with ``shards_per_vault`` shards of equal read demand by `spread_pick` (so the dies nearest the sink first:
    one shard per column on the top die, then the next die down). A fractional count weighs its last shard by the
    fraction; none: evenly. TAPS's model puts its instances' weight-read heat in the dies by this profile (the
    thermal service's ``vault_dies``); it is the mean vault's, and equal demand: the book gives the hottest shards
    the top die first, so the reads sit nearer the sink than this says."""
    L, banks = geom.n_dram_layers, geom.vault_banks
    share = np.zeros(L)
    k = max(float(shards_per_vault), 0.0)
    load, used = np.zeros(banks), np.zeros(banks)
    everywhere = np.ones(banks, dtype=bool)
    for i in range(math.ceil(k - 1e-9)):
        slot = spread_pick(load, used, everywhere, L)
        load[slot] += 1.0
        used[slot] += 1.0
        share[slot % L] += min(1.0, k - i)
    return share / share.sum() if share.sum() > 0 else np.full(L, 1.0 / L)


class BankBook:
    """Occupancy (bytes) and read-bandwidth demand (bytes/s) of every bank, shaped (n_cores, vault_banks)."""

    def __init__(self, geom: ChipGeometry, bank_capacity_bytes: float, bank_bw_bps: float) -> None:
        self.geom = geom
        self.cap = float(bank_capacity_bytes)
        self.bw_cap = float(bank_bw_bps)
        self.used = np.zeros((geom.n_cores, geom.vault_banks))
        self.bw = np.zeros((geom.n_cores, geom.vault_banks))
        self.spilled = 0  # shards placed outside their user's vault
        self.over_capacity = 0  # shards placed in a bank without room (the chip is full)
        self.over_bw = 0  # shards placed where the bank's bandwidth demand exceeds bank_bw_gbps

    def _pick(self, v: int, mask: np.ndarray) -> int:
        return spread_pick(self.bw[v], self.used[v], mask, self.geom.n_dram_layers)

    def place(self, core: int, size: float, demand: float) -> tuple[int, int]:
        """Place one shard for ``core``: its own vault when a bank has room and bandwidth, else the nearest vault with
        both, else the nearest with room (bandwidth exceeded), else the least-used bank of its own vault (over
        capacity); within a vault, `spread_pick` (least-demanded column, least-demanded bank, the die nearest the
        sink). Returns (vault core, slot)."""
        room = np.asarray(self.used + size <= self.cap + 1e-6, dtype=bool)
        bw_ok = np.asarray(self.bw + demand <= self.bw_cap * (1 + 1e-9), dtype=bool)
        order = vault_order(self.geom.mesh_x, self.geom.mesh_y)[core]
        passes: tuple[tuple[np.ndarray, str | None], ...] = ((room & bw_ok, None), (room, "bw"))
        for mask_all, counter in passes:
            if mask_all[core].any():
                v = core
            else:
                has = np.asarray(mask_all.any(axis=1))[order]
                if not has.any():
                    continue
                v = int(order[int(np.argmax(has))])
            slot = self._pick(v, mask_all[v])
            if v != core:
                self.spilled += 1
            if counter == "bw":
                self.over_bw += 1
            self._add(v, slot, size, demand)
            return v, slot
        # the chip is full: the least used bank of the core's own vault (`spread_pick` with no demand to weigh: the
        # least used, then the die nearest the sink, then the lowest slot)
        banks = self.geom.vault_banks
        slot = spread_pick(np.zeros(banks), self.used[core], np.ones(banks, dtype=bool), self.geom.n_dram_layers)
        self.over_capacity += 1
        self._add(core, slot, size, demand)
        return core, slot

    def _add(self, v: int, slot: int, size: float, demand: float) -> None:
        self.used[v, slot] += size
        self.bw[v, slot] += demand

    def bw_util_max(self) -> float:
        return float(self.bw.max() / self.bw_cap) if self.bw_cap > 0 else 0.0

    def notes(self) -> list[str]:
        out = []
        if self.spilled:
            out.append(f"{self.spilled} weight shards spilled to a neighbouring vault (own vault full or busy)")
        if self.over_bw:
            out.append(f"{self.over_bw} weight shards placed in banks whose read demand exceeds bank_bw_gbps")
        if self.over_capacity:
            out.append(f"{self.over_capacity} weight shards do not fit the chip's DRAM: placed over bank capacity")
        return out
