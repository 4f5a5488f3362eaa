"""Stage 3: the memory traffic of pieces: which bank each piece reads or writes, how many bytes, how far.

- Weight tensors ``W_*`` of a routed expert are read from (first match): the replica state's ``shard_banks`` (TACS's
  migrations: where it records a shard, it is the one record) > ``state.tensor_banks`` (weight overlays the replica
  state does not record, or ``L{l}E{e}_*`` after an expert row with bytes) > ``placement.tensors`` (a
  replica reads its own copy in ``replica_banks``) > a bank of the home core's vault chosen by CRC-32 of the tensor
  id. A placement bank is used only by the core it was placed for (the instance's first core).
- KV, activations and the weights of split (non-expert) rows live in the executing core's own vault: a split piece
  streams its ``1/k`` share of the weights from there (the weights of a GEMM split over N are sharded with it).
- Bytes: weights scale with ``w_frac`` (each replica streams the whole expert), KV/activations with ``tok_frac``.
- ``hops`` = Manhattan distance between the executing core and the bank's vault core.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from services.lowering.physical.assign import Pieces
from services.lowering.physical.columns import Strings
from services.lowering.physical.overlays import expert_cores
from shared.chip import Chip, stable_hash
from shared.contracts.ids import expert_id, parse_weight_tensor_id
from shared.contracts.placement import Placement, ReplicaState
from shared.errors import BadInput

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
B = NDArray[np.bool_]


class TensorTable:
    """Where each tensor lives (see the module docstring), resolved once per tensor (by its code in ``names``) for
    one placement, replica state and set of tensor banks: whether it is a weight, its CRC-32 bank part, its placed
    bank and the core that copy is for (-1: none / any), and its replicas' copies."""

    def __init__(self, names: Strings, placement: Placement, replicas: ReplicaState, tensor_banks: dict[str, str],
                 chip: Chip) -> None:
        self.names = names
        self.placement = placement
        self.replicas = replicas
        self.tensor_banks = tensor_banks
        self.chip = chip
        self.resolved = np.zeros(0, dtype=bool)
        self.is_w = np.zeros(0, dtype=bool)
        self.key_part = np.zeros(0, dtype=np.int64)  # `Chip.vault_bank_parts` of the tensor's CRC-32
        self.bank = np.zeros(0, dtype=np.int64)
        self.owner = np.zeros(0, dtype=np.int64)
        self.rep_bank: dict[tuple[int, int], int] = {}  # (tensor, replica core) -> bank of its copy
        self._rep_index: tuple[I64, I64] | None = None  # rep_bank as sorted keys (tensor·cores + core) and banks
        self.core_part = chip.vault_bank_parts(np.zeros(0, dtype=np.int64))[1]
        self._experts: dict[str, tuple[str, list[int]]] = {}  # an expert id -> (its id if placed, its cores)

    def resolve(self, codes: I64) -> None:
        """Resolve the tensors ``codes`` not resolved yet (in order of their codes)."""
        n = len(self.names)
        if self.resolved.size < n:
            grow = n - self.resolved.size
            self.resolved = np.concatenate([self.resolved, np.zeros(grow, dtype=bool)])
            self.is_w = np.concatenate([self.is_w, np.zeros(grow, dtype=bool)])
            self.key_part = np.concatenate([self.key_part, np.zeros(grow, dtype=np.int64)])
            self.bank = np.concatenate([self.bank, np.full(grow, -1, dtype=np.int64)])
            self.owner = np.concatenate([self.owner, np.full(grow, -1, dtype=np.int64)])
        if not codes.size or self.resolved[codes].all():
            return
        todo = np.unique(codes[~self.resolved[codes]])
        names = self.names.names[todo].tolist()
        self.is_w[todo] = [t.startswith("W_") for t in names]
        self.key_part[todo] = self.chip.vault_bank_parts(np.array([stable_hash(t) for t in names], dtype=np.int64))[0]
        for j, t in zip(todo.tolist(), names, strict=True):
            if t.startswith("W_"):
                self._place(j, t)
        self.resolved[todo] = True

    def _place(self, j: int, t: str) -> None:
        chip, placement, replicas, tensor_banks = self.chip, self.placement, self.replicas, self.tensor_banks
        try:
            lv, e, k_shard = parse_weight_tensor_id(t)
            key_s = expert_id(lv, e)
        except ValueError:  # a "W_" tensor that is no expert's shard: no expert's bank, the tensor's own rules
            key_s, k_shard = "", -1
        info = self._experts.get(key_s)
        if info is None:
            try:
                info = (key_s, expert_cores(key_s, placement, replicas, chip)) if key_s else ("", [])
            except BadInput:
                info = ("", [])
            self._experts[key_s] = info
        key, cores = info
        ent = replicas.experts.get(key) if key else None
        tp = placement.tensors.get(t)
        bank_s: str | None = None
        if ent is not None and ent.shard_banks and 0 <= k_shard < len(ent.shard_banks):
            bank_s, where = ent.shard_banks[k_shard], f"state.replicas.experts.{key}.shard_banks"
        else:
            bank_s = tensor_banks.get(t) or (tensor_banks.get(f"{key}_*") if key else None)
            where = f"state.tensor_banks.{t}"
        if bank_s is None and tp is not None:
            bank_s, where = tp.dram_bank, f"placement.tensors.{t}.dram_bank"
        if bank_s is not None:
            self.bank[j] = chip.parse_bank(bank_s, where)
            self.owner[j] = cores[0] if cores else -1
        if tp is not None and tp.replica_banks and len(cores) > 1:
            for c, rb in zip(cores[1:], tp.replica_banks, strict=False):
                self.rep_bank[(j, c)] = chip.parse_bank(rb, f"placement.tensors.{t}.replica_banks")
            self._rep_index = None

    def replica_banks(self, tensor: I64, core: I64) -> I64:
        """The bank of ``core``'s copy (or slice) of each tensor, -1 where ``rep_bank`` has none (vectorised)."""
        if self._rep_index is None:
            n = self.chip.n_cores
            keys = np.array([t * n + c for t, c in self.rep_bank], dtype=np.int64)
            vals = np.array(list(self.rep_bank.values()), dtype=np.int64)
            order = np.argsort(keys)
            self._rep_index = (keys[order], vals[order])
        keys, vals = self._rep_index
        out = np.full(tensor.size, -1, dtype=np.int64)
        if not keys.size or not tensor.size:
            return out
        q = tensor * self.chip.n_cores + core
        at = np.minimum(np.searchsorted(keys, q), keys.size - 1)
        hit = keys[at] == q
        out[hit] = vals[at[hit]]
        return out


