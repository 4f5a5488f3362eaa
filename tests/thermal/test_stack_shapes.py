"""Stacks HotSpot cannot take (issue 19, item 3): a layer smaller than the die (a chiplet on a larger die, with a
filler around it) and HotSpot's -detailed_3D per-block materials. Such layers are laterally non-uniform and are solved
by the sparse direct solver; where the spectral solver applies to the same physics, the two agree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from services.cli import main
from services.thermal import hotspot, solvers
from services.thermal.api import Stack
from services.thermal.hotspot_io import parse_temp_file
from services.thermal.model import build_model
from services.thermal.network import build_network
from tests.thermal.conftest import small_arch

MM = 1e-3
Block = tuple[str, float, float, float, float]  # name, width, height, left x, bottom y (mm)


@pytest.mark.parametrize(("variant", "detailed"), [("hotspot", False), ("hotspot", True), ("physical", False)])
def test_a_layer_of_equal_cells_is_the_uniform_network(variant: str, detailed: bool) -> None:
    spec = dataclasses.replace(build_model(small_arch(variant=variant)).net.spec, detailed_3d=detailed)
    nrc = spec.rows * spec.cols
    lay = spec.layers[1]
    odd = dataclasses.replace(spec, layers=(spec.layers[0], dataclasses.replace(
        lay, k_cells=(lay.k,) * nrc, rho_c_cells=(lay.rho_c,) * nrc), *spec.layers[2:]))
    a, b = build_network(spec), build_network(odd)
    assert a.uniform and not b.uniform
    assert abs(a.conductance - b.conductance).max() <= 1e-12 * abs(a.conductance).max()
    np.testing.assert_allclose(b.capacitance, a.capacitance, rtol=1e-14)


def _flp(blocks: list[Block], extra: dict[str, tuple[float, float]] | None = None
         ) -> str:
    lines = []
    for name, w, h, x, y in blocks:
        mat = extra.get(name) if extra else None
        tail = f"\t{mat[0]:g}\t{mat[1]:g}" if mat else ""
        lines.append(f"{name}\t{w * MM:.6g}\t{h * MM:.6g}\t{x * MM:.6g}\t{y * MM:.6g}{tail}")
    return "\n".join(lines) + "\n"


def _lcf(layers: list[tuple[bool, float, float, float, str]]) -> str:
    """(power, rho_c, resistivity, thickness, floorplan) per layer, farthest from the sink first."""
    out = []
    for n, (power, rc, res, t, flp) in enumerate(layers):
        out += [str(n), "Y", "Y" if power else "N", f"{rc:g}", f"{res:g}", f"{t:g}", flp, ""]
    return "\n".join(out)


LOGIC: list[Block] = [("L_sw", 4, 4, 0, 0), ("L_se", 4, 4, 4, 0), ("L_nw", 4, 4, 0, 4), ("L_ne", 4, 4, 4, 4)]
CHIP: list[Block] = [("X_w", 2, 4, 2, 2), ("X_e", 2, 4, 4, 2)]  # a 4 x 4 mm chiplet in the middle of the 8 x 8 mm die
# the rest of the die around the chiplet
PAD: list[Block] = [("P_s", 8, 2, 0, 0), ("P_n", 8, 2, 0, 6), ("P_w", 2, 4, 0, 2), ("P_e", 2, 4, 6, 2)]


def _case(d: Path, chip: list[Block]) -> list[str]:
    """chiplet (farthest from the sink) on the logic die, then the TIM; 16 x 16 grid; returns the options."""
    (d / "logic.flp").write_text(_flp(LOGIC))
    (d / "chip.flp").write_text(_flp(chip))
    (d / "tim.flp").write_text(_flp([("T", 8, 8, 0, 0)]))
    (d / "stack.lcf").write_text(_lcf([(True, 1.63e6, 1 / 100, 50e-6, "chip.flp"),
                                       (True, 1.63e6, 1 / 130, 50e-6, "logic.flp"),
                                       (False, 4e6, 1 / 4, 20e-6, "tim.flp")]))
    names = [b[0] for b in chip] + [b[0] for b in LOGIC]
    watts = [3.0 if n == "X_w" else 1.0 if n == "X_e" else 0.0 if n.startswith("P_") else 0.5 for n in names]
    (d / "p.ptrace").write_text("\t".join(names) + "\n" + "\t".join(map(str, watts)) + "\n")
    cfg = Path(__file__).resolve().parents[1] / "fixtures" / "thermal" / "tiny.config"
    return ["-c", str(cfg), "-grid_layer_file", str(d / "stack.lcf"), "-p", str(d / "p.ptrace"),
            "-grid_rows", "16", "-grid_cols", "16"]


def test_a_chiplet_with_its_own_material_around_it_equals_the_padded_uniform_stack(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    small = hotspot.run(hotspot.parse_options([*_case(tmp_path / "a", CHIP), "-k_filler", "100",
                                               "-p_filler", "1.63e6"]))
    padded = hotspot.run(hotspot.parse_options(_case(tmp_path / "b", CHIP + PAD)))
    assert not small.case.net.uniform and padded.case.net.uniform  # sparse LU against the spectral solver
    assert hotspot.solver_note(small.case.net) is not None and hotspot.solver_note(padded.case.net) is None
    a = hotspot.steady_blocks(small)
    b = hotspot.steady_blocks(padded)
    for name in ("layer_0_X_w", "layer_0_X_e", *(f"layer_1_{n[0]}" for n in LOGIC)):
        assert a[name] == pytest.approx(b[name], abs=1e-6)


def test_the_filler_matters_and_energy_is_conserved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _case(tmp_path, CHIP)
    hot = {}
    for k in (0.9, 100.0):  # a mold compound, silicon
        res = hotspot.run(hotspot.parse_options([*base, "-k_filler", str(k), "-p_filler", "1.6e6"]))
        assert res.case.net.heat_to_ambient(res.steady) == pytest.approx(4.0 + 4 * 0.5, rel=1e-9)
        hot[k] = hotspot.steady_blocks(res)["layer_0_X_w"]
    assert hot[0.9] > hot[100.0] + 0.05  # the chiplet spreads its heat sideways only through the filler
    # the CLI reports the solver it chose
    assert main(["hotspot", *base, "-k_filler", "0.9", "-p_filler", "1.6e6", "-steady_file",
                 str(tmp_path / "o.steady")]) == 0
    assert "sparse direct solver" in capsys.readouterr().err
    assert parse_temp_file((tmp_path / "o.steady").read_text())["layer_0_X_w"] == pytest.approx(hot[0.9], abs=0.006)


def test_layers_of_different_sizes_without_a_filler_are_refused(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = _case(tmp_path, CHIP)
    assert main(["hotspot", *args, "-steady_file", str(tmp_path / "o")]) == 2  # the chiplet is layer 0
    err = capsys.readouterr().err
    assert "lies outside the die (4 mm x 4 mm" in err and "-k_filler" in err and err.count("\n") == 1
    # the chiplet below the full-size die (farther from the sink is layer 0): smaller than layer 0
    lcf = (tmp_path / "stack.lcf").read_text()
    (tmp_path / "stack.lcf").write_text(lcf.replace("chip.flp", "TMP").replace("logic.flp", "chip.flp")
                                        .replace("TMP", "logic.flp"))
    assert main(["hotspot", *args, "-steady_file", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "is 4 mm x 4 mm on a 8 mm x 8 mm die" in err and "-p_filler" in err and err.count("\n") == 1


def test_detailed_3d_per_block_materials(tmp_path: Path) -> None:
    d = tmp_path
    args = _case(d, CHIP + PAD)
    plain = hotspot.run(hotspot.parse_options([*args, "-detailed_3D", "on"]))
    # the chiplet layer's own material written on every block: the same stack, now through the per-cell path
    same = {n: (1.63e6, 1 / 100) for n, *_ in CHIP + PAD}
    (d / "chip.flp").write_text(_flp(CHIP + PAD, same))
    again = hotspot.run(hotspot.parse_options([*args, "-detailed_3D", "on"]))
    assert plain.case.net.uniform and not again.case.net.uniform
    np.testing.assert_allclose(again.steady, plain.steady, atol=1e-6)
    # a poor conductor under the hot block (1 W/(m K)) heats it; without -detailed_3D the columns are ignored
    (d / "chip.flp").write_text(_flp(CHIP + PAD, {"X_w": (1.63e6, 1.0)}))
    poor = hotspot.run(hotspot.parse_options([*args, "-detailed_3D", "on"]))
    assert hotspot.steady_blocks(poor)["layer_0_X_w"] > hotspot.steady_blocks(plain)["layer_0_X_w"] + 0.01
    assert poor.case.net.heat_to_ambient(poor.steady) == pytest.approx(6.0, rel=1e-9)
    ignored = hotspot.run(hotspot.parse_options(args))
    assert ignored.case.net.uniform


def test_transient_on_a_non_uniform_stack_reaches_its_steady_state(tmp_path: Path) -> None:
    args = dict(zip(_case(tmp_path, CHIP)[::2], _case(tmp_path, CHIP)[1::2], strict=True))
    stack = Stack.from_hotspot(args["-grid_layer_file"], config=args["-c"], grid_rows=16, grid_cols=16,
                               k_filler=0.9, p_filler=1.6e6)
    assert not stack.net.uniform and isinstance(stack.solver, solvers.SparseSolver)
    w = {"X_w": 3.0, "X_e": 1.0}
    _, last = stack.transient([w] * 30, dt=20.0)
    np.testing.assert_allclose(last.nodes, stack.steady(w).nodes, atol=1e-3)
