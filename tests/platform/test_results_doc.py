"""docs/results.md is what scripts/render_results.py renders from the committed summary files: a number edited by
hand on the page, or a summary file changed without rendering the page again, fails here (``make docs`` renders
it again). Also: every figure the page links is committed, the template types no measured number, an experiment
without files renders as a note, and a results folder that ran other configs is refused."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from scripts import render_results as rr
from tests.conftest import REPO

DOCS = REPO / "docs"


def test_committed_page_is_what_the_committed_files_render() -> None:
    assert (DOCS / rr.PAGE).read_text(encoding="utf-8") == rr.render(DOCS), \
        "docs/results.md differs from what its template and docs/results/ render: run `make docs`"


def test_every_linked_figure_is_committed() -> None:
    page = (DOCS / rr.PAGE).read_text(encoding="utf-8")
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", page)
    assert links
    assert all((DOCS / link).is_file() for link in links), links


def test_the_template_types_no_measured_number() -> None:
    """Prose interprets numbers through placeholders only: no value with a unit of the results is typed."""
    text = rr.PLACEHOLDER.sub("", (DOCS / rr.TEMPLATE).read_text(encoding="utf-8"))
    typed = re.findall(r"\d+(?:\.\d+)?\s*(?:%|°C|ms\b|s\b|W\b|J\b|mJ|GHz|tok)", text)
    assert not typed, typed


def _copy_docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copyfile(DOCS / rr.TEMPLATE, docs / rr.TEMPLATE)
    shutil.copytree(DOCS / rr.DATA, docs / rr.DATA)
    shutil.copytree(DOCS / rr.FIGURES, docs / rr.FIGURES)
    return docs


def test_a_changed_number_changes_the_page(tmp_path: Path) -> None:
    docs = _copy_docs(tmp_path)
    name = next(p.name for p in sorted((docs / rr.DATA).iterdir()) if (p / "summary.csv").is_file())
    summary = docs / rr.DATA / name / "summary.csv"
    rows = rr.read_rows(summary)
    before = rr.render(docs)
    peak = float(rows[0]["T_peak_logic"])
    summary.write_text(summary.read_text(encoding="utf-8").replace(rows[0]["T_peak_logic"], str(peak + 7.25), 1),
                       encoding="utf-8")
    after = rr.render(docs)
    assert after != before and f"{peak + 7.25:.1f}" in after


def test_an_experiment_without_files_is_a_note(tmp_path: Path) -> None:
    docs = _copy_docs(tmp_path)
    shutil.rmtree(docs / rr.DATA)
    page = rr.render(docs)
    assert "Not rendered yet: run `make quick`, then `make docs`." in page
    assert "| scenario |" not in page and "{{" not in page


def test_unknown_placeholder_is_an_error(tmp_path: Path) -> None:
    docs = _copy_docs(tmp_path)
    tpl = docs / rr.TEMPLATE
    tpl.write_text(tpl.read_text(encoding="utf-8").replace("{{thermal_table}}", "{{thermal_tabel}}"),
                   encoding="utf-8")
    with pytest.raises(rr.DocsError, match="unknown placeholder"):
        rr.render(docs)


def _results_folder(tmp_path: Path, config: dict[str, object]) -> Path:
    """A results folder for the quick experiment, made of the committed summary files and a run log."""
    out = tmp_path / "results" / "quick"
    (out / "runs" / "baseline").mkdir(parents=True)
    for f in ("summary.csv", "comparison.md"):
        shutil.copyfile(DOCS / rr.DATA / "quick" / f, out / f)
    (out / "runs" / "baseline" / "run.log").write_text(
        "2000-01-01 00:00:00,000 INFO tasmoe.runfile run=x seed 42\n"
        f"2000-01-01 00:00:00,000 INFO tasmoe.runfile run=x config {json.dumps(config)}\n", encoding="utf-8")
    return out


def _quick_config() -> dict[str, object]:
    from services.orchestrator.default_experiment import QUICK
    from services.orchestrator.local import with_warmup
    from shared.configs import load_arch, load_tas

    assert QUICK.warmup_ms is not None
    return {"arch": with_warmup(load_arch(REPO / QUICK.arch), QUICK.warmup_ms).model_dump(mode="json"),
            "tas": load_tas(REPO / QUICK.tas).model_dump(mode="json"),
            "workload": QUICK.workload_config(REPO / QUICK.workload).model_dump(mode="json"),
            "scenarios": list(QUICK.scenarios), "seed": 42}


def test_collect_copies_the_summary_files_and_checks_the_configs(tmp_path: Path) -> None:
    config = _quick_config()
    _results_folder(tmp_path, config)
    docs = tmp_path / "docs"
    said: list[str] = []
    assert rr.collect("quick", results_root=tmp_path, docs=docs, say=said.append)
    for f in ("summary.csv", "comparison.md"):
        assert (docs / rr.DATA / "quick" / f).read_bytes() == (DOCS / rr.DATA / "quick" / f).read_bytes()
    facts = json.loads((docs / rr.DATA / "quick" / "experiment.json").read_text(encoding="utf-8"))
    assert facts == json.loads((DOCS / rr.DATA / "quick" / "experiment.json").read_text(encoding="utf-8"))
    assert not rr.collect("default", results_root=tmp_path, docs=docs, say=said.append)  # no folder: a note
    assert "default: no " in said[-1] and "make run" in said[-1]

    wl = config["workload"]
    assert isinstance(wl, dict)
    wl["serving"]["duration_ms"] = 5000.0  # a run with other arrivals is not the quick experiment
    shutil.rmtree(tmp_path / "results")
    _results_folder(tmp_path, config)
    with pytest.raises(rr.DocsError, match="ran other workload settings"):
        rr.collect("quick", results_root=tmp_path, docs=docs, say=said.append)


def _summary(experiment: str) -> dict[str, dict[str, str]]:
    import csv

    with (DOCS / rr.DATA / experiment / "summary.csv").open(encoding="utf-8") as fh:
        return {r["scenario"]: r for r in csv.DictReader(fh)}


def test_the_findings_the_template_states_hold_in_the_committed_data() -> None:
    """The prose of docs/results.template.md states findings in words; they must hold for the committed results, so
    that a re-run that changes them fails here until the prose is rewritten."""
    text = (DOCS / "results.template.md").read_text(encoding="utf-8")
    default, flat = _summary("default"), _summary("flatout")
    f = float
    if "**TACS did not act** in this run" in text:  # the default experiment
        for k in ("T_peak_logic", "T_peak_dram", "ips", "energy_j", "time_above_thot_ms"):
            assert default["tacs"][k] == default["baseline"][k], k
    if "**TAPS** lowers the logic peak, the time above Thot and the energy per token, but its hottest core" in text:
        taps, base = default["taps"], default["baseline"]
        for k in ("T_peak_logic", "time_above_thot_ms", "energy_j"):
            assert f(taps[k]) < f(base[k]), k
        assert f(base["time_throttled_ms"]) < f(taps["time_throttled_ms"]) < 100  # "tens of milliseconds"
        assert f(taps["ttft_p99_ms"]) > f(base["ttft_p99_ms"])
        assert f(default["taps"]["requests_done"]) < 50  # "a couple of dozen requests"
    if "throttling costs no goodput in this run" in text:
        assert f(default["baseline"]["goodput_tok_s"]) >= f(default["unthrottled"]["goodput_tok_s"])
    if "**TAPS serves what baseline serves** (within one per cent) with less time above Thot and less throttling" \
            in text:
        base = flat["baseline"]
        assert abs(f(flat["taps"]["ips"]) - f(base["ips"])) <= 0.01 * f(base["ips"])
        assert f(flat["taps"]["time_above_thot_ms"]) < f(base["time_above_thot_ms"])
        assert f(flat["taps"]["time_throttled_ms"]) < f(base["time_throttled_ms"])
    if "**TACS serves less than baseline flat out, and so does tas**" in text:
        for sc in ("tacs", "tas"):
            assert f(flat[sc]["ips"]) < f(flat["baseline"]["ips"]) < f(flat["unthrottled"]["ips"]), sc
    _capacity_findings(text)
    if "**No placement keeps this chip at its top clock flat out.**" in text:
        bound = json.loads((DOCS / rr.DATA / "flatout" / "spread_bound.json").read_text(encoding="utf-8"))
        assert bound["best_peak_c"] > bound["under_c"] and bound["max_share"] is not None and bound["max_share"] < 1
    if "**Space is not where the heat is.**" in text:
        bound = json.loads((DOCS / rr.DATA / "flatout" / "spread_bound.json").read_text(encoding="utf-8"))
        gap_space = bound["run_mean_field_peak_c"] - bound["best_peak_c"]
        assert 0 <= gap_space < bound["run_hottest_p90_c"] - bound["run_mean_field_peak_c"]
        assert bound["run_share_at_or_above"] >= 0.5  # "much of the run above the trip"
        assert 1.5 <= bound["run_power_max_w"] / bound["run_power_mean_w"] <= 2.5  # "about twice its mean"



def test_the_readme_says_which_scenario_loses_more_than_one_per_cent_and_it_does() -> None:
    """The acceptance's rule: a scenario that loses more than 1 % throughput at the limit against baseline is named in
    the README with the reason; the committed flat-out data must bear the README out, and every such scenario is
    named."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    flat = _summary("flatout")
    base = float(flat["baseline"]["ips"])
    losers = {sc for sc, row in flat.items() if sc != "unthrottled" and float(row["ips"]) < 0.99 * base}
    if "Flat out, TACS and tas serve more than 1 % less than baseline" in readme:
        assert losers == {"tacs", "tas"}
    else:
        assert not losers, losers


