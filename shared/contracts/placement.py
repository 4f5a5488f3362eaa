"""Placement (seed 001 §3.2), TACS overlays (§3.3), replica state (§3.5) and telemetry (§4.3).

Owner: placement service. Consumers: lowering (physicalize), orchestrator (files, window loop).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator

from shared.contracts.columnar import Columnar
from shared.contracts.ids import parse_weight_tensor_id, weight_tensor_id
from shared.errors import BadInput

META_MAX_CORES = 1024  # the most cores of a mesh (shared.configs.arch.MAX_CORES)


class ExpertPlacement(BaseModel):
    """An expert instance's cores. ``single``: one core; ``replicate``: full copies, tokens split over them;
    ``stripe``: its weights spread over the cores' vaults and its GEMMs split tensor-parallel over the cores (each
    reads its own vault)."""

    cores: list[int] = Field(min_length=1, max_length=META_MAX_CORES)
    policy: Literal["single", "replicate", "stripe"] = "single"


class TensorPlacement(BaseModel):
    dram_bank: str  # "B(x,y,layer)": the copy used by ``experts[...].cores[0]``
    size_bytes: int | None = None  # bytes of this shard (the last shard of an expert may be smaller)
    replica_banks: list[str] | None = None  # copies for ``cores[1:]`` of a replicated expert, in the same order


class PlacementMeta(BaseModel):
    """What the placer says of its placement: per core at most the mesh's most cores (shared.configs.arch
    MAX_CORES), a bounded objective and notes (a request carries a placement inline: its size is bounded here)."""

    method: str = Field(default="default", max_length=64)
    predicted_core_temps_c: list[float] | None = Field(default=None, max_length=META_MAX_CORES)
    # TAPS's mean power of each core's area of the logic die (W)
    predicted_core_power_w: list[float] | None = Field(default=None, max_length=META_MAX_CORES)
    predicted_peak_c: float | None = None
    objective: dict[str, float] = Field(default_factory=dict, max_length=64)
    optimality_gap: float | None = None
    notes: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64)


class Placement(BaseModel):
    """``placement.json``: ``experts.{L{l}E{e}}.cores`` and ``tensors.{W_L{l}E{e}_{k}}.dram_bank``."""

    experts: dict[str, ExpertPlacement]
    tensors: dict[str, TensorPlacement] = Field(default_factory=dict)
    meta: PlacementMeta = Field(default_factory=PlacementMeta)

    @field_validator("tensors")
    @classmethod
    def _shards_from_zero(cls, tensors: dict[str, TensorPlacement]) -> dict[str, TensorPlacement]:
        """An expert's weight shards are listed from ``W_L{l}E{e}_0`` without a gap, so that `expert_shards` (and
        every service that walks an expert's shards with it) sees all of them. Other tensor ids are not checked."""
        shards: dict[tuple[int, int], list[int]] = {}
        for tid in tensors:
            try:
                layer, expert, k = parse_weight_tensor_id(tid)
            except ValueError:
                continue
            shards.setdefault((layer, expert), []).append(k)
        for (layer, expert), ks in shards.items():
            if max(ks) != len(ks) - 1:  # canonical ids are distinct shards: contiguous from 0 iff max = count − 1
                gap = min(set(range(max(ks))) - set(ks))
                raise ValueError(f"{weight_tensor_id(layer, expert, max(ks))} is listed without "
                                 f"{weight_tensor_id(layer, expert, gap)}: an expert's weight shards are listed "
                                 "from _0 without a gap")
        return tensors

    def expert_shards(self, layer: int, expert: int) -> list[tuple[str, TensorPlacement]]:
        """(tensor id, placement) of each weight shard the placement lists for expert ``L{layer}E{expert}``, in
        shard order ``W_L{l}E{e}_0``, ``_1``, ... (listed without a gap: the validator; the one rule for how many
        shards an expert has; ``ReplicaEntry.shard_banks[k]`` is shard ``k``'s bank after a TACS migration)."""
        out: list[tuple[str, TensorPlacement]] = []
        while (tp := self.tensors.get(tid := weight_tensor_id(layer, expert, len(out)))) is not None:
            out.append((tid, tp))
        return out


