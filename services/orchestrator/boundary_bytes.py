"""Bytes that cross each service boundary per window of a run (goal: <= 200 kB per window), measured.

The compute services run in process (the embedded wiring), each wrapped in an ASGI counter of the request bodies it
receives and the response bodies it sends; a ``tas`` run of the default experiment walks ``windows`` windows on them.
The per-window figure divides everything (the run's set-up included: trace, placement, the capacity estimate, the
run data registered once) by the thermal steps: the windows run plus the warm-up pass's windows (both cross the same
boundaries).

    python -m services.orchestrator.boundary_bytes [--windows 200] [--paths] [--events]

In control epochs the states travel whole once per epoch (the thermal field, the physicalizer's queues, the replica
state), the thermal step takes each window's energy deposit instead of its events, and each window's logical events
go to the physicalizer (and to TACS in the TACS scenarios) once.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.orchestrator.local import run_local
from services.orchestrator.schemas import Scenario
from services.orchestrator.worker import compute_clients
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class Tally:
    sent: int = 0  # request bodies into the service
    received: int = 0  # response bodies out of it
    calls: int = 0
    paths: dict[str, list[int]] = field(default_factory=dict)  # "POST /v1/step": [calls, bytes in + out]

    def add(self, key: str, calls: int = 0, nbytes: int = 0) -> None:
        row = self.paths.setdefault(key, [0, 0])
        row[0] += calls
        row[1] += nbytes


@dataclass
class Counting:
    """An ASGI wrapper counting the body bytes in and out of one app."""

    app: Any
    tally: Tally = field(default_factory=Tally)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.tally.calls += 1
        key = f"{scope['method']} {_route(scope['path'])}"
        self.tally.add(key, calls=1)

        async def counting_receive() -> Message:
            msg = await receive()
            if msg["type"] == "http.request":
                self.tally.sent += len(msg.get("body", b""))
                self.tally.add(key, nbytes=len(msg.get("body", b"")))
            return msg

        async def counting_send(msg: Message) -> None:
            if msg["type"] == "http.response.body":
                self.tally.received += len(msg.get("body", b""))
                self.tally.add(key, nbytes=len(msg.get("body", b"")))
            await send(msg)

        await self.app(scope, counting_receive, counting_send)


def counting(wrapped: dict[str, Counting]) -> Callable[[str, Any], Counting]:
    """A ``wrap`` for `services.orchestrator.worker.compute_clients`: each app behind a `Counting`, kept in
    ``wrapped`` by service."""
    def count(name: str, app: Any) -> Counting:
        wrapped[name] = Counting(app)
        return wrapped[name]
    return count


def _route(path: str) -> str:
    """The path with its ids folded (``/v1/traces/<id>/windows/<k>``), so a path's calls add up."""
    parts = path.split("/")
    return "/".join("<id>" if any(c.isdigit() for c in p) and p not in ("v1",) else p for p in parts)


def measure(windows: int = 200, scenario: Scenario = "tas", *, events: bool = False
            ) -> tuple[dict[str, Tally], int]:
    """({service: tally}, windows stepped incl. the warm-up) of the first ``windows`` windows of one scenario of the
    default experiment, which writes its trace files; ``events``: it also writes the physical event files (the
    physicalizer then answers the events too: they cross once, lowering to orchestrator)."""
    tmp = Path(tempfile.mkdtemp(prefix="tasmoe-bytes-"))
    settings = Settings(results_dir=tmp / "results", configs_dir=REPO / "configs")
    wrapped: dict[str, Counting] = {}
    with compute_clients(settings, wrap=counting(wrapped)) as clients:
        res = run_local(arch=REPO / "configs/arch_8x8_32x32x8.yaml",
                        workload=REPO / "configs/workload_mixtral_8x7b.yaml", tas=REPO / "configs/tas_params.yaml",
                        out=tmp / "out", scenarios=[scenario], windows=windows,
                        settings=settings, clients=clients, events=events,
                        database_url=f"sqlite:///{tmp / 'db.sqlite3'}")
    stepped = wrapped["thermal"].tally.paths.get("POST /v1/step", [0, 0])[0]  # one per window, warm-up included
    return {name: w.tally for name, w in wrapped.items()}, max(stepped, sum(res.windows.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--windows", type=int, default=200, help="windows of the tas run (default: %(default)s)")
    ap.add_argument("--paths", action="store_true", help="also the bytes per window of each endpoint")
    ap.add_argument("--events", action="store_true", help="the run writes its physical events (they come back)")
    args = ap.parse_args(argv)
    tallies, n = measure(args.windows, events=args.events)
    total = 0
    for name, t in tallies.items():
        per = (t.sent + t.received) / n
        total += t.sent + t.received
        print(f"{name:10s} in {t.sent / n / 1e3:8.1f} kB  out {t.received / n / 1e3:8.1f} kB  per window "
              f"({t.calls} calls)  {per / 1e3:.1f} kB")
        if args.paths:
            for key, (calls, nbytes) in sorted(t.paths.items(), key=lambda kv: -kv[1][1]):
                print(f"    {key:40s} {calls:5d} calls  {nbytes / n / 1e3:8.1f} kB per window")
    print(f"all boundaries: {total / n / 1e3:.1f} kB per window over {n} windows")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
