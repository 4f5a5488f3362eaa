"""The thermal model's Python API (services/thermal/api.py): the README's examples run as written, and the API agrees
with `tasmoe hotspot` and with itself (superposition, transient to steady)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest

from services.thermal import hotspot
from services.thermal.api import Stack
from services.thermal.network import RCNetwork
from shared.errors import BadInput

README = Path(__file__).resolve().parents[2] / "services" / "thermal" / "README.md"


def _examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Python API"):]
    section = section[:section.index("\n### ", 5)] if "\n### " in section[5:] else section
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_examples_run(reference_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _examples()
    assert len(blocks) >= 4
    monkeypatch.chdir(reference_dir / "hotspot")
    namespace: dict[str, object] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for code in blocks:  # one namespace: later examples use earlier ones' variables, as a reader would
            exec(compile(code, str(README), "exec"), namespace)  # our own README
    printed = out.getvalue()
    assert "power blocks" in printed and "self-heating of C_3_4" in printed and "hottest cell" in printed


def test_api_steady_is_the_drop_in_s_solution(reference_dir: Path) -> None:
    ref = reference_dir / "hotspot"
    stack = Stack.from_hotspot(ref / "S8" / "stack.lcf", config=ref / "hotspot.config")
    res = hotspot.run(hotspot.parse_options(["-c", str(ref / "hotspot.config"), "-grid_layer_file",
                                             str(ref / "S8" / "stack.lcf"), "-model_type", "grid",
                                             "-p", str(ref / "S8" / "steady_b_hotcore.ptrace")]))
    header, values = (ref / "S8" / "steady_b_hotcore.ptrace").read_text().splitlines()[:2]
    field = stack.steady(dict(zip(header.split(), map(float, values.split()), strict=True)))
    np.testing.assert_allclose(field.nodes, res.steady, rtol=0, atol=1e-9)
    assert stack.blocks == res.trace_names


def test_influence_superposition_and_transient_reaches_steady(arch_small_stack: Stack) -> None:
    stack = arch_small_stack
    rng = np.random.default_rng(3)
    w = rng.random(len(stack.blocks))
    H = stack.influence()
    direct = stack.steady(w)
    np.testing.assert_allclose(stack.ambient + H @ w, list(direct.blocks().values()), atol=1e-9)
    _, last = stack.transient([w] * 40, dt=10.0)  # 400 s: far beyond the slowest mode
    np.testing.assert_allclose(last.nodes, direct.nodes, atol=1e-3)
    temps, _ = stack.transient([w, w], dt=1e-3)
    assert temps.shape == (2, len(stack.blocks)) and (temps[1] >= temps[0] - 1e-6).all()  # heating from ambient


@pytest.fixture(scope="module")
def arch_small_stack() -> Stack:
    from tests.thermal.conftest import small_arch

    return Stack.from_arch(small_arch())


@pytest.mark.parametrize(("power", "needle"), [
    ({"no_such_block": 1.0}, "no power block 'no_such_block'"),
    ({"core_0": float("nan")}, "power of block core_0"),
    ({"core_1": -1.0}, "power of block core_1"),
    ([1.0, 2.0], "2 values for"),
])
def test_bad_power_is_refused_naming_the_block(arch_small_stack: Stack, power: object, needle: str) -> None:
    with pytest.raises(BadInput, match=re.escape(needle)):
        arch_small_stack.steady(power)  # type: ignore[arg-type]


def test_bad_layer_and_dt(arch_small_stack: Stack) -> None:
    field = arch_small_stack.uniform(300.0)
    assert field.layer(0).shape == (16, 16)
    with pytest.raises(BadInput, match="layer 99"):
        field.layer(99)
    with pytest.raises(BadInput, match="dt"):
        arch_small_stack.transient([{}], dt=0.0)


def test_a_block_name_in_two_power_layers_is_refused_by_name_not_guessed() -> None:
    stack = Stack(build_twin_net(), ["A", "A"], lambda w: w, lambda T: T)
    with pytest.raises(BadInput, match="several power layers"):
        stack.power_vector({"A": 1.0})
    assert stack.power_vector([1.0, 2.0]).tolist() == [1.0, 2.0]


def build_twin_net() -> RCNetwork:
    from tests.thermal.conftest import small_arch

    return Stack.from_arch(small_arch()).net
