"""`tasmoe capacity`: the verdict of one probe, the bisection over probes (runs replaced by a chip of known capacity)
and the command's bad inputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from services.cli import main as cli_main
from services.orchestrator.local import LocalResult
from services.orchestrator.schemas import Scenario
from services.orchestrator.slo_capacity import ProbeRun, judge, measure_slo_capacity, probe_paths, requests_offered
from shared.configs import WorkloadConfig
from shared.errors import BadInput
from tests.conftest import CONFIGS

SERVING = CONFIGS / "workload_serving.yaml"
ROW = {"tokens_offered": "100", "tokens_served": "100", "tokens_queued": "0", "tokens_shed": "0",
       "ttft_p99_ms": "500", "tpot_p99_ms": "50", "goodput_tok_s": "5", "bw_util": "0.1", "T_peak_logic": "80"}


def test_a_probe_meets_the_slo_only_when_nothing_is_shed_or_left_and_both_p99s_are_within() -> None:
    assert judge(1.0, ROW, 2000, 200).met
    for change, why in (({"tokens_shed": "3"}, "3 tokens shed"), ({"tokens_queued": "7"}, "still queued"),
                        ({"ttft_p99_ms": "2500"}, "p99 TTFT"), ({"tpot_p99_ms": "201"}, "p99 TPOT"),
                        ({"ttft_p99_ms": ""}, "p99 TTFT n/a")):
        p = judge(1.0, {**ROW, **change}, 2000, 200)
        assert not p.met and why in p.why, (change, p.why)


def _drain(wl: WorkloadConfig) -> float:
    """A stand-in for the workload service's drain that judges a probe's requests: 30 s."""
    return 30_000.0


def _chip(capacity_rps: float, seen: list[float]) -> ProbeRun:
    """A stand-in for a served run: meets the SLO below ``capacity_rps``, queues tokens above it."""

    def run(wl: WorkloadConfig, out: Path) -> LocalResult:
        assert wl.serving is not None and wl.serving.rate_rps is not None
        rate = wl.serving.rate_rps
        seen.append(rate)
        out.mkdir(parents=True, exist_ok=True)
        row = {**ROW, "tokens_queued": "0" if rate <= capacity_rps else "40"}
        path = out / "row.csv"
        with path.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(row))
            w.writeheader()
            w.writerow(row)
        return LocalResult(experiment_id="x", out_dir=out, csvs={"baseline": path}, status={"baseline": "succeeded"},
                           errors={}, windows={"baseline": 1}, wall_s=0.0, compute_s={})

    return run


def test_the_search_brackets_the_capacity_and_writes_how_it_was_found(tmp_path: Path) -> None:
    seen: list[float] = []
    res = measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path, lo_rps=0.1, hi_rps=10.0,
                               probes=9, run=_chip(1.3, seen), drain_to_judge=_drain)
    # doubling from 0.1: 0.1 .. 0.8 met, 1.6 missed; then bisection of [0.8, 1.6] (16 and 32 requests over the
    # 20 s of arrivals) with the four runs left: 23, 27, 25, 26 requests; 26 and 27 are one request apart
    assert seen[:5] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert seen[5:] == pytest.approx([1.15, 1.35, 1.25, 1.3])
    assert res.rate_rps == pytest.approx(1.3)
    assert "doubling from 0.1" in res.how and "9 runs" in res.how and "one request apart" in res.how
    saved = json.loads((tmp_path / "slo_capacity.json").read_text())
    assert saved["rate_rps"] == res.rate_rps and len(saved["probes"]) == 9
    rates = [float(r["rate_rps"]) for r in csv.DictReader((tmp_path / "slo_capacity.csv").open())]
    assert rates == sorted(rates)


@pytest.mark.parametrize(("capacity", "expect"), [(100.0, 10.0), (0.01, None)])
def test_a_rate_range_that_does_not_bracket_says_so(tmp_path: Path, capacity: float, expect: float | None) -> None:
    seen: list[float] = []
    res = measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path, lo_rps=0.1, hi_rps=10.0,
                               probes=16, run=_chip(capacity, seen), drain_to_judge=_drain)
    assert res.rate_rps == expect
    assert ("at least the highest (a bound)" in res.how) == (expect is not None)
    assert "below the lowest rate" in res.line() or expect is not None
    assert max(seen) <= 10.0


def test_a_workload_without_serving_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        measure_slo_capacity(arch="unused", workload=CONFIGS / "workload_mixtral_8x7b.yaml", tas="unused",
                             out=tmp_path, lo_rps=0.1, hi_rps=1.0, run=_chip(1.0, []), drain_to_judge=_drain)
    assert e.value.field == "workload.serving"


@pytest.mark.parametrize(("args", "says"), [(["--lo", "0"], "must be > 0"), (["--hi", "x"], "expected a number"),
                                            (["--duration-ms", "-1"], "must be > 0")])
def test_bad_arguments_exit_2_in_one_line(args: list[str], says: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["--log-level", "ERROR", "capacity", "--out", str(tmp_path), *args])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err.strip().splitlines()[-1]


def test_lo_above_hi_is_a_bad_input_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["--log-level", "ERROR", "capacity", "--out", str(tmp_path), "--lo", "5", "--hi", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lo_rps" in err[0]


def test_each_probe_has_its_own_folder_and_workload_file(tmp_path: Path) -> None:
    """Every rate's workload file is its own (the rate's decimal point is not a suffix: 2.18 and 2.28 once both
    wrote probe-2.workload.json)."""
    paths = [probe_paths(tmp_path, r) for r in (2.0, 2.181, 2.2776)]
    assert len({w for w, _ in paths}) == len({f for _, f in paths}) == 3
    for where, wl_file in paths:
        assert wl_file.parent == where.parent and wl_file.name == f"{where.name}.workload.json"


def test_every_rate_tried_is_a_whole_number_of_requests_and_none_twice(tmp_path: Path) -> None:
    """A rate offers round(rate x duration) requests; the search runs each count once and stops when the highest met
    and the lowest missed are one request apart, however many runs it was allowed."""
    seen: list[float] = []
    res = measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path, lo_rps=2.0,
                               hi_rps=2.378, probes=30, duration_ms=10_000.0, run=_chip(2.3, seen),
                               drain_to_judge=_drain)
    counts = [r * 10.0 for r in seen]
    assert counts == pytest.approx([round(c) for c in counts]) and len(set(map(round, counts))) == len(seen)
    assert res.rate_rps == pytest.approx(2.3) and 2.4 in [pytest.approx(r) for r in seen]
    assert len(seen) < 30


def test_a_range_narrower_than_one_request_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as e:
        measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path, lo_rps=2.0, hi_rps=2.04,
                             duration_ms=10_000.0, run=_chip(1.0, []), drain_to_judge=_drain)
    assert e.value.field == "hi_rps"


def test_a_set_value_reaches_every_probe_and_is_recorded(tmp_path: Path) -> None:
    from services.orchestrator.slo_capacity import _configs_with_sets
    from shared.configs import load_arch

    seen_chunks: list[int] = []
    chip = _chip(2.3, [])

    def run(wl: WorkloadConfig, out: Path) -> LocalResult:
        assert wl.serving is not None
        seen_chunks.append(wl.serving.prefill_chunk)
        return chip(wl, out)

    sets = {"workload.serving.prefill_chunk": 256}
    res = measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path, lo_rps=2.0, hi_rps=2.4,
                               duration_ms=10_000.0, run=run, sets=sets, drain_to_judge=_drain)
    assert seen_chunks and set(seen_chunks) == {256}
    assert "workload.serving.prefill_chunk = 256" in res.how
    assert json.loads((tmp_path / "slo_capacity.json").read_text())["set"] == sets
    arch, tas = _configs_with_sets(CONFIGS / "arch_hbm_on_logic.yaml", CONFIGS / "tas_params_hbm_on_logic.yaml",
                                   {"arch.geometry.cooling.h_wmk2k": 2777.8}, tmp_path / "air")
    assert arch == tmp_path / "air" / "arch.json" and tas == CONFIGS / "tas_params_hbm_on_logic.yaml"
    assert load_arch(arch).geometry.cooling.h_wmk2k == 2777.8


@pytest.mark.parametrize(("sets", "field"), [
    ({"arch.geometry.cooling.nope": 1}, "set.arch.geometry.cooling.nope"),
    ({"arch.geometry.cooling.h_wmk2k": -1}, "set.arch.geometry.cooling.h_wmk2k"),
    ({"workload.serving.rate_rps": 3}, "set.workload.serving.rate_rps"),
    ({"seed": 3}, "set.seed"),
])
def test_a_bad_set_is_a_bad_input_naming_it(tmp_path: Path, sets: dict[str, object], field: str) -> None:
    from services.orchestrator.slo_capacity import _configs_with_sets, check_sets, with_sets
    from shared.configs import load_workload

    with pytest.raises(BadInput) as e:
        check_sets(sets)
        with_sets(load_workload(SERVING), "workload", sets)
        _configs_with_sets(CONFIGS / "arch_hbm_on_logic.yaml", CONFIGS / "tas_params_hbm_on_logic.yaml", sets,
                           tmp_path)
    assert e.value.field == field


def test_a_set_reaches_a_field_the_configs_json_leaves_out_at_its_default() -> None:
    """``operators.attn.query_block`` and ``schedule.expert_stripe`` are left out of a config's JSON at their default
    (so its hash reads as before they existed); ``--set`` and a sweep's grid name them all the same."""
    from services.orchestrator.schemas import ExperimentRequest
    from services.orchestrator.service import apply_point, resolve_spec
    from services.orchestrator.slo_capacity import with_sets
    from shared.configs import load_arch, load_tas, load_workload

    wl = load_workload(SERVING)
    assert "query_block" not in wl.model_dump(mode="json")["operators"]["attn"]
    assert with_sets(wl, "workload", {"workload.operators.attn.query_block": 128}).operators.attn.query_block == 128
    arch = load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")
    assert "expert_stripe" not in arch.model_dump(mode="json")["schedule"]
    spec = resolve_spec(ExperimentRequest(arch=arch, workload=wl, tas=load_tas(CONFIGS / "tas_params.yaml")),
                        configs_dir=CONFIGS)
    point = apply_point(spec, {"arch.schedule.expert_stripe": 8, "workload.operators.attn.query_block": 64})
    assert point.arch.schedule.expert_stripe == 8 and point.workload.operators.attn.query_block == 64
    with pytest.raises(BadInput) as e:
        apply_point(spec, {"workload.operators.attn.query_blok": 64})
    assert e.value.field == "grid.workload.operators.attn.query_blok"


