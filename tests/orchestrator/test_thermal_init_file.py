"""thermal.init: "<name>.json" (Science II, issue 15): a run starts from a thermal state file of the configs
directory, e.g. the thermal_final.json another run wrote; names only, never paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from services.orchestrator.local import run_local
from services.orchestrator.service import load_thermal_init
from shared.client import ServiceClients
from shared.configs import ArchConfig, load_arch
from shared.errors import BadInput, ConfigError
from shared.settings import Settings
from tests.conftest import CONFIGS
from tests.orchestrator import fakes


@pytest.mark.parametrize("name", ["../warm.json", "/etc/passwd.json", ".hidden.json", "warm.yaml", "a/b.json"])
def test_init_file_is_a_bare_json_name(name: str) -> None:
    with pytest.raises(ValueError):
        ArchConfig.model_validate({"thermal": {"init": name}})


def test_missing_or_bad_state_file_names_the_field(tmp_path: Path) -> None:
    arch = ArchConfig.model_validate({"thermal": {"init": "warm.json"}})
    with pytest.raises(BadInput) as exc:
        load_thermal_init(arch, configs_dir=tmp_path)
    assert exc.value.field == "arch.thermal.init"
    (tmp_path / "warm.json").write_text('{"t_ns": "later"}')
    with pytest.raises(BadInput) as exc:
        load_thermal_init(arch, configs_dir=tmp_path)
    assert exc.value.field == "arch.thermal.init" and "not a thermal state" in exc.value.message
    assert load_thermal_init(ArchConfig(), configs_dir=tmp_path) is None


def test_a_run_starts_from_another_runs_final_state(settings: Settings, tmp_path: Path) -> None:
    """Run A (fakes) writes thermal_final.json; run B names it in thermal.init and its first window starts there:
    warmer than run A's own first window, which started at ambient."""
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    s = settings.model_copy(update={"configs_dir": configs})
    clients = ServiceClients(s, asgi_apps=fakes.build_apps(s))
    base = load_arch(configs / "arch_8x8_32x32x8.yaml")
    cold = base.model_copy(update={"thermal": base.thermal.model_copy(update={"init": "ambient"})})
    (configs / "arch_cold.yaml").write_text(json.dumps(cold.model_dump(mode="json")))
    a = run_local(arch=configs / "arch_cold.yaml", workload=configs / "workload_mixtral_8x7b.yaml",
                  tas=configs / "tas_params.yaml", out=tmp_path / "a", windows=6, settings=s, clients=clients,
                  scenarios=["baseline"], database_url=f"sqlite:///{tmp_path / 'a.sqlite3'}")
    assert a.ok, a.errors
    final = tmp_path / "a" / "runs" / "baseline" / "thermal_final.json"
    state = json.loads(final.read_text())
    assert state["window"] == -1 and state["field_b64"]
    shutil.copy(final, configs / "warm.json")
    warm = base.model_copy(update={"thermal": base.thermal.model_copy(update={"init": "warm.json"})})
    (configs / "arch_warm.yaml").write_text(json.dumps(warm.model_dump(mode="json")))
    b = run_local(arch=configs / "arch_warm.yaml", workload=configs / "workload_mixtral_8x7b.yaml",
                  tas=configs / "tas_params.yaml", out=tmp_path / "b", windows=1, settings=s, clients=clients,
                  scenarios=["baseline"], database_url=f"sqlite:///{tmp_path / 'b.sqlite3'}")
    clients.close()
    assert b.ok, b.errors
    row_a = (tmp_path / "a" / "baseline" / "mixtral-8x7b.csv").read_text().splitlines()[1].split(",")
    row_b = (tmp_path / "b" / "baseline" / "mixtral-8x7b.csv").read_text().splitlines()[1].split(",")
    # T_avg (column 4) of B's first window starts from A's last field: warmer than A's average from ambient
    assert float(row_b[4]) > float(row_a[4])
    (configs / "arch_path.yaml").write_text("thermal: {init: ../configs/warm.json}\n")
    with pytest.raises(ConfigError):  # a path in a config file is refused when it is loaded
        load_arch(configs / "arch_path.yaml")
