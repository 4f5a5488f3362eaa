"""Run data registered once per run and named by hash (issue 21, item 3): the real compute services forget it in
the middle of a run (their LRUs cleared, as a restart, an eviction or another replica would), the pipeline registers
it again and repeats the window's requests once, and the run's files are byte-identical to an undisturbed run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.orchestrator import repository as repo
from services.orchestrator.boundary_bytes import Counting
from services.orchestrator.service import create_experiment, resolve_spec
from services.orchestrator.settings import OrchestratorSettings
from services.orchestrator.window_loop import run_scenario
from services.orchestrator.worker import compute_clients
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator.conftest import Db
from tests.orchestrator.test_window_loop import _tree, small_request


def _calls(app: Counting, key: str) -> int:
    return app.tally.paths.get(key, [0, 0])[0]


def test_services_forgetting_the_run_data_mid_run_change_nothing(sqlite: Db, settings: Settings,
                                                                 tmp_path: Path) -> None:
    from services.thermal import model as thermal_models

    settings = OrchestratorSettings(**{**settings.model_dump(), "epoch_windows": 2})  # windows 3+ in later epochs
    spec = resolve_spec(small_request(scenarios=["tas"], plots=False), configs_dir=CONFIGS)
    ref, _ = create_experiment(sessions=sqlite.sessions, spec=spec, settings=settings, out_dir=tmp_path / "ref")
    ref_apps: dict[str, Counting] = {}
    apps: dict[str, Counting] = {}

    def counting(into: dict[str, Counting]) -> Any:
        def count(name: str, app: Any) -> Counting:
            into[name] = Counting(app)
            return into[name]
        return count

    with compute_clients(settings, wrap=counting(ref_apps)) as clients:
        assert run_scenario(repo.run_id_for(ref, "tas"), clients, sqlite.sessions).status == "succeeded"

    def forget(_r: str, k: int, _n: int) -> bool:
        if k == 2:
            apps["lowering"].app.state.run_data.clear()
            apps["placement"].app.state.run_data.clear()
            thermal_models.MODELS.clear()
        return True

    exp, _ = create_experiment(sessions=sqlite.sessions, spec=spec, settings=settings, out_dir=tmp_path / "forgot")
    with compute_clients(settings, wrap=counting(apps)) as clients:
        out = run_scenario(repo.run_id_for(exp, "tas"), clients, sqlite.sessions, on_window=forget)
    assert out.status == "succeeded", out.error
    assert out.windows_run == 8
    # registered once at the start and once more after window 2; every other epoch named them by hash only
    for service, path in (("lowering", "/v1/registry/placements"), ("lowering", "/v1/registry/archs"),
                          ("placement", "/v1/registry/placements"), ("placement", "/v1/registry/influence"),
                          ("placement", "/v1/registry/tacs-params"), ("placement", "/v1/registry/archs")):
        assert _calls(ref_apps[service], f"POST {path}") == 1, (service, path)
        assert _calls(apps[service], f"POST {path}") == 2, (service, path)
    assert _calls(ref_apps["thermal"], "POST /v1/models") == 2  # H for TAPS/TACS, the run data
    assert _calls(apps["thermal"], "POST /v1/models") == 3  # and once more
    # the next epoch's first request to each service was answered 404 once, then repeated
    for service, key in (("lowering", "POST /v1/physicalize/epoch"), ("placement", "POST /v1/tacs/epoch"),
                         ("thermal", "POST /v1/step/epoch")):
        assert _calls(ref_apps[service], key) > 4  # the epochs and the warm-up pass's
        assert _calls(apps[service], key) == _calls(ref_apps[service], key) + 1, key
        assert apps[service].tally.sent > ref_apps[service].tally.sent
    assert _tree(tmp_path / "forgot") == _tree(tmp_path / "ref")
