"""Chip geometry (one owner; lowering and thermal call it): vaults, banks, hops, DVFS domains, directed NoC links.

Conventions (``shared/contracts/ids.py``, ARCHITECTURE §5.2): core ``c = y·X + x``; bank ``B(bx,by,layer)``; the
``BX/X × BY/Y`` banks above core (x, y) on every DRAM layer are its vault; ``hops`` is the Manhattan distance
between the core and the bank's vault core. Banks are handled as flat ints ``(layer·BY + by)·BX + bx`` inside.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from numpy.typing import NDArray

from shared.configs.arch import ArchConfig
from shared.contracts.ids import parse_bank_id
from shared.errors import BadInput

IntArr = NDArray[np.int64]


@lru_cache(maxsize=1 << 16)
def stable_hash(s: str) -> int:
    """Process-independent 32-bit hash (Python's ``hash`` is salted per process)."""
    return zlib.crc32(s.encode())


@lru_cache(maxsize=1 << 16)
def _parse_bank_cached(s: str) -> tuple[int, int, int]:
    return parse_bank_id(s)


def core_domains(arch: ArchConfig) -> tuple[int, ...]:
    """The DVFS domain of every core, by one rule for every service: a domain that lists a core explicitly owns it
    (the first such domain when several list it); ``"all"`` (the first ``"all"`` domain) covers the cores no domain
    lists; a core in no domain at all belongs to domain 0. So ``[all @ 2.0 GHz, [0, 1] @ 1.5 GHz]`` runs cores 0-1
    at 1.5 GHz and the rest at 2.0, whatever the order of the two domains."""
    n = arch.mesh.n_cores
    dom = [-1] * n
    for d, spec in enumerate(arch.dvfs.domains):
        if spec.cores != "all":
            for c in spec.cores:
                if dom[c] < 0:
                    dom[c] = d
    all_d = next((d for d, spec in enumerate(arch.dvfs.domains) if spec.cores == "all"), 0)
    return tuple(all_d if d < 0 else d for d in dom)


def attention_groups(arch: ArchConfig) -> tuple[int, int]:
    """``(groups, k)``: a micro-batch's non-expert work (attention, router, shared/dense FFN, head) is split over the
    ``k`` cores of group ``mb mod groups`` (cores ``g·k .. g·k + k − 1``); ``arch.schedule.attention == "all"``:
    one group of every core (the physicalizer maps with it, TAPS prices the work with it)."""
    n = arch.mesh.n_cores
    if arch.schedule.attention == "all":
        return 1, n
    k = arch.schedule.group_cores
    return max(1, n // k), k


def attention_share(arch: ArchConfig) -> NDArray[np.float64]:
    """(cores,) the mean fraction of the non-expert work each core runs over many micro-batches (`attention_groups`:
    each micro-batch's work split evenly over its group's ``k`` cores, the groups in turn): ``1 / (groups·k)`` on the
    cores of a group, 0 on cores in none."""
    groups, k = attention_groups(arch)
    share = np.zeros(arch.mesh.n_cores)
    share[:groups * k] = 1.0 / (groups * k)
    return share


@dataclass(frozen=True)
class Chip:
    X: int
    Y: int
    BX: int
    BY: int
    L: int
    vault_bw_bytes_per_ns: float  # GB/s == bytes/ns
    link_bw_bytes_per_ns: float
    link_latency_ns: float
    core_domain: tuple[int, ...]  # DVFS domain index per core

    @classmethod
    def from_arch(cls, arch: ArchConfig) -> Chip:
        X, Y = arch.mesh.cores
        BX, BY, L = arch.dram.banks
        noc = arch.mesh.noc
        return cls(X=X, Y=Y, BX=BX, BY=BY, L=L, vault_bw_bytes_per_ns=arch.dram.vault_bw_gbps,
                   link_bw_bytes_per_ns=noc.width_bits / 8 * noc.link_freq_ghz,
                   link_latency_ns=noc.link_latency_ns, core_domain=core_domains(arch))

    @property
    def n_cores(self) -> int:
        return self.X * self.Y

    @property
    def bpx(self) -> int:
        return self.BX // self.X

    @property
    def bpy(self) -> int:
        return self.BY // self.Y

    @property
    def n_links(self) -> int:
        return 2 * (self.X - 1) * self.Y + 2 * self.X * (self.Y - 1)

    def domain_names(self) -> list[str]:
        return [f"d{d}" for d in self.core_domain]

    # ---- banks ------------------------------------------------------------------------------------------------
    def flat_bank(self, bx: IntArr, by: IntArr, layer: IntArr) -> IntArr:
        return (layer * self.BY + by) * self.BX + bx

    @cached_property
    def _vault_of_bank(self) -> IntArr:
        """Vault core of every flat bank id: ``(by // bpy)·X + bx // bpx`` with ``bx = flat % BX``,
        ``by = (flat // BX) % BY``."""
        flat = np.arange(self.BX * self.BY * self.L, dtype=np.int64)
        bx = flat % self.BX
        by = (flat // self.BX) % self.BY
        out: IntArr = (by // self.bpy) * self.X + bx // self.bpx
        return out

    def bank_vault_core(self, flat: IntArr) -> IntArr:
        """The vault core of each flat bank id, by table (integer division of int64 arrays is slow). The formula is
        periodic in ``flat`` with period BX·BY·L, so ``mode="wrap"`` gives it for any integer, -1 included."""
        out: IntArr = np.take(self._vault_of_bank, flat, mode="wrap")
        return out

    def vault_bank(self, core: IntArr, key: IntArr) -> IntArr:
        """A bank of ``core``'s vault chosen by ``key`` (a stable hash): spreads tensors over the vault's banks."""
        per_layer = self.bpx * self.bpy
        k = key % (per_layer * self.L)
        lx = k % self.bpx
        ly = (k // self.bpx) % self.bpy
        layer = k // per_layer
        cx, cy = core % self.X, core // self.X
        return self.flat_bank(cx * self.bpx + lx, cy * self.bpy + ly, layer)

    def vault_bank_parts(self, key: IntArr) -> tuple[IntArr, IntArr]:
        """``vault_bank(core, key) == key_part[key] + core_part[core]`` (the flat bank id is linear in both):
        lets a caller gather two small tables instead of recomputing per event."""
        per_layer = self.bpx * self.bpy
        k = key % (per_layer * self.L)
        key_part = self.flat_bank(k % self.bpx, (k // self.bpx) % self.bpy, k // per_layer)
        cores = np.arange(self.n_cores, dtype=np.int64)
        core_part = (cores // self.X) * self.bpy * self.BX + (cores % self.X) * self.bpx
        return key_part, core_part

    def bank_str(self, flat: int) -> str:
        bx = flat % self.BX
        by = (flat // self.BX) % self.BY
        layer = flat // (self.BX * self.BY)
        return f"B({bx},{by},{layer})"

    def parse_bank(self, s: str, field: str) -> int:
        try:
            bx, by, layer = _parse_bank_cached(s)
        except ValueError as exc:
            raise BadInput(str(exc), field=field) from None
        if not (bx < self.BX and by < self.BY and layer < self.L):
            raise BadInput(f"bank {s} outside the {self.BX}x{self.BY}x{self.L} bank grid", field=field)
        return int((layer * self.BY + by) * self.BX + bx)

    def bank_strs(self, flat: IntArr) -> list[str]:
        """Vectorised formatting: format each distinct bank once."""
        if flat.size == 0:
            return []
        uniq, inv = np.unique(flat, return_inverse=True)
        names = np.array([self.bank_str(int(b)) for b in uniq], dtype=object)
        out: list[str] = names[inv].tolist()
        return out

    # ---- mesh -------------------------------------------------------------------------------------------------
    @cached_property
    def _core_xy(self) -> tuple[IntArr, IntArr]:
        c = np.arange(self.n_cores, dtype=np.int64)
        return c % self.X, c // self.X

    def hops(self, a: IntArr, b: IntArr) -> IntArr:
        """Manhattan distance between cores ``a`` and ``b`` (mesh coordinates by table when every id is a core)."""
        n = self.n_cores
        if a.size and b.size and min(int(a.min()), int(b.min())) >= 0 and max(int(a.max()), int(b.max())) < n:
            cx, cy = self._core_xy
            out: IntArr = np.abs(cx[a] - cx[b]) + np.abs(cy[a] - cy[b])
            return out
        out = np.abs(a % self.X - b % self.X) + np.abs(a // self.X - b // self.X)
        return out

    def check_core(self, c: int, field: str) -> int:
        if not 0 <= c < self.n_cores:
            raise BadInput(f"core {c} outside the mesh (0..{self.n_cores - 1})", field=field)
        return c

    @cached_property
    def _link_base(self) -> int:
        return 2 * (self.X - 1) * self.Y

    @property
    def gather_link_share(self) -> NDArray[np.float64]:
        """``(cores, links)``: bytes on each directed link per byte gathered at core ``c`` evenly from every core
        (``1/n`` from each, XY routing) — the MoE dispatch of a routed expert's token activations, whose attention
        ran split over all cores. Row ``c`` sums to the mean hop count from all cores to ``c``. Cached per mesh
        shape (a `Chip` is rebuilt for every window)."""
        return _uniform_link_shares(self.X, self.Y)[0]

    @property
    def scatter_link_share(self) -> NDArray[np.float64]:
        """``(cores, links)``: the reverse of `gather_link_share` (the combine: core ``c`` sends ``1/n`` to each)."""
        return _uniform_link_shares(self.X, self.Y)[1]

    @cached_property
    def link_ends(self) -> IntArr:
        """``(links, 2)``: the (from, to) cores of every directed link, in `link_bytes`' link order."""
        out = np.zeros((self.n_links, 2), dtype=np.int64)
        cx, cy = self._core_xy
        for a in range(self.n_cores):
            for b in np.flatnonzero(np.abs(cx - cx[a]) + np.abs(cy - cy[a]) == 1).tolist():
                out[self.route_links(a, b)[0]] = (a, b)
        return out

    def route_links(self, src: int, dst: int) -> tuple[int, ...]:
        """The directed links of the XY route from core ``src`` to core ``dst`` (X first), in `link_bytes`' ids."""
        return _route_links(self.X, self.Y, src, dst)

    def link_bytes(self, src: IntArr, dst: IntArr, nbytes: NDArray[np.float64]) -> NDArray[np.float64]:
        """Bytes per directed link with XY routing (X first, then Y) from ``src`` core to ``dst`` core.

        Link ids: east/west links ``2·(y·(X−1) + x) + {0: +x, 1: −x}`` for the link between (x, y) and (x+1, y);
        north/south links ``2(X−1)Y + 2·(x·(Y−1) + y) + {0: +y, 1: −y}`` between (x, y) and (x, y+1).
        """
        out = np.zeros(self.n_links, dtype=np.float64)
        m = src != dst
        if not m.any():
            return out
        x, y = src[m] % self.X, src[m] // self.X
        tx, ty = dst[m] % self.X, dst[m] // self.X
        w = nbytes[m]
        while True:
            mv = x != tx
            if not mv.any():
                break
            step = np.sign(tx - x)
            lo = np.minimum(x, x + step)
            ids = 2 * (y * (self.X - 1) + lo) + (step < 0)
            out += np.bincount(ids[mv], weights=w[mv], minlength=self.n_links)
            x = np.where(mv, x + step, x)
        while True:
            mv = y != ty
            if not mv.any():
                break
            step = np.sign(ty - y)
            lo = np.minimum(y, y + step)
            ids = self._link_base + 2 * (x * (self.Y - 1) + lo) + (step < 0)
            out += np.bincount(ids[mv], weights=w[mv], minlength=self.n_links)
            y = np.where(mv, y + step, y)
        return out


@lru_cache(maxsize=16)
def _uniform_link_shares(X: int, Y: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(gather, scatter) link shares of an X×Y mesh (see `Chip.gather_link_share`); read-only arrays."""
    chip = Chip(X=X, Y=Y, BX=X, BY=Y, L=1, vault_bw_bytes_per_ns=1.0, link_bw_bytes_per_ns=1.0, link_latency_ns=0.0,
                core_domain=(0,) * (X * Y))
    n = X * Y
    cores = np.arange(n, dtype=np.int64)
    share = np.full(n, 1.0 / n)
    gather = np.stack([chip.link_bytes(cores, np.full(n, c, dtype=np.int64), share) for c in range(n)])
    scatter = np.stack([chip.link_bytes(np.full(n, c, dtype=np.int64), cores, share) for c in range(n)])
    gather.setflags(write=False)
    scatter.setflags(write=False)
    return gather, scatter


@lru_cache(maxsize=1 << 14)
def _route_links(X: int, Y: int, src: int, dst: int) -> tuple[int, ...]:
    """The links `Chip.link_bytes` loads on the XY route ``src -> dst`` (its link-id formula is the only one)."""
    chip = Chip(X=X, Y=Y, BX=X, BY=Y, L=1, vault_bw_bytes_per_ns=1.0, link_bw_bytes_per_ns=1.0, link_latency_ns=0.0,
                core_domain=(0,) * (X * Y))
    loaded = chip.link_bytes(np.array([src], dtype=np.int64), np.array([dst], dtype=np.int64), np.ones(1))
    return tuple(np.flatnonzero(loaded).tolist())
