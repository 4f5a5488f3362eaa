"""Chip geometry: the uniform gather/scatter link shares used for MoE dispatch/combine traffic."""

from __future__ import annotations

import numpy as np

from services.lowering.chip import Chip
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
