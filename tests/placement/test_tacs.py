"""TACS: hot spot spreading, replica-state invariants under adversarial telemetry, monotonicity in Thot and μ,
overlay format, bad input. Thermal response is a synthetic kernel (``synthetic_diffusion_kernel``), stated per test."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.placement.geometry import ChipGeometry, hops_matrix, synthetic_diffusion_kernel
from services.placement.tacs import ACT_BYTES_PER_TOKEN, replica_state_from_placement, tacs_step
from services.thermal.influence import influence_matrix
from shared.configs import ArchConfig, TasParams
from shared.configs.tas import TacsParams
from shared.contracts.placement import (
    Overlays,
    Placement,
    ReplicaEntry,
    ReplicaState,
    Telemetry,
    TensorPlacement,
)
from shared.contracts.workload import LogicalMemory
from shared.errors import BadInput
from tests.placement.conftest import small_arch
from tests.placement.tacs_helpers import cores_now, placement_from, temps, window

ARCH4 = small_arch(4, 4, (8, 8, 2))
H4 = synthetic_diffusion_kernel(4, 4, self_kw=2.0, length=1.0, base_kw=0.05)


def test_hot_spot_is_spread_out(arch: ArchConfig, tas: TasParams, kernel64: np.ndarray) -> None:
    """All 16 experts on core 27 (synthetic kernel): TACS moves them out, the peak falls window after window."""
    cores = {f"L0E{e}": [27] for e in range(16)}
    watts = {eid: 2.0 for eid in cores}
    plc = placement_from(arch, cores)
    state = ReplicaState()
    smoothed = None
    peaks = []
    for k in range(20):
        T = temps(kernel64, cores_now(plc, state), watts)
        peaks.append(T.max())
        tele = Telemetry(temps_core=T.tolist(), util_core=[0.5] * 64, noc_load=0.1, ts_ns=k * 3_000_000)
        ov, state, smoothed = tacs_step(tele, plc, state, tas.tacs, arch, kernel64, window(k + 1, watts), smoothed,
                                        (k + 1) * 3_000_000)
        assert ov.migrate.obj_type.count("expert") <= tas.tacs.max_parallel_migrations
    final = cores_now(plc, state)
    assert peaks[0] > 100 and peaks[-1] < peaks[0] - 25
    assert peaks[-1] <= tas.tacs.thresholds.Thot + 1.0  # spread until the hottest core is about Thot
    assert len({c for cs in final.values() for c in cs}) >= 5
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(peaks))


def test_hot_spot_with_the_chip_influence_matrix(arch: ArchConfig, tas: TasParams) -> None:
    """Same hot spot with the thermal service's influence matrix of the chip. Powers are scaled so the hot spot
    starts 60 K above ambient."""
    H = influence_matrix(arch)
    cores = {f"L0E{e}": [27] for e in range(16)}
    watts = {eid: 60.0 / (16 * H[27, 27]) for eid in cores}
    plc = placement_from(arch, cores)
    state, smoothed = ReplicaState(), None
    rise0 = temps(H, cores, watts).max() - 45.0
    for k in range(30):
        T = temps(H, cores_now(plc, state), watts)
        tele = Telemetry(temps_core=T.tolist(), util_core=[0.5] * 64, noc_load=0.1)
        _, state, smoothed = tacs_step(tele, plc, state, tas.tacs, arch, H, window(k + 1, watts, 3.0), smoothed,
                                       (k + 1) * 3_000_000)
    rise = temps(H, cores_now(plc, state), watts).max() - 45.0
    assert rise0 > 55 and rise < 0.8 * rise0


def test_overlay_rows_follow_the_seed_schema(arch: ArchConfig, tas: TasParams, kernel64: np.ndarray) -> None:
    cores = {f"L0E{e}": [27] for e in range(8)}
    watts = {eid: 3.0 for eid in cores}
    plc = placement_from(arch, cores)
    T = temps(kernel64, cores, watts)
    pend = window(5, watts)
    ov, state, sm = tacs_step(Telemetry(temps_core=T.tolist()), plc, ReplicaState(), tas.tacs, arch, kernel64, pend,
                              None, 15_000_000)
    assert len(ov.migrate) >= 2 and len(ov.reroute) >= 1
    assert set(ov.migrate.t_apply_ns) == {pend.t0_ns} and set(ov.reroute.t_apply_ns) == {pend.t0_ns}
    geom = ChipGeometry.of(arch)
    for typ, oid, src, dst, size in zip(ov.migrate.obj_type, ov.migrate.obj_id, ov.migrate.src, ov.migrate.dst,
                                        ov.migrate.size_bytes, strict=True):
        if typ == "weight":
            assert oid.startswith("W_L0E") and size == 32 << 20
            assert geom.bank_core_slot(src)[0] == 27
            moved_to = state.experts[oid[2:oid.rindex("_")]].cores[0]
            assert geom.bank_core_slot(dst)[0] == moved_to
        else:
            assert typ == "expert" and src == "27" and int(dst) == state.experts[oid].cores[0]
    migrated = {oid for typ, oid in zip(ov.migrate.obj_type, ov.migrate.obj_id, strict=True) if typ == "expert"}
    rerouted = set()
    for scope, fr, to, mbj in zip(ov.reroute.scope, ov.reroute.from_core, ov.reroute.to_core, ov.reroute.mb_ids_json,
                                  strict=True):
        ids = json.loads(mbj)
        assert scope == "expert" and fr == 27 and len(ids) == 1 and ids[0].startswith("L0E")
        assert state.experts[ids[0]].cores == [to]
        rerouted.add(ids[0])
    assert rerouted == migrated  # every migration also moves the expert's work
    ent = next(iter(state.experts.values()))
    assert ent.ts_created_ns == pend.t0_ns and ent.last_change_ns == pend.t0_ns and ent.prev_cores == [27]
    assert sm == pytest.approx(T.tolist())  # first call: smoothing starts at the raw value


def test_a_migrated_experts_shards_spread_over_the_destination_vaults_columns(
        arch: ArchConfig, tas: TasParams, kernel64: np.ndarray) -> None:
    """Science III: the shards of an expert are read one after another; TACS puts a migrated expert's shards in
    distinct columns of the destination vault (``shards.spread_pick``), not stacked in one (the slot order)."""
    cores = {f"L0E{e}": [27] for e in range(8)}
    watts = {eid: 3.0 for eid in cores}
    geom = ChipGeometry.of(arch)
    L = geom.n_dram_layers
    # four 8 MiB shards per expert, each in its own bank of the source vault
    slots = iter(range(geom.vault_banks))
    tensors = {f"W_{eid}_{k}": TensorPlacement(dram_bank=geom.slot_bank_id(27, next(slots)), size_bytes=8 << 20)
               for eid in cores for k in range(4)}
    plc = placement_from(arch, cores).model_copy(update={"tensors": tensors})
    ov, _, _ = tacs_step(Telemetry(temps_core=temps(kernel64, cores, watts).tolist()), plc, ReplicaState(),
                             tas.tacs, arch, kernel64, window(5, watts), None, 15_000_000)
    by_expert: dict[str, list[int]] = {}
    for typ, oid, dst in zip(ov.migrate.obj_type, ov.migrate.obj_id, ov.migrate.dst, strict=True):
        if typ == "weight":
            by_expert.setdefault(oid[2:oid.rindex("_")], []).append(geom.bank_core_slot(dst)[1] // L)
    assert by_expert and all(len(cols) >= 2 for cols in by_expert.values())
    for cols in by_expert.values():
        assert len(set(cols)) == len(cols), f"shards stacked in one column: {cols}"


def test_smoothing_is_exponential(tas: TasParams) -> None:
    plc = placement_from(ARCH4, {"L0E0": [0]})
    prev = [50.0] * 16
    tele = Telemetry(temps_core=[70.0] * 16)
    _, _, sm = tacs_step(tele, plc, ReplicaState(), tas.tacs, ARCH4, H4, None, prev, 0)
    a = tas.tacs.smoothing_alpha
    assert sm == pytest.approx([a * 70 + (1 - a) * 50] * 16)


def _mixed_placement() -> tuple[dict[str, list[int]], dict[str, float]]:
    cores = {f"L0E{e}": [e % 16] for e in range(12)}
    cores.update({f"L1E{e}": [e % 16, (e + 5) % 16] for e in range(4)})
    cores.update({f"L2E{e}": [5] for e in range(4)})  # a crowded core
    watts = {eid: 1.0 + (i % 5) for i, eid in enumerate(sorted(cores))}
    return cores, watts


temps_st = st.lists(st.floats(min_value=40.0, max_value=110.0), min_size=16, max_size=16)
utils_st = st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=16, max_size=16)


def _check_invariants(params: TacsParams, seq: list[tuple[list[float], list[float], float]]) -> int:
    """Run TACS over ``seq`` (temps, utils, noc load per window) and assert the replica-state invariants; returns the
    number of migrations seen."""
    cores, watts = _mixed_placement()
    plc = placement_from(ARCH4, cores)
    state = replica_state_from_placement(plc, 0)
    smoothed = None
    history: dict[str, list[tuple[int, list[int], list[int]]]] = {}
    for k, (t, u, noc) in enumerate(seq):
        pend = window(k + 1, watts)
        ov, new, smoothed = tacs_step(Telemetry(temps_core=t, util_core=u, noc_load=noc, ts_ns=k * 3_000_000), plc,
                                      state, params, ARCH4, H4, pend, smoothed, pend.t0_ns)
        assert set(ov.migrate.t_apply_ns) <= {pend.t0_ns} and set(ov.reroute.t_apply_ns) <= {pend.t0_ns}
        moved = [eid for eid in new.experts if new.experts[eid] != state.experts.get(eid)]
        assert len(moved) == ov.migrate.obj_type.count("expert") <= params.max_parallel_migrations
        if noc > params.noc_guard:
            assert not moved  # NoC congestion guard
        for eid in moved:
            old, ent = state.experts[eid], new.experts[eid]
            history.setdefault(eid, []).append((pend.t0_ns, old.cores, ent.cores))
            assert ent.ts_created_ns == ent.last_change_ns == pend.t0_ns and ent.prev_cores == old.cores
        state = new
    for changes in history.values():
        for (t0, from0, to0), (t1, from1, to1) in itertools.pairwise(changes):
            assert t1 - t0 >= params.min_residency_ms * 1e6  # minimum residency
            assert from1 == to0
            if set(to1) & set(from0):  # moved back where it came from: only after the undo cool-down
                assert t1 - t0 >= params.undo_cooldown_ms * 1e6
    return sum(len(c) for c in history.values())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=st.lists(st.tuples(temps_st, utils_st, st.floats(min_value=0.0, max_value=1.0)), min_size=4,
                    max_size=14))
def test_replica_state_invariants(tas: TasParams, seq: list[tuple[list[float], list[float], float]]) -> None:
    """Adversarial telemetry (hypothesis): min residency and the undo cool-down always hold; never more than
    max_parallel_migrations moves per window; the NoC guard holds; overlays only for the next window."""
    params = tas.tacs.model_copy(update={"min_residency_ms": 7.0, "undo_cooldown_ms": 13.0})
    _check_invariants(params, seq)


def test_replica_state_invariants_flip_flop(tas: TasParams) -> None:
    """Deterministic adversary: the hot side of the chip flips every window, tempting experts to bounce back."""
    params = tas.tacs.model_copy(update={"min_residency_ms": 7.0, "undo_cooldown_ms": 13.0})
    left = [100.0 if c % 4 < 2 else 50.0 for c in range(16)]
    right = [150.0 - t for t in left]
    seq = [(left if k % 2 == 0 else right, [0.5] * 16, 0.1) for k in range(30)]
    assert _check_invariants(params, seq) >= 10


def _run(params: TacsParams, t: list[float], u: list[float], noc: float) -> tuple[Overlays, ReplicaState]:
    cores, watts = _mixed_placement()
    plc = placement_from(ARCH4, cores)
    ov, st_, _ = tacs_step(Telemetry(temps_core=t, util_core=u, noc_load=noc), plc, ReplicaState(), params, ARCH4,
                           H4, window(9, watts), None, 27_000_000)
    return ov, st_


def _noc_bytes_hops(ov: Overlays) -> float:
    """Bytes × hops the overlays add to the NoC: weight moves plus rerouted activations (8 tokens x 2 mbs / 2
    replicas in the scenario)."""
    geom = ChipGeometry.of(ARCH4)
    h = hops_matrix(4, 4)
    total = 0.0
    for typ, src, dst, size in zip(ov.migrate.obj_type, ov.migrate.src, ov.migrate.dst, ov.migrate.size_bytes,
                                   strict=True):
        if typ == "weight":
            total += size * h[geom.bank_core_slot(src)[0], geom.bank_core_slot(dst)[0]]
    for reason, fr, to in zip(ov.reroute.reason, ov.reroute.from_core, ov.reroute.to_core, strict=True):
        if reason != "migrate":
            total += 16 / 2 * ACT_BYTES_PER_TOKEN * 2 * h[fr, to]
    return total


THOTS = (70.0, 78.0, 82.0, 86.0, 89.5)
MUS = (0.0, 0.5, 2.0, 8.0, 64.0, 1000.0)
warm_st = st.lists(st.floats(min_value=55.0, max_value=100.0), min_size=16, max_size=16)
util_mid_st = st.lists(st.floats(min_value=0.0, max_value=0.8), min_size=16, max_size=16)


def _counts_over_thot(tas: TasParams, t: list[float], u: list[float], noc: float) -> list[tuple[int, int]]:
    out = []
    for thot in THOTS:
        params = tas.tacs.model_copy(update={"thresholds": tas.tacs.thresholds.model_copy(update={"Thot": thot})})
        ov, _ = _run(params, t, u, noc)
        out.append((ov.migrate.obj_type.count("expert"), len(ov.reroute)))
    return out


def _noc_over_mu(tas: TasParams, t: list[float], u: list[float], noc: float, lam: float, eta: float) -> list[float]:
    out = []
    for mu in MUS:
        cost = tas.tacs.cost.model_copy(update={"mu_noc": mu, "lambda_hops": lam, "eta_temp": eta})
        ov, _ = _run(tas.tacs.model_copy(update={"cost": cost}), t, u, noc)
        out.append(_noc_bytes_hops(ov))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=warm_st, u=util_mid_st, noc=st.floats(min_value=0.0, max_value=0.7))
def test_raising_thot_never_increases_migrations(tas: TasParams, t: list[float], u: list[float], noc: float) -> None:
    counts = _counts_over_thot(tas, t, u, noc)
    migrations = [m for m, _ in counts]
    actions = [m + r for m, r in counts]
    assert all(b <= a for a, b in itertools.pairwise(migrations)), counts
    assert all(b <= a for a, b in itertools.pairwise(actions)), counts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=warm_st, u=util_mid_st, noc=st.floats(min_value=0.0, max_value=0.7),
       weights=st.sampled_from([(1.0, 1.5), (0.0, 0.0), (0.0, 1.5), (1.0, 0.0)]))
def test_raising_mu_never_increases_added_noc_load(tas: TasParams, t: list[float], u: list[float], noc: float,
                                                   weights: tuple[float, float]) -> None:
    loads = _noc_over_mu(tas, t, u, noc, *weights)
    assert all(b <= a + 1e-6 for a, b in itertools.pairwise(loads)), loads


def test_monotonicity_tests_are_not_vacuous(tas: TasParams) -> None:
    """On seeded random scenarios, raising Thot does remove actions and raising μ does cut NoC traffic sometimes."""
    rng = np.random.default_rng(7)
    thot_drops = mu_drops = 0
    for _ in range(12):
        t = rng.uniform(55, 100, 16).tolist()
        u = rng.uniform(0, 0.8, 16).tolist()
        counts = _counts_over_thot(tas, t, u, 0.2)
        thot_drops += counts[-1] < counts[0]
        loads = _noc_over_mu(tas, t, u, 0.2, 0.0, 0.0)
        mu_drops += loads[-1] < loads[0]
    assert thot_drops >= 2 and mu_drops >= 2


def test_cool_chip_does_nothing(tas: TasParams) -> None:
    cores, watts = _mixed_placement()
    plc = placement_from(ARCH4, cores)
    ov, st_, _ = tacs_step(Telemetry(temps_core=[60.0] * 16, util_core=[0.3] * 16), plc, ReplicaState(), tas.tacs,
                           ARCH4, H4, window(1, watts), None, 0)
    assert ov.is_empty() and st_.experts == {}


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d.update(temps_core=[50.0] * 3), "telemetry.temps_core"),
    (lambda d: d.update(util_core=[0.5] * 3), "telemetry.util_core"),
    (lambda d: d.update(freq_ghz=[2.0] * 3), "telemetry.freq_ghz"),
])
def test_bad_telemetry_names_the_field(tas: TasParams, mutate: object, field: str) -> None:
    plc = placement_from(ARCH4, {"L0E0": [0]})
    d: dict[str, object] = {"temps_core": [50.0] * 16}
    mutate(d)  # type: ignore[operator]
    with pytest.raises(BadInput) as ei:
        tacs_step(Telemetry.model_validate(d), plc, ReplicaState(), tas.tacs, ARCH4, H4, None, None, 0)
    assert ei.value.field == field


def test_core_outside_mesh_names_the_field(tas: TasParams) -> None:
    plc = placement_from(ARCH4, {"L0E0": [0]})
    plc.experts["L0E1"] = plc.experts["L0E0"].model_copy(update={"cores": [99]})
    with pytest.raises(BadInput) as ei:
        tacs_step(Telemetry(temps_core=[50.0] * 16), plc, ReplicaState(), tas.tacs, ARCH4, H4, None, None, 0)
    assert ei.value.field == "placement.experts.L0E1.cores"


def test_bank_outside_the_chip_names_the_tensor(tas: TasParams) -> None:
    plc = placement_from(ARCH4, {"L0E0": [0], "L0E1": [0]})
    plc.tensors["W_L0E1_0"] = plc.tensors["W_L0E1_0"].model_copy(update={"dram_bank": "B(99,0,0)"})
    hot = [100.0] + [50.0] * 15
    with pytest.raises(BadInput) as ei:
        tacs_step(Telemetry(temps_core=hot), plc, ReplicaState(), tas.tacs, ARCH4, H4,
                  window(9, {"L0E0": 2.0, "L0E1": 2.0}), None, 27_000_000)
    assert ei.value.field == "placement.tensors.W_L0E1_0"


def test_overlays_are_accepted_by_the_physicalizer(arch: ArchConfig, tas: TasParams, kernel64: np.ndarray) -> None:
    """Contract check against the lowering service's ``physicalize_window``: TACS rows parse, the migrated expert
    runs on its new core with TACS's replica state, which the physicalizer carries unchanged."""
    from services.lowering.physical import physicalize_window
    from shared.contracts.events import PhysicalState

    # two hot sources: core 27 with single-core experts (a migration pays for its weights' heat), core 36 with
    # a replicated one (a reroute); light enough that every core finishes its work inside the window
    cores = {f"L0E{e}": [27] for e in range(8)}
    cores["L0E8"] = [36, 37]
    watts = {eid: 1.0 for eid in cores}  # 1 W per 3 ms window = 0.2 W over TACS's 15 ms horizon
    plc = placement_from(arch, cores)
    pend = window(6, watts)
    hot = [50.0] * 64
    hot[27] = 95.0
    hot[36] = 94.0
    ov, state, _ = tacs_step(Telemetry(temps_core=hot), plc, ReplicaState(), tas.tacs, arch, kernel64, pend, None,
                             pend.t0_ns)
    moved = {oid: int(dst) for typ, oid, dst in zip(ov.migrate.obj_type, ov.migrate.obj_id, ov.migrate.dst,
                                                    strict=True) if typ == "expert"}
    assert moved and "L0E8" in "".join(ov.reroute.mb_ids_json)
    with pytest.raises(BadInput):  # the replica state is TACS's: the physicalizer does not apply the moves itself
        physicalize_window(6, pend, plc, ov, PhysicalState(), arch, [2.0] * 64, 3.0)
    C, _, phys, _ = physicalize_window(6, pend, plc, ov, PhysicalState(replicas=state), arch, [2.0] * 64, 3.0)
    assert phys.replicas == state
    for eid, dst in moved.items():
        assert phys.replicas.experts[eid].cores == state.experts[eid].cores == [dst]
        assert dst in set(C.core_id)
    base, _, _, _ = physicalize_window(6, pend, plc, Overlays(), PhysicalState(), arch, [2.0] * 64, 3.0)

    def flops_on(ev: Any, core: int) -> float:
        return float(sum(f for c, f in zip(ev.core_id, ev.flops, strict=True) if c == core))

    assert flops_on(C, 27) < flops_on(base, 27)  # the hot core sheds work
    for fr, to, mbj in zip(ov.reroute.from_core, ov.reroute.to_core, ov.reroute.mb_ids_json, strict=True):
        (eid,) = json.loads(mbj)
        assert fr in cores[eid] and to in (state.experts[eid].cores if eid in state.experts else cores[eid])


