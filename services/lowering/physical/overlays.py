"""Stage 1: TACS/TAPS overlays (seed 001 §3.3). Migrations become transfers (and weight moves update the tensor
banks); reroute rows are parsed into rules that ``assign`` applies to work generated at or after ``t_apply_ns``.

Migrate rows: ``obj_type = "expert"`` moves/adds/drops an expert instance's core (``src``/``dst`` are core ids; an
empty or ``-1`` src adds a replica, an empty or ``-1`` dst drops one); its bytes move from a bank of the source
core's vault to one of the destination's. The replica state (``ReplicaState``: which cores run an expert) has one
owner, the placement service (TACS answers the state after its overlays): the physicalizer reads it, never writes
it, and refuses an expert row the state it is given does not reflect (``dst`` not among the expert's cores, or
``src`` still among them). ``obj_type = "weight"`` moves one weight tensor
between banks: where the replica state records the shard's bank (``shard_banks``, TACS's migrations), the row must
agree with it and that is its one record; otherwise ``PhysicalState.tensor_banks`` keeps it. A transfer reads at
the source bank and writes at the destination bank with ``noc_qos = "migration"``; ``schedule`` gives it both
vaults' channels for ``bytes / W``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from shared.chip import Chip, stable_hash
from shared.contracts.ids import expert_id, parse_expert_id, parse_weight_tensor_id
from shared.contracts.placement import Overlays, Placement, ReplicaState
from shared.errors import BadInput

_NONE = ("", "-1", "none", "None")


@dataclass(frozen=True)
class Transfer:
    """One migration: ``nbytes`` from ``src_bank`` to ``dst_bank`` (flat bank ids), not before ``t_apply_ns``."""

    src_bank: int
    dst_bank: int
    nbytes: float
    t_apply_ns: float


@dataclass(frozen=True)
class Reroute:
    """Work of ``from_core`` generated at or after ``t_apply_ns`` goes to ``to_core`` (seed §3.3).

    ``scope == "mb"``: only the micro-batches ``mbs``; ``"expert"``: routed-expert work only (restricted to ``mbs``
    when given). ``experts``: when not empty, only these instances' work (``layer · 2^20 + expert`` codes)."""

    t_apply_ns: float
    scope: str
    from_core: int
    to_core: int
    mbs: tuple[int, ...]
    experts: tuple[int, ...]
    within: tuple[int, ...] | None = None  # only these micro-batches (a rule carried from an earlier window)


EXPERT_CODE_SHIFT = 20


def expert_code(layer: int, expert: int) -> int:
    return (layer << EXPERT_CODE_SHIFT) + expert


def parse_ids(s: str, field: str) -> list[object]:
    try:
        v = json.loads(s) if s.strip() else []
    except json.JSONDecodeError:
        raise BadInput(f"not a JSON array: {s!r}", field=field) from None
    if not isinstance(v, list):
        raise BadInput(f"not a JSON array: {s!r}", field=field)
    return v


def expert_cores(key: str, placement: Placement, replicas: ReplicaState, chip: Chip) -> list[int]:
    """The cores of an expert instance: the replica state's when it lists the instance, else the placement's."""
    ent = replicas.experts.get(key)
    if ent is not None and ent.cores:
        cores = ent.cores
    elif key in placement.experts:
        cores = placement.experts[key].cores
    else:
        raise BadInput(f"expert instance {key} has no placement", field=f"placement.experts.{key}")
    for c in cores:
        chip.check_core(c, f"placement.experts.{key}.cores")
    return list(cores)


def replica_shard_bank(tensor_id: str, replicas: ReplicaState) -> tuple[str, str] | None:
    """(expert id, bank) the replica state records for weight shard ``W_L{l}E{e}_{k}`` (its expert's
    ``shard_banks[k]``, written by TACS when it migrates the expert), else None."""
    try:
        layer, e, k = parse_weight_tensor_id(tensor_id)
    except ValueError:
        return None
    eid = expert_id(layer, e)
    ent = replicas.experts.get(eid)
    banks = ent.shard_banks if ent is not None else None
    return (eid, banks[k]) if banks and k < len(banks) else None


