"""The README and docs/ stay true to the repository: every relative link resolves to a file (and its anchor to a
heading of that file), every path named in inline code exists, no commit hash sits in their prose, and every command
in their code blocks is one the repository has: ``tasmoe ...`` parses with the real argument parser, ``make X`` is a
Makefile target, ``python -m M`` names an importable module and ``curl`` lines split as a shell would."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

from services.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "CHANGELOG.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PATH_IN_CODE = re.compile(r"`((?:services|shared|scripts|tests|configs|deploy|docs|openapi)/[\w./*-]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
# a diary names the modules of its time, some since removed: its paths are history, not pointers
DIARIES = {REPO / "docs" / "bench_history.md"}


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def prose(text: str) -> str:
    """The text outside code blocks and inline code."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_relative_links_resolve(doc: Path) -> None:
    broken: list[str] = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.name}")
    assert broken == [], broken


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_paths_in_inline_code_exist(doc: Path) -> None:
    if doc in DIARIES:
        pytest.skip("a diary's paths are history")
    missing = [p for p in PATH_IN_CODE.findall(doc.read_text(encoding="utf-8"))
               if not any(REPO.glob(p.rstrip("/")))]
    assert missing == [], missing


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_no_commit_hash_in_prose(doc: Path) -> None:
    assert re.findall(r"\b[0-9a-f]{7}\b", prose(doc.read_text(encoding="utf-8"))) == []


def commands(doc: Path) -> list[str]:
    """Every command line of the doc's code blocks: continuation lines joined, comments dropped."""
    out: list[str] = []
    for block in FENCE.findall(doc.read_text(encoding="utf-8")):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith(("#", "{", "|", '"', "from ", "import ", "def ")):
                out.append(line)
    return out


def _parse_tasmoe(argv: list[str]) -> str | None:
    """None when the real parser accepts ``argv``, else its error message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else err.getvalue().strip().splitlines()[-1]
    return None


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_commands_in_code_blocks_exist(doc: Path) -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.M))
    problems: list[str] = []
    for line in commands(doc):
        try:
            words = shlex.split(line)
        except ValueError as exc:
            problems.append(f"{line}: {exc}")
            continue
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value prefixes
            words = words[1:]
        if not words:
            continue
        head = words[0].removeprefix(".venv/bin/")
        if head == "tasmoe":
            error = _parse_tasmoe(words[1:])
            if error:
                problems.append(f"{line}: {error}")
        elif head == "make":
            problems += [f"{line}: no make target {t}" for t in words[1:] if "=" not in t and t not in targets]
        elif head in {"python", "python3"} and words[1:2] == ["-m"] and importlib.util.find_spec(words[2]) is None:
            problems.append(f"{line}: no module {words[2]}")
    assert problems == [], problems


def test_the_parser_is_the_cli_s() -> None:
    """The check above uses the command's own parser (not a copy of its options)."""
    assert isinstance(build_parser(), argparse.ArgumentParser)
    assert _parse_tasmoe(["run", "--no-such-option"]) is not None