@pytest.mark.parametrize(("arg", "says"), [("x", "expected KEY=V1,V2"),
                                           ("arch.geometry.cooling.h_wmk2k=1,2", "one value per --set")])
def test_a_bad_set_flag_exits_2_in_one_line(arg: str, says: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["--log-level", "ERROR", "capacity", "--out", str(tmp_path), "--set", arg])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err.strip().splitlines()[-1]


def _run_local_writing_what_a_run_leaves(capacity_rps: float, ran: list[float]) -> Any:
    """A stand-in for `run_local` that leaves what a finished run does: its result row at `result_csv_path` and the
    ``config`` line of its run log (the resolved spec, the unthrottled chip for ``unthrottled``)."""
    from services.orchestrator.local import local_spec
    from services.orchestrator.run_files import result_csv_path
    from shared.configs.arch import unthrottled

    def fake(*, arch: Path, workload: Path, tas: Path, out: Path, scenarios: list[Scenario], **_: Any) -> LocalResult:
        spec = local_spec(arch=arch, workload=workload, tas=tas, scenarios=scenarios, traces=False)
        if scenarios == ["unthrottled"]:
            spec = spec.model_copy(update={"arch": unthrottled(spec.arch)})
        assert spec.workload.serving is not None and spec.workload.serving.rate_rps is not None
        rate = spec.workload.serving.rate_rps
        ran.append(rate)
        log = out / "runs" / scenarios[0] / "run.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"2026-01-01 INFO tasmoe.runfile run=x config {json.dumps(spec.model_dump(mode='json'))}\n",
                       encoding="utf-8")
        path = result_csv_path(out, scenarios[0], spec.workload.label)
        path.parent.mkdir(parents=True, exist_ok=True)
        row = {**ROW, "tokens_queued": "0" if rate <= capacity_rps else "40"}
        with path.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(row))
            w.writeheader()
            w.writerow(row)
        return LocalResult(experiment_id="x", out_dir=out, csvs={scenarios[0]: path},
                           status={scenarios[0]: "succeeded"}, errors={}, windows={scenarios[0]: 1}, wall_s=0.0,
                           compute_s={})

    return fake