# --- Science III (issue 16): live bank occupancy, no move off an idle core, benefit versus cost -------------------

def _occupancy(plc: Placement, state: ReplicaState, arch: ArchConfig) -> dict[tuple[int, int], int]:
    """Bytes per bank recomputed from scratch: a shard sits in its TACS bank when its expert moved, else in the
    placement's banks (primary and replicas)."""
    geom = ChipGeometry.of(arch)
    out: dict[tuple[int, int], int] = {}
    for tid, tp in plc.tensors.items():
        eid, k = tid[2:].rsplit("_", 1)
        ent = state.experts.get(eid)
        banks = [ent.shard_banks[int(k)]] if ent is not None and ent.shard_banks else \
            [tp.dram_bank, *(tp.replica_banks or [])]
        for b in banks:
            key = geom.bank_core_slot(b)
            out[key] = out.get(key, 0) + int(tp.size_bytes or 0)
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=st.lists(st.tuples(temps_st, utils_st), min_size=3, max_size=12))
def test_bank_capacity_holds_after_any_sequence_of_steps(tas: TasParams,
                                                         seq: list[tuple[list[float], list[float]]]) -> None:
    """Banks of exactly one shard (32 MiB) and a crowded chip: whatever TACS does over a run, no bank ever holds more
    than its capacity (the occupancy it decides on is the live one, moves of earlier windows included)."""
    arch = ARCH4.model_copy(update={"dram": ARCH4.dram.model_copy(update={"bank_capacity_mb": 32.0})})
    cores = {f"L{lv}E{e}": [(3 * lv + e) % 16] for lv in range(4) for e in range(8)}  # 2 experts per core
    watts = {eid: 3.0 for eid in cores}
    plc = placement_from(arch, cores)
    params = tas.tacs.model_copy(update={"min_residency_ms": 0.0, "undo_cooldown_ms": 0.0})
    state = replica_state_from_placement(plc, 0)
    cap = 32 << 20
    for k, (t, u) in enumerate(seq):
        pend = window(k + 1, watts)
        _, state, _ = tacs_step(Telemetry(temps_core=t, util_core=u), plc, state, params, arch, H4, pend, None,
                                pend.t0_ns)
        occ = _occupancy(plc, state, arch)
        assert max(occ.values()) <= cap, (k, max(occ.values()))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=temps_st, idle=st.sets(st.integers(min_value=0, max_value=15), min_size=1, max_size=16))
