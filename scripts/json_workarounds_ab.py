"""What the JSON work-arounds still buy: the first N windows of the default experiment, embedded (the `make bench`
set-up), with them (``fast``) or without (``none``: FastAPI's own request parsing instead of `JsonBodyRoute`, and no
`gc.freeze` in the window loop; ``plain`` / ``nofreeze``: one of the two). One process per call, so the service apps
are built with the variant's route class; alternate the variants and compare runs of one session::

    for v in fast none fast none; do python -m scripts.json_workarounds_ab 1000 $v; done

Prints one JSON line: the variant, the wall time and each scenario's time in the window loop (s)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("fast", "none", "plain", "nofreeze")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="json_workarounds_ab")
    ap.add_argument("windows", type=int, help="windows per scenario (the first N of the default experiment)")
    ap.add_argument("variant", choices=VARIANTS)
    args = ap.parse_args(argv)
    if args.windows < 1:
        ap.error("windows must be >= 1")
    if args.variant in ("none", "plain"):  # before any service app is imported: their routers take this class
        import fastapi.routing

        import shared.service_app

        shared.service_app.JsonBodyRoute = fastapi.routing.APIRoute  # type: ignore[misc,assignment]
    if args.variant in ("none", "nofreeze"):
        import services.orchestrator.window_loop as window_loop

        window_loop.freeze_heap = lambda: None
    from services.orchestrator.jobs import start_method
    from services.orchestrator.local import run_local

    if start_method() != "fork":  # a spawned worker would import the services afresh: the fast path, whatever asked
        ap.error("the variants need the run workers forked from this process (it runs threads already)")
    from shared.settings import Settings

    with tempfile.TemporaryDirectory(prefix="json-ab-") as d:
        tmp = Path(d)
        settings = Settings(results_dir=tmp / "results", configs_dir=REPO / "configs")
        t0 = time.perf_counter()
        res = run_local(arch=REPO / "configs/arch_8x8_32x32x8.yaml",
                        workload=REPO / "configs/workload_mixtral_8x7b.yaml", tas=REPO / "configs/tas_params.yaml",
                        out=tmp / "mixtral", settings=settings, windows=args.windows,
                        database_url=f"sqlite:///{tmp / 'run.sqlite3'}")
        wall = time.perf_counter() - t0
    print(json.dumps({"variant": args.variant, "windows": args.windows, "wall_s": round(wall, 1),
                      "loop_s": {k: round(v, 1) for k, v in res.compute_s.items()}, "ok": res.ok}))
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
