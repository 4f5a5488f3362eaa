"""shared/series_table.py: the per-window table of a run (every window, documented columns, same bytes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shared.contracts.metrics import WindowMetrics
from shared.errors import NotFound
from shared.series_table import POWER_COMPONENTS, SeriesTableWriter, read_series_table, write_series_table


def _chunks(ws: list[WindowMetrics], size: int) -> list[list[dict[str, object]]]:
    js = [w.model_dump(mode="json") for w in ws]
    return [js[i:i + size] for i in range(0, len(js), size)]


def test_round_trip_and_same_bytes(runs: dict[str, list[WindowMetrics]], tmp_path: Path) -> None:
    ws = runs["taps"]
    a, b = tmp_path / "a.series.csv.gz", tmp_path / "b.series.csv.gz"
    assert write_series_table(a, _chunks(ws, 2)) == len(ws)
    assert write_series_table(b, _chunks(ws, 5)) == len(ws)  # chunking does not show
    assert a.read_bytes() == b.read_bytes()
    t = read_series_table(a)
    assert np.allclose(t["T_peak_logic"], [w.T_peak_logic for w in ws], rtol=1e-6)
    assert np.allclose(t["T_core_9"], [w.temps_core_c[9] for w in ws], rtol=1e-6)
    assert np.allclose(t["T_dram_3_max"], [max(v[3] for v in w.temps_bank_c) for w in ws], rtol=1e-6)
    assert np.allclose(t["lat_count"], [len(w.latencies_ms) for w in ws])
    assert np.allclose(t["noc_util_max"], [max(w.noc_link_util) for w in ws], rtol=1e-6)
    for c in POWER_COMPONENTS:
        assert np.allclose(t[f"power_{c}_w"], [getattr(w.power, c) for w in ws], rtol=1e-6)
    assert [k for k in t if k.startswith("power_die_")][:2] == ["power_die_logic_w", "power_die_dram_1_w"]


def test_no_window_writes_no_file(tmp_path: Path) -> None:
    p = tmp_path / "x.series.csv.gz"
    assert write_series_table(p, []) == 0
    assert not p.exists() and not list(tmp_path.iterdir())
    with pytest.raises(NotFound):
        read_series_table(p)


def test_a_window_without_latencies_has_empty_fields(runs: dict[str, list[WindowMetrics]], tmp_path: Path) -> None:
    ws = [w.model_copy(update={"latencies_ms": [], "tokens_completed": 0}) for w in runs["baseline"][:2]]
    p = tmp_path / "x.series.csv.gz"
    write_series_table(p, _chunks(ws, 2))
    t = read_series_table(p)
    assert t["lat_count"].tolist() == [0.0, 0.0] and np.isnan(t["lat_mean_ms"]).all()


def test_an_interrupted_writer_leaves_no_file(runs: dict[str, list[WindowMetrics]], tmp_path: Path) -> None:
    p = tmp_path / "x.series.csv.gz"
    with pytest.raises(RuntimeError), SeriesTableWriter(p) as w:
        w.add(_chunks(runs["tas"], 3)[0])
        raise RuntimeError("the database went away")
    assert list(tmp_path.iterdir()) == []
