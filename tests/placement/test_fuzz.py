"""Hostile requests to every placement endpoint: any status but 5xx, and 4xx bodies in the shared error format."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.root_app import embedded
from shared.settings import Settings

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=6))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                      max_leaves=12)
loads = st.lists(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=5), max_size=4)

FIELDS: dict[str, dict[str, Any]] = {
    "/v1/placements": {"method": st.sampled_from(["default", "heuristic", "milp", "x"]), "expert_load": loads,
                       "moe_layers": st.lists(st.integers(-2, 5), max_size=4), "n_experts": st.integers(-1, 9),
                       "expert_bytes": st.floats(-1, 1e9), "expert_flops_per_token": st.floats(allow_nan=True),
                       "H": st.lists(st.lists(st.floats(-1, 5), max_size=3), max_size=3), "arch": values},
    "/v1/balance": {"loads": loads, "cores": st.integers(-2, 70), "slots": st.integers(-2, 300)},
    "/v1/tacs/step": {"telemetry": st.fixed_dictionaries({"temps_core": st.lists(st.floats(0, 120), max_size=65)}),
                      "placement": st.fixed_dictionaries({"experts": st.dictionaries(
                          st.sampled_from(["L0E0", "L1E2", "x"]),
                          st.fixed_dictionaries({"cores": st.lists(st.integers(-3, 70), max_size=3)}),
                          max_size=3)}),
                      "now_ns": st.integers(-5, 10**9), "smoothed": st.none() | st.lists(st.floats(0, 99))},
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    """The placement service as it runs: lifespan entered (its MILP pool) and its peers wired (the workload and
    thermal services it asks for expert counts and H), all in process."""
    with embedded(Settings()) as emb:
        yield TestClient(emb.apps["placement"], raise_server_exceptions=False)


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_no_server_errors(client: TestClient, path: str) -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(body=st.fixed_dictionaries({}, optional=FIELDS[path]))
    def run(body: dict[str, Any]) -> None:
        r = client.post(path, content=_dumps(body), headers={"content-type": "application/json"})
        assert r.status_code < 500, (body, r.text)
        if r.status_code >= 400:
            err = r.json()["error"]
            assert set(err) == {"code", "message", "field"}

    run()


def _dumps(body: dict[str, Any]) -> str:
    import json

    return json.dumps(body, allow_nan=True)
