"""The embedded wiring gives back what it built: the peers' clients of the in-process services (their event loop
threads) end with the block that built them (issue 21: no hidden state, nothing left running)."""

from __future__ import annotations

import threading
from pathlib import Path

from services.orchestrator.apps import build_apps
from services.orchestrator.worker import compute_clients
from shared.peers import close_peers, peers_of
from shared.settings import Settings
from tests.conftest import CONFIGS


def _loops() -> int:
    return sum(t.name == "tasmoe-asgi-loop" and t.is_alive() for t in threading.enumerate())


def test_compute_clients_close_the_peers_they_wired(tmp_path: Path) -> None:
    settings = Settings(results_dir=tmp_path, configs_dir=CONFIGS)
    before = _loops()
    for _ in range(3):
        with compute_clients(settings) as clients:
            assert clients["workload"].get_json("/v1/models")["models"]
            assert _loops() >= before + 2  # the orchestrator's clients and the services' peers
    assert _loops() == before


def test_close_peers_closes_each_client_once_and_forgets_it(tmp_path: Path) -> None:
    apps = build_apps(Settings(results_dir=tmp_path, configs_dir=CONFIGS))
    peers = {id(peers_of(app)) for app in apps.values()}
    assert len(peers) == 1  # one client shared by the five services
    before = _loops()
    assert before >= 1
    close_peers(apps)
    assert _loops() == before - 1
    assert all(app.state.peers is None for app in apps.values())
    close_peers(apps)  # nothing left to close
