"""`tasmoe <command>` imports only the service that owns the command (services/commands.py), `tasmoe --help` none;
the table agrees with what every service's `cli.register` adds."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from services import optional_module
from services.commands import COMMANDS
from shared import SERVICES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("service", SERVICES)
def test_the_table_lists_every_command_a_service_registers_with_its_help(service: str) -> None:
    mod = optional_module(service, "cli")
    owned = {name: c.help for name, c in COMMANDS.items() if c.service == service}
    if mod is None:
        assert owned == {}
        return
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    mod.register(sub)
    assert set(sub.choices) == set(owned)
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert helps == owned


def _modules_after(argv: list[str], cwd: Path) -> list[str]:
    """The modules a fresh interpreter holds after ``tasmoe <argv>`` (the command's exit status is ignored)."""
    code = ("import json, sys\nfrom services.cli import main\ntry:\n    main(json.loads(sys.argv[1]))\n"
            "except SystemExit:\n    pass\nprint(json.dumps(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], cwd=cwd, capture_output=True, text=True,
                          check=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    mods: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return mods


def test_hotspot_imports_the_thermal_service_only(reference_dir: Path, tmp_path: Path) -> None:
    ref = reference_dir / "hotspot"
    mods = _modules_after(["hotspot", "-c", str(ref / "hotspot.config"), "-grid_layer_file",
                           str(ref / "S2" / "stack.lcf"), "-model_type", "grid", "-p",
                           str(ref / "S2" / "steady_a_uniform.ptrace"), "-steady_file", str(tmp_path / "a.steady")],
                          tmp_path)
    assert (tmp_path / "a.steady").exists()  # it ran
    services = {m.split(".")[1] for m in mods if m.startswith("services.") and m.count(".") >= 1}
    assert services <= {"thermal", "cli", "commands"}
    for heavy in ("sqlalchemy", "matplotlib", "fastapi", "celery", "httpx", "numba"):
        assert heavy not in mods, heavy
    # the spectral path needs numpy alone: scipy's import was half of the whole process (BENCHMARKS.md)
    assert not [m for m in mods if m == "scipy" or m.startswith("scipy.")]


def test_a_stack_the_spectral_solver_cannot_take_loads_scipy_sparse(tmp_path: Path) -> None:
    """The negative of the above: the lazy import is where the sparse path needs it (a chiplet smaller than the
    die is solved by SuperLU)."""
    runs = REPO / "tests" / "fixtures" / "hotspot_runs" / "ev6_3D"
    mods = _modules_after(["hotspot", "-c", str(runs / "example.config"), "-grid_layer_file",
                           str(runs / "ev6_3D.lcf"), "-model_type", "grid", "-detailed_3D", "on", "-p",
                           str(runs / "ev6_3D.ptrace"), "-steady_file", str(tmp_path / "a.steady")], runs)
    assert (tmp_path / "a.steady").exists()
    assert "scipy.sparse.linalg" in mods


def test_help_imports_no_service(tmp_path: Path) -> None:
    mods = _modules_after(["--help"], tmp_path)
    assert not [m for m in mods if m.startswith("services.") and m not in ("services.cli", "services.commands")]
    assert "numpy" not in mods and "sqlalchemy" not in mods
