"""An experiment's files over HTTP: listed, downloaded whole or by range, zipped; confined to the experiment's folder;
every file-system error a 4xx on a connection that stays open."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from services.orchestrator import artefacts
from services.orchestrator import repository as repo
from services.orchestrator.app import create_app
from shared.errors import BadInput, NotFound
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator.fakes import RecordingDispatcher


@pytest.fixture()
def exp(tmp_path: Path) -> Iterator[tuple[TestClient, str, Path]]:
    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    with TestClient(create_app(settings, dispatcher=RecordingDispatcher())) as c:
        exp_id = c.post("/v1/experiments", json={"workload": "workload_quick.yaml", "scenarios": ["baseline"]}
                        ).json()["id"]
        with c.app.state.rt.sessions() as s:  # type: ignore[attr-defined]
            out = Path(repo.get_experiment(session=s, exp_id=exp_id).out_dir)  # type: ignore[union-attr]
        (out / "baseline").mkdir(parents=True)
        (out / "baseline" / "mixtral.csv").write_bytes(b"scenario,T\nbaseline,51.39\n")
        (out / "plots").mkdir()
        (out / "plots" / "temperature.png").write_bytes(bytes(range(256)) * 40)
        (tmp_path / "secret.txt").write_text("not yours")
        (out / "leak.txt").symlink_to(tmp_path / "secret.txt")
        yield c, exp_id, out


def test_list_download_range_and_archive(exp: tuple[TestClient, str, Path]) -> None:
    c, exp_id, out = exp
    files = c.get(f"/v1/experiments/{exp_id}/files").json()["files"]
    assert {f["path"]: f["bytes"] for f in files} == {"baseline/mixtral.csv": 26, "plots/temperature.png": 10240}
    r = c.get(f"/v1/experiments/{exp_id}/files/baseline/mixtral.csv")
    assert r.status_code == 200 and r.content == (out / "baseline" / "mixtral.csv").read_bytes()
    r = c.get(f"/v1/experiments/{exp_id}/files/plots/temperature.png", headers={"Range": "bytes=1000-1099"})
    assert r.status_code == 206 and r.content == (out / "plots" / "temperature.png").read_bytes()[1000:1100]
    assert r.headers["Content-Range"] == "bytes 1000-1099/10240"
    z = zipfile.ZipFile(io.BytesIO(c.get(f"/v1/experiments/{exp_id}/archive").content))
    assert sorted(z.namelist()) == [f"{exp_id}/baseline/mixtral.csv", f"{exp_id}/plots/temperature.png"]
    assert z.read(f"{exp_id}/baseline/mixtral.csv") == (out / "baseline" / "mixtral.csv").read_bytes()


def test_nothing_outside_the_folder(exp: tuple[TestClient, str, Path]) -> None:
    c, exp_id, out = exp
    assert c.get(f"/v1/experiments/{exp_id}/files/leak.txt").status_code == 422  # a symlink leading out
    assert c.get(f"/v1/experiments/{exp_id}/files/%2E%2E/%2E%2E/secret.txt").status_code in {404, 422}
    assert c.get(f"/v1/experiments/{exp_id}/files/nope.csv").status_code == 404
    assert c.get("/v1/experiments/exp-000000000000/files").status_code == 404
    for bad in ("../secret.txt", "/etc/passwd", "baseline/../../secret.txt", "a\x00b"):
        with pytest.raises(BadInput):
            artefacts.resolve_file(out, bad)
    with pytest.raises(NotFound):
        artefacts.resolve_file(out, "baseline")  # a folder is not a file


def test_every_file_system_error_is_a_4xx(exp: tuple[TestClient, str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    c, exp_id, out = exp
    (out / "loop-a").symlink_to(out / "loop-b")
    (out / "loop-b").symlink_to(out / "loop-a")
    cases = {"a" * 256: (422, "File name too long"), "baseline/" + "b" * 300 + "/x.csv": (422, "File name too long"),
             "baseline": (404, "is a folder"), "baseline/": (404, "is a folder"),
             "baseline/mixtral.csv/x": (404, "no file"), "loop-a": (422, "symbolic links"),
             "a/" * 2100 + "x": (422, "")}
    for path, (status, words) in cases.items():
        r = c.get(f"/v1/experiments/{exp_id}/files/{path}")
        assert r.status_code == status, (path[:40], r.text)
        assert r.json()["error"]["field"] == "path" and words in r.json()["error"]["message"], r.text
    for errno_, status in ((13, 403), (1, 403), (5, 404), (36, 422)):  # EACCES, EPERM, EIO, ENAMETOOLONG
        def refuse(self: Path, *_: object, _e: int = errno_, **__: object) -> object:
            raise OSError(_e, "refused")

        with monkeypatch.context() as m:
            m.setattr(Path, "open", refuse)
            r = c.get(f"/v1/experiments/{exp_id}/files/baseline/mixtral.csv")
        assert r.status_code == status and r.json()["error"]["field"] == "path", (errno_, r.text)
    with monkeypatch.context() as m:  # a file that vanishes while the folder is walked is left out
        real_stat = Path.stat

        def vanishing(self: Path, **kw: bool) -> object:
            if self.name == "temperature.png":
                raise FileNotFoundError(2, "gone")
            return real_stat(self, **kw)

        m.setattr(Path, "stat", vanishing)
        listed = c.get(f"/v1/experiments/{exp_id}/files")
    assert listed.status_code == 200 and [f["path"] for f in listed.json()["files"]] == ["baseline/mixtral.csv"]


def test_a_refused_file_leaves_the_connection_open(tmp_path: Path) -> None:
    """Over a real socket: a name too long used to answer 500 and the server then closed the keep-alive connection
    (the client's next request on it failed with a reset). Each answer here arrives on one connection."""
    import http.client
    import json

    from tests.orchestrator.instances import serve_app

    settings = Settings(results_dir=tmp_path / "results", configs_dir=CONFIGS)
    with serve_app(create_app(settings, dispatcher=RecordingDispatcher())) as base:
        host, port = base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)

        def get(path: str, method: str = "GET", body: bytes | None = None) -> int:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status

        body = b'{"workload": "workload_quick.yaml", "scenarios": ["baseline"]}'
        assert get("/v1/experiments", "POST", body) == 202
        conn.request("GET", "/v1/experiments")
        exp_id = str(json.loads(conn.getresponse().read())["items"][0]["id"])
        out = tmp_path / "results" / exp_id
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.csv").write_bytes(b"a,b\n1,2\n")
        files = f"/v1/experiments/{exp_id}/files"
        statuses = [get(f"{files}/{'n' * 256}"), get(f"{files}/summary.csv"), get(f"{files}/{'n' * 256}"),
                    get(f"/v1/experiments/{exp_id}"), get(f"{files}/summary.csv/x"),
                    get(f"/v1/experiments/{exp_id}/archive")]
        assert statuses == [422, 200, 422, 200, 404, 200]
        conn.close()
