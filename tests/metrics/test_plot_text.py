"""Plot text is drawn as written (issue 17): a workload name with "$" used to be parsed as matplotlib math text
("$\\foo$" answered 422 with the parser's output, nested roots a 500)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.metrics.app import create_app
from shared.settings import Settings


def _row() -> dict[str, Any]:
    spec = create_app(Settings()).openapi()
    row: dict[str, Any] = dict.fromkeys(spec["components"]["schemas"]["ResultRow"]["required"], 1.0)
    row.update(scenario="baseline", workload="w", tokens=1, windows=1, migrations=0)
    return row


@pytest.mark.parametrize("name", [r"$\foo$", r"$\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{x}}}}}$" * 3, "a_b^c $x$ 100%"])
def test_a_workload_name_with_math_characters_is_plain_text(name: str) -> None:
    with TestClient(create_app(Settings()), raise_server_exceptions=False) as c:
        r = c.post("/v1/plots/performance", json={"workload": name, "rows": [_row()]})
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"] == "image/png" and r.content[:8] == b"\x89PNG\r\n\x1a\n"
