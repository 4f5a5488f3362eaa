"""docs/settings.md is what ``scripts/settings_reference.py`` renders from the settings models, and it lists every
field of the shared and the services' settings classes with its real default: the reference cannot drift from the
code."""

from __future__ import annotations

import re

from scripts.settings_reference import OUT, format_default, render, settings_classes


def test_the_committed_reference_is_the_rendered_one() -> None:
    assert OUT.read_text(encoding="utf-8") == render(), "docs/settings.md is stale: run make settings-docs"


def test_every_field_is_listed_with_its_default() -> None:
    text = OUT.read_text(encoding="utf-8")
    table = {name: default.strip()
             for name, default in re.findall(r"^\| `(TASMOE_[A-Z0-9_]+)` \| ([^|]*) \|", text, re.M)}
    fields = {name: field for _, cls in settings_classes() for name, field in cls.model_fields.items()}
    expected = {f"TASMOE_{name.upper()}" for name in fields}
    assert set(table) == expected, f"missing {sorted(expected - set(table))}, stale {sorted(set(table) - expected)}"
    for name, shown in table.items():
        assert shown == format_default(fields[name[len("TASMOE_"):].lower()].default), name


def test_every_field_says_what_it_means() -> None:
    undocumented = [f"{cls.__name__}.{name}" for _, cls in settings_classes()
                    for name, field in cls.model_fields.items() if not field.description]
    assert undocumented == []
