"""Helpers for the platform tests: free loopback ports and a real uvicorn server in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


def free_port() -> int:
    """A loopback port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_in_thread(app: Any, port: int, *, start_delay_s: float = 0.0) -> Iterator[uvicorn.Server]:
    """Run ``app`` under a real uvicorn on 127.0.0.1:``port`` in a daemon thread (optionally starting late, so a
    client's first attempts meet a refused connection); stops it on exit."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))

    def run() -> None:
        time.sleep(start_delay_s)
        server.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        if start_delay_s == 0.0:
            deadline = time.monotonic() + 10.0
            while not server.started:
                if time.monotonic() > deadline or not thread.is_alive():
                    raise RuntimeError(f"uvicorn did not start on port {port}")
                time.sleep(0.01)
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)
