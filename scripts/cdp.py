"""Headless Chromium driven over the Chrome DevTools Protocol: what the dashboard's browser test and the dashboard's
screenshots (``python -m scripts.ui_screenshots``) use to load a page, run JavaScript in it, wait for what it shows
and capture it as PNG.

Debian's ``chromium`` (``.ci/run`` installs it), started with the same flags as the docs test (no network beyond
the page's own server) and ``--remote-debugging-port=0``; the protocol is JSON over the WebSocket Chromium opens
(``websockets``' synchronous client, a dependency of uvicorn[standard] already). Console messages, uncaught
exceptions and browser log entries (a content-security-policy violation is one) are kept in ``messages``."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from websockets.sync.client import ClientConnection, connect

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--disable-dev-shm-usage")


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class CdpError(RuntimeError):
    pass


class Chromium:
    """One headless browser with one page. ``with Chromium(tmp) as b: b.goto(url); b.wait_for("js expression")``."""

    def __init__(self, user_data_dir: Path, *, width: int = 1400, height: int = 1000, binary: str | None = None,
                 timeout_s: float = 60.0) -> None:
        exe = binary or chromium_binary()
        if exe is None:
            raise CdpError("Chromium is not installed (apt-get install chromium; .ci/run does)")
        user_data_dir.mkdir(parents=True, exist_ok=True)
        self.messages: list[str] = []
        self._ids = itertools.count(1)
        self._proc = subprocess.Popen([exe, *FLAGS, "--remote-debugging-port=0", f"--user-data-dir={user_data_dir}",
                                       f"--window-size={width},{height}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = user_data_dir / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._proc.kill()
                raise CdpError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            targets = json.load(resp)
        page = next(t for t in targets if t.get("type") == "page")
        self._stack = ExitStack()  # the connection is a context manager (websockets >= 17.1)
        self._ws: ClientConnection = self._stack.enter_context(
            connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=timeout_s))
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.resize(width, height)

    def _note(self, event: dict[str, Any]) -> None:
        method, p = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            self.messages.append(f"console.{p.get('type')}: {text}")
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.messages.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Log.entryAdded":
            e = p.get("entry", {})
            self.messages.append(f"log.{e.get('level')}: {e.get('text')}")

    def call(self, method: str, timeout_s: float = 60.0, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its answer (events that arrive meanwhile are noted)."""
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError(f"{method}: no answer in {timeout_s} s")
            msg = json.loads(self._ws.recv(timeout=left))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise CdpError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            self._note(msg)

    def evaluate(self, expression: str, timeout_s: float = 60.0) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited); its exception raised."""
        got = self.call("Runtime.evaluate", timeout_s=timeout_s, expression=expression, awaitPromise=True,
                        returnByValue=True)
        if "exceptionDetails" in got:
            d = got["exceptionDetails"]
            raise CdpError(f"{expression[:80]}: {d.get('exception', {}).get('description') or d.get('text')}")
        return got.get("result", {}).get("value")

    def goto(self, url: str, timeout_s: float = 60.0) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout_s=timeout_s)

    def wait_for(self, expression: str, timeout_s: float = 60.0, poll_s: float = 0.25) -> Any:
        """Evaluate ``expression`` until it is truthy; its value. CdpError with the page's messages on a timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise CdpError(f"timed out waiting for {expression!r}; page messages: {self.messages[-10:]}")
            time.sleep(poll_s)

    def resize(self, width: int, height: int) -> None:
        """The page's viewport (CSS pixels)."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """The page as PNG (the whole document when ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.call("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": size["width"],
                                                            "height": size["height"], "scale": 1})
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
