"""How many windows TACS needs to bring the hand-made hot spot under Thot: the set-up of
``tests/orchestrator/test_hotspot_tacs.py`` (every Mixtral expert on core 27, the seed's arrivals, Thot 0.5 K above
the hottest other core of a short baseline run), run for N windows as baseline and tacs; prints JSON.

    .venv/bin/python -m scripts.hotspot_report 1000 [--lookahead N] [--power-over window]

To compare with another commit, copy this file into a checkout of it and run it there (it uses only the test's
``_derived_thot``, ``_run``, ``_tas`` and ``HOT``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import tests.orchestrator.test_hotspot_tacs as hs
from shared.settings import Settings
from tests.conftest import CONFIGS


def report(n_windows: int, lookahead: int = 0, power_over: str = "residency") -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="hotspot-"))
    settings = Settings(results_dir=tmp / "results", configs_dir=CONFIGS)
    thot = hs._derived_thot(tmp / "a", settings)
    tas = hs._tas(thot)
    changes: dict[str, Any] = {}  # only what differs from the test's set-up (so the file runs on older commits)
    if lookahead:
        changes["lookahead_windows"] = lookahead
    if power_over != "residency":
        changes["power_over"] = power_over
    if changes:
        tas = tas.model_copy(update={"tacs": tas.tacs.model_copy(update=changes)})
    res = hs._run(tmp / "b", settings, ["baseline", "tacs"], tas, windows=n_windows)
    out: dict[str, Any] = {"thot_c": thot, "windows": n_windows, "lookahead_windows": lookahead,
                           "power_over": power_over}
    for sc, (rows, _) in res.items():
        hot = [float(m["temps_core_c"][hs.HOT]) for m in rows]
        peak = [float(m["T_peak_logic"]) for m in rows]
        # the first window from which the hot core stays under Thot to the end (None: it never does)
        under = next((k for k in range(len(hot)) if all(t < thot for t in hot[k:])), None)
        out[sc] = {"migrations": sum(int(m["migrations"]) for m in rows),
                   "windows_hot_core_at_or_above_thot": sum(t >= thot for t in hot),
                   "under_thot_from_window": under, "hot_core_last30_c": sum(hot[-30:]) / len(hot[-30:]),
                   "hot_core_max_c": max(hot), "peak_last30_c": max(peak[-30:]),
                   "tokens": sum(int(m["tokens_completed"]) for m in rows)}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("windows", nargs="?", type=int, default=150)
    ap.add_argument("--lookahead", type=int, default=0, help="TACS's lookahead_windows (default 0: reactive)")
    ap.add_argument("--power-over", choices=("residency", "window"), default="residency",
                    help="TACS's power_over: the pending energy over the residency (default) or over the window")
    args = ap.parse_args()
    print(json.dumps(report(args.windows, args.lookahead, args.power_over), indent=1))
