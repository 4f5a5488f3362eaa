"""Load balance face: never worse than DeepSeek EPLB on the reference cases with the same slot count, distinct cores
per expert, honest lower bound."""

from __future__ import annotations

import csv
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from services.placement.balance import balance, read_loads_file
from shared.errors import BadInput


@cache
def _solve(ref: Path, n_experts: int, slots: int, layer: int) -> dict[str, Any]:
    loads = read_loads_file(ref / "placement" / f"input_loads_E{n_experts}.csv")
    out: dict[str, Any] = balance([loads[layer]], 64, slots)["layers"][0]
    out["_loads"] = loads[layer]
    return out


def test_no_worse_than_eplb_on_every_reference_case(reference_dir: Path) -> None:
    results = json.loads((reference_dir / "placement" / "eplb_results.json").read_text())
    exact = {(c["name"], lay["layer"]): lay["max_over_mean"] for c in results["cases"] for lay in c["layers"]}
    rows = list(csv.DictReader((reference_dir / "placement" / "eplb_summary.csv").read_text().splitlines()))
    assert len(rows) == 40
    worse = []
    for row in rows:
        e, s, layer = int(row["num_experts"]), int(row["num_replicas"]), int(row["layer"])
        eplb = exact[(row["case"], layer)]
        assert eplb == pytest.approx(float(row["max_over_mean_core_load"]), rel=1e-5)
        ours = _solve(reference_dir, e, s, layer)
        if ours["max_over_mean"] > eplb * (1 + 1e-9):
            worse.append((row["case"], layer, ours["max_over_mean"], eplb))
    assert not worse, worse


@pytest.mark.parametrize(("n_experts", "slots"), [(8, 64), (8, 128), (64, 64), (64, 128), (64, 192)])
def test_layout_invariants(reference_dir: Path, n_experts: int, slots: int) -> None:
    for layer in range(4):
        out = _solve(reference_dir, n_experts, slots, layer)
        w = np.asarray(out["_loads"])
        reps = out["replicas"]
        assert len(reps) == slots  # the same total slot count
        pairs = {(c, e) for c, e in reps}
        assert len(pairs) == len(reps)  # never two replicas of one expert on one core
        counts = np.bincount([e for _, e in reps], minlength=n_experts)
        assert counts.min() >= 1 and counts.tolist() == out["replica_counts"]
        load = np.zeros(64)
        for c, e in reps:
            assert 0 <= c < 64
            load[c] += w[e] / counts[e]
        np.testing.assert_allclose(out["core_loads"], load, rtol=1e-6, atol=1e-6)
        mean = w.sum() / 64
        assert out["max_over_mean"] == pytest.approx(load.max() / mean)
        assert mean <= out["lower_bound"] <= load.max() * (1 + 1e-9)
        assert out["gap"] == pytest.approx(load.max() / out["lower_bound"] - 1)


def test_equal_counts_per_core_are_not_forced() -> None:
    # {3} | {1, 1, 1} is perfectly balanced; two replicas per core (EPLB's rule) could not do better than {3, 1}
    out = balance([[3.0, 1.0, 1.0, 1.0]], cores=2, slots=4)["layers"][0]
    per_core = sorted(np.bincount([c for c, _ in out["replicas"]], minlength=2).tolist())
    assert per_core == [1, 3]
    assert out["max_over_mean"] == pytest.approx(1.0)
    assert out["gap"] == pytest.approx(0.0)


@pytest.mark.parametrize(("loads", "cores", "slots", "field"), [
    ([[1.0, 2.0, 3.0]], 4, 2, "slots"),
    ([[1.0, -2.0, 3.0]], 4, 4, "loads[0][1]"),
    ([[1.0, 2.0, 3.0], [1.0, 2.0]], 4, 4, "loads[1]"),
    ([[1.0, 2.0]], 4, 9, "slots"),
    ([[1.0, 2.0]], 0, 2, "cores"),
])
def test_bad_input_names_the_field(loads: list[list[float]], cores: int, slots: int, field: str) -> None:
    with pytest.raises(BadInput) as ei:
        balance(loads, cores, slots)
    assert ei.value.field == field


def test_reads_reference_csv_and_json(reference_dir: Path, tmp_path: Path) -> None:
    loads = read_loads_file(reference_dir / "placement" / "input_loads_E8.csv")
    assert len(loads) == 4 and all(len(r) == 8 for r in loads)
    assert loads[1][0] == 14003
    p = tmp_path / "l.json"
    p.write_text(json.dumps(loads))
    assert read_loads_file(p) == loads
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(BadInput):
        read_loads_file(bad)