def test_no_move_starts_from_a_core_with_no_work(tas: TasParams, t: list[float], idle: set[int]) -> None:
    """Cores in ``idle`` have no utilisation and no pending work (their experts get no tokens this window): however
    hot they are, no migration or reroute leaves them."""
    cores, watts = _mixed_placement()
    busy_watts = {eid: w for eid, w in watts.items() if not set(cores[eid]) & idle}
    u = [0.0 if c in idle else 0.5 for c in range(16)]
    plc = placement_from(ARCH4, cores)
    ov, _, _ = tacs_step(Telemetry(temps_core=t, util_core=u), plc, ReplicaState(), tas.tacs, ARCH4, H4,
                         window(3, busy_watts) if busy_watts else None, None, 9_000_000)
    assert not set(ov.reroute.from_core) & idle


def test_a_busy_cool_chip_and_a_move_not_worth_its_heat_do_nothing(tas: TasParams) -> None:
    """Utilisation alone (every core at 95 %, all below Thot) triggers nothing; a hot core whose expert draws too
    little power for its drop to pay for streaming its weights is left alone, and the same core with a power-hungry
    expert is relieved."""
    cores, watts = _mixed_placement()
    plc = placement_from(ARCH4, cores)
    ov, _, _ = tacs_step(Telemetry(temps_core=[70.0] * 16, util_core=[0.95] * 16), plc, ReplicaState(), tas.tacs,
                         ARCH4, H4, window(1, watts), None, 0)
    assert ov.is_empty()
    lone = {"L0E0": [6]}
    hot = [60.0] * 16
    hot[6] = 81.0
    small = placement_from(ARCH4, lone)  # 32 MiB of weights: ~1 mJ to read and write, ~0.2 K at core 6 over 15 ms
    late = window(10, {"L0E0": 0.05})  # 30 ms in: past the minimum residency; 0.05 W moved saves < 0.1 K
    ov, _, _ = tacs_step(Telemetry(temps_core=hot, util_core=[0.5] * 16), small, ReplicaState(), tas.tacs, ARCH4,
                         H4, late, None, late.t0_ns)
    assert ov.is_empty()
    late = window(10, {"L0E0": 3.0})
    ov, _, _ = tacs_step(Telemetry(temps_core=hot, util_core=[0.5] * 16), small, ReplicaState(), tas.tacs, ARCH4,
                         H4, late, None, late.t0_ns)
    assert ov.migrate.obj_type.count("expert") == 1


