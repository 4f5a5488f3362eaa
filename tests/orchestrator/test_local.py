"""Embedded runs as the scripts do them: four scenarios -> four CSVs; bad config -> one line, exit 2."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from scripts.run_all import main as run_all_main
from services.cli import main as cli_main
from services.orchestrator import jobs
from services.orchestrator.capacity import Capacity
from services.orchestrator.local import (
    LocalResult,
    default_mapping_notes,
    roofline_line,
    run_local,
    short_drain_note,
)
from services.orchestrator.settings import OrchestratorSettings
from services.placement.default import default_placement
from shared.client import ServiceClients
from shared.configs import load_arch, load_workload
from shared.contracts.placement import PlacementMeta
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator import fakes


def test_run_local_four_scenarios_four_csvs(settings: Settings, tmp_path: Path) -> None:
    clients = ServiceClients(settings, asgi_apps=fakes.build_apps(settings))
    res = run_local(arch=CONFIGS / "arch_8x8_32x32x8.yaml", workload=CONFIGS / "workload_mixtral_8x7b.yaml",
                    tas=CONFIGS / "tas_params.yaml", out=tmp_path / "mix", windows=4, settings=settings,
                    clients=clients, database_url=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    clients.close()
    assert res.ok, res.errors
    assert sorted(res.csvs) == ["baseline", "tacs", "taps", "tas"]
    for sc, path in res.csvs.items():
        assert path == tmp_path / "mix" / sc / "mixtral-8x7b.csv"
        lines = path.read_text().splitlines()
        assert len(lines) == 2 and lines[1].startswith(f"{sc},mixtral-8x7b,")
    assert res.windows == {sc: 4 for sc in res.csvs}
    assert (tmp_path / "mix" / "summary.csv").read_text().count("\n") == 5


def test_run_all_bad_config_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "arch.yaml"
    bad.write_text("mesh: {cores: [0, 8]}\n")
    rc = run_all_main(["--arch", str(bad), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "mesh.cores[0]" in err[0]
    rc = cli_main(["run", "--workload", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "file not found" in err[0]


def _files(root: Path) -> dict[str, bytes]:
    """Every file a run wrote under ``root`` except run.log (timings, pids, versions)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run.log"}


