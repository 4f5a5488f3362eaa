"""TAPS's slot model (services/placement/slots.py) and the thermal pulse responses it is built from: invariants of
the model (its mean is the steady model's mean field, the responses sum to H, symmetry is exact), its physics
(consecutive bursts on one core are hotter than spread ones) and TAPS's rule that it never keeps a placement its
model predicts to be worse than the default mapping."""

from __future__ import annotations

import numpy as np
import pytest

from services.placement.default import default_placement
from services.placement.placer import build_placement, slot_model
from services.placement.slots import SlotModel, objective_terms, periodic_response, slot_count
from services.placement.taps import Problem, build_problem
from services.thermal.influence import (
    influence_for_model,
    mesh_symmetries,
    pulse_response,
    vault_influence_for_model,
)
from services.thermal.model import get_model
from shared.configs import ArchConfig, TasParams, WorkloadConfig
from tests.placement.conftest import small_arch

SLOT_S = 0.007


@pytest.fixture(scope="module")
def chip() -> tuple[ArchConfig, np.ndarray, np.ndarray]:
    arch = small_arch(4, 4)
    m = get_model(arch)
    return arch, influence_for_model(m), vault_influence_for_model(m)


def _pulse(arch: ArchConfig):  # type: ignore[no-untyped-def]
    return lambda slot_s, lags, dies: pulse_response(get_model(arch), slot_s, lags, dies)


def test_pulse_responses_of_symmetric_sources_equal_a_direct_solve(chip: tuple[ArchConfig, np.ndarray,
                                                                               np.ndarray]) -> None:
    arch, _, _ = chip
    m = get_model(arch)
    assert len(mesh_symmetries(m)) == 8  # a square, symmetric stack: mirrors, transpose and their products
    Dc, Dv = pulse_response(m, SLOT_S, 3)
    amb = float(m.net.ambient)
    for c in (1, 6, 11, 15):  # sources that are not their orbit's representative
        core_w = np.zeros(m.n_cores)
        core_w[c] = 1.0
        T = m.step(np.full(m.net.n_nodes, amb), core_w, np.zeros((len(m.dram_layers), m.n_banks_per_layer)),
                   SLOT_S)
        assert np.abs(m.core_temps(T) - amb - Dc[0, :, c]).max() < 1e-8
    assert Dv[0].max() > 0


def test_pulse_responses_sum_to_the_steady_influence(chip: tuple[ArchConfig, np.ndarray, np.ndarray]) -> None:
    """A pulse's energy ends up as the steady response: Σ_j D[j] approaches H (sampled once per slot) from below;
    what is left after many lags is the package's slow mode, the same at every core (the tail the slot model spreads
    evenly over a period)."""
    arch, H, _ = chip
    m = get_model(arch)
    short = pulse_response(m, 0.05, 4)[0].sum(axis=0)
    long = pulse_response(m, 0.05, 48)[0].sum(axis=0)
    assert np.all(long >= short - 1e-12)
    resid = H - long  # the slow package modes, still to come after 2.4 s: positive and nearly uniform over cores
    assert resid.min() > -1e-9
    assert resid.max() - resid.min() < 0.01 * H.max()
    assert np.abs(resid).max() < np.abs(H - short).max()
    # the vault sources in given shares per DRAM die tend to H_vault for the same shares, not the even one's
    # (slots of 0.2 s: the same 2.4 s in a quarter of the steps)
    Hd = vault_influence_for_model(m, [0.0, 1.0])
    long_v = pulse_response(m, 0.2, 12, [0.0, 1.0])[1].sum(axis=0)
    resid = Hd - long_v
    assert resid.min() > -1e-9 and resid.max() - resid.min() < 0.01 * Hd.max()
    assert np.abs(long_v - pulse_response(m, 0.2, 12)[1].sum(axis=0)).max() > 10 * (resid.max() - resid.min())


def test_periodic_response_has_the_steady_mean(chip: tuple[ArchConfig, np.ndarray, np.ndarray]) -> None:
    arch, H, _ = chip
    Dc, _ = pulse_response(get_model(arch), SLOT_S, 12)
    for S in (5, 12, 40):
        R = periodic_response(Dc, H, S)
        assert R.shape == (S, 16, 16)
        assert np.allclose(R.sum(axis=0), H, atol=1e-12)


