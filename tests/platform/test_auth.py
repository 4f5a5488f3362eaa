"""API keys, scopes, owners and quotas (issue 17, item 1; shared/auth.py, shared/service_app.AuthMiddleware)."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.cli import main
from services.orchestrator.app import create_app as create_orchestrator
from services.root_app import create_service
from shared.auth import KeyStore, check_bind, redact_paths
from shared.client import ServiceClients
from shared.errors import BadInput
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator.fakes import RecordingDispatcher


def _keyed(tmp_path: Path, **extra: Any) -> tuple[Settings, KeyStore]:
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS, auth="keys",
                        keys_file=tmp_path / "keys.json", **extra)
    return settings, KeyStore(tmp_path / "keys.json")


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_the_key_file_keeps_hashes_only(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    key = store.create("alice", "submit")
    text = (tmp_path / "keys.json").read_text()
    assert key not in text and key.split("_", 2)[2] not in text  # the secret may itself hold "_"
    assert stat.S_IMODE((tmp_path / "keys.json").stat().st_mode) == 0o600
    p = store.verify(key)
    assert p is not None and (p.name, p.scope) == ("alice", "submit")
    assert store.verify(key[:-1] + ("A" if key[-1] != "A" else "B")) is None  # one character off
    assert store.verify("tsk_00000000_" + "x" * 43) is None and store.verify("not a key") is None
    store.revoke(p.key_id or "")
    assert store.verify(key) is None
    assert [r["principal"] for r in store.records()] == ["alice"] and "sha256" not in store.records()[0]
    # the first start's admin key: only while no key is active, once however many services start
    first = store.first_admin_key()
    assert first is not None and store.verify(first) is not None and store.first_admin_key() is None
    # the deployment's service key, registered once
    made = "tsk_0badcafe_" + "s" * 43
    store.ensure(made, "service", "admin")
    store.ensure(made, "service", "admin")
    assert [r["id"] for r in store.records()].count("0badcafe") == 1 and store.verify(made) is not None
    with pytest.raises(BadInput, match="TASMOE_SERVICE_KEY"):
        store.ensure("secret", "service", "admin")


def test_a_compute_service_needs_a_key_of_the_right_scope(tmp_path: Path) -> None:
    settings, store = _keyed(tmp_path)
    reader, submitter = store.create("r", "read"), store.create("s", "submit")
    with TestClient(create_service("workload", settings)) as c:
        assert c.get("/healthz").status_code == 200  # public: probes carry no key
        spec = c.get("/openapi.json").json()
        assert spec["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
        r = c.get("/v1/models")
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        assert r.json()["error"]["field"] == "Authorization"
        assert c.get("/v1/models", headers=_h("tsk_12345678_" + "a" * 43)).status_code == 401
        assert c.get("/v1/models", headers=_h(reader)).status_code == 200
        # a path that merely ends like a public one is not public
        assert c.get("/v1/models/docs").status_code == 401 and c.get("/v1/traces/healthz").status_code == 401
        body = {"model": "mixtral-8x7b"}
        r = c.post("/v1/ir", json=body, headers=_h(reader))
        assert r.status_code == 403 and "read" in r.json()["error"]["message"]
        assert c.post("/v1/ir", json=body, headers=_h(submitter)).status_code == 200


def test_service_to_service_calls_carry_the_service_key(tmp_path: Path) -> None:
    settings, store = _keyed(tmp_path)
    service_key = store.create("service", "admin")
    app = create_service("workload", settings)
    with TestClient(app):
        ok = ServiceClients(settings.model_copy(update={"service_key": service_key}), asgi_apps={"workload": app})
        assert ok["workload"].request("GET", "/v1/models").json()["models"]
        ok.close()
        bare = ServiceClients(settings, asgi_apps={"workload": app})
        with pytest.raises(Exception, match="API key"):
            bare["workload"].request("GET", "/v1/models")
        bare.close()


@pytest.fixture()
def orchestrator(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    settings, store = _keyed(tmp_path)
    keys = {"alice": store.create("alice", "submit"), "bob": store.create("bob", "submit"),
            "admin": store.create("root", "admin")}
    with TestClient(create_orchestrator(settings, dispatcher=RecordingDispatcher())) as c:
        yield c, keys


def _body(**kw: Any) -> dict[str, Any]:
    return {"workload": "workload_quick.yaml", "scenarios": ["baseline"], **kw}


def test_experiments_belong_to_their_principal(orchestrator: tuple[TestClient, dict[str, str]]) -> None:
    c, keys = orchestrator
    r = c.post("/v1/experiments", json=_body(), headers=_h(keys["alice"]))
    assert r.status_code == 202, r.text
    exp = r.json()["id"]
    assert c.get(f"/v1/experiments/{exp}", headers=_h(keys["alice"])).status_code == 200
    for path in ("", "/results", "/log", "/power"):  # another principal: as if it did not exist
        assert c.get(f"/v1/experiments/{exp}{path}", headers=_h(keys["bob"])).status_code == 404, path
    assert c.post(f"/v1/experiments/{exp}/cancel", headers=_h(keys["bob"])).status_code == 404
    assert c.get("/v1/experiments", headers=_h(keys["bob"])).json()["total"] == 0
    assert c.get("/v1/experiments", headers=_h(keys["alice"])).json()["total"] == 1
    everyone = c.get("/v1/experiments", headers=_h(keys["admin"])).json()
    assert everyone["total"] == 1
    # the owner sees no server path; the admin sees where the files are
    mine = c.get(f"/v1/experiments/{exp}", headers=_h(keys["alice"])).json()
    assert not mine["out_dir"].startswith("/") and everyone["items"][0]["out_dir"].startswith("/")
    # an Idempotency-Key is the principal's own: not a way into another's experiment, nor a hint that another used
    # it; two principals use the same key independently, each replay answering its own experiment
    k = {"Idempotency-Key": "same-key"}
    a = c.post("/v1/experiments", json=_body(), headers={**_h(keys["alice"]), **k})
    b = c.post("/v1/experiments", json=_body(), headers={**_h(keys["bob"]), **k})
    assert a.status_code == b.status_code == 202 and a.json()["created"] and b.json()["created"]
    assert a.json()["id"] != b.json()["id"]
    for who, first in (("alice", a), ("bob", b)):
        again = c.post("/v1/experiments", json=_body(), headers={**_h(keys[who]), **k})
        assert again.status_code == 202 and again.json()["id"] == first.json()["id"] and not again.json()["created"]
    r = c.post("/v1/experiments", json=_body(scenarios=["tas"]), headers={**_h(keys["bob"]), **k})
    assert r.status_code == 409 and r.json()["error"]["field"] == "Idempotency-Key"  # its own key, another body


def test_a_principal_over_its_quota_gets_429_with_retry_after(tmp_path: Path) -> None:
    settings, store = _keyed(tmp_path)
    from services.orchestrator.settings import OrchestratorSettings

    osettings = OrchestratorSettings(**settings.model_dump(), quota_active_runs=3)
    alice, bob = store.create("alice", "submit"), store.create("bob", "submit")
    with TestClient(create_orchestrator(osettings, dispatcher=RecordingDispatcher())) as c:
        two = _body(scenarios=["baseline", "tas"])
        assert c.post("/v1/experiments", json=two, headers=_h(alice)).status_code == 202
        r = c.post("/v1/experiments", json=two, headers=_h(alice))  # 2 queued + 2 > 3
        assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
        assert r.json()["error"]["code"] == "quota" and "TASMOE_QUOTA_ACTIVE_RUNS" in r.json()["error"]["message"]
        assert c.post("/v1/experiments", json=two, headers=_h(bob)).status_code == 202  # per principal
        r = c.post("/v1/sweeps", json={"base": _body(), "grid": {"seed": [1, 2, 3, 4]}}, headers=_h(bob))
        assert r.status_code == 429


def test_logs_reach_non_admins_without_server_paths() -> None:
    text = "config /srv/tasmoe/results/exp-1/runs/tas/run.log written; python /usr/lib/python3.11/x.py ok"
    out = redact_paths(text)
    assert "/srv" not in out and "/usr" not in out and "run.log" in out and "x.py" in out


def test_without_keys_the_services_listen_on_loopback_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    check_bind("127.0.0.1", "off")
    check_bind("::1", "off")
    check_bind("0.0.0.0", "keys")
    with pytest.raises(BadInput, match="TASMOE_AUTH=keys"):
        check_bind("0.0.0.0", "off")
    monkeypatch.delenv("TASMOE_AUTH", raising=False)
    assert main(["serve", "workload", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0" in err and err.count("\n") == 1


def test_tasmoe_keys_create_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = str(tmp_path / "k.json")
    assert main(["keys", "create", "--scope", "admin", "--principal", "ops", "--file", f]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("tsk_")
    rows = json.loads(Path(f).read_text())["keys"]
    assert rows[0]["principal"] == "ops" and rows[0]["scope"] == "admin"
    assert main(["keys", "list", "--file", f]) == 0
    assert "ops" in capsys.readouterr().out
    assert main(["keys", "revoke", rows[0]["id"], "--file", f]) == 0
    assert KeyStore(Path(f)).verify(key) is None
    assert main(["keys", "create", "--principal", "no spaces", "--file", f]) == 2


def test_keys_are_checked_under_one_port_too(tmp_path: Path) -> None:
    """`tasmoe serve all`: every service mounted below /<service>; its health and docs stay public, the rest not."""
    from services.root_app import create_root_app

    settings, store = _keyed(tmp_path)
    key = store.create("r", "read")
    with TestClient(create_root_app(settings)) as c:
        assert c.get("/workload/healthz").status_code == 200
        assert c.get("/workload/openapi.json").status_code == 200
        assert c.get("/workload/v1/models").status_code == 401
        assert c.get("/workload/v1/models", headers=_h(key)).status_code == 200