class OverlayReroute(Columnar):
    """``runtime/overlay_reroute.csv`` columns (seed §3.3); ``mb_ids_json`` holds JSON arrays as strings.

    Scope ``"mb"``: the listed micro-batch ids; scope ``"expert"``: routed-expert work, all of it when ``mb_ids_json``
    is ``[]``, else the listed micro-batch ids and/or ``"L{l}E{e}"`` expert instances (TACS writes one expert id).
    ``expected_gain``: TACS's predicted temperature drop at ``from_core`` (K).
    """

    t_apply_ns: list[int]
    scope: list[str]  # "mb" | "expert"
    from_core: list[int]
    to_core: list[int]
    mb_ids_json: list[str]
    reason: list[str]
    expected_gain: list[float]


class OverlayMigrate(Columnar):
    """``runtime/overlay_migrate.csv`` columns (seed §3.3).

    TACS writes, per migrated expert, one ``expert`` row (src/dst = core ids as text, ``size_bytes`` 0: the move of the
    instance itself) followed by one ``weight`` row per shard (src/dst = banks, bytes moved over the NoC); ``cost`` is
    the move's cost ``λ·hops + μ·NoC + η·ΔT̂`` (on the expert row; weight rows carry their byte share of it).
    """

    t_apply_ns: list[int]
    obj_type: list[str]  # "weight" | "expert"
    obj_id: list[str]
    src: list[str]  # bank id or core id as text
    dst: list[str]
    size_bytes: list[int]
    cost: list[float]


class Overlays(BaseModel):
    reroute: OverlayReroute = Field(default_factory=OverlayReroute.empty)
    migrate: OverlayMigrate = Field(default_factory=OverlayMigrate.empty)

    def is_empty(self) -> bool:
        return len(self.reroute) == 0 and len(self.migrate) == 0


class ReplicaEntry(BaseModel):
    cores: list[int]
    ts_created_ns: int = 0
    last_change_ns: int | None = None  # when TACS last changed this expert's cores (undo cool-down)
    prev_cores: list[int] | None = None  # the cores before that change (to detect an undo)
    shard_banks: list[str] | None = None  # where the weight shards of cores[0] live after a migration (else placement)


class ReplicaState(BaseModel):
    """``runtime/replica_state.json``: ``{expert_id: {cores, ts_created_ns, ...}}`` (seed §3.5)."""

    experts: dict[str, ReplicaEntry] = Field(default_factory=dict)

    def to_json_obj(self) -> dict[str, dict[str, object]]:
        return {k: v.model_dump(exclude_none=True) for k, v in sorted(self.experts.items())}


class Telemetry(BaseModel):
    """What the chip reported for the last committed window (raw values, °C)."""

    temps_core: list[float]
    temps_bank: list[float] = Field(default_factory=list)  # per vault, hottest layer
    util_core: list[float] = Field(default_factory=list)  # 0..1
    noc_load: float = Field(default=0.0, ge=0)
    ts_ns: int = 0
    # GHz per core, the clock of the coming window (thermal's DVFS governor after the last one: its snapshot's
    # freq_ghz); empty: each domain's top step.
    # TACS prices a core's compute energy at its voltage, (V/V0)^2 (shared/dvfs.py).
    freq_ghz: list[Annotated[float, Field(gt=0, le=1e3)]] = Field(default_factory=list)


def check_cores_in_mesh(cores_of: Mapping[str, Sequence[int]], n_cores: int, where: str, *,
                        nonempty: bool = False) -> None:
    """Every expert's cores (``{expert id: cores}``) on the mesh (0..n_cores-1), and at least one when ``nonempty``:
    a 422 naming ``<where>.<expert id>.cores`` otherwise (a placement's experts, a replica state's)."""
    for eid, cores in cores_of.items():
        bad = [c for c in cores if not 0 <= c < n_cores]
        if bad:
            raise BadInput(f"{where}.{eid}.cores: core {bad[0]} is outside the mesh (0..{n_cores - 1})",
                           field=f"{where}.{eid}.cores")
        if nonempty and not cores:
            raise BadInput(f"{where}.{eid}.cores: no core", field=f"{where}.{eid}.cores")