def _problem(arch: ArchConfig, mixtral: WorkloadConfig, tas: TasParams, H: np.ndarray, n_layers: int = 8) -> Problem:
    loads = [[1.0 / (e + 1) for e in range(8)] for _ in range(n_layers)]
    return build_problem(arch, mixtral, tas.taps, loads, 2 * 3 * 4096 * 14336, H,
                         expert_bytes=3 * 4096 * 14336 * 2 // 64, critical_path_tol=0.01, replicate_hot_k=0)


def _slot_model(pb: Problem, arch: ArchConfig, H: np.ndarray, Hv: np.ndarray, S: int) -> SlotModel:
    slot_s = 1.0 / pb.steps_per_s / S
    Dc, Dv = pulse_response(get_model(arch), slot_s, 6)
    assert pb.inst_e_logic is not None and pb.inst_e_vault is not None
    return SlotModel(S=S, slot_s=slot_s, Rc=periodic_response(Dc, H, S), Rv=periodic_response(Dv, Hv, S),
                     inst_slot=pb.expert_layer[pb.inst_expert] % S, inst_pc=pb.inst_e_logic / slot_s,
                     inst_pv=pb.inst_e_vault / slot_s)


def test_the_slot_model_mean_is_the_steady_mean_field(chip: tuple[ArchConfig, np.ndarray, np.ndarray],
                                                      mixtral: WorkloadConfig, tas: TasParams) -> None:
    arch, H, Hv = chip
    pb = _problem(arch, mixtral, tas, H)
    sm = _slot_model(pb, arch, H, Hv, 20)
    assign = np.arange(pb.m) % pb.n
    T = sm.temps(pb, assign)
    assert pb.inst_e_logic is not None and pb.inst_e_vault is not None
    pc = np.bincount(assign, weights=pb.inst_e_logic, minlength=pb.n) * pb.steps_per_s
    pv = np.bincount(assign, weights=pb.inst_e_vault, minlength=pb.n) * pb.steps_per_s
    assert np.allclose(T.mean(axis=0), pb.t_base + H @ pc + Hv @ pv, atol=1e-9)
    assert T.max() > T.mean(axis=0).max() + 1e-3  # and its peak is a burst above the mean


def test_consecutive_bursts_on_one_core_are_hotter_than_spread_ones(
        chip: tuple[ArchConfig, np.ndarray, np.ndarray], mixtral: WorkloadConfig, tas: TasParams) -> None:
    """Two experts of consecutive layers on one core heat it more than the same two experts half a period apart:
    the physics the steady model cannot see (both have the same mean)."""
    arch, H, Hv = chip
    pb = _problem(arch, mixtral, tas, H, n_layers=16)
    sm = _slot_model(pb, arch, H, Hv, 16)
    i0, i1, i8 = (int(np.flatnonzero(pb.inst_expert == k)[0]) for k in (0, 8, 8 * 8))  # L0E0, L1E0, L8E0
    assert pb.inst_e_logic is not None and pb.inst_e_vault is not None
    assert pb.inst_e_logic[i1] == pb.inst_e_logic[i8] and pb.inst_e_vault[i1] == pb.inst_e_vault[i8]
    core = 5  # an inner core of the 4 x 4 mesh
    alone = sm.kernel(i0)[:, :, core]  # (S, n): what L0E0 on the core adds at every core and slot end

    def with_(j: int) -> np.ndarray:
        return np.asarray(alone + sm.kernel(j)[:, :, core])

    near, far = with_(i1), with_(i8)
    assert np.isclose(near[:, core].mean(), far[:, core].mean(), rtol=1e-12)  # the same mean...
    assert near[:, core].max() > far[:, core].max() + 1e-3  # ...but back-to-back bursts peak higher


def test_taps_never_keeps_a_placement_predicted_worse_than_the_default_mapping(
        chip: tuple[ArchConfig, np.ndarray, np.ndarray], mixtral: WorkloadConfig, tas: TasParams) -> None:
    arch, H, Hv = chip
    loads = [[1.0 / (e + 1) ** 1.2 for e in range(8)] for _ in range(8)]
    eb = 3 * 4096 * 14336 * 2 // 64
    plc = build_placement(arch, mixtral, tas.taps, loads, 2 * 3 * 4096 * 14336, H, method="heuristic",
                          H_vault=Hv, pulse=_pulse(arch), moe_layers=list(range(8)), expert_bytes=eb)
    notes = " ".join(plc.meta.notes)
    assert "slot model" in notes
    pb = build_problem(arch, mixtral, tas.taps, loads, 2 * 3 * 4096 * 14336, H, expert_bytes=eb,
                       critical_path_tol=0.01, replicate_hot_k=0, H_vault=Hv)
    sm = slot_model(pb, _pulse(arch), Hv)
    assert sm is not None
    default_obj = objective_terms(pb, sm.temps(pb, np.arange(pb.m) % pb.n))["objective"]
    assert plc.meta.objective["objective"] <= default_obj + 1e-9
    if "kept: default" in notes:  # TAPS kept the default mapping's cores (its shards: TAPS's bank book)
        d = default_placement(arch, list(range(8)), 8, mixtral.tensors.weight_shard_mb, eb)
        assert plc.experts == d.experts


def test_slot_count() -> None:
    assert slot_count(0.3, 0.007, 32) == 43
    assert slot_count(0.1, 0.007, 32) == 32  # a saturated period: every slot is a layer
    assert slot_count(0.3, 0.0, 4) == 4