@pytest.mark.parametrize("method", ["default", "spawn"])
def test_process_pool_writes_the_same_bytes_as_the_thread_pool(tmp_path: Path, method: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`TASMOE_POOL=process` (worker processes, each with its own in-process services and database engine) and
    `TASMOE_POOL=thread` write byte-identical run files (ARCHITECTURE §6), whichever start method the pool uses."""
    if method == "spawn":
        monkeypatch.setattr(jobs, "start_method", lambda: "spawn")
    files = {}
    for pool in ("thread", "process"):
        d = tmp_path / pool
        s = OrchestratorSettings(results_dir=d / "results", configs_dir=CONFIGS, pool=pool)
        res = run_local(arch=CONFIGS / "arch_8x8_32x32x8.yaml", workload=CONFIGS / "workload_mixtral_8x7b.yaml",
                        tas=CONFIGS / "tas_params.yaml", out=d / "out", windows=6, settings=s, events=True,
                        apps="tests.orchestrator.fakes:build_apps", database_url=f"sqlite:///{d / 'db.sqlite3'}")
        assert res.ok, res.errors
        assert res.windows == {sc: 6 for sc in ("baseline", "taps", "tacs", "tas")}
        files[pool] = _files(d / "out")
    assert "runs/tas/traces/physical/compute_events.csv.gz" in files["thread"]
    assert "traces/logical_compute.csv.gz" in files["thread"] and "runs/tas/traces/logical_compute.csv" not in files[
        "thread"]  # one copy of the logical trace, by the first scenario
    assert "summary.csv" in files["thread"]
    assert files["process"].keys() == files["thread"].keys()
    assert [k for k in files["thread"] if files["process"][k] != files["thread"][k]] == []


def test_quick_run_prints_a_five_row_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`tasmoe run --quick`: the default experiment cut short on the real services, its five scenarios in a table
    with completed tokens and the throttling line; a bad combination of options is a usage error."""
    monkeypatch.setenv("TASMOE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("TASMOE_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert cli_main(["run", "--quick", "--out", str(tmp_path / "quick"), "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next((i for i, line in enumerate(out) if line.startswith("scenario ")), None)
    assert head is not None, out
    rows = [line.split() for line in out[head + 1:head + 6]]
    assert [r[0] for r in rows] == ["baseline", "taps", "tacs", "tas", "unthrottled"]
    assert all(int(r[6]) > 0 and float(r[3]) > 0 for r in rows)  # tokens completed, throughput
    assert any(line.startswith("Throttling (") for line in out)
    assert (tmp_path / "quick" / "baseline" / "mixtral-8x7b.series.csv.gz").is_file()
    assert cli_main(["run", "--quick", "--workload", "configs/workload_mixtral_8x7b.yaml"]) == 2
    assert cli_main(["run", "--quick", "--experiment", "reference"]) == 2


def test_a_run_shorter_than_a_micro_batch_says_why_no_token_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TASMOE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("TASMOE_DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite3'}")
    assert cli_main(["--log-level", "ERROR", "run", "--experiment", "reference", "--windows", "2", "--scenarios",
                     "baseline", "--quiet", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "note: no token completed: the run (6 ms simulated) is shorter than one micro-batch" in out
    assert "DRAM roofline" in out and "served of the DRAM roofline" in out and "baseline 0 %" in out


def test_a_run_that_ends_before_its_requests_are_judged_says_so() -> None:
    """The default workload (10 s of arrivals at 2.3 requests/s: its requests are judged 33.3 s after the arrivals)
    cut to 20 s: a scenario left with tokens queued, none shed, is named; one that shed tokens (a miss whatever the
    drain), one that ran until every request was judged, or a workload that is not served are not."""
    wl = load_workload(CONFIGS / "workload_serving.yaml")
    row = {"scenario": "baseline", "tokens_queued": "38", "tokens_shed": "0", "sim_time_ms": "20000"}
    note = short_drain_note(wl, [row, {**row, "scenario": "taps", "tokens_shed": "5"}])
    assert note is not None and note.startswith("note: baseline ended with tokens still queued after 20 s")
    assert "10 s of arrivals and 33.3 s of drain; workload.serving.drain_ms is 10 s" in note and "taps" not in note
    both = short_drain_note(wl, [row, {**row, "scenario": "taps"}])
    assert both is not None and both.startswith("note: every scenario ended with tokens still queued")
    assert short_drain_note(wl, [{**row, "sim_time_ms": "43400"}]) is None
    assert short_drain_note(wl, [{**row, "tokens_queued": "0"}]) is None
    assert short_drain_note(load_workload(CONFIGS / "workload_mixtral_8x7b.yaml"), [row]) is None


def test_a_drain_the_workload_service_cannot_compute_leaves_a_note_not_a_crash(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    import services.orchestrator.local as local
    from shared.errors import BadInput

    def refuse(*_: object, **__: object) -> float:
        raise BadInput("workload: too many windows", field="workload")

    monkeypatch.setattr(local, "drain_to_judge_ms", refuse)
    row = {"scenario": "baseline", "tokens_queued": "38", "tokens_shed": "0", "sim_time_ms": "20000"}
    note = short_drain_note(load_workload(CONFIGS / "workload_serving.yaml"), [row])
    assert note is not None and "unknown (workload: too many windows)" in note


def test_the_roofline_line_gives_each_scenarios_share() -> None:
    cap = Capacity(makespan_ms=10.0, open_limit=8, capacity_tok_s=1000.0, offered_tok_s=3200.0, load=3.2,
                   exact=False, bytes_mb=1e9, roofline_tok_s=1000.0)
    rows = [{"scenario": "baseline", "ips": "450"}, {"scenario": "unthrottled", "ips": "905.5"}]
    assert roofline_line(rows, cap) == "served of the DRAM roofline (1000.0 tok/s): baseline 45 %, unthrottled 91 %"
    assert roofline_line([], cap) is None
    assert roofline_line(rows, replace(cap, roofline_tok_s=math.inf)) is None


def test_the_default_mappings_notes_are_printed_with_the_summary(tmp_path: Path) -> None:
    """The default mapping places a model over the chip's DRAM too (TAPS refuses it): the summary says so."""
    arch = load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")
    over = default_placement(arch, 32, 8, 64.0, 40 * 64 * 2**20)  # 40 shards an expert: 4 experts a core, 32 banks
    fits = default_placement(arch, 32, 8, 64.0, 6 * 64 * 2**20)
    taps = fits.model_copy(update={"meta": PlacementMeta(method="heuristic", notes=["a TAPS note"])})
    assert over.meta.notes and not fits.meta.notes
    for sc, plc in (("baseline", over), ("tacs", fits), ("taps", taps), ("tas", over)):
        path = tmp_path / "runs" / sc / "mapping" / "placement.json"
        path.parent.mkdir(parents=True)
        path.write_text(plc.model_dump_json(), encoding="utf-8")
    res = LocalResult(experiment_id="exp-x", out_dir=tmp_path, csvs={}, errors={"tas": "boom"}, windows={},
                      status={"baseline": "succeeded", "tacs": "succeeded", "taps": "succeeded", "tas": "failed"},
                      wall_s=0.0, compute_s={})
    assert default_mapping_notes(res) == [f"baseline: the default mapping: {n}" for n in over.meta.notes]


def test_an_experiment_with_its_own_rate_refuses_another_workload(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["run", "--experiment", "flatout", "--workload", "configs/workload_serving.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "leave out --workload" in err[0] and "requests/s" in err[0]