@dataclass
class MemRows:
    """The logical memory rows of ``Rows``, sorted by compute row, with their tensors' banks (``table``)."""

    start: I64  # per compute row: first memory row (into the sorted arrays)
    count: I64  # per compute row: how many
    nbytes: F64
    write: B
    tensor: I64  # tensor codes of ``table``
    table: TensorTable


@dataclass
class Traffic:
    """One entry per (piece, memory row)."""

    piece: I64
    bank: I64
    nbytes: F64
    write: B
    hops: I64
    act: B  # a routed expert's token activations (its dispatch/combine crosses the NoC)


def prepare(m_row: I64, nbytes: F64, write: B, tensor: I64, nrow: int, table: TensorTable) -> MemRows:
    """Memory rows (each with its compute row among the ``nrow`` rows being lowered, in row order) grouped by compute
    row, their tensors resolved in ``table``."""
    table.resolve(tensor)
    mo = np.argsort(m_row, kind="stable")
    count = np.bincount(m_row, minlength=nrow).astype(np.int64)
    start = (np.cumsum(count) - count).astype(np.int64)
    return MemRows(start=start, count=count, nbytes=nbytes[mo], write=write[mo], tensor=tensor[mo], table=table)


def row_bytes(mr: MemRows, nrow: int) -> F64:
    """Total bytes of each compute row."""
    if not mr.nbytes.size:
        return np.zeros(nrow)
    owner = np.repeat(np.arange(nrow), mr.count)
    return np.bincount(owner, weights=mr.nbytes, minlength=nrow).astype(np.float64)


def traffic(mr: MemRows, p: Pieces, idx: I64, chip: Chip) -> Traffic:
    """The traffic of pieces ``idx`` (entries name positions in ``idx``)."""
    row = p.row[idx]
    per = mr.count[row]
    e_p = np.repeat(np.arange(idx.size, dtype=np.int64), per)
    offs = np.arange(e_p.size, dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
    e_m = np.repeat(mr.start[row], per) + offs
    pi = idx[e_p]
    core = p.core[pi]
    tab = mr.table
    t = mr.tensor[e_m]
    is_w = tab.is_w[t]
    split = p.split[pi]
    nbytes = mr.nbytes[e_m] * np.where(is_w, p.w_frac[pi], p.tok_frac[pi])
    # split rows: everything in the executing core's vault; expert rows: weights at the home core's vault
    default_core = np.where(is_w & ~split, p.home[pi], core)
    tb, own = tab.bank[t], tab.owner[t]
    use_tb = ~split & (tb >= 0) & ((own < 0) | (own == default_core))
    bank = np.where(use_tb, tb, tab.key_part[t] + tab.core_part[default_core]) if t.size else np.zeros(0, np.int64)
    if tab.rep_bank:
        ev = np.flatnonzero(is_w & ~use_tb & ~split)
        copy = tab.replica_banks(t[ev], default_core[ev])
        bank[ev[copy >= 0]] = copy[copy >= 0]
    hops = chip.hops(core, chip.bank_vault_core(bank))
    return Traffic(piece=e_p, bank=bank.astype(np.int64), nbytes=nbytes, write=mr.write[e_m], hops=hops,
                   act=~split & ~is_w)
