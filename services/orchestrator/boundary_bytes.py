"""Bytes that cross each service boundary per window of a run (issue 21's goal: <= 200 kB per window), measured.

The compute services run in process (the embedded wiring), each wrapped in an ASGI counter of the request bodies it
receives and the response bodies it sends; a ``tas`` run of the default experiment walks ``windows`` windows on them.
The per-window figure divides by the windows run plus the warm-up pass's windows (both cross the same boundaries).

    python -m services.orchestrator.boundary_bytes [--windows 200]      # also a row of make bench
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

        async def counting_receive() -> Message:
            msg = await receive()
            if msg["type"] == "http.request":
                self.tally.sent += len(msg.get("body", b""))
            return msg

        async def counting_send(msg: Message) -> None:
            if msg["type"] == "http.response.body":
                self.tally.received += len(msg.get("body", b""))
            await send(msg)

        await self.app(scope, counting_receive, counting_send)


def measure(windows: int = 200, scenario: Scenario = "tas") -> tuple[dict[str, Tally], int]:
    """({service: tally}, windows stepped incl. the warm-up) of the first ``windows`` windows of one scenario of the
    default experiment."""
    tmp = Path(tempfile.mkdtemp(prefix="tasmoe-bytes-"))
    settings = Settings(results_dir=tmp / "results", configs_dir=REPO / "configs")
    wrapped: dict[str, Counting] = {}

    def count(name: str, app: Any) -> Counting:
        wrapped[name] = Counting(app)
        return wrapped[name]

    with compute_clients(settings, wrap=count) as clients:
        res = run_local(arch=REPO / "configs/arch_8x8_32x32x8.yaml",
                        workload=REPO / "configs/workload_mixtral_8x7b.yaml", tas=REPO / "configs/tas_params.yaml",
                        out=tmp / "out", scenarios=[scenario], windows=windows,
                        settings=settings, clients=clients, traces=False,
                        database_url=f"sqlite:///{tmp / 'db.sqlite3'}")
    stepped = wrapped["thermal"].tally.calls  # about one /v1/step per window, warm-up included
    return {name: w.tally for name, w in wrapped.items()}, max(stepped, sum(res.windows.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--windows", type=int, default=200, help="windows of the tas run (default: %(default)s)")
    args = ap.parse_args(argv)
    tallies, n = measure(args.windows)
    total = 0
    for name, t in tallies.items():
        per = (t.sent + t.received) / n
        total += t.sent + t.received
        print(f"{name:10s} in {t.sent / n / 1e3:8.1f} kB  out {t.received / n / 1e3:8.1f} kB  per window "
              f"({t.calls} calls)  {per / 1e3:.1f} kB")
    print(f"all boundaries: {total / n / 1e3:.1f} kB per window over {n} windows")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