def _capacity_findings(text: str) -> None:
    """The default experiment's SLO-capacity prose (docs/results/default/capacity.json)."""
    path = DOCS / rr.DATA / "default" / "capacity.json"
    if "SLO capacity" not in text:
        return
    found = json.loads(path.read_text(encoding="utf-8"))["scenarios"]
    facts = json.loads((DOCS / rr.DATA / "default" / "experiment.json").read_text(encoding="utf-8"))
    if "it is the SLO capacity of the same chip without its thermal limit" in text:  # "The load."
        assert facts["serving"]["rate_rps"] == found["unthrottled"]["rate_rps"]
    if "**Heat costs no capacity at the SLO on this chip, to one request**" in text:
        assert set(found) == set(_summary("default"))  # "every scenario"
        brackets = {(v["rate_rps"], v["first_missed_rps"]) for v in found.values()}
        assert len(brackets) == 1
        (met, missed), = brackets
        assert met is not None and missed is not None and round((missed - met) * 10) == 1  # one request in 10 s
    if "**What binds one request above is the queue, not heat**" in text:
        slo = facts["serving"]["slo"]
        for sc, v in found.items():
            over = [p for p in v["probes"] if p["rate_rps"] == v["first_missed_rps"]]
            assert len(over) == 1 and "p99 TTFT" in over[0]["why"] and "TPOT" not in over[0]["why"], sc
            assert over[0]["tpot_p99_ms"] <= slo["tpot_p99_ms"], sc
    if "**A small sample**: over these arrivals a probe offers a couple of dozen requests" in text:
        for sc, v in found.items():
            assert 15 <= v["best"]["requests"] <= 40 and v["duration_ms"] == 10_000.0, sc
