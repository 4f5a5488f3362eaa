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

from services.lowering.physical.assign import Pieces, Rows
from services.lowering.physical.overlays import expert_cores
from shared.chip import Chip, stable_hash
from shared.contracts.ids import expert_id, parse_weight_tensor_id
from shared.contracts.placement import Placement, ReplicaState
from shared.contracts.workload import LogicalMemory
from shared.errors import BadInput

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
B = NDArray[np.bool_]


@dataclass
class MemRows:
    """The logical memory rows of ``Rows``, sorted by compute row, with each tensor's bank resolved once."""

    start: I64  # per compute row: first memory row (into the sorted arrays)
    count: I64  # per compute row: how many
    nbytes: F64
    write: B
    tensor: I64  # index into the per-tensor tables
    t_is_w: B
    t_hash: I64
    t_bank: I64  # placed bank of the tensor's copy on the instance's first core, -1 = none
    t_owner: I64  # that first core, -1 = any
    rep_bank: dict[tuple[int, int], int]  # (tensor, replica core) -> bank of its copy


@dataclass
class Traffic:
    """One entry per (piece, memory row)."""

    piece: I64
    bank: I64
    nbytes: F64
    write: B
    hops: I64
    act: B  # a routed expert's token activations (its dispatch/combine crosses the NoC)


def prepare(lm: LogicalMemory, rows: Rows, placement: Placement,
            replicas: ReplicaState, tensor_banks: dict[str, str], chip: Chip) -> MemRows:
    """Resolve memory rows to compute rows (by ``event_id``) and tensors to banks."""
    nrow = len(rows)
    nm = len(lm)
    if nm:
        m_ev = np.asarray(lm.event_id, dtype=np.int64)
        order_ev = np.argsort(rows.event_id, kind="stable")
        pos = np.minimum(np.searchsorted(rows.event_id[order_ev], m_ev), max(nrow - 1, 0))
        bad = (nrow == 0) | (rows.event_id[order_ev][pos] != m_ev) if nrow else np.ones(nm, dtype=bool)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise BadInput(f"memory row {i} refers to unknown compute event {int(m_ev[i])}",
                           field="logical.memory.event_id")
        m_row = order_ev[pos]
        nbytes = np.asarray(lm.bytes, dtype=np.float64)
        acc = np.asarray(lm.access)
        write = acc == "write"
        bad_acc = np.flatnonzero(~write & (acc != "read"))
        if bad_acc.size:
            i = int(bad_acc[0])
            raise BadInput(f"access must be 'read' or 'write', got {lm.access[i]!r}",
                           field=f"logical.memory.access[{i}]")
        if np.any(~np.isfinite(nbytes) | (nbytes < 0)):
            raise BadInput("bytes must be finite and >= 0", field="logical.memory.bytes")
    else:
        m_row = np.zeros(0, np.int64)
        nbytes = np.zeros(0)
        write = np.zeros(0, dtype=bool)
    t_code: dict[str, int] = {}
    t_inv = np.array([t_code.setdefault(t, len(t_code)) for t in lm.tensor_id], dtype=np.int64)
    names = list(t_code)
    t_is_w = np.array([t.startswith("W_") for t in names], dtype=bool)
    t_hash = np.array([stable_hash(t) for t in names], dtype=np.int64)
    t_bank = np.full(len(names), -1, dtype=np.int64)
    t_owner = np.full(len(names), -1, dtype=np.int64)
    rep_bank: dict[tuple[int, int], int] = {}
    any_info = bool(tensor_banks) or bool(placement.tensors) or any(e.shard_banks for e in replicas.experts.values())
    key_info: dict[str, tuple[str, list[int]]] = {}
    for j, t in enumerate(names if any_info else []):
        if not t_is_w[j]:
            continue
        try:
            lv, e, k_shard = parse_weight_tensor_id(t)
            key_s = expert_id(lv, e)
        except ValueError:  # a "W_" tensor that is no expert's shard: no expert's bank, the tensor's own rules
            key_s, k_shard = "", -1
        info = key_info.get(key_s)
        if info is None:
            try:
                info = (key_s, expert_cores(key_s, placement, replicas, chip)) if key_s else ("", [])
            except BadInput:
                info = ("", [])
            key_info[key_s] = info
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
            t_bank[j] = chip.parse_bank(bank_s, where)
            t_owner[j] = cores[0] if cores else -1
        if tp is not None and tp.replica_banks and len(cores) > 1:
            for c, rb in zip(cores[1:], tp.replica_banks, strict=False):
                rep_bank[(j, c)] = chip.parse_bank(rb, f"placement.tensors.{t}.replica_banks")
    mo = np.argsort(m_row, kind="stable")
    count = np.bincount(m_row, minlength=nrow).astype(np.int64)
    start = (np.cumsum(count) - count).astype(np.int64)
    return MemRows(start=start, count=count, nbytes=nbytes[mo], write=write[mo], tensor=t_inv[mo] if nm else t_inv,
                   t_is_w=t_is_w, t_hash=t_hash, t_bank=t_bank, t_owner=t_owner, rep_bank=rep_bank)


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
    t = mr.tensor[e_m]
    is_w = mr.t_is_w[t]
    split = p.split[pi]
    nbytes = mr.nbytes[e_m] * np.where(is_w, p.w_frac[pi], p.tok_frac[pi])
    # split rows: everything in the executing core's vault; expert rows: weights at the home core's vault
    default_core = np.where(is_w & ~split, p.home[pi], core)
    key_part, core_part = chip.vault_bank_parts(mr.t_hash)
    tb, own = mr.t_bank[t], mr.t_owner[t]
    use_tb = ~split & (tb >= 0) & ((own < 0) | (own == default_core))
    bank = np.where(use_tb, tb, key_part[t] + core_part[default_core]) if t.size else np.zeros(0, np.int64)
    if mr.rep_bank:
        for ev in np.flatnonzero(is_w & ~use_tb & ~split).tolist():
            copy = mr.rep_bank.get((int(t[ev]), int(default_core[ev])))
            if copy is not None:
                bank[ev] = copy
    hops = chip.hops(core, chip.bank_vault_core(bank))
    return Traffic(piece=e_p, bank=bank.astype(np.int64), nbytes=nbytes, write=mr.write[e_m], hops=hops,
                   act=~split & ~is_w)
