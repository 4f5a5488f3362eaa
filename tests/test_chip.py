"""Chip geometry: the uniform gather/scatter link shares used for MoE dispatch/combine traffic, vault and hop tables."""

from __future__ import annotations

import numpy as np
import pytest

from shared.chip import Chip
from shared.configs import ArchConfig


def test_gather_and_scatter_shares_carry_the_mean_hop_count() -> None:
    chip = Chip.from_arch(ArchConfig())
    n = chip.n_cores
    cores = np.arange(n, dtype=np.int64)
    mean_hops = np.array([chip.hops(cores, np.full(n, c, dtype=np.int64)).mean() for c in range(n)])
    # one byte spread evenly over all sources crosses, on average, the mean hop count of links
    np.testing.assert_allclose(chip.gather_link_share.sum(axis=1), mean_hops)
    np.testing.assert_allclose(chip.scatter_link_share.sum(axis=1), mean_hops)
    # centre cores are closer to everyone than corners
    assert mean_hops[0] > mean_hops[27]
    # gather into c uses only links that point towards c: the reverse links of the scatter from c
    assert chip.gather_link_share.shape == (n, chip.n_links)
    assert not np.allclose(chip.gather_link_share, chip.scatter_link_share)
    # explicit check for one core against link_bytes of every (source, 27) pair
    direct = sum(chip.link_bytes(np.array([s]), np.array([27]), np.array([1.0 / n])) for s in range(n))
    np.testing.assert_allclose(chip.gather_link_share[27], direct)


def test_vault_and_hop_tables_equal_the_formulas() -> None:
    """bank_vault_core and hops use tables; they give the defining formulas' values for every integer input."""
    chip = Chip.from_arch(ArchConfig())
    n_banks = chip.BX * chip.BY * chip.L
    flat = np.concatenate([np.arange(n_banks), [-1, -n_banks - 3, n_banks, 5 * n_banks + 17]]).astype(np.int64)
    bx, by = flat % chip.BX, (flat // chip.BX) % chip.BY
    assert np.array_equal(chip.bank_vault_core(flat), (by // chip.bpy) * chip.X + bx // chip.bpx)
    rng = np.random.default_rng(0)
    for lo, hi in ((0, chip.n_cores), (-3, chip.n_cores + 5)):
        a, b = rng.integers(lo, hi, 500), rng.integers(lo, hi, 500)
        ref = np.abs(a % chip.X - b % chip.X) + np.abs(a // chip.X - b // chip.X)
        assert np.array_equal(chip.hops(a, b), ref)
        assert np.array_equal(chip.hops(a[:1], b), ref[:1] * 0 + np.abs(a[0] % chip.X - b % chip.X)
                              + np.abs(a[0] // chip.X - b // chip.X))
    assert chip.hops(np.zeros(0, np.int64), np.zeros(0, np.int64)).size == 0


@pytest.mark.parametrize("order", ["all_first", "list_first"])
def test_one_dvfs_domain_rule_across_the_services(order: str) -> None:
    """Domains [all @ 2.0 GHz, [0, 1] @ 1.5 GHz] (either order): cores 0-1 run at 1.5 GHz in the orchestrator's first
    window, the lowering service's default clocks, the thermal service's DVFS and its voltages, and the event
    columns; every other core at 2.0 GHz."""
    from services.lowering.service import default_freqs
    from services.orchestrator.epochs import initial_freqs
    from shared.chip import core_domains
    from shared.contracts.events import PhysicalizeRequest
    from shared.contracts.placement import Placement
    from shared.contracts.workload import LogicalCompute, LogicalMemory, LogicalWindow
    from shared.dvfs import freq_volt, volts_for

    doms: list[dict[str, object]] = [{"cores": "all", "steps_ghz": [2.0, 1.0], "trip_c": [85.0]},
                                     {"cores": [0, 1], "steps_ghz": [1.5, 1.0], "trip_c": [85.0]}]
    if order == "list_first":
        doms.reverse()
    arch = ArchConfig.model_validate({"dvfs": {"domains": doms}})
    want = [1.5, 1.5] + [2.0] * 62
    special = 1 if order == "all_first" else 0
    assert core_domains(arch)[:3] == (special, special, 1 - special)
    assert initial_freqs(arch) == want
    lw = LogicalWindow(trace_id="t", window=0, t0_ns=0, t1_ns=1, compute=LogicalCompute.empty(),
                       memory=LogicalMemory.empty())
    req = PhysicalizeRequest(window=0, logical=lw, placement=Placement(experts={}), arch=arch, window_ms=1.0)
    assert req.arch is not None and default_freqs(req.arch) == want
    f, v = freq_volt(np.zeros(64, dtype=int), arch)
    assert f.tolist() == want
    np.testing.assert_allclose(volts_for(f, arch), v)
    assert Chip.from_arch(arch).core_domain == core_domains(arch)
