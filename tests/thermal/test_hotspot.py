"""HotSpot drop-in: `tasmoe hotspot` on every reference case against HotSpot's own results, plus bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from services.cli import main
from services.thermal import hotspot, solvers
from services.thermal.hotspot_io import parse_grid_steady, parse_temp_file, parse_ttrace
from services.thermal.spectral import SpectralSolver
from tests.conftest import FIXTURES

TINY = FIXTURES / "thermal"
STEADY_CASES = [("S2", "steady_a_uniform"), ("S2", "steady_b_hotcore"), ("S2", "steady_c_pattern"),
                ("S8", "steady_a_uniform"), ("S8", "steady_b_hotcore")]


def _base(ref: Path, stack: str) -> list[str]:
    return ["hotspot", "-c", str(ref / "hotspot.config"), "-grid_layer_file", str(ref / stack / "stack.lcf"),
            "-model_type", "grid"]


@pytest.mark.parametrize(("stack", "case"), STEADY_CASES)
def test_steady_matches_hotspot(reference_dir: Path, tmp_path: Path, stack: str, case: str) -> None:
    ref = reference_dir / "hotspot"
    steady, grid = tmp_path / "out.steady", tmp_path / "out.grid.steady"
    rc = main([*_base(ref, stack), "-f", str(ref / stack / "logic.flp"), "-p", str(ref / stack / f"{case}.ptrace"),
               "-steady_file", str(steady), "-grid_steady_file", str(grid)])
    assert rc == 0
    ours = parse_temp_file(steady.read_text())
    theirs = parse_temp_file((ref / stack / "out" / f"{case}.slu.block.steady").read_text())
    assert list(ours) == list(theirs)  # same blocks, same order (layers, hsp_, hsink_, inode_0..11)
    err = np.array([ours[k] - theirs[k] for k in theirs])
    assert np.abs(err).max() <= 0.5
    g_ours = parse_grid_steady(grid.read_text())
    g_theirs = parse_grid_steady((ref / stack / "out" / f"{case}.slu.grid.steady").read_text())
    assert g_ours.shape == g_theirs.shape
    assert np.abs(g_ours - g_theirs).max() <= 0.5
    # the hot core really is hot: the comparison is not trivially satisfied by a flat field
    assert max(theirs.values()) - min(theirs.values()) > 1.0


@pytest.mark.parametrize("name", ["t1_cold", "t2_warm"])
def test_transient_matches_hotspot_rk4(reference_dir: Path, tmp_path: Path, name: str) -> None:
    ref = reference_dir / "hotspot"
    out = tmp_path / f"{name}.ttrace"
    extra = ["-init_file", str(ref / "S2" / "out" / "transient_base.slu.block.steady")] if name == "t2_warm" else []
    rc = main([*_base(ref, "S2"), "-p", str(ref / "S2" / "transient_move.ptrace"), "-o", str(out), *extra])
    assert rc == 0
    names, ours = parse_ttrace(out.read_text())
    ref_names, rk4 = parse_ttrace((ref / "S2" / "out" / f"{name}.rk4.ttrace").read_text())
    assert names == ref_names and ours.shape == rk4.shape == (20, 576)
    assert np.abs(ours - rk4).max() <= 1.0
    # the one-BE-step-per-interval trace is several K off on the moving hot core; we must not be that coarse
    _, be = parse_ttrace((ref / "S2" / "out" / f"{name}.be.ttrace").read_text())
    assert np.abs(ours - be).max() > 2.0


def test_spectral_and_sparse_agree_on_s2(reference_dir: Path) -> None:
    ref = reference_dir / "hotspot"
    opts = hotspot.parse_options([*_base(ref, "S2")[1:], "-p", str(ref / "S2" / "steady_b_hotcore.ptrace")])
    net = hotspot.load_case(opts).net
    rng = np.random.default_rng(7)
    P = np.zeros(net.n_nodes)
    P[: 3 * net.rows * net.cols] = rng.random(3 * net.rows * net.cols) * 0.01
    fast, oracle = SpectralSolver(net), solvers.SparseSolver(net)
    assert np.abs(solvers.steady(fast, P) - solvers.steady(oracle, P)).max() < 1e-6
    T0 = np.full(net.n_nodes, net.ambient) + rng.random(net.n_nodes)
    a = solvers.step(fast, T0, P, 1e-3, 2)
    b = solvers.step(oracle, T0, P, 1e-3, 2)
    assert np.abs(a - b).max() < 1e-6


def test_detailed_3d_raises_core_maxima_as_documented(reference_dir: Path) -> None:
    """../shared/reference/hotspot/README.md: `-detailed_3D on` moves half the convection resistance between
    spreader and sink: +11..+18 K."""
    ref = reference_dir / "hotspot"
    args = [*_base(ref, "S2")[1:], "-p", str(ref / "S2" / "steady_a_uniform.ptrace")]
    off = hotspot.run(hotspot.parse_options(args))
    on = hotspot.run(hotspot.parse_options([*args, "-detailed_3D", "on"]))
    core = off.case.power_layers[-1]
    rise = on.case.block_temps(on.steady, core).max() - off.case.block_temps(off.steady, core).max()
    assert 11.0 <= rise <= 18.0


# --- bad input -------------------------------------------------------------------------------------------------

def _tiny(tmp_path: Path) -> Path:
    for f in TINY.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def _run_tiny(d: Path, *extra: str) -> int:
    return main(["hotspot", "-c", str(d / "tiny.config"), "-grid_layer_file", str(d / "tiny.lcf"),
                 "-p", str(d / "tiny.ptrace"), "-steady_file", str(d / "out.steady"), *extra])


def test_tiny_case_runs_and_conserves_energy(tmp_path: Path) -> None:
    d = _tiny(tmp_path)
    assert _run_tiny(d, "-o", str(d / "out.ttrace")) == 0
    temps = parse_temp_file((d / "out.steady").read_text())
    assert temps["layer_0_A"] > temps["layer_0_B"] > 318.15  # A has the higher average power (2.0 vs 1.25 W)
    res = hotspot.run(hotspot.parse_options(["-c", str(d / "tiny.config"), "-grid_layer_file", str(d / "tiny.lcf"),
                                             "-p", str(d / "tiny.ptrace")]))
    assert res.case.net.heat_to_ambient(res.steady) == pytest.approx(3.25, rel=1e-9)


@pytest.mark.parametrize(
    ("option", "value"),
    [("model_type", "block"), ("model_secondary", "1"), ("leakage_used", "1"), ("grid_transient_file", "x"),
     ("d", "dump.config"), ("no_such_option", "1")],
)
def test_unsupported_options_exit_2_naming_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      option: str, value: str) -> None:
    d = _tiny(tmp_path)
    assert _run_tiny(d, f"-{option}", value) == 2
    err = capsys.readouterr().err
    assert f"-{option}" in err and "Traceback" not in err


def _expect_error(d: Path, capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    assert _run_tiny(d) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    for n in needles:
        assert n in err


@pytest.mark.parametrize(("name", "text", "needles"), [
    ("tiny.ptrace", "A\tB\n1.0\t2.0\n3.0\t-0.5\n", ("tiny.ptrace:3", "block B", "negative")),
    ("tiny.ptrace", "A\tB\n1.0\tnan\n", ("tiny.ptrace:2", "block B")),
    ("tiny_tim.flp", "T\t0.004\t0.004\t0.000\t0.000\nX\t0.001\t0.001\t0.0045\t0.0\n",
     ("tiny_tim.flp:2: block X", "outside the die")),
    ("tiny.flp", "A\t0.002\t0.004\t0.000\t0.000\nB\t0.002\t0.004\t0.0015\t0.000\n",
     ("tiny.flp:2: blocks A (line 1) and B overlap",)),
    ("tiny.ptrace", "# two blocks expected\nA\n1.0\n",  # a floorplan block missing from the trace
     ("tiny.ptrace:2: block B of", "tiny.flp (power layer 0) has no column in the trace")),
    ("tiny.ptrace", "A\tB\tC\n1.0\t2.0\t3.0\n", ("tiny.ptrace:1: block C of the header is in no power layer's",)),
    ("tiny.ptrace", "A\tZ\n1.0\t2.0\n",
     ("tiny.ptrace:1: block Z is not in", "tiny.flp, the floorplan of power layer 0")),
])
def test_a_bad_file_is_one_line_naming_the_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         name: str, text: str, needles: tuple[str, ...]) -> None:
    d = _tiny(tmp_path)
    (d / name).write_text(text)
    _expect_error(d, capsys, *needles)


def test_an_unknown_flag_in_the_config_file_names_its_line(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    d = _tiny(tmp_path)
    text = (d / "tiny.config").read_text()
    (d / "tiny.config").write_text(text + "\t-no_such_flag\t1\n")
    _expect_error(d, capsys, f"tiny.config:{len(text.splitlines()) + 1}: unsupported option -no_such_flag")


def test_zero_thickness_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _tiny(tmp_path)
    text = (d / "tiny.lcf").read_text().replace("2e-05", "0")
    (d / "tiny.lcf").write_text(text)
    _expect_error(d, capsys, "layer 1", "thickness")


def test_detailed_3d_uses_per_block_materials(tmp_path: Path) -> None:
    d = _tiny(tmp_path)
    (d / "tiny.flp").write_text("A\t0.002\t0.004\t0.000\t0.000\t1.6e6\t0.05\nB\t0.002\t0.004\t0.002\t0.000\n")
    assert _run_tiny(d, "-detailed_3D", "on") == 0  # A at 20 W/(m K), B the layer's own material
    with_mat = parse_temp_file((d / "out.steady").read_text())
    assert _run_tiny(d) == 0  # without -detailed_3D HotSpot ignores the extra columns, and so do we
    (d / "tiny.flp").write_text("A\t0.002\t0.004\t0.000\t0.000\nB\t0.002\t0.004\t0.002\t0.000\n")
    assert _run_tiny(d, "-detailed_3D", "on") == 0
    without = parse_temp_file((d / "out.steady").read_text())
    assert with_mat["layer_0_A"] > without["layer_0_A"]  # a poorer conductor under the hotter block