def _real_configs(out: Path) -> dict[str, Any]:
    """A search of the hot chip's configs between 2 and 2.4 requests/s over 10 s of arrivals, into ``out``."""
    return {"arch": CONFIGS / "arch_hbm_on_logic.yaml", "workload": SERVING,
            "tas": CONFIGS / "tas_params_hbm_on_logic.yaml", "out": out, "lo_rps": 2.0, "hi_rps": 2.4,
            "duration_ms": 10_000.0}


@pytest.mark.parametrize("scenario", ["baseline", "unthrottled"])
def test_a_search_run_again_reads_the_probes_it_finished_and_runs_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str) -> None:
    """An interrupted search (the terminal gone, a machine needed) run again into the same folder does not run again
    the probes it finished; an unfinished probe's leftovers are removed and it runs from the start."""
    import services.orchestrator.slo_capacity as sc

    ran: list[float] = []
    monkeypatch.setattr(sc, "run_local", _run_local_writing_what_a_run_leaves(2.3, ran))
    kw = {**_real_configs(tmp_path), "scenario": scenario}
    first = measure_slo_capacity(probes=2, **kw)
    assert len(ran) == 2 and first.rate_rps == pytest.approx(2.0)
    unfinished, _ = probe_paths(tmp_path, 2.2)  # the next probe the search will run, killed mid-run
    (unfinished / "runs" / scenario).mkdir(parents=True)
    (tmp_path / f"{unfinished.name}.sqlite3").write_text("half a run", encoding="utf-8")
    again = measure_slo_capacity(probes=8, **kw)
    assert [round(r, 6) for r in ran] == [2.0, 2.4, 2.2, 2.3]  # the first two not again; 2.2 from its start
    assert [p.rate_rps for p in again.probes[:2]] == [p.rate_rps for p in first.probes]
    assert again.rate_rps == pytest.approx(2.3) and [p.met for p in again.probes] == [True, False, True, True]
    assert not (tmp_path / f"{unfinished.name}.sqlite3").exists()  # (its runs folder too: the stand-in makes it anew)


