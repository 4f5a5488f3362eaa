"""The README stays true: `make run` / `make test` come first, the settings table lists every Settings field with its
real default, every `make` target it mentions exists, and the Results section is there."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic_settings import BaseSettings

from services import optional_module
from shared import SERVICES
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _settings_table() -> dict[str, str]:
    rows = re.findall(r"^\| `(TASMOE_[A-Z0-9_]+)` \| ([^|]*) \|", README, re.M)
    return {name: default.strip() for name, default in rows}


def test_make_run_and_make_test_come_first() -> None:
    first_block = README.split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make run", "make test"]
    assert README.index("make run") < README.index("## ")


def _settings_classes() -> list[type[BaseSettings]]:
    """The shared Settings and every service's own settings class (``services/<name>/settings.py``)."""
    classes: list[type[BaseSettings]] = [Settings]
    for name in SERVICES:
        mod = optional_module(name, "settings")
        if mod is None:
            continue
        classes += [obj for obj in vars(mod).values()
                    if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj.__module__ == mod.__name__]
    return classes


def test_settings_table_lists_every_field_with_its_default() -> None:
    table = _settings_table()
    fields = {name: field for cls in _settings_classes() for name, field in cls.model_fields.items()}
    expected = {f"TASMOE_{name.upper()}" for name in fields}
    assert set(table) == expected, f"missing {sorted(expected - set(table))}, stale {sorted(set(table) - expected)}"
    for name, shown in table.items():
        value = fields[name[len("TASMOE_"):].lower()].default
        if value in ("", None):
            assert shown == "*(empty)*", name
        else:
            want = str(value).lower() if isinstance(value, bool) else str(value)
            assert shown == f"`{want}`", f"{name}: README says {shown}, Settings default is {want}"


def test_mentioned_make_targets_exist() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.M))
    mentioned = set(re.findall(r"\bmake ([a-z][a-z-]*)", README))
    assert mentioned <= targets, f"README mentions unknown make targets: {sorted(mentioned - targets)}"


def test_results_section_is_present() -> None:
    assert re.search(r"^## Results$", README, re.M)


def test_every_cli_option_is_described() -> None:
    """`tasmoe <command> --help` describes every argument and option of every subcommand (issue 20)."""
    import argparse

    from services.cli import build_parser

    missing: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "tasmoe")
    assert missing == []
