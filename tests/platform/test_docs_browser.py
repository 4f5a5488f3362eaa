"""The API docs as a researcher meets them (issue 17, item 7): `/docs` and `/redoc` of a real `tasmoe serve`, rendered
in headless Chromium (Debian's package; `.ci/run` installs it) from assets the service serves itself (no CDN), and
the request example Swagger UI shows for `POST /v1/experiments` posted as written: accepted, and the experiment
succeeds."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import CONFIGS, REPO, need_chromium

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    need_chromium(CHROMIUM)  # before the server starts: without a browser there is nothing to render
    tmp = tmp_path_factory.mktemp("docs")
    port = _free_port()
    env = {**os.environ, "TASMOE_RESULTS_DIR": str(tmp / "results"), "TASMOE_CONFIGS_DIR": str(CONFIGS),
           "TASMOE_AUTH": "off", "TASMOE_LOG_LEVEL": "WARNING"}
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", "orchestrator", "--port", str(port)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "serve.log").read_text()[-2000:]
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(20)


def _render(url: str, tmp: Path) -> str:
    """The page's DOM after its scripts ran (Chromium headless, flags for a machine without the internet)."""
    need_chromium(CHROMIUM)
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp}", "--virtual-time-budget=10000", "--dump-dom", url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _text(dom: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", dom))


def test_the_docs_pages_load_no_asset_from_elsewhere(server: str) -> None:
    for page in ("/docs", "/redoc"):
        src = httpx.get(server + page).text
        urls = re.findall(r"""(?:src|href)=["']([^"']+)""", src) + re.findall(r"""url: ?['"]([^'"]+)""", src)
        assert urls and all(u.startswith("/") for u in urls), (page, urls)
        for u in urls:
            if "docs-static" in u:
                assert httpx.get(server + u).status_code == 200, u


def test_swagger_shows_the_example_and_it_succeeds_as_written(server: str, tmp_path: Path) -> None:
    dom = _render(f"{server}/docs#/orchestrator/orchestrator-create_experiment", tmp_path / "chrome")
    assert 'data-path="/v1/experiments/{exp_id}/retry"' in dom  # Swagger UI ran and drew the operations
    text = _text(dom)
    m = re.search(r"Example ValueSchema(\{.*?\n\})", text, re.S)
    assert m, text[:2000]
    example = json.loads(m.group(1))
    assert example["workload"] == "workload_quick.yaml"
    r = httpx.post(f"{server}/v1/experiments", json=example, timeout=60)
    assert r.status_code == 202, r.text
    exp = r.json()["id"]
    deadline = time.monotonic() + 300
    while True:
        view = httpx.get(f"{server}/v1/experiments/{exp}", timeout=30).json()
        if view["status"] not in {"queued", "running"}:
            break
        assert time.monotonic() < deadline, view
        time.sleep(1)
    assert view["status"] == "succeeded", view
    rows = httpx.get(f"{server}/v1/experiments/{exp}/results", timeout=30).json()["rows"]
    assert {r["scenario"] for r in rows} == set(example["scenarios"])


def test_redoc_renders_the_operations(server: str, tmp_path: Path) -> None:
    text = _text(_render(f"{server}/redoc", tmp_path / "chrome"))
    assert "/v1/experiments/{exp_id}/retry" in text  # ReDoc ran and drew the operations
    assert "Start an experiment" in text