def test_a_cores_clock_prices_its_work_at_its_voltage(tas: TasParams) -> None:
    """TACS prices an instance's FLOPs at ``(V/V0)²`` of the core that runs them (``telemetry.freq_ghz``, the
    governor's clocks for the coming window; shared/dvfs.py). 1 W of work (priced at V0) on hot core 6 is worth
    moving at the top step; with every core at the lowest step (1.2 GHz, V ∝ f: 0.6 V, 0.36× the energy) the same
    work draws 0.36 W, and the hot core's drop no longer pays for streaming its weights. No clocks given means each
    domain's top step."""
    hot = [60.0] * 16
    hot[6] = 81.0
    small = placement_from(ARCH4, {"L0E0": [6]})
    late = window(10, {"L0E0": 1.0})

    def migrations(freq: list[float]) -> int:
        ov, _, _ = tacs_step(Telemetry(temps_core=hot, util_core=[0.5] * 16, freq_ghz=freq), small, ReplicaState(),
                             tas.tacs, ARCH4, H4, late, None, late.t0_ns)
        return ov.migrate.obj_type.count("expert")

    top = ARCH4.dvfs.domains[0].steps_ghz
    assert migrations([top[0]] * 16) == migrations([]) == 1
    assert migrations([top[-1]] * 16) == 0


