"""run.log keeps the run's own lines and any module's warnings, not other modules' INFO records (httpx's line per
request made it ~1.1 kB per window)."""

from __future__ import annotations

import logging
from pathlib import Path

from services.orchestrator.run_log import run_log
from shared.logging import bind_run_id


def test_run_log_keeps_its_lines_and_warnings_but_not_other_modules_info(tmp_path: Path) -> None:
    path = tmp_path / "run.log"
    other = logging.getLogger("httpx")
    old = other.level
    other.setLevel(logging.INFO)
    try:
        with bind_run_id("r1"), run_log(path, run_id="r1") as rlog:
            rlog.info("progress line")
            other.info('HTTP Request: POST http://thermal/v1/step "HTTP/1.1 200 OK"')
            other.warning("a warning of another module")
    finally:
        other.setLevel(old)
    text = path.read_text()
    assert "progress line" in text
    assert "a warning of another module" in text
    assert "HTTP Request" not in text
