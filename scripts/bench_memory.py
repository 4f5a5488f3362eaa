"""`make bench`, "request memory": the memory one request can take, per service, at the request body limit.

Each service runs as an operator runs it (``tasmoe serve <service>``, a fresh process for every measurement) and gets
one worst-case body of exactly ``TASMOE_MAX_BODY_MB`` over HTTP; the row is the process's peak RSS growth during that
request (``VmHWM`` after it, reset before it through ``/proc/<pid>/clear_refs``, minus ``VmRSS`` before it) divided
by the body's size, the median of ``--repeat`` processes. The bodies are the worst each JSON bound lets through
(`shared.body_guard`; the bounds are read from the environment as the services read them):

- unknown keys: as many unique unknown keys at the body's top level as ``TASMOE_MAX_JSON_KEYS`` allows;
- deep nesting: arrays ``TASMOE_MAX_JSON_DEPTH`` deep, and as many empty arrays inside as ``TASMOE_MAX_JSON_VALUES``
  allows, under a key of the request's (a free-form one where the request has one);
- numbers: as many ``0`` as ``TASMOE_MAX_JSON_VALUES`` allows in a ``list[float]`` field of the request (a JSON
  integer becomes a Python float there: 32 bytes for 2), the other fields valid.

Each body is padded with spaces to the limit (spaces cost nothing parsed). Linux only (``/proc``).

``python -m scripts.bench_memory [--repeat N] [--only SERVICE ...]`` prints the rows.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from shared import SERVICES
from shared.auth import KeyStore
from shared.bench import BenchRow
from shared.settings import Settings

GOAL = 10.0  # peak RSS growth per body byte
MiB = 2**20


@dataclass(frozen=True)
class Case:
    """One worst-case body for one route: ``make(n)`` is a body of ``n`` items, spaces not included."""

    service: str
    path: str
    kind: str  # "unknown keys", "deep nesting", "numbers"
    items: str  # what is counted, for the row's name
    make: Callable[[int], bytes]


def _keys(n: int) -> bytes:
    return b"{" + b",".join(b'"k%08d":0' % i for i in range(n)) + b"}"


def _numbers(prefix: bytes, suffix: bytes) -> Callable[[int], bytes]:
    return lambda n: prefix + b",".join([b"0"] * n) + suffix


def _deep(key: bytes, depth: int, prefix: bytes = b"{", suffix: bytes = b"}", outer: int = 1) -> Callable[[int], bytes]:
    inner = depth - outer - 1  # `outer` objects around, then arrays: the empty arrays sit at depth `depth`
    return lambda n: (prefix + b'"' + key + b'":' + b"[" * inner + b",".join([b"[]"] * n) + b"]" * inner + suffix)


_WINDOW = (b'{"window":0,"t_start_ms":0,"dt_ms":3,"temps_bank_c":[],"T_peak_logic":50,"T_peak_dram":50,'
           b'"T_mean_logic":50,"T_mean_dram":50,"power_w":1,"freq_ghz":[],"refresh_mhz":1,"bytes_moved":0,'
           b'"bw_eff_gbps":1,"noc_link_util":[],"tokens_completed":0,"latencies_ms":[],"queue_delay_ms":0,'
           b'"migrations":0,"oldest_inflight_ms":0,"temps_core_c":[')
_LOGICAL = b'{"window":0,"logical":{"trace_id":"t","window":0,"t0_ns":0,"t1_ns":1,"memory":{},"compute":{"flops":['
_PLACEMENT = b'{"placement":{"experts":{},"tensors":{},"meta":{"method":"m","predicted_core_temps_c":['

# service -> (route, its list[float] field as prefix/suffix, the key the deep arrays go under)
ROUTES: dict[str, tuple[str, bytes, bytes, bytes]] = {
    "orchestrator": ("/v1/experiments", _PLACEMENT, b"]}}}", b"x"),
    "workload": ("/v1/ir", b'{"model":"mixtral-8x7b","config":{"x":[', b"]}}", b"config"),
    "placement": ("/v1/registry/influence", b'{"H":[[', b"]]}", b"x"),
    "lowering": ("/v1/physicalize", _LOGICAL, b"]}}}", b"x"),
    "thermal": ("/v1/solve", b'{"arch":{},"core_w":[', b"]}", b"x"),
    "metrics": ("/v1/reduce", b'{"scenario":"tas","workload":"w","thot_c":80,"windows":[' + _WINDOW, b"]}]}", b"x"),
}


def cases(service: str, limits: Settings) -> list[Case]:
    path, num_prefix, num_suffix, deep_key = ROUTES[service]
    deep = (_deep(b"x", limits.max_json_depth, b'{"model":"mixtral-8x7b","config":{', b"}}", outer=2)
            if deep_key == b"config"
            else _deep(deep_key, limits.max_json_depth))
    return [Case(service, path, "unknown keys", "unique unknown keys", _keys),
            Case(service, path, "deep nesting", f"empty arrays {limits.max_json_depth} deep", deep),
            Case(service, path, "numbers", "zeros in a list[float]", _numbers(num_prefix, num_suffix))]


def worst_body(case: Case, limits: Settings, size: int) -> tuple[bytes, int]:
    """The case's body with as many items as its bound allows and as fit in ``size`` bytes, padded with spaces to
    exactly ``size``; and the number of items."""
    # an empty array counts twice (one comma, one array: `shared.body_guard.Shape`)
    bound = {"unknown keys": limits.max_json_keys, "deep nesting": (limits.max_json_values - 256) // 2}.get(
        case.kind, limits.max_json_values - 256)
    per_item = max(1, len(case.make(1001)) - len(case.make(1000)))
    n = min(bound, (size - len(case.make(0))) // per_item)
    body = case.make(n)
    while len(body) > size:  # the estimate was one item too generous
        n -= 1
        body = case.make(n)
    return body[:-1] + b" " * (size - len(body)) + body[-1:], n


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Measured:
    status: int
    answer: str
    base_rss: int  # bytes before the request
    growth: int  # peak RSS during the request minus base_rss
    cpu_s: float


def measure(case: Case, body: bytes, warmup: bytes) -> Measured:
    """Start the service in a fresh process as a deployed lab runs it (``TASMOE_AUTH=keys``), warm its route with
    ``warmup``, post ``body`` with a researcher's key (scope ``submit``: an admin's requests are trusted and not
    walked along their model, ``shared.body_guard``), stop it."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="tasmoe-bench-memory-") as tmp:
        keys = Path(tmp) / "keys.json"
        key = KeyStore(keys).create("researcher", "submit")
        env = {**os.environ, "TASMOE_RESULTS_DIR": tmp, "TASMOE_LOG_LEVEL": "WARNING", "TASMOE_AUTH": "keys",
               "TASMOE_KEYS_FILE": str(keys)}
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", case.service, "--port", str(port)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600.0) as client:
                deadline = time.monotonic() + 120.0
                while True:
                    try:
                        if client.get("/healthz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"tasmoe serve {case.service} did not start")
                    time.sleep(0.1)
                client.post(case.path, content=warmup, headers=headers)
                time.sleep(0.2)
                Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
                before, cpu0 = _status(proc.pid)["VmRSS"], _cpu_s(proc.pid)
                r = client.post(case.path, content=body, headers=headers)
                after, cpu1 = _status(proc.pid)["VmHWM"], _cpu_s(proc.pid)
            return Measured(r.status_code, r.text[:120], before, after - before, cpu1 - cpu0)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def bench(services: list[str] | None = None, repeat: int = 3) -> list[BenchRow]:
    if not Path("/proc/self/clear_refs").exists():
        return [BenchRow("request memory", "not measured: needs Linux /proc (VmHWM, clear_refs)")]
    limits = Settings()
    size = int(limits.max_body_mb * MiB)
    rows: list[BenchRow] = []
    for service in services or list(SERVICES):
        for case in cases(service, limits):
            body, n = worst_body(case, limits, size)
            runs = [measure(case, body, case.make(100)) for _ in range(repeat)]
            growth = statistics.median(m.growth for m in runs)
            ratio = growth / len(body)
            last = runs[-1]
            rows.append(BenchRow(
                f"{service} POST {case.path}: {case.kind} ({n:,} {case.items}, {len(body) / MiB:.0f} MiB body)",
                f"{growth / MiB:.0f} MiB peak RSS growth, {ratio:.1f}x the body (median of {repeat} processes)",
                f"<= {GOAL:.0f}x", ratio <= GOAL,
                f"{last.status}: {last.answer!r}; {statistics.median(m.cpu_s for m in runs):.2f} s CPU; "
                f"RSS before {last.base_rss / MiB:.0f} MiB; growths "
                f"{', '.join(f'{m.growth / MiB:.0f}' for m in runs)} MiB"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench_memory")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per case (the row is their median)")
    ap.add_argument("--only", nargs="*", default=None, help="services to measure (default: all)")
    args = ap.parse_args(argv)
    for row in bench(args.only, args.repeat):
        print(f"| {row.name} | {row.value} | {row.target} | {row.met} | {row.note} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
