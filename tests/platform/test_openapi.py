"""The committed ``openapi/<service>.json`` files match what each service's app serves now (run ``make openapi``)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from services.root_app import openapi_text, write_openapi
from shared import SERVICES
from shared.settings import Settings

OPENAPI_DIR = Path(__file__).resolve().parents[2] / "openapi"


def _spec_settings(tmp_path: Path) -> Settings:
    return Settings.model_validate({"results_dir": tmp_path})


@pytest.mark.parametrize("service", SERVICES)
def test_committed_spec_matches_the_app(service: str, tmp_path: Path) -> None:
    path = OPENAPI_DIR / f"{service}.json"
    assert path.is_file(), f"openapi/{service}.json is missing: run make openapi"
    committed = path.read_text(encoding="utf-8")
    current = openapi_text(service, _spec_settings(tmp_path))
    if committed != current:
        diff = "".join(list(difflib.unified_diff(committed.splitlines(True), current.splitlines(True),
                                                 f"openapi/{service}.json (committed)", f"{service} app (now)"))[:60])
        pytest.fail(f"openapi/{service}.json differs from the {service} app's spec: run make openapi\n{diff}")


def test_no_stray_spec_files() -> None:
    stray = sorted(p.name for p in OPENAPI_DIR.glob("*.json") if p.stem not in SERVICES)
    assert not stray, f"openapi/ has files for no service: {stray}"


def test_written_specs_have_sorted_keys_and_the_service_title(tmp_path: Path) -> None:
    paths = write_openapi(tmp_path / "out", _spec_settings(tmp_path))
    assert [p.name for p in paths] == [f"{s}.json" for s in SERVICES]
    for service, path in zip(SERVICES, paths, strict=True):
        text = path.read_text(encoding="utf-8")
        spec = json.loads(text)
        assert spec["info"]["title"] == f"tasmoe-{service}"
        assert "/healthz" in spec["paths"]
        assert text == json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
