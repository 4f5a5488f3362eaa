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


def vault_bw_raw_gbps(arch: ArchConfig) -> float:
    """The vaults' raw bandwidth, GB/s: one vault per core (``mesh.n_cores × dram.vault_bw_gbps``), before refresh
    takes its share (the DRAM roofline's bandwidth and ``bw_util_raw``'s denominator)."""
    return arch.mesh.n_cores * arch.dram.vault_bw_gbps


def attention_groups(arch: ArchConfig) -> tuple[int, int]:
    """``(groups, k)``: a micro-batch's non-expert work (attention, router, shared/dense FFN, head) is split over the
    ``k`` cores of group ``mb mod groups`` (cores ``g·k .. g·k + k − 1``); ``arch.schedule.attention == "all"``:
    one group of every core (the physicalizer maps with it, TAPS prices the work with it)."""
    n = arch.mesh.n_cores
    if arch.schedule.attention == "all":
        return 1, n
    k = arch.schedule.group_cores
    return max(1, n // k), k


def stripe_groups(arch: ArchConfig) -> NDArray[np.int64]:
    """(groups, k) the cores of each expert stripe group (``arch.schedule.expert_stripe`` = k consecutive cores; k = 1:
    one group per core)."""
    k = arch.schedule.expert_stripe
    return np.arange(arch.mesh.n_cores, dtype=np.int64).reshape(-1, k)


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
        """The chip of ``arch``: one instance per distinct geometry in the process (`_interned`), so that its cached
        tables (bank vaults, bank names) are built once, not once per window."""
        X, Y = arch.mesh.cores
        BX, BY, L = arch.dram.banks
        noc = arch.mesh.noc
        return _interned(cls(X=X, Y=Y, BX=BX, BY=BY, L=L, vault_bw_bytes_per_ns=arch.dram.vault_bw_gbps,
                             link_bw_bytes_per_ns=noc.width_bits / 8 * noc.link_freq_ghz,
                             link_latency_ns=noc.link_latency_ns, core_domain=core_domains(arch)))

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

    @cached_property
    def _die_vault_of_bank(self) -> IntArr:
        """``die · n_cores + vault core`` of every flat bank id (the die is ``flat // (BX·BY)``)."""
        flat = np.arange(self.BX * self.BY * self.L, dtype=np.int64)
        out: IntArr = (flat // (self.BX * self.BY)) * self.n_cores + self._vault_of_bank
        return out

    def bank_die_vault(self, flat: IntArr) -> IntArr:
        """``die · n_cores + vault core`` of each flat bank id of the grid, by table: one id per (die, vault)."""
        out: IntArr = np.take(self._die_vault_of_bank, flat)
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

    @cached_property
    def bank_names(self) -> NDArray[np.object_]:
        """``bank_str`` of every flat bank id, by table (read-only)."""
        out = np.array([self.bank_str(b) for b in range(self.BX * self.BY * self.L)], dtype=object)
        out.setflags(write=False)
        return out

    @cached_property
    def bank_of_name(self) -> dict[str, int]:
        """The flat id of every bank by its name as `bank_str` writes it (``B(x,y,layer)``, no spaces)."""
        return {name: b for b, name in enumerate(self.bank_names.tolist())}

    def bank_strs(self, flat: IntArr) -> list[str]:
        """`bank_str` of many flat ids (each in the bank grid), by table."""
        if flat.size == 0:
            return []
        out: list[str] = self.bank_names[flat].tolist()
        return out

    # ---- mesh -------------------------------------------------------------------------------------------------
    @cached_property
    def _core_xy(self) -> tuple[IntArr, IntArr]:
        c = np.arange(self.n_cores, dtype=np.int64)
        return c % self.X, c // self.X

    @cached_property
    def _hop_table(self) -> IntArr:
        """Hops between every pair of cores, ``a·n + b`` (meshes of up to 256 cores: 64 K entries)."""
        cx, cy = self._core_xy
        out: IntArr = (np.abs(cx[:, None] - cx[None, :]) + np.abs(cy[:, None] - cy[None, :])).reshape(-1)
        return out

    def hops(self, a: IntArr, b: IntArr) -> IntArr:
        """Manhattan distance between cores ``a`` and ``b`` (by table when every id is a core)."""
        n = self.n_cores
        if a.size and b.size and _all_below(a, n) and _all_below(b, n):
            if n <= 256 and a.shape == b.shape:
                by_pair: IntArr = self._hop_table[a * n + b]
                return by_pair
            cx, cy = self._core_xy
            out: IntArr = np.abs(cx[a] - cx[b]) + np.abs(cy[a] - cy[b])
            return out
        out = np.abs(a % self.X - b % self.X) + np.abs(a // self.X - b // self.X)
        return out

    def check_core(self, c: int, field: str) -> int:
        if not 0 <= c < self.n_cores:
            raise BadInput(f"core {c} outside the mesh (0..{self.n_cores - 1})", field=field)
        return c

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

    @property
    def link_ends(self) -> IntArr:
        """``(links, 2)``: the (from, to) cores of every directed link, in `link_bytes`' link order (read-only,
        cached per mesh shape)."""
        return _link_ends(self.X, self.Y)

    def route_links(self, src: int, dst: int) -> tuple[int, ...]:
        """The directed links of the XY route from core ``src`` to core ``dst`` (X first), in `link_bytes`' ids."""
        return _route_links(self.X, self.Y, src, dst)

    def link_bytes(self, src: IntArr, dst: IntArr, nbytes: NDArray[np.float64]) -> NDArray[np.float64]:
        """Bytes per directed link with XY routing (X first, then Y) from ``src`` core to ``dst`` core.

        Link ids: east/west links ``2·(y·(X−1) + x) + {0: +x, 1: −x}`` for the link between (x, y) and (x+1, y);
        north/south links ``2(X−1)Y + 2·(x·(Y−1) + y) + {0: +y, 1: −y}`` between (x, y) and (x, y+1).

        Each link's total is summed step by step of the routes (all events' first X hop, their second, ..., then
        their Y hops), each step's bytes in event order: `_xy_link_bytes` walks the routes so; with every id a core
        of the mesh, the routes come from a table (`_xy_routes`) and one ``bincount`` keyed by (step, link) gives
        every step's sums at once, added in the same order (the same floating-point sums, bit for bit).
        """
        m = src != dst
        if not m.any():
            return np.zeros(self.n_links, dtype=np.float64)
        s, d, w = src[m], dst[m], nbytes[m]
        n = self.n_cores
        if not (_all_below(s, n) and _all_below(d, n)):
            return _xy_link_bytes(self.X, self.Y, s, d, w)
        routes = _xy_routes(self.X, self.Y)
        pair = s * n + d
        cnt = routes.count[pair]
        first = np.cumsum(cnt) - cnt
        ent = np.repeat(routes.start[pair] - first, cnt) + np.arange(int(first[-1] + cnt[-1]), dtype=np.int64)
        per_step = np.bincount(routes.key[ent], weights=np.repeat(w, cnt), minlength=routes.n_steps * self.n_links)
        out = np.zeros(self.n_links, dtype=np.float64)
        for row in per_step.reshape(routes.n_steps, self.n_links):  # the steps' sums in step order
            out += row
        return out


def _all_below(a: IntArr, n: int) -> bool:
    """Whether every value of the integer array ``a`` (not empty) is in ``0 .. n − 1`` (int64: one pass, negatives
    read as unsigned are above any ``n``)."""
    if a.dtype == np.int64:
        return int(np.ascontiguousarray(a).view(np.uint64).max()) < n
    return bool(a.min() >= 0) and bool(a.max() < n)


def _xy_link_bytes(X: int, Y: int, src: IntArr, dst: IntArr, w: NDArray[np.float64]) -> NDArray[np.float64]:
    """`Chip.link_bytes` of events that all move (``src != dst``), walking the XY routes one step at a time: the
    link-id formula of record (`_xy_routes` tabulates it; ids outside the mesh go through here)."""
    n_links = 2 * (X - 1) * Y + 2 * X * (Y - 1)
    out = np.zeros(n_links, dtype=np.float64)
    x, y = src % X, src // X
    tx, ty = dst % X, dst // X
    while True:
        mv = x != tx
        if not mv.any():
            break
        step = np.sign(tx - x)
        lo = np.minimum(x, x + step)
        ids = 2 * (y * (X - 1) + lo) + (step < 0)
        out += np.bincount(ids[mv], weights=w[mv], minlength=n_links)
        x = np.where(mv, x + step, x)
    while True:
        mv = y != ty
        if not mv.any():
            break
        step = np.sign(ty - y)
        lo = np.minimum(y, y + step)
        ids = 2 * (X - 1) * Y + 2 * (x * (Y - 1) + lo) + (step < 0)
        out += np.bincount(ids[mv], weights=w[mv], minlength=n_links)
        y = np.where(mv, y + step, y)
    return out


@dataclass(frozen=True)
class _Routes:
    """The XY route of every (src, dst) core pair of a mesh, as `_xy_link_bytes` walks it: pair ``s·n + d``'s
    entries are ``start[pair] .. start[pair] + count[pair] - 1``, each a ``key = step·n_links + link`` with step
    ``0 .. X−2`` for its X hops and ``X−1 .. X+Y−3`` for its Y hops."""

    start: IntArr
    count: IntArr
    key: IntArr
    n_steps: int


@lru_cache(maxsize=16)
def _xy_routes(X: int, Y: int) -> _Routes:
    n = X * Y
    n_links = 2 * (X - 1) * Y + 2 * X * (Y - 1)
    pair = np.arange(n * n, dtype=np.int64)
    src, dst = pair // n, pair % n
    x, y = src % X, src // X
    tx, ty = dst % X, dst // X
    pairs: list[IntArr] = []
    keys: list[IntArr] = []
    for k in range(X - 1):  # X hops: step k
        mv = x != tx
        step = np.sign(tx - x)
        lo = np.minimum(x, x + step)
        pairs.append(pair[mv])
        keys.append(k * n_links + (2 * (y * (X - 1) + lo) + (step < 0))[mv])
        x = np.where(mv, x + step, x)
    for k in range(Y - 1):  # Y hops: step X - 1 + k
        mv = y != ty
        step = np.sign(ty - y)
        lo = np.minimum(y, y + step)
        pairs.append(pair[mv])
        keys.append((X - 1 + k) * n_links + (2 * (X - 1) * Y + 2 * (x * (Y - 1) + lo) + (step < 0))[mv])
        y = np.where(mv, y + step, y)
    p = np.concatenate(pairs) if pairs else np.zeros(0, np.int64)
    key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    order = np.argsort(p * max(1, (X + Y) * n_links) + key, kind="stable")
    count = np.bincount(p, minlength=n * n).astype(np.int64)
    routes = _Routes(start=np.cumsum(count) - count, count=count, key=key[order], n_steps=max(1, X + Y - 2))
    for a in (routes.start, routes.count, routes.key):
        a.setflags(write=False)
    return routes


@lru_cache(maxsize=16)
def _link_ends(X: int, Y: int) -> IntArr:
    chip = Chip(X=X, Y=Y, BX=X, BY=Y, L=1, vault_bw_bytes_per_ns=1.0, link_bw_bytes_per_ns=1.0, link_latency_ns=0.0,
                core_domain=(0,) * (X * Y))
    out = np.zeros((chip.n_links, 2), dtype=np.int64)
    cx, cy = chip._core_xy
    for a in range(chip.n_cores):
        for b in np.flatnonzero(np.abs(cx - cx[a]) + np.abs(cy - cy[a]) == 1).tolist():
            out[chip.route_links(a, b)[0]] = (a, b)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=64)
def _interned(chip: Chip) -> Chip:
    """The first `Chip` equal to ``chip`` this process made (a frozen dataclass: equal fields, equal chips)."""
    return chip


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
