"""The rational approximation of exp behind the exponential window step (services/thermal/rational.py)."""

from __future__ import annotations

import numpy as np
import pytest

from services.thermal.rational import DEGREES, exp_error, exp_poles, rational_exp

HALPHEN = 9.28903  # the best type (n, n) approximation's error on (−∞, 0] falls like HALPHEN^−n


@pytest.mark.parametrize("n", DEGREES)
def test_error_falls_like_halphens_constant(n: int) -> None:
    err = exp_error(n)
    assert err < max(2.2 * HALPHEN ** -n, 2e-13)  # 2e-13: double precision's floor of the CF construction
    assert err > 0.5 * HALPHEN ** -n  # a near-best approximation, not an accident of the sampling


@pytest.mark.parametrize("n", DEGREES)
def test_exact_at_zero_and_at_minus_infinity(n: int) -> None:
    assert rational_exp(np.array([0.0]), n)[0] == pytest.approx(1.0, abs=1e-13)
    assert abs(rational_exp(np.array([-1e15]), n)[0]) < 1e-13


def test_poles_are_half_of_the_conjugate_pairs() -> None:
    for n in DEGREES:
        z, c = exp_poles(n)
        assert len(z) == len(c) == n // 2
        assert all(zk.imag > 0 for zk in z)


def test_the_degree_must_be_an_even_supported_one() -> None:
    with pytest.raises(ValueError, match="degree must be one of"):
        exp_poles(5)
