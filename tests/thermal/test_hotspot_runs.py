"""`tasmoe hotspot` against the HotSpot binary on the shapes past HotSpot's usual limits (issue 19, item 3): a grid that
is not a power of two, HotSpot's own -detailed_3D example, and a chiplet smaller than the die (HotSpot: padded with
filler blocks; ours: the chiplet alone and -k_filler/-p_filler). The HotSpot outputs and how they were made:
tests/fixtures/hotspot_runs/README.md. HotSpot prints two decimals, so 0.005 K is agreement."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.thermal import hotspot
from services.thermal.hotspot_io import parse_temp_file as _parse_text
from shared.errors import BadInput
from tests.thermal.test_stack_shapes import CHIP, _case

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "hotspot_runs"
TINY = Path(__file__).resolve().parents[1] / "fixtures" / "thermal" / "tiny.config"
ROUNDING_K = 0.005 + 1e-9  # HotSpot's two decimals


def parse_temp_file(path: Path) -> dict[str, float]:
    return _parse_text(path.read_text(), str(path))


def _worst(ours: dict[str, float], theirs: dict[str, float]) -> tuple[float, str]:
    common = sorted(set(ours) & set(theirs))
    return max((abs(ours[n] - theirs[n]), n) for n in common)


def _ours(args: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    monkeypatch.chdir(cwd)  # HotSpot's layer file names its floorplans relative to the working directory
    return hotspot.steady_blocks(hotspot.run(hotspot.parse_options(args)))


def test_a_grid_that_is_not_a_power_of_two(reference_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s8 = reference_dir / "hotspot" / "S8"
    ours = _ours(["-c", "../hotspot.config", "-p", "steady_b_hotcore.ptrace", "-grid_layer_file", "stack.lcf",
                  "-model_type", "grid", "-grid_rows", "48", "-grid_cols", "40"], s8, monkeypatch)
    theirs = parse_temp_file(RUNS / "s8_steady_b_hotcore_48x40.steady")
    assert set(theirs) <= set(ours)
    worst, name = _worst(ours, theirs)
    assert worst <= ROUNDING_K, name
    # and the grid matters: the 64 x 64 reference differs from it by more than the rounding
    ref64 = parse_temp_file(s8 / "out" / "steady_b_hotcore.slu.block.steady")
    assert _worst(ref64, theirs)[0] > 0.1


def test_hotspots_own_detailed_3d_example(monkeypatch: pytest.MonkeyPatch) -> None:
    d = RUNS / "ev6_3D"
    ours = _ours(["-c", "example.config", "-p", "ev6_3D.ptrace", "-grid_layer_file", "ev6_3D.lcf", "-model_type",
                  "grid", "-detailed_3D", "on"], d, monkeypatch)
    theirs = parse_temp_file(d / "hotspot.steady")
    assert set(theirs) <= set(ours)
    worst, name = _worst(ours, theirs)
    assert worst <= ROUNDING_K, name


def test_a_chiplet_smaller_than_the_die(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _case(tmp_path, CHIP)  # the chiplet's floorplan alone: 4 x 4 mm on the 8 x 8 mm die
    theirs = parse_temp_file(RUNS / "chiplet" / "hotspot.steady")  # HotSpot: padded with filler blocks
    ours = _ours([*args, "-k_filler", "0.9", "-p_filler", "1.6e6", "-detailed_3D", "on"], tmp_path, monkeypatch)
    checked = [n for n in theirs if n in ours and n.startswith("layer_")]
    assert {"layer_0_X_w", "layer_0_X_e", "layer_1_L_sw", "layer_2_T"} <= set(checked)
    worst, name = _worst(ours, theirs)
    assert worst <= ROUNDING_K, name
    # the filler is what HotSpot's padding says: another filler moves the hot block by more than the rounding
    other = _ours([*args, "-k_filler", "100", "-p_filler", "1.6e6", "-detailed_3D", "on"], tmp_path, monkeypatch)
    assert abs(other["layer_0_X_w"] - theirs["layer_0_X_w"]) > 0.1


def test_the_floorplanners_options_in_hotspots_template_config_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """HotSpot's examples share one config with its floorplanner (-wrap_l2, -Rcool, ...); `hotspot` ignores those,
    and so do we, while a misspelt option is still refused."""
    base = ["-c", str(RUNS / "ev6_3D" / "example.config"), "-p", "x.ptrace", "-model_type", "grid"]
    assert hotspot.parse_options(base).text("wrap_l2") == "1"
    with pytest.raises(BadInput, match=r"unsupported option -grid_row$"):
        hotspot.parse_options([*base, "-grid_row", "8"])
