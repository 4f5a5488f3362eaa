"""The water fill of replicated experts (`physicalize._water_fill`) gives exactly the token splits of the plain
60-step bisection it replaced, on random inputs (ties, zero loads, one to six replicas, large backlogs)."""

from __future__ import annotations

import random

import pytest

from services.lowering.physical.assign import water_fill as _water_fill


def reference_water_fill(tokens: int, loads: list[float], per_token: list[float], cores: list[int]) -> list[int]:
    """The original implementation, kept verbatim as the reference."""
    k = len(cores)
    order = sorted(range(k), key=lambda i: (loads[i], cores[i]))
    out = [0] * k
    lo, hi = min(loads), max(loads) + tokens * max(per_token) + 1.0
    for _ in range(60):  # bisection on the water level
        mid = (lo + hi) / 2
        n = sum(max(0.0, (mid - loads[i]) / per_token[i]) for i in range(k))
        if n >= tokens:
            hi = mid
        else:
            lo = mid
    for i in range(k):
        out[i] = int(max(0.0, (lo - loads[i]) / per_token[i]))
    rest = tokens - sum(out)
    j = 0
    while rest > 0:
        i = order[j % k]
        out[i] += 1
        rest -= 1
        j += 1
    return out


def _case(rng: random.Random) -> tuple[int, list[float], list[float], list[int]]:
    k = rng.choice([1, 2, 2, 2, 3, 4, 6])
    scale = rng.choice([1.0, 1e3, 1e6, 1e8])
    base = rng.uniform(0, scale)
    kind = rng.random()
    if kind < 0.2:
        loads = [base] * k  # ties
    elif kind < 0.3:
        loads = [0.0] * k
    else:
        loads = [base + rng.uniform(0, scale) for _ in range(k)]
    pt = rng.choice([1e-9, 1.0, 37.5, 1e4, 3e5])
    per_token = [pt if rng.random() < 0.5 else rng.uniform(pt / 4, pt * 4) for _ in range(k)]
    cores = rng.sample(range(64), k)
    return rng.randint(1, 200), loads, per_token, cores


@pytest.mark.parametrize("seed", range(4))
def test_water_fill_equals_the_plain_bisection(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2500):
        tokens, loads, per_token, cores = _case(rng)
        got = _water_fill(tokens, loads, per_token, cores)
        assert got == reference_water_fill(tokens, loads, per_token, cores), (tokens, loads, per_token, cores)
        assert sum(got) == tokens


def test_water_fill_levels_the_load() -> None:
    # an idle core takes tokens until it reaches the busy one's level, then they share
    assert _water_fill(10, [0.0, 4.0], [1.0, 1.0], [3, 1]) == [7, 3]
    assert _water_fill(4, [0.0, 100.0], [1.0, 1.0], [0, 1]) == [4, 0]
