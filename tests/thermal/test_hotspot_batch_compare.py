"""`tasmoe hotspot` batch mode (many power traces, one build) and the difference report against HotSpot's output."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from services.cli import main
from services.thermal import hotspot, solvers
from services.thermal.network import RCNetwork
from services.thermal.spectral import SpectralSolver


def _base(ref: Path, stack: str = "S2") -> list[str]:
    return ["hotspot", "-c", str(ref / "hotspot.config"), "-grid_layer_file", str(ref / stack / "stack.lcf"),
            "-model_type", "grid"]


def test_batch_writes_what_single_runs_write_with_one_build(reference_dir: Path, tmp_path: Path) -> None:
    ref = reference_dir / "hotspot"
    cases = ["steady_a_uniform", "steady_b_hotcore", "steady_c_pattern"]
    for c in cases:  # one process-equivalent run per case
        assert main([*_base(ref), "-p", str(ref / "S2" / f"{c}.ptrace"), "-steady_file", str(tmp_path / f"{c}.one"),
                     "-grid_steady_file", str(tmp_path / f"{c}.grid.one")]) == 0
    argv = [*_base(ref)]
    for c in cases:
        argv += ["-p", str(ref / "S2" / f"{c}.ptrace")]
    assert main([*argv, "-steady_file", str(tmp_path / "steady"), "-grid_steady_file", str(tmp_path / "grid")]) == 0
    for c in cases:
        assert (tmp_path / "steady" / f"{c}.steady").read_text() == (tmp_path / f"{c}.one").read_text()
        assert (tmp_path / "grid" / f"{c}.grid.steady").read_text() == (tmp_path / f"{c}.grid.one").read_text()
    # one model build and one solver for the whole batch
    built: list[RCNetwork] = []

    def factory(net: RCNetwork) -> solvers.Solver:
        built.append(net)
        return SpectralSolver(net)

    opts = hotspot.parse_options([*argv[1:], "-steady_file", str(tmp_path / "again")])
    traces = hotspot.batch_traces([ref / "S2" / f"{c}.ptrace" for c in cases], [])
    results = hotspot.run_batch(opts, traces, factory)
    assert len(built) == 1 and [t.stem for t, _ in results] == cases
    again = (tmp_path / "again" / "steady_b_hotcore.steady").read_text()
    assert again == (tmp_path / "steady_b_hotcore.one").read_text()


def test_batch_directory_and_transient_outputs(reference_dir: Path, tmp_path: Path) -> None:
    ref = reference_dir / "hotspot"
    d = tmp_path / "traces"
    d.mkdir()
    for c in ("transient_move", "steady_b_hotcore"):
        shutil.copy(ref / "S2" / f"{c}.ptrace", d)
    assert main([*_base(ref), "--batch", str(d), "-o", str(tmp_path / "tt"), "-steady_file", str(tmp_path / "st")]) == 0
    assert sorted(p.name for p in (tmp_path / "tt").iterdir()) == ["steady_b_hotcore.ttrace", "transient_move.ttrace"]
    single = tmp_path / "single.ttrace"
    assert main([*_base(ref), "-p", str(d / "transient_move.ptrace"), "-o", str(single)]) == 0
    assert (tmp_path / "tt" / "transient_move.ttrace").read_text() == single.read_text()


@pytest.mark.parametrize(("args", "needle"), [
    (["--batch", "no_such_dir"], "--batch no_such_dir: not a directory"),
    (["--batch", "."], "no *.ptrace file"),
    (["-p", "x/a.ptrace", "-p", "y/a.ptrace"], "same name 'a'"),
    (["-p", "a.ptrace", "-p", "b.ptrace", "--compare", "h.steady"], "--compare takes one power trace"),
])
def test_bad_batches_exit_2_with_one_line(reference_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*_base(reference_dir / "hotspot"), *args, "-steady_file", "out"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def _s2(reference_dir: Path, trace: str, output: str) -> tuple[Path, list[str]]:
    """HotSpot's output file of an S2 case and our command line for the same inputs."""
    ref = reference_dir / "hotspot"
    return ref / "S2" / "out" / output, [*_base(ref), "-p", str(ref / "S2" / f"{trace}.ptrace")]


def test_compare_reports_every_block_and_the_worst(reference_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    theirs, argv = _s2(reference_dir, "steady_b_hotcore", "steady_b_hotcore.slu.block.steady")
    assert main([*argv, "--compare", str(theirs)]) == 0
    out = capsys.readouterr().out.splitlines()
    n_blocks = len(theirs.read_text().split("\n")) - 1
    assert len(out) == 2 + n_blocks  # summary, header, one line per block
    diffs = [abs(float(line.split("\t")[3])) for line in out[2:]]
    assert diffs == sorted(diffs, reverse=True) and max(diffs) <= 0.01  # agrees with HotSpot (2-decimal output)
    # a HotSpot file with one block 1 K off: that block is the worst, with the right sign
    lines = theirs.read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if line.startswith("layer_2_C_3_4"))
    name, value = lines[k].split("\t")
    lines[k] = f"{name}\t{float(value) + 1.0:.2f}"
    tampered = tmp_path / "tampered.steady"
    tampered.write_text("\n".join(lines) + "\n")
    assert main([*argv, "--compare", str(tampered)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "worst layer_2_C_3_4" in out[0]
    assert out[2].startswith("layer_2_C_3_4\t") and -1.01 <= float(out[2].split("\t")[3]) <= -0.99


def test_compare_transient_needs_o_and_reports_the_step(reference_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    theirs, argv = _s2(reference_dir, "transient_move", "t1_cold.rk4.ttrace")
    assert main([*argv, "--compare", str(theirs)]) == 2
    assert "run with -o" in capsys.readouterr().err
    assert main([*argv, "-o", str(tmp_path / "o.ttrace"), "--compare", str(theirs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].endswith("\tstep") and len(out) == 2 + 576
    worst = float(out[2].split("\t")[3])
    assert 0.0 < abs(worst) <= 1.0  # the transient test's tolerance against HotSpot's RK4
    # against the coarse backward-Euler trace the worst block is several K off
    assert main([*argv, "-o", str(tmp_path / "o.ttrace"), "--compare",
                 str(theirs.with_name("t1_cold.be.ttrace"))]) == 0
    assert abs(float(capsys.readouterr().out.splitlines()[2].split("\t")[3])) > 2.0


def test_compare_names_a_missing_block(reference_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    ref = reference_dir / "hotspot"
    theirs = (ref / "S2" / "out" / "steady_a_uniform.slu.block.steady").read_text().splitlines()
    short = tmp_path / "short.steady"
    short.write_text("\n".join(line for line in theirs if not line.startswith("layer_0_D2_0_0\t")) + "\n")
    argv = [*_base(ref), "-p", str(ref / "S2" / "steady_a_uniform.ptrace"), "--compare", str(short)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no temperature for block" in err and err.count("\n") == 1


def test_comparison_of_identical_values_is_zero(reference_dir: Path) -> None:
    ref = reference_dir / "hotspot"
    res = hotspot.run(hotspot.parse_options([*_base(ref)[1:], "-p", str(ref / "S2" / "steady_a_uniform.ptrace")]))
    vals = hotspot.steady_blocks(res)
    assert len(vals) == len(res.case.block_steady_text(res.steady).splitlines())
    assert np.isfinite(list(vals.values())).all()