def test_a_moves_drop_weighs_the_work_at_the_source_and_at_the_destination_voltage(tas: TasParams) -> None:
    """The hot core's drop of a move is ``w_s·H[s,s] − w_d·H[s,d]``: the work leaves s at s's voltage and arrives
    at d at d's (the reroute row's ``expected_gain``). With every core at the top step it is ``w·(H[s,s] − H[s,d])``;
    with the source at the top step and every other core at the lowest (0.36× the energy), the same work heats the
    destination less, so the source's drop is larger, by ``0.64·w·H[s,d]`` exactly."""
    hot = [60.0] * 16
    hot[6] = 81.0
    small = placement_from(ARCH4, {"L0E0": [6]})
    late = window(10, {"L0E0": 3.0})
    top, low = ARCH4.dvfs.domains[0].steps_ghz[0], ARCH4.dvfs.domains[0].steps_ghz[-1]

    def move(freq: list[float]) -> tuple[int, float]:
        ov, _, _ = tacs_step(Telemetry(temps_core=hot, util_core=[0.5] * 16, freq_ghz=freq), small, ReplicaState(),
                             tas.tacs, ARCH4, H4, late, None, late.t0_ns)
        assert ov.reroute.from_core == [6]
        return ov.reroute.to_core[0], ov.reroute.expected_gain[0]

    d, gain = move([top] * 16)
    w = gain / (H4[6, 6] - H4[6, d])  # W of the expert's work at V0
    mixed = [low] * 16
    mixed[6] = top
    d2, gain2 = move(mixed)
    assert gain2 == pytest.approx(w * H4[6, 6] - 0.36 * w * H4[6, d2], rel=1e-4)
    assert gain2 > w * (H4[6, 6] - H4[6, d2]) + 1e-3


