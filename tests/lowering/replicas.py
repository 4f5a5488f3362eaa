"""The replica state after a window's expert migrations, as the placement service (its only owner) would answer it:
the tests' stand-in for a TACS step when they hand-make migrate overlays for the physicalizer."""

from __future__ import annotations

from shared.contracts.events import PhysicalState
from shared.contracts.ids import expert_id, parse_expert_id
from shared.contracts.placement import Overlays, Placement, ReplicaEntry, ReplicaState

_NONE = ("", "-1", "none", "None")  # no core (services/lowering/physical/overlays.py)


def after_migrations(state: PhysicalState, overlays: Overlays | None, placement: Placement) -> PhysicalState:
    """``state`` with each expert row of ``overlays.migrate`` applied to its replica state (src dropped, dst added)."""
    if overlays is None or not len(overlays.migrate):
        return state
    experts = dict(state.replicas.experts)
    mig = overlays.migrate
    for i in range(len(mig)):
        if mig.obj_type[i] != "expert":
            continue
        key = expert_id(*parse_expert_id(mig.obj_id[i]))
        prev = experts.get(key)
        cores = list(prev.cores) if prev is not None and prev.cores else list(placement.experts[key].cores)
        src, dst = mig.src[i].strip(), mig.dst[i].strip()
        new = [c for c in cores if src in _NONE or c != int(src)]
        if dst not in _NONE and int(dst) not in new:
            new.append(int(dst))
        experts[key] = ReplicaEntry(cores=new, ts_created_ns=prev.ts_created_ns if prev is not None else 0,
                                    last_change_ns=int(mig.t_apply_ns[i]), prev_cores=cores)
    return state.model_copy(update={"replicas": ReplicaState(experts=experts)})
