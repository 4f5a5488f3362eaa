"""An experiment's files over HTTP (issue 17, item 7): listed, downloaded whole or by range, zipped; confined to the
experiment's folder."""

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