def test_the_lookahead_shift_moves_each_cores_own_power() -> None:
    """Look-ahead (step 6): the shifted power leaves core s as ``w_core_s`` and arrives at d as ``w_core_d`` (each at
    its own voltage), and its vault part moves vault."""
    from services.placement.tacs import _Lookahead

    rng = np.random.default_rng(5)
    Dc, Dv = rng.random((4, 16, 16)), rng.random((4, 16, 16))
    look = _Lookahead.of(np.full(16, 60.0), (Dc, Dv), 4)
    Cc, Cv = np.cumsum(Dc, axis=0), np.cumsum(Dv, axis=0)
    got = look.shift(6, 9, 0.5, 2.0, 0.25, start=0)
    np.testing.assert_allclose(got, 2.0 * Cc[:, :, 9] - 0.5 * Cc[:, :, 6] + 0.25 * (Cv[:, :, 9] - Cv[:, :, 6]))
    later = look.shift(6, 9, 0.5, 2.0, 0.25, start=2)
    np.testing.assert_allclose(later[:2], 0.0)
    np.testing.assert_allclose(later[2:], got[:2])


def test_the_bank_index_of_one_placement_object_follows_the_chip() -> None:
    """A registered placement is one object shared by every window's request: its parsed bank occupancy is cached,
    keyed by the chip layout too, so the same object on a chip with the same counts but another vault shape is
    parsed for that chip (not served the first chip's index)."""
    from services.placement import tacs as tacs_mod
    from shared.contracts.placement import ExpertPlacement, TensorPlacement

    plc = Placement(experts={"L0E0": ExpertPlacement(cores=[0])},
                    tensors={"W_L0E0_0": TensorPlacement(dram_bank="B(0,1,0)", size_bytes=1000)})
    square, flat = small_arch(4, 4, (8, 8, 2)), small_arch(4, 4, (16, 4, 2))  # vaults 2x2x2 and 4x1x2: 8 banks each
    ga, gb = ChipGeometry.of(square), ChipGeometry.of(flat)
    assert (ga.n_cores, ga.vault_banks) == (gb.n_cores, gb.vault_banks)
    first = tacs_mod._index(plc, ga).used.copy()
    second = tacs_mod._index(plc, gb).used.copy()
    tacs_mod._INDEX_CACHE.clear()
    assert np.array_equal(second, tacs_mod._index(plc, gb).used)
    assert not np.array_equal(first, second)  # the two layouts put the bank in different vaults


