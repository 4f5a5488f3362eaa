"""A long run reduced chunk by chunk (``fold_windows`` then ``reduce_window_metrics(partial=...)``, HTTP
``/v1/reduce/fold``) gives the row of the one-shot reduction, and the checks across chunks still name the field."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from services.metrics.app import create_app
from services.metrics.reduce import fold_windows, reduce_window_metrics
from services.metrics.synthetic import synthetic_windows
from shared.contracts.metrics import ReducePartial, WindowMetrics
from shared.errors import BadInput
from shared.settings import Settings
from shared.window_series import block_size, coarsen, merge


def _run(n: int = 23) -> list[WindowMetrics]:
    return synthetic_windows(n, "tacs", seed=3)


@pytest.mark.parametrize("chunk", [1, 4, 10, 22])
def test_folding_in_chunks_gives_the_one_shot_row(chunk: int) -> None:
    ws = _run()
    whole = reduce_window_metrics(ws, scenario="tacs", workload="w", thot_c=50.0, bw_raw_gbps=100.0)
    partial: ReducePartial | None = None
    parts = [ws[i:i + chunk] for i in range(0, len(ws), chunk)]
    for part in parts[:-1]:
        partial = fold_windows(part, thot_c=50.0, partial=partial)
    row = reduce_window_metrics(parts[-1], scenario="tacs", workload="w", thot_c=50.0, bw_raw_gbps=100.0,
                                partial=partial)
    for name, value in whole.model_dump().items():
        got = getattr(row, name)
        assert got == pytest.approx(value, rel=1e-12, abs=1e-12), name
    assert row.windows == len(ws) and row.tokens == sum(w.tokens_completed for w in ws)


def test_checks_across_chunks_name_the_field() -> None:
    ws = _run(8)
    p = fold_windows(ws[:4], thot_c=50.0)
    with pytest.raises(BadInput) as exc:  # a repeated window
        fold_windows(ws[3:], thot_c=50.0, partial=p)
    assert exc.value.field == "windows[0].window"
    early = ws[4].model_copy(update={"t_start_ms": ws[3].t_start_ms})
    with pytest.raises(BadInput) as exc:  # starts before the last folded window ends
        fold_windows([early, *ws[5:]], thot_c=50.0, partial=p)
    assert exc.value.field == "windows[0].t_start_ms"
    fewer = ws[4].model_copy(update={"temps_core_c": ws[4].temps_core_c[:16],
                                     "temps_bank_c": ws[4].temps_bank_c[:16], "freq_ghz": ws[4].freq_ghz[:16]})
    with pytest.raises(BadInput) as exc:  # another chip
        fold_windows([fewer], thot_c=50.0, partial=p)
    assert exc.value.field == "windows[0].temps_core_c"
    with pytest.raises(BadInput) as exc:  # folded with another threshold
        fold_windows(ws[4:], thot_c=60.0, partial=p)
    assert exc.value.field == "thot_c"
    with pytest.raises(BadInput) as exc:
        reduce_window_metrics(ws[4:], scenario="tacs", workload="w", thot_c=60.0, partial=p)
    assert exc.value.field == "thot_c"


def test_http_fold_then_reduce(settings: Settings) -> None:
    ws = _run(9)
    client = TestClient(create_app(settings))
    dump = [w.model_dump(mode="json") for w in ws]
    r = client.post("/v1/reduce/fold", json={"thot_c": 50.0, "windows": dump[:5]})
    assert r.status_code == 200, r.text
    r2 = client.post("/v1/reduce", json={"scenario": "tacs", "workload": "w", "thot_c": 50.0, "windows": dump[5:],
                                         "partial": r.json()})
    one = client.post("/v1/reduce", json={"scenario": "tacs", "workload": "w", "thot_c": 50.0, "windows": dump})
    assert r2.status_code == 200 and one.status_code == 200
    assert r2.json()["row"] == pytest.approx(one.json()["row"], rel=1e-12)
    bad = client.post("/v1/reduce/fold", json={"thot_c": 50.0, "windows": dump[4:6], "partial": r.json()})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "windows[0].window"
    assert client.post("/v1/reduce/fold", json={"thot_c": 50.0, "windows": []}).status_code == 422


def test_coarsened_series_keep_the_peaks_the_hottest_map_and_the_sums() -> None:
    ws = _run(23)
    dumps = [w.model_dump(mode="json") for w in ws]
    merged = list(coarsen([dumps[:10], dumps[10:]], n_windows=23, max_windows=5))
    assert block_size(23, 5) == 5 and len(merged) == 5
    assert [m["window"] for m in merged] == [0, 5, 10, 15, 20]
    assert sum(m["dt_ms"] for m in merged) == pytest.approx(sum(w.dt_ms for w in ws))
    assert sum(m["tokens_completed"] for m in merged) == sum(w.tokens_completed for w in ws)
    assert max(m["T_peak_logic"] for m in merged) == max(w.T_peak_logic for w in ws)
    hottest = max(ws, key=lambda w: w.T_peak_logic)
    assert any(m["temps_core_c"] == hottest.temps_core_c for m in merged)
    # the merged windows are valid windows: reducing them gives the run's time-weighted columns
    row = reduce_window_metrics([WindowMetrics.model_validate(m) for m in merged], scenario="tacs", workload="w",
                                thot_c=50.0)
    whole = reduce_window_metrics(ws, scenario="tacs", workload="w", thot_c=50.0)
    for name in ("T_peak_logic", "T_peak_dram", "T_avg", "ips", "lat_ms", "bw_util", "refresh_mhz", "noc_load",
                 "energy_j", "tokens", "migrations", "freq_avg_ghz", "queue_delay_ms"):
        assert getattr(row, name) == pytest.approx(getattr(whole, name), rel=1e-9), name
    assert merge(dumps[:1]) == dumps[0]