def test_a_finished_probe_of_other_configs_is_refused_naming_out(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The same folder searched again on another chip: its finished probes are not this search's, and are not read as
    if they were."""
    import services.orchestrator.slo_capacity as sc

    ran: list[float] = []
    monkeypatch.setattr(sc, "run_local", _run_local_writing_what_a_run_leaves(2.3, ran))
    kw = {**_real_configs(tmp_path), "probes": 2}
    measure_slo_capacity(**kw)
    with pytest.raises(BadInput) as e:
        measure_slo_capacity(**kw, sets={"arch.geometry.cooling.h_wmk2k": 2777.8})
    assert e.value.field == "out" and "other configs" in str(e.value)
    assert len(ran) == 2


def test_a_probe_that_differs_only_in_its_drain_is_refused_saying_how_to_resume_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search drained 10 s, resumed without --drain-ms (so drained until its requests are judged): the refusal
    says that only the drain differs, and the flag that resumes it."""
    import services.orchestrator.slo_capacity as sc

    ran: list[float] = []
    monkeypatch.setattr(sc, "run_local", _run_local_writing_what_a_run_leaves(2.3, ran))
    kw = {**_real_configs(tmp_path), "probes": 2}
    measure_slo_capacity(**kw, drain_ms=10_000.0)
    with pytest.raises(BadInput) as e:
        measure_slo_capacity(**kw, drain_to_judge=lambda wl: 32_000.0)
    assert e.value.field == "out" and "only its drain differs, 10 s against this search's 32 s" in str(e.value)
    assert "--drain-ms 10000 resumes it" in str(e.value) and len(ran) == 2
    measure_slo_capacity(**kw, drain_ms=10_000.0)  # resumed as said: nothing runs again
    assert len(ran) == 2


def test_a_judged_drain_search_resumed_with_a_fixed_drain_is_told_to_drop_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other way round: probes drained until their requests were judged, resumed with --drain-ms: the refusal
    says that resuming without --drain-ms reads them."""
    import services.orchestrator.slo_capacity as sc

    ran: list[float] = []
    monkeypatch.setattr(sc, "run_local", _run_local_writing_what_a_run_leaves(2.3, ran))
    kw = {**_real_configs(tmp_path), "probes": 2, "drain_to_judge": lambda wl: 32_000.0}
    measure_slo_capacity(**kw)
    with pytest.raises(BadInput) as e:
        measure_slo_capacity(**kw, drain_ms=10_000.0)
    assert "only its drain differs, 32 s against this search's 10 s" in str(e.value)
    assert "without --drain-ms" in str(e.value) and len(ran) == 2


def test_a_search_of_another_scenario_into_the_same_folder_is_refused_and_removes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe folder holding another scenario's finished run is not this search's: refused naming out, and kept."""
    import services.orchestrator.slo_capacity as sc

    ran: list[float] = []
    monkeypatch.setattr(sc, "run_local", _run_local_writing_what_a_run_leaves(2.3, ran))
    kw = {**_real_configs(tmp_path), "probes": 2}
    measure_slo_capacity(**kw)
    kept = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(BadInput) as e:
        measure_slo_capacity(**kw, scenario="unthrottled")
    assert e.value.field == "out" and "runs/baseline" not in str(e.value) and "baseline" in str(e.value)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == kept and len(ran) == 2


def _chip_seeing_drains(capacity_rps: float, drains: list[float]) -> ProbeRun:
    chip = _chip(capacity_rps, [])

    def run(wl: WorkloadConfig, out: Path) -> LocalResult:
        assert wl.serving is not None
        drains.append(wl.serving.drain_ms)
        return chip(wl, out)

    return run


def test_each_probe_drains_until_its_requests_are_judged_unless_a_drain_is_given(tmp_path: Path) -> None:
    """Without --drain-ms a probe runs the drain after which every request it offers is judged (here a stand-in:
    1 s per request offered); the probes and the verdict say so."""
    drains: list[float] = []
    res = measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path / "auto", lo_rps=2.0,
                               hi_rps=2.4, duration_ms=10_000.0, run=_chip_seeing_drains(2.3, drains),
                               drain_to_judge=lambda wl: 1e3 * requests_offered(wl.serving.rate_rps, 10_000.0)
                               if wl.serving and wl.serving.rate_rps else 0.0)
    assert drains == [1e3 * round(p.rate_rps * 10) for p in res.probes]
    assert all(p.drain_ms == p.drain_needed_ms for p in res.probes) and res.drain_ms is None
    assert "the drain that judges every request it offers" in res.how and "20 to 24 s" in res.how
    assert not any("short of" in p.why for p in res.probes) and "(a bound)" not in res.how
    saved = json.loads((tmp_path / "auto" / "slo_capacity.json").read_text())
    assert [p["drain_ms"] for p in saved["probes"]] == drains

    drains.clear()
    given = measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path / "given", lo_rps=2.0,
                                 hi_rps=2.4, duration_ms=10_000.0, drain_ms=5_000.0,
                                 run=_chip_seeing_drains(2.3, drains), drain_to_judge=_drain)
    assert set(drains) == {5_000.0} and "5 s of drain" in given.how


