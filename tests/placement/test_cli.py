"""``tasmoe place`` and ``tasmoe place balance``: JSON output, one-line errors with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli import main
from tests.conftest import CONFIGS


def _cfg(name: str) -> str:
    return str(CONFIGS / name)


def test_place_heuristic_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "placement.json"
    rc = main(["place", "--arch", _cfg("arch_8x8_32x32x8.yaml"), "--workload", _cfg("workload_mixtral_8x7b.yaml"),
               "--tas", _cfg("tas_params.yaml"), "--method", "heuristic", "--json", "--out", str(out_file)])
    assert rc == 0
    body = json.loads(capsys.readouterr().out)
    assert len(body["experts"]) == 256
    assert body["predicted_peak_c"] == body["meta"]["predicted_peak_c"] > 45.0
    assert json.loads(out_file.read_text())["experts"] == body["experts"]


def test_place_balance_json(capsys: pytest.CaptureFixture[str], reference_dir: Path) -> None:
    rc = main(["place", "balance", "--loads", str(reference_dir / "placement" / "input_loads_E8.csv"), "--cores", "64",
               "--slots", "64", "--json"])
    assert rc == 0
    body = json.loads(capsys.readouterr().out)
    assert [lay["layer"] for lay in body["layers"]] == [0, 1, 2, 3]
    for lay in body["layers"]:
        assert {"replicas", "core_loads", "max_over_mean", "lower_bound", "gap"} <= set(lay)
        assert len(lay["replicas"]) == 64 and lay["max_over_mean"] < 1.07


@pytest.mark.parametrize(("argv", "needle"), [
    (["place", "balance", "--loads", "REF", "--slots", "4"], "slots"),
    (["place", "balance", "--loads", "/nonexistent.csv", "--slots", "64"], "file not found"),
    (["place", "--arch", _cfg("arch_8x8_32x32x8.yaml")], "--workload is required"),
])
def test_user_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], reference_dir: Path, argv: list[str],
                                         needle: str) -> None:
    argv = [str(reference_dir / "placement" / "input_loads_E8.csv") if a == "REF" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err