def test_ids_that_name_no_expert_shard_change_nothing(tas: TasParams) -> None:
    """A weight row whose id is no expert's shard (``W_`` then anything) in the pending window, and a replica-state
    entry under a key that is no expert's id with banks recorded, are ignored (the ids' one parser,
    ``shared.contracts.ids``): the step is the one without them, not an error."""
    cores, watts = _mixed_placement()
    plc = placement_from(ARCH4, cores)
    t = [60.0] * 16
    t[5] = 95.0
    u = [0.6] * 16
    pend = window(2, watts)
    # reads under ids that look like a shard of L1E0 (the expert the step reroutes off the hot core) but are not
    # its shards' names (`weight_tensor_id`: the shard number and nothing else, no leading zeros), at a size that
    # would change the reroute's expected gain if they counted as its weight stream
    odd_ids = ["W_junk_0", "W_L1E0_gate", "W_L01E0_0", "W_L1E00_0", "W_L1E0_00"]
    extra = LogicalMemory.from_columns({"event_id": [0] * len(odd_ids), "tensor_id": odd_ids,
                                        "access": ["read"] * len(odd_ids), "bytes": [1e12] * len(odd_ids),
                                        "locality_hint": ["shard0"] * len(odd_ids)})
    odd_pend = pend.model_copy(update={"memory": LogicalMemory.concat([pend.memory, extra])})
    state = replica_state_from_placement(plc, 0)
    odd_state = state.model_copy(update={"experts": {**state.experts,
                                                     "junk": ReplicaEntry(cores=[3], shard_banks=["B(0,0,0)"])}})
    ov, new, _ = tacs_step(Telemetry(temps_core=t, util_core=u), plc, state, tas.tacs, ARCH4, H4, pend, None,
                           pend.t0_ns)
    ov2, new2, _ = tacs_step(Telemetry(temps_core=t, util_core=u), plc, odd_state, tas.tacs, ARCH4, H4, odd_pend,
                             None, pend.t0_ns)
    assert json.loads(ov.reroute.mb_ids_json[0]) == ["L1E0"]  # the hot core is relieved: the comparison sees a decision
    assert ov2 == ov
    assert {k: v for k, v in new2.experts.items() if k != "junk"} == new.experts
