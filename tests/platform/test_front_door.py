"""`tasmoe serve all` as a front door: a landing page at its root (the dashboard, every service's offline docs),
`/docs` there the orchestrator's, `/v1` there the orchestrator's API, and every URL a mounted service hands out
(``Location``, its docs' assets and spec) carrying the mount's prefix. The dashboard's files: served by the
orchestrator from its own package (no CDN, no inline script, a content security policy), public, and holding no
secret."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from services.orchestrator.app import UI_DIR
from services.root_app import create_root_app
from shared import SERVICES
from shared.auth import KeyStore
from shared.settings import Settings
from tests.conftest import CONFIGS


def _cancel_at(client: TestClient, location: str) -> None:
    assert client.post(f"{location}/cancel").status_code == 200


def test_the_root_is_a_landing_page_and_every_url_carries_its_prefix(settings: Settings) -> None:
    with TestClient(create_root_app(settings)) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        links = set(re.findall(r'href="([^"]+)"', page.text))
        assert "orchestrator/ui/" in links
        assert {f"{n}/docs" for n in SERVICES} | {f"{n}/redoc" for n in SERVICES} <= links
        for link in links:  # relative links: they resolve under any prefix, and every one answers
            assert not link.startswith(("/", "http")), link
            assert c.get(f"/{link}").status_code == 200, link
        # /docs at the root: the orchestrator's docs (the root's own were a blank page: CDN assets, /healthz only)
        r = c.get("/docs", follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == "/orchestrator/docs"
        docs = c.get("/orchestrator/docs").text
        assets = re.findall(r"""(?:src|href)=["']([^"']+)|url: ?['"]([^'"]+)""", docs)
        urls = [a or b for a, b in assets]
        assert urls and all(u.startswith("/orchestrator/") for u in urls), urls
        assert all(c.get(u).status_code == 200 for u in urls)
        spec = c.get("/orchestrator/openapi.json").json()
        assert spec["servers"] == [{"url": "/orchestrator"}] and "/v1/experiments" in spec["paths"]
        assert "/ui/" in spec["info"]["description"]  # the dashboard is linked from the API description
        # a new experiment's Location is followable where it was created: under the prefix, and at the root
        body = {"workload": "workload_quick.yaml", "scenarios": ["baseline"]}
        r = c.post("/orchestrator/v1/experiments", json=body)
        assert r.status_code == 202 and r.headers["location"] == f"/orchestrator/v1/experiments/{r.json()['id']}"
        assert r.json()["location"] == r.headers["location"]
        assert c.get(r.headers["location"]).json()["id"] == r.json()["id"]
        _cancel_at(c, r.headers["location"])
        r = c.post("/v1/experiments", json=body)
        assert r.status_code == 202 and r.headers["location"] == f"/v1/experiments/{r.json()['id']}"
        assert c.get(r.headers["location"]).json()["id"] == r.json()["id"]
        _cancel_at(c, r.headers["location"])
        assert c.get("/v1/experiments").json()["total"] == 2
        sweep = c.post("/orchestrator/v1/sweeps", json={"base": {**body, "windows": 200},
                                                       "grid": {"seed": [1]}})
        assert sweep.headers["location"] == f"/orchestrator/v1/sweeps/{sweep.json()['id']}"
        for exp in sweep.json()["experiments"]:
            _cancel_at(c, f"/v1/experiments/{exp}")
        # the dashboard: under the prefix, and at the root too
        r = c.get("/orchestrator/ui", follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == "/orchestrator/ui/"
        for path in ("/orchestrator/ui/", "/ui/"):
            r = c.get(path)
            assert r.status_code == 200 and "js/main.js" in r.text
            assert "default-src 'self'" in r.headers["content-security-policy"]


def test_the_dashboard_is_public_and_its_data_is_not(tmp_path: Path) -> None:
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS, auth="keys",
                        keys_file=tmp_path / "keys.json")
    key = KeyStore(tmp_path / "keys.json").create("alice", "read")
    with TestClient(create_root_app(settings)) as c:
        assert c.get("/").status_code == 200
        for f in sorted(UI_DIR.rglob("*")):
            if f.is_file():
                assert c.get(f"/orchestrator/ui/{f.relative_to(UI_DIR).as_posix()}").status_code == 200, f
        assert c.get("/orchestrator/v1/experiments").status_code == 401
        assert c.get("/v1/experiments").status_code == 401
        assert c.get("/v1/experiments", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert c.get("/orchestrator/uix").status_code == 401  # only the dashboard's own paths are public


def test_the_dashboard_loads_nothing_from_elsewhere_and_holds_no_secret() -> None:
    files = {f.relative_to(UI_DIR).as_posix(): f.read_text(encoding="utf-8") for f in UI_DIR.rglob("*") if f.is_file()}
    assert {"index.html", "style.css", "js/main.js", "js/api.js", "js/run.js"} <= set(files)
    html = files["index.html"]
    refs = re.findall(r"""(?:src|href)=["']([^"']+)""", html)
    assert all(not r.startswith(("http:", "https:", "//", "/")) for r in refs), refs
    assert "<script>" not in html and "style=" not in html  # no inline script or style (the CSP forbids them)
    for name, text in files.items():
        assert "tsk_" not in text and "Bearer tsk" not in text, name  # no key in the page
        if name.endswith(".js"):
            imports = re.findall(r"""^import .* from ['"]([^'"]+)['"]""", text, re.M)
            assert all(i.startswith("./") for i in imports), (name, imports)
            assert not re.search(r"""fetch\(['"]https?:""", text), name
        assert "cdn" not in text.lower(), name
