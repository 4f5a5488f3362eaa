"""docs/sweep.md's prefill-chunk table is its committed sweep.csv (docs/results/sweep-chunk/), and the findings it
states in words hold there: a re-run that changes them fails here until the page is rewritten."""

from __future__ import annotations

import csv

from tests.conftest import REPO

DOCS = REPO / "docs"


def _rows() -> dict[tuple[int, str], dict[str, str]]:
    with (DOCS / "results" / "sweep-chunk" / "sweep.csv").open(encoding="utf-8") as fh:
        return {(int(r["param:workload.serving.prefill_chunk"]), r["scenario"]): r for r in csv.DictReader(fh)}


def test_the_table_is_the_committed_sweep() -> None:
    rows = _rows()
    page = (DOCS / "sweep.md").read_text(encoding="utf-8")
    for chunk in (2048, 256):
        base, ref = rows[(chunk, "baseline")], rows[(chunk, "unthrottled")]
        b, u = float(base["ips"]), float(ref["ips"])
        line = (f"| {chunk} | {b:.1f} | {u:.1f} | {100 * (1 - b / u):.1f} % | {float(base['bw_util']):.2f} | "
                f"{float(base['power_avg_w']):.0f} |")
        assert line in page, line


def test_the_findings_hold_in_the_committed_sweep() -> None:
    rows = _rows()
    f = float
    for sc in ("baseline", "unthrottled"):  # "more than twice the output tokens per second"
        assert f(rows[(256, sc)]["ips"]) > 2 * f(rows[(2048, sc)]["ips"]), sc
    assert f(rows[(256, "baseline")]["bw_util"]) > f(rows[(2048, "baseline")]["bw_util"])

    def loss(chunk: int) -> float:
        return 1 - f(rows[(chunk, "baseline")]["ips"]) / f(rows[(chunk, "unthrottled")]["ips"])

    assert 0 < loss(256) < loss(2048)  # "shrinks but does not vanish"
    base = rows[(256, "baseline")]
    assert f(base["time_throttled_ms"]) > 0.5 * f(base["sim_time_ms"])  # "throttled for most of the run"
    assert f(base["power_avg_w"]) > f(rows[(2048, "baseline")]["power_avg_w"])
    assert all(int(f(r["requests_done"])) == 0 for r in rows.values())  # "no request finished in these 3 s"