def test_a_miss_on_tokens_queued_after_a_drain_too_short_to_judge_says_the_drain_may_be_why(tmp_path: Path) -> None:
    """A drain given shorter than the one that judges the requests: a probe missed on tokens still queued may have
    met the SLO with a longer one, so its reason says so and the capacity found is a bound."""
    res = measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path, lo_rps=2.0, hi_rps=2.4,
                               duration_ms=10_000.0, drain_ms=10_000.0, run=_chip(2.3, []), drain_to_judge=_drain)
    missed = [p for p in res.probes if not p.met]
    assert missed and all("short of the 30 s that judges its requests" in p.why for p in missed)
    assert all(p.drain_short for p in missed) and not any(p.drain_short for p in res.probes if p.met)
    assert "perhaps the drain's miss" in res.how and "(a bound)" in res.how
    long_enough = measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path / "long",
                                       lo_rps=2.0, hi_rps=2.4, duration_ms=10_000.0, drain_ms=30_000.0,
                                       run=_chip(2.3, []), drain_to_judge=_drain)
    assert not any(p.drain_short for p in long_enough.probes) and "perhaps" not in long_enough.how
    p = judge(1.0, {**ROW, "ttft_p99_ms": "2500"}, 2000, 200, drain_ms=1.0, drain_needed_ms=2.0)
    assert not p.drain_short and "short of" not in p.why  # nothing queued: the drain is not why


