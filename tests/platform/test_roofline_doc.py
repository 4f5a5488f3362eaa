"""docs/chip_hbm_on_logic.md's DRAM-roofline measurement holds in its committed run (docs/results/roofline/): the
roofline is the formula on the hot chip's vaults and the bytes of one micro-batch, and every number of the prose is
the summary's. A re-run that changes them fails here until the page is rewritten."""

from __future__ import annotations

import csv
import json

from shared.chip import vault_bw_raw_gbps
from shared.configs import load_arch, load_workload
from tests.conftest import CONFIGS, REPO

DATA = REPO / "docs" / "results" / "roofline"


def _page() -> str:
    """The page with its line breaks and indents as single spaces (the prose's sentences wrap)."""
    return " ".join((REPO / "docs" / "chip_hbm_on_logic.md").read_text(encoding="utf-8").split())


def _rows() -> dict[str, dict[str, str]]:
    with (DATA / "summary.csv").open(encoding="utf-8") as fh:
        return {r["scenario"]: r for r in csv.DictReader(fh)}


def test_the_roofline_workload_is_the_saturated_one_run_longer() -> None:
    mine = load_workload(DATA / "workload_roofline.yaml")
    saturated = load_workload(CONFIGS / "workload_mixtral_8x7b_saturated.yaml")
    assert mine.sequence.steps == 3000 and mine.sequence.step_interval_ms == 1.0  # "every 1 ms for 3 s"
    assert mine.sequence.micro_batch == 32 and mine.sequence.tokens == 2048  # "32 tokens at a 2048-token context"
    assert mine.model_copy(update={"name": saturated.name, "sequence": saturated.sequence}) == saturated
    offered = mine.sequence.micro_batch / (mine.sequence.step_interval_ms * 1e-3)
    cap = json.loads((DATA / "capacity.json").read_text(encoding="utf-8"))
    assert cap["offered_tok_s"] == offered and 15 < offered / cap["roofline_tok_s"] < 25  # "~20x the roofline"


def test_the_roofline_findings_hold_in_the_committed_run() -> None:
    arch, page, rows = load_arch(CONFIGS / "arch_hbm_on_logic.yaml"), _page(), _rows()
    cap = json.loads((DATA / "capacity.json").read_text(encoding="utf-8"))
    bw_raw = vault_bw_raw_gbps(arch)  # GB/s
    assert cap["roofline_tok_s"] == cap["capacity_tok_s"]  # the roofline binds, not the overlap bound
    assert abs(cap["roofline_tok_s"] - 32 * bw_raw * 1e9 / cap["bytes_mb"]) < 1e-6 * cap["roofline_tok_s"]
    assert f"**The roofline is {cap['roofline_tok_s']:.1f} tok/s**: one micro-batch moves " \
           f"{cap['bytes_mb'] / 1e9:.2f} GB" in page
    assert f"against {bw_raw:.1f} GB/s of vault bandwidth" in page
    b, u = rows["baseline"], rows["unthrottled"]
    assert {k: v for k, v in b.items() if k != "scenario"} == {k: v for k, v in u.items() if k != "scenario"}
    served = float(b["ips"])
    assert f"**Served: {served:.1f} tok/s, {100 * served / cap['roofline_tok_s']:.0f} % of it**" in page
    assert f"over the {float(b['sim_time_ms']) / 1000:g} s after the thermal warm-up" in page
    assert f"the vaults moved {100 * float(b['bw_util_raw']):.1f} % of what they could" in page
    refresh = arch.refresh.trfc_ns / (arch.refresh.tref_base_us * 1e3)  # below 85 degC: multiplier 1
    assert float(b["T_peak_dram"]) <= arch.refresh.tref_curve[0][0]
    left = float(b["bw_util_raw"]) / float(b["bw_util"])  # the bandwidth refresh leaves, of the raw
    assert abs(left - (1 - refresh)) < 1e-6
    assert f"**Refresh takes {100 * refresh:.1f} % of the vaults' time**" in page
    assert f"no schedule passes {100 * (1 - refresh):.1f} % of this roofline" in page
    assert f"the chip used {100 * float(b['bw_util']):.1f} % (`bw_util`)" in page
    assert (f"({100 * served / cap['roofline_tok_s']:.0f} % of the tokens, {100 * float(b['bw_util_raw']):.1f} % of "
            "the bytes)") in page
    assert (f"the tokens reach {100 * served / (cap['roofline_tok_s'] * left):.1f} % and the bytes "
            f"{100 * float(b['bw_util']):.1f} %") in page
    trip = arch.dvfs.domains[0].trip_c[0]
    assert float(b["T_peak_logic"]) < trip and float(b["time_throttled_ms"]) == 0.0
    assert float(b["freq_avg_ghz"]) == arch.dvfs.domains[0].steps_ghz[0]
    assert (f"the logic die peaks at {float(b['T_peak_logic']):.2f} °C, below the first DVFS trip ({trip:g} °C)"
            in page)
    assert f"({float(b['power_avg_w']):.1f} W mean)" in page
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert (f"decode at a batch of 32 serves {100 * served / cap['roofline_tok_s']:.0f} % of the chip's "
            f"DRAM-bandwidth roofline; refresh takes {100 * refresh:.1f} % of the vaults' time") in readme
