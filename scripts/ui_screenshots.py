"""The screenshots of the dashboard (``docs/dashboard_live.png``, ``docs/dashboard_replay.png``: README.md and
docs/operations.md, "The dashboard"), taken by headless Chromium (``scripts/cdp.py``) from a real ``tasmoe serve all``:

- live: the seed's chip (``configs/arch_seed.yaml``), the default workload cut to 600 windows, the four scenarios
  side by side while they run;
- replay: the hand-made hot spot (every expert of Mixtral-8x7B on core 27, Thot just above the hottest other core:
  `hot_spot_request`), baseline against tacs, scrubbed to a window where TACS has just migrated experts.

``.venv/bin/python -m scripts.ui_screenshots [--out docs]`` (~5 min on two cores). The hot spot is also what the
browser test uses to see a migration drawn: TACS makes no move on the seed's chip (docs/operations.md,
"The dashboard")."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from scripts.cdp import Chromium
from shared.configs import load_tas, load_workload

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
HOT_CORE = 27
TERMINAL = {"succeeded", "failed", "cancelled"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(results: Path, service: str = "all", env: dict[str, str] | None = None) -> Iterator[str]:
    """``tasmoe serve <service>`` on a free loopback port, results under ``results``; its base URL."""
    port = free_port()
    full = {**os.environ, "TASMOE_RESULTS_DIR": str(results), "TASMOE_CONFIGS_DIR": str(CONFIGS),
            "TASMOE_AUTH": "off", "TASMOE_LOG_LEVEL": "WARNING", **(env or {})}
    results.mkdir(parents=True, exist_ok=True)
    log = (results / f"serve-{port}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", service, "--port", str(port)],
                            cwd=REPO, env=full, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((results / f"serve-{port}.log").read_text()[-3000:])
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait_done(api: str, exp_id: str, timeout_s: float = 900.0, headers: dict[str, str] | None = None
              ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        view: dict[str, Any] = httpx.get(f"{api}/experiments/{exp_id}", headers=headers, timeout=30).json()
        if view["status"] in TERMINAL or time.monotonic() > deadline:
            return view
        time.sleep(1)


def hot_spot_request(scenarios: list[str], thot: float | None = None, events: bool = False) -> dict[str, Any]:
    """Every expert of Mixtral-8x7B on core 27 under the seed's arrivals (one micro-batch a millisecond) for 60 ms
    (20 windows), ``Thot`` (and ``Temg`` 5 K above) as given: tests/orchestrator/test_hotspot_tacs.py's set-up."""
    wl = load_workload(CONFIGS / "workload_mixtral_8x7b_saturated.yaml")
    wl = wl.model_copy(update={"sequence": wl.sequence.model_copy(update={"steps": 60})})
    tas = load_tas(CONFIGS / "tas_params.yaml").model_dump(mode="json")
    if thot is not None:
        tas["tacs"]["thresholds"] = {"Thot": thot, "Temg": thot + 5.0}
    experts = {f"L{layer}E{e}": {"cores": [HOT_CORE]} for layer in range(32) for e in range(8)}
    return {"workload": wl.model_dump(mode="json"), "tas": tas, "scenarios": scenarios, "events": events,
            "placement": {"experts": experts}, "name": f"hot spot on core {HOT_CORE}"}


def hot_spot_thot(api: str, headers: dict[str, str] | None = None) -> float:
    """Thot just above the hottest other core of the hot spot's baseline run (0.5 K), as the TACS test derives it."""
    r = httpx.post(f"{api}/experiments", json=hot_spot_request(["baseline"]), headers=headers, timeout=120)
    r.raise_for_status()
    exp = r.json()["id"]
    assert wait_done(api, exp, headers=headers)["status"] == "succeeded"
    wins = httpx.get(f"{api}/experiments/{exp}/windows", params={"fields": "temps_core_c"}, headers=headers,
                     timeout=60).json()["scenarios"]["baseline"]
    others = max(t for w in wins for c, t in enumerate(w["temps_core_c"]) if c != HOT_CORE)
    return round(float(others) + 0.5, 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1250)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tasmoe-shots-"))
    with serve(tmp / "results") as base, Chromium(tmp / "chrome", width=args.width, height=args.height) as b:
        api = f"{base}/orchestrator/v1"
        ui = f"{base}/orchestrator/ui/"
        thot = hot_spot_thot(api)
        hot = httpx.post(f"{api}/experiments", json=hot_spot_request(["baseline", "tacs"], thot, events=True),
                         timeout=120).json()["id"]
        assert wait_done(api, hot)["status"] == "succeeded"
        seed = httpx.post(f"{api}/experiments", timeout=120, json={
            "arch": "arch_seed.yaml", "windows": 600, "name": "the seed's chip, 600 windows"}).json()["id"]
        b.goto(f"{ui}#/exp/{seed}")
        b.wait_for("[...document.querySelectorAll('canvas.logic')].filter(c => +c.dataset.frames >= 2).length >= 2",
                   timeout_s=900, poll_s=1)
        time.sleep(2)
        b.screenshot(args.out / "dashboard_live.png", full_page=False)
        print(f"wrote {args.out / 'dashboard_live.png'}")
        moves = httpx.get(f"{api}/experiments/{hot}/map", params={"scenario": "tacs", "span": 100}).json()["moves"]
        first = min(min(m["window"] for m in moves if m["kind"] == "migrate") + 4, 19)
        b.resize(args.width, 1900)  # the replay: maps, timelines, trace, results
        b.goto(f"{ui}#/exp/{hot}")
        b.wait_for("!!document.querySelector('#results')", timeout_s=120)
        b.evaluate(f"(() => {{ const s = document.getElementById('scrub'); s.value = {first}; "
                   "s.dispatchEvent(new Event('input')); })()")
        b.wait_for(f"document.querySelector('canvas.expert-map[data-scenario=tacs]').dataset.window == {first}")
        time.sleep(1.5)
        b.screenshot(args.out / "dashboard_replay.png", full_page=False)
        print(f"wrote {args.out / 'dashboard_replay.png'}")
        httpx.post(f"{api}/experiments/{seed}/cancel", timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
