"""The README stays a guide: `make run` / `make test` come first, every `make` target it mentions exists, it is short
and it points to the documentation by reader (the settings table lives in docs/settings.md, generated and checked by
test_settings_reference.py)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_make_run_and_make_test_come_first() -> None:
    first_block = README.split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make run", "make test"]
    assert README.index("make run") < README.index("## ")


def test_mentioned_make_targets_exist() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.M))
    mentioned = set(re.findall(r"\bmake ([a-z][a-z-]*)", README))
    assert mentioned <= targets, f"README mentions unknown make targets: {sorted(mentioned - targets)}"


def test_it_is_a_guide_that_links_the_docs_by_reader() -> None:
    assert len(README.splitlines()) <= 250
    for doc in ("docs/results.md", "docs/chip.md", "docs/science.md", "docs/operations.md", "docs/api.md",
                "docs/settings.md", "CHANGELOG.md", "BENCHMARKS.md"):
        assert f"]({doc})" in README, doc
    assert not re.search(r"\b[0-9a-f]{7}\b", README), "a commit hash in the README"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "a date in the README"


def test_every_cli_option_is_described() -> None:
    """`tasmoe <command> --help` describes every argument and option of every subcommand."""
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
