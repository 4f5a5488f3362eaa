"""The dashboard as a researcher uses it: a real ``tasmoe serve all`` (real services) and headless Chromium
(Debian's package; ``.ci/run`` installs it) driven over the DevTools protocol (``scripts/cdp.py``): the page lists
the experiments, shows the API's own message at the field a bad form names, submits ``workload_quick.yaml`` by its
file name and draws its heat maps from the event stream, shows the peak of the result CSV at the window the series
has it, draws TACS's migrations of the hand-made hot spot as arrows (the seed's chip makes no TACS move:
docs/operations.md, "The dashboard"), offers the Chrome trace, and, with keys on, opens nothing of another
principal's."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.cdp import Chromium, chromium_binary
from scripts.ui_screenshots import HOT_CORE, hot_spot_request, hot_spot_thot, serve, wait_done
from shared.auth import KeyStore
from tests.conftest import need_chromium

pytestmark = pytest.mark.slow
_STATE: dict[str, float] = {}  # the hot spot's Thot, derived once in the first test (a 20-window baseline run)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    need_chromium(chromium_binary())  # before the server starts: without a browser there is nothing to drive
    with serve(tmp_path_factory.mktemp("dash") / "results") as base:
        yield base


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Chromium]:
    need_chromium(chromium_binary())
    with Chromium(tmp_path / "chrome") as b:
        yield b
        errors = [m for m in b.messages if m.startswith(("exception", "console.error"))
                  or ("Content Security Policy" in m)]
        assert not errors, errors


def _api(server: str) -> str:
    return f"{server}/orchestrator/v1"


def _form(b: Chromium, js: str) -> Any:
    return b.evaluate(f"(() => {{ const f = document.getElementById('new-experiment'); {js} }})()")


def test_list_form_stream_and_the_numbers(server: str, browser: Chromium) -> None:
    b, api = browser, _api(server)
    thot = hot_spot_thot(api)  # an experiment in the list (and the next test's Thot)
    b.goto(f"{server}/")  # the front door links the dashboard
    b.evaluate("document.querySelector('a[href=\"orchestrator/ui/\"]').click()")
    b.wait_for("!!document.querySelector('#experiments tbody tr[data-status=succeeded]')")
    assert "hot spot" in b.evaluate("document.getElementById('experiments').textContent")

    # a bad field: the API's message, at the field it names
    b.goto(f"{server}/orchestrator/ui/#/new")
    b.wait_for("!!document.querySelector('[data-path=\"tas.tacs.thresholds.Thot\"]')")
    _form(b, """f.querySelector('select[name=workload]').value = 'workload_quick.yaml';
        f.querySelector('select[name=workload]').dispatchEvent(new Event('change'));
        const t = f.querySelector('[data-path="tas.tacs.thresholds.Thot"]'); t.value = '40';
        t.dispatchEvent(new Event('input', {bubbles: true})); f.requestSubmit();""")
    box = "document.getElementById('form-error')"
    shown = b.wait_for(f"!{box}.hidden && {box}.textContent")
    tas = httpx.get(f"{api}/configs/tas_params.yaml").json()["config"]
    tas["tacs"]["thresholds"]["Thot"] = 40
    direct = httpx.post(f"{api}/experiments", json={"workload": "workload_quick.yaml", "tas": tas}).json()["error"]
    assert shown == direct["message"] and "ambient" in shown
    assert direct["field"] == "tas.tacs.thresholds.Thot"
    assert b.evaluate("document.querySelector('.invalid').dataset.path") == direct["field"]
    assert b.evaluate(f"document.querySelector('.field-error[data-for=\"{direct['field']}\"]').textContent") == shown

    # the quick workload by its file name (the TAS section back to its preset: sent by name too)
    _form(b, """f.querySelector('select[name=tas]').dispatchEvent(new Event('change'));
        for (const c of f.querySelectorAll('input[name=scenarios]')) c.checked = ['baseline', 'tas'].includes(c.value);
        f.querySelector('[name=name]').value = 'quick, from the form';""")
    for section in ("arch", "workload", "tas"):  # untouched: each sent by its file name
        b.wait_for(f"document.querySelector('[data-section={section}] .muted').textContent === 'sent by its file name'")
    _form(b, "f.requestSubmit();")
    exp = b.wait_for("location.hash.startsWith('#/exp/') && location.hash.slice(6)", timeout_s=60)
    spec = httpx.get(f"{api}/experiments/{exp}").json()
    assert spec["name"] == "quick, from the form" and [r["scenario"] for r in spec["runs"]] == ["baseline", "tas"]
    log = httpx.get(f"{api}/experiments/{exp}/log").text
    assert '"steps": 2,' in log and '"step_interval_ms": 300.0' in log  # workload_quick.yaml's two micro-batches
    # its heat maps follow the stream: a scenario's map redrawn from at least two frames, at two windows
    seen: dict[str, set[str]] = {}
    deadline = time.monotonic() + 600
    while b.evaluate("document.querySelector('.badge').textContent") != "succeeded":
        got = b.evaluate("[...document.querySelectorAll('canvas.logic')].filter(c => c.dataset.source === 'stream')"
                         ".map(c => [c.dataset.scenario, c.dataset.window])")
        for sc, w in got or []:
            seen.setdefault(sc, set()).add(w)
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    frames = b.evaluate("Math.max(...[...document.querySelectorAll('canvas.logic')]"
                        ".map(c => +(c.dataset.frames || 0)))")
    assert frames >= 2 and max(len(ws) for ws in seen.values()) >= 2, (frames, seen)

    # finished: the peak shown is the CSV's, at the window the series has it
    b.wait_for("!!document.querySelector('#results tr[data-scenario=tas]')", timeout_s=60)
    text = httpx.get(f"{api}/experiments/{exp}/results", params={"format": "csv"}).text
    rows = list(csv.DictReader(io.StringIO(text)))
    for row in rows:
        sc = row["scenario"]
        wins = httpx.get(f"{api}/experiments/{exp}/windows", params={"scenario": sc, "fields": "T_peak_logic"}
                         ).json()["scenarios"][sc]
        peak = max(w["T_peak_logic"] for w in wins)
        at = next(w["window"] for w in wins if w["T_peak_logic"] == peak)
        shown_peak = b.evaluate(f"document.querySelector('.scenario[data-scenario={sc}] .peak-logic').dataset.value")
        shown_at = b.evaluate(f"document.querySelector('.scenario[data-scenario={sc}] .peak-logic').dataset.window")
        assert float(shown_peak) == pytest.approx(float(row["T_peak_logic"]), abs=0.005) and int(shown_at) == at
        assert float(row["T_peak_logic"]) == pytest.approx(peak, abs=1e-4)
        cell = b.evaluate(f"document.querySelector('#results tr[data-scenario={sc}] "
                          "td[data-col=T_peak_logic]').dataset.value")
        assert float(cell) == pytest.approx(float(row["T_peak_logic"]))
    # replay: the scrubber reads a stored window back; the maps are that window's
    b.evaluate("(() => { const s = document.getElementById('scrub'); s.value = 7; "
               "s.dispatchEvent(new Event('input')); })()")
    b.wait_for("[...document.querySelectorAll('canvas.logic')]"
               ".every(c => c.dataset.window === '7' && c.dataset.source === 'replay')")
    w7 = httpx.get(f"{api}/experiments/{exp}/windows", params={"scenario": "tas", "offset": 7, "limit": 1}).json()
    hottest = max(w7["scenarios"]["tas"][0]["temps_core_c"])
    assert b.evaluate("document.querySelector('canvas.logic[data-scenario=tas]').dataset.max") == f"{hottest:.2f}"
    assert b.evaluate("document.getElementById('clock').dataset.mode") == "replay"
    # no events kept: the trace button says how to get them
    b.evaluate("document.getElementById('trace-go').click()")
    msg = "document.getElementById('trace-msg')"
    assert b.wait_for(f"['ok', 'error'].includes({msg}.dataset.status) && {msg}.dataset.status") == "error"
    assert '"events": true' in b.evaluate(f"{msg}.textContent")
    assert b.evaluate("document.querySelectorAll('.figures img').length") >= 1
    _STATE["thot"] = thot


def test_tacs_migrations_are_drawn_as_arrows(server: str, browser: Chromium) -> None:
    b, api = browser, _api(server)
    thot = _STATE.get("thot") or hot_spot_thot(api)
    exp = httpx.post(f"{api}/experiments", json=hot_spot_request(["tacs"], thot, events=True), timeout=120).json()["id"]
    b.goto(f"{server}/orchestrator/ui/#/exp/{exp}")
    arrows = b.wait_for("+(document.querySelector('canvas.expert-map[data-scenario=tacs]') || {dataset: {}})"
                        ".dataset.arrows", timeout_s=600)
    assert arrows >= 1
    assert wait_done(api, exp)["status"] == "succeeded"
    overlay = httpx.get(f"{api}/experiments/{exp}/files/runs/tacs/runtime/overlay_migrate.csv").text
    moved = [r for r in csv.DictReader(io.StringIO(overlay)) if r["obj_type"] == "expert"]
    assert moved and all(r["src"] == str(HOT_CORE) for r in moved)  # the premise: TACS moved experts off the hot core
    listed = b.wait_for("[...document.querySelectorAll('.scenario[data-scenario=tacs] ul.moves li[data-kind=migrate]')]"
                        ".map(li => li.textContent).join('\\n')", timeout_s=60)
    assert any(f"{r['obj_id']} core {HOT_CORE} → {r['dst']}" in listed for r in moved), listed
    # the schedule of a window range as a Chrome trace, from the page's link
    b.evaluate("document.getElementById('trace-go').click()")
    msg = "document.getElementById('trace-msg')"
    assert b.wait_for(f"['ok', 'error'].includes({msg}.dataset.status) && {msg}.dataset.status") == "ok"
    assert "perfetto" in b.evaluate(f"{msg}.textContent")
    r = httpx.get(f"{api}/experiments/{exp}/trace", params={"scenario": "tacs", "start": 0, "count": 5})
    assert any(e["ph"] == "X" and e["tid"] == HOT_CORE for e in r.json()["traceEvents"])
    # the front door's /docs: Swagger UI drawn from the service's own assets, the orchestrator's operations
    b.goto(f"{server}/docs")
    b.wait_for("!!document.querySelector('[data-path=\"/v1/experiments/{exp_id}/retry\"]')")


def test_with_keys_another_principals_experiment_is_out_of_reach(tmp_path: Path, browser: Chromium) -> None:
    store = KeyStore(tmp_path / "keys.json")
    alice, bob = store.create("alice", "submit"), store.create("bob", "submit")
    env = {"TASMOE_AUTH": "keys", "TASMOE_KEYS_FILE": str(tmp_path / "keys.json"),
           "TASMOE_SERVICE_KEY": store.create("service", "admin")}
    with serve(tmp_path / "results", "orchestrator", env) as base:
        api = f"{base}/v1"
        ha, hb = ({"Authorization": f"Bearer {k}"} for k in (alice, bob))
        r = httpx.post(f"{api}/experiments", json={"workload": "workload_quick.yaml", "scenarios": ["baseline"]},
                       headers=ha, timeout=120)
        assert r.status_code == 202, r.text
        mine = r.json()["id"]
        httpx.post(f"{api}/experiments/{mine}/cancel", headers=ha, timeout=60)
        token = httpx.get(f"{api}/experiments/{mine}/token", headers=ha).json()["token"]
        theirs = httpx.post(f"{api}/experiments", json={"workload": "workload_quick.yaml", "scenarios": ["baseline"]},
                            headers=hb, timeout=120).json()["id"]
        httpx.post(f"{api}/experiments/{theirs}/cancel", headers=hb, timeout=60)
        b = browser
        b.goto(f"{base}/ui/")
        b.wait_for("document.getElementById('notice').textContent.includes('API key')")  # 401 until a key is given
        b.evaluate(f"(() => {{ document.getElementById('key').value = {json.dumps(bob)}; "
                   "document.getElementById('key-form').requestSubmit(); })()")
        b.wait_for(f"!!document.querySelector('#experiments tr[data-id=\"{theirs}\"]')")
        assert mine not in b.evaluate("document.getElementById('experiments').textContent")
        b.goto(f"{base}/ui/#/exp/{mine}")
        b.wait_for("document.getElementById('notice').textContent.includes('no experiment')")
        # from the page: alice's token opens neither bob's experiment nor its stream
        codes = b.evaluate(f"""Promise.all([
            fetch('../v1/experiments/{theirs}?token={token}').then(r => r.status),
            fetch('../v1/experiments/{theirs}/events?frames=true&token={token}').then(r => r.status),
            fetch('../v1/experiments/{mine}?token={token}').then(r => r.status)])""")
        assert codes == [401, 401, 200]
        b.messages.clear()  # the refused fetches above log as errors by design
