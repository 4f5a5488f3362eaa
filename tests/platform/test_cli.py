"""The `tasmoe` command's platform subcommands: help on each, one-line errors with exit 2 for bad flags, bad
environment values and bad files; `openapi` writes the six specs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli import main
from shared import SERVICES
from shared.settings import get_settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_settings_and_logging() -> Iterator[None]:
    """`main` reads settings once and configures the root logger: give each test fresh ones, restore after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_help_lists_the_platform_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("serve", "config", "openapi"):
        assert cmd in out
    for cmd in ("serve", "config", "openapi"):
        with pytest.raises(SystemExit) as info:
            main([cmd, "--help"])
        assert info.value.code == 0
        assert f"usage: tasmoe {cmd}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["serve", "gpu"], "invalid choice: 'gpu'"), (["--log-level", "LOUD", "openapi"], "--log-level"),
     (["serve", "thermal", "--port", "many"], "--port"), (["serve", "thermal", "--port", "99999999"], "1 to 65535"),
     (["serve", "thermal", "--port", "-1"], "1 to 65535"), ([], "required")],
)
def test_bad_flags_exit_2_with_one_line(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1] and err[-1].startswith("tasmoe")


def test_bad_environment_value_is_one_line_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv("TASMOE_HTTP_RETRIES", "-3")
    assert main(["openapi", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tasmoe openapi: error: environment variable TASMOE_HTTP_RETRIES: must be >= 0"
    assert not list(tmp_path.iterdir())


def test_missing_config_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["config", "arch", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope.yaml" in err and "Traceback" not in err


def test_openapi_writes_six_sorted_specs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["openapi", "--out", str(tmp_path / "o")]) == 0
    written = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert written == sorted(f"{s}.json" for s in SERVICES)
    spec = json.loads((tmp_path / "o" / "thermal.json").read_text())
    assert spec["info"]["title"] == "tasmoe-thermal"
    assert capsys.readouterr().out.count(".json") == len(SERVICES)


def test_console_script_runs() -> None:
    exe = Path(sys.executable).with_name("tasmoe")
    res = subprocess.run([str(exe), "serve", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and "--port" in res.stdout


def test_platform_commands_do_not_import_the_services_clis() -> None:
    """`tasmoe serve <name>` (six of them in a cluster) starts without importing every service's CLI."""
    code = ("import sys; from services.cli import main; "
            "rc = main(['config', 'arch', 'configs/arch_8x8_32x32x8.yaml']); "
            "print(rc, sorted(m for m in sys.modules if m.startswith('services.') and m.endswith('.cli')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.stdout.strip().splitlines()[-1] == "0 ['services.cli']", res.stdout + res.stderr


def test_command_detection_skips_global_options() -> None:
    from services.cli import _command_of

    assert _command_of(["--log-level", "DEBUG", "serve", "thermal"]) == "serve"
    assert _command_of(["--log-level=debug", "run"]) == "run"
    assert _command_of(["--help"]) is None


@pytest.mark.parametrize(("content", "needle"), [
    (b"\x00\xff\xfe", "not UTF-8"),
    (b"a: " + b"[" * 10000 + b"\n", "nested too deeply"),
])
def test_unreadable_config_is_one_line(content: bytes, needle: str, capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    """A hostile-request probe found tracebacks (UnicodeDecodeError; RecursionError in ~3000 lines)."""
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    assert main(["config", "arch", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_a_db_that_is_not_a_url_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["experiments", "list", "--db", str(tmp_path / "x.sqlite3")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--db" in err and "not a database URL" in err