def drop_recorded(tensor_banks: dict[str, str], replicas: ReplicaState, placement: Placement) -> None:
    """Remove from ``tensor_banks`` (in place) every entry the replica state records: a shard with a bank in its
    expert's ``shard_banks``, and an expert's ``L{l}E{e}_*`` when its ``shard_banks`` cover every shard the
    placement lists for it (the replica state is then where all its shards live; an older physical state may still
    hold a copy). A ``_*`` entry still serves the shards a shorter list leaves out, and stays when the placement
    lists no shards of the expert (how many there are is not known here; the lookup takes ``shard_banks`` first)."""
    for key in list(tensor_banks):
        if key.endswith("_*"):
            try:
                layer, e = parse_expert_id(key[:-2])
            except ValueError:
                continue
            ent = replicas.experts.get(expert_id(layer, e))
            if ent is None or not ent.shard_banks:
                continue
            n_shards = len(placement.expert_shards(layer, e))
            if n_shards and len(ent.shard_banks) >= n_shards:
                del tensor_banks[key]
        elif replica_shard_bank(key, replicas) is not None:
            del tensor_banks[key]


def apply_migrations(overlays: Overlays, placement: Placement, replicas: ReplicaState,
                     tensor_banks: dict[str, str], chip: Chip, t0: float) -> tuple[list[Transfer], int]:
    """The transfers of the migrate rows and the number of objects moved (an expert with its shards counts once, a
    lone weight shard once); ``tensor_banks`` is updated in place. ``replicas``: the replica state after the
    overlays (read only; an expert row it does not reflect is refused). A weight row of a shard the replica state
    records (``shard_banks``: TACS's migrations) must agree with it and leaves ``tensor_banks`` without the shard:
    the replica state is its one record. ``tensor_banks`` keeps the moves no replica state records (a hand-written
    weight row; ``L{l}E{e}_*`` for an expert row that carries its bytes)."""
    out: list[Transfer] = []
    moved: set[str] = set()
    mig = overlays.migrate
    for i in range(len(mig)):
        t_apply, obj_type, obj_id = mig.t_apply_ns[i], mig.obj_type[i], mig.obj_id[i]
        src, dst, size = mig.src[i], mig.dst[i], mig.size_bytes[i]
        f = f"overlays.migrate[{i}]"
        if size < 0:
            raise BadInput("size_bytes must be >= 0", field=f"{f}.size_bytes")
        if obj_type == "weight":
            sb = chip.parse_bank(src, f"{f}.src")
            db = chip.parse_bank(dst, f"{f}.dst")
            owned = replica_shard_bank(obj_id, replicas)
            if owned is None:  # a move the replica state does not record: this state keeps it
                tensor_banks[obj_id] = chip.bank_str(db)
            elif chip.parse_bank(owned[1], f"state.replicas.experts.{owned[0]}.shard_banks") != db:
                raise BadInput(f"{obj_id} moves to {dst} but the replica state keeps it in {owned[1]}: send the "
                               "replica state after the overlays as `replicas`", field=f"{f}.dst")
            else:  # the replica state (the placement service's) is the one record of where it lives
                tensor_banks.pop(obj_id, None)
            try:  # an expert's shard counts with its expert
                w_layer, w_expert, _ = parse_weight_tensor_id(obj_id)
                moved.add(expert_id(w_layer, w_expert))
            except ValueError:  # a tensor that is no expert's shard counts on its own
                moved.add(obj_id)
            if size > 0:
                out.append(Transfer(sb, db, float(size), float(max(t_apply, t0))))
        elif obj_type == "expert":
            try:
                layer, e = parse_expert_id(obj_id)
            except ValueError as exc:
                raise BadInput(str(exc), field=f"{f}.obj_id") from None
            key = expert_id(layer, e)
            moved.add(key)
            cores = expert_cores(key, placement, replicas, chip)  # after the migration (the placement's state)
            try:
                s_core = None if src.strip() in _NONE else chip.check_core(int(src), f"{f}.src")
                d_core = None if dst.strip() in _NONE else chip.check_core(int(dst), f"{f}.dst")
            except ValueError:
                raise BadInput(f"src/dst of an expert migration are core ids, got {src!r} -> {dst!r}",
                               field=f"{f}.src") from None
            if d_core is not None and d_core not in cores:
                raise BadInput(f"{key} moves to core {d_core} but the replica state puts it on {cores}: send the "
                               "replica state after the overlays (the placement service's, e.g. the TACS step's "
                               "answer) as `replicas`", field=f"{f}.dst")
            if s_core is not None and s_core != d_core and s_core in cores:
                raise BadInput(f"{key} leaves core {s_core} but the replica state still puts it on {cores}: send "
                               "the replica state after the overlays as `replicas`", field=f"{f}.src")
            ent_now = replicas.experts.get(key)
            if size > 0 and ent_now is not None and ent_now.shard_banks:
                raise BadInput(f"{key} carries {size} bytes but the replica state records where its shards are "
                               "(shard_banks): move them with weight rows (as TACS does) or send a replica state "
                               "without shard_banks", field=f"{f}.size_bytes")
            if d_core is not None and size > 0:  # the instance's weights, when no weight rows list them
                if s_core is not None:
                    from_core = s_core
                else:  # a replica added: its bytes come from another core of the expert, else the one it left
                    ent = replicas.experts.get(key)
                    plc = placement.experts.get(key)
                    sources = ([c for c in cores if c != d_core], ent.prev_cores if ent else None,
                               plc.cores if plc else None)
                    from_core = next((s[0] for s in sources if s), d_core)
                key_h = np.array([stable_hash(key)])
                sb = int(chip.vault_bank(np.array([from_core]), key_h)[0])
                db = int(chip.vault_bank(np.array([d_core]), key_h)[0])
                out.append(Transfer(sb, db, float(size), float(max(t_apply, t0))))
                tensor_banks[f"{key}_*"] = chip.bank_str(db)  # its shards now live in the destination vault
        else:
            raise BadInput(f"obj_type must be 'weight' or 'expert', got {obj_type!r}", field=f"{f}.obj_type")
    return out, len(moved)