def test_the_drain_to_judge_is_the_workload_services_for_the_probes_requests() -> None:
    """The search asks the workload service (its trace summary) for the drain, and it is shared/slo.py's rule over
    the requests the probe's workload offers."""
    from services.orchestrator.local import drain_to_judge_ms
    from services.workload.arrivals import offered_requests
    from shared.configs import load_workload
    from shared.slo import drain_to_judge_ms as rule

    wl = load_workload(SERVING)
    assert wl.serving is not None
    for rate in (0.5, 2.3):
        probe = wl.model_copy(update={"serving": wl.serving.model_copy(update={"rate_rps": rate})})
        assert probe.serving is not None
        off = offered_requests(probe.serving)
        want = rule(off.t_arrival_ns, off.output_tokens, off.duration_ns, slo_ttft_ms=2000.0, slo_tpot_ms=200.0)
        assert drain_to_judge_ms(probe) == want > 0


def test_a_miss_that_shed_tokens_is_not_the_drains_and_nothing_met_claims_no_bound(tmp_path: Path) -> None:
    """A shed request is lost whatever the drain: such a miss is decided. A search that met nothing says it was
    perhaps the drain, and claims no capacity."""
    p = judge(1.0, {**ROW, "tokens_shed": "5", "tokens_queued": "7"}, 2000, 200, drain_ms=1.0, drain_needed_ms=2.0)
    assert not p.met and not p.drain_short and "short of" not in p.why
    res = measure_slo_capacity(arch="unused", workload=SERVING, tas="unused", out=tmp_path, lo_rps=2.0, hi_rps=2.4,
                               duration_ms=10_000.0, drain_ms=10_000.0, run=_chip(1.0, []), drain_to_judge=_drain)
    assert res.rate_rps is None and "perhaps the drain's miss" in res.how and "(a bound)" not in res.how


def test_a_judged_drain_out_of_the_configs_bounds_is_a_bad_input_saying_to_give_one(tmp_path: Path) -> None:
    """A trace whose answers would take longer to judge than the serving config allows a drain (1e7 ms): the
    search stops before running, naming drain_ms, and says --drain-ms sets one."""
    with pytest.raises(BadInput) as e:
        measure_slo_capacity(**{**_real_configs(tmp_path), "probes": 2}, drain_to_judge=lambda wl: 2e7,
                             run=_chip(2.3, []))
    assert e.value.field == "drain_ms" and "judges every request" in str(e.value) and "--drain-ms" in str(e.value)