def parse_reroutes(overlays: Overlays, chip: Chip) -> list[Reroute]:
    rr = overlays.reroute
    rr_expert: list[str] = list(getattr(rr, "expert_id", None) or [""] * len(rr))  # extra column (placement)
    out: list[Reroute] = []
    for i in range(len(rr)):
        f = f"overlays.reroute[{i}]"
        chip.check_core(rr.from_core[i], f"{f}.from_core")
        chip.check_core(rr.to_core[i], f"{f}.to_core")
        if rr.scope[i] not in ("mb", "expert"):
            raise BadInput(f"scope must be 'mb' or 'expert', got {rr.scope[i]!r}", field=f"{f}.scope")
        ids = parse_ids(rr.mb_ids_json[i], f"{f}.mb_ids_json")
        mbs = tuple(int(x) for x in ids if isinstance(x, int | float) and not isinstance(x, bool))
        names = [str(x) for x in ids if isinstance(x, str)] + ([rr_expert[i]] if rr_expert[i] else [])
        codes: list[int] = []
        for name in names:
            try:
                lv, e = parse_expert_id(name)
            except ValueError as exc:
                raise BadInput(str(exc), field=f"{f}.expert_id") from None
            codes.append(expert_code(lv, e))
        out.append(Reroute(float(rr.t_apply_ns[i]), rr.scope[i], int(rr.from_core[i]), int(rr.to_core[i]), mbs,
                           tuple(codes)))
    return out
