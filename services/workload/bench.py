"""Workload benchmarks (``make bench``): trace generation time, one window over HTTP (ASGI), streaming memory."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from services.workload.app import create_app
from services.workload.traces import generate_logical_traces, iter_windows
from shared.bench import BenchRow, fmt_s, time_call
from shared.client import async_asgi_client
from shared.configs import WorkloadConfig, load_workload
from shared.settings import Settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MIXTRAL = CONFIGS / "workload_mixtral_8x7b.yaml"
REPLAY = CONFIGS / "workload_mixtral_8x7b_replay.yaml"  # the same workload, routing replayed from the sample


def _with_steps(cfg: WorkloadConfig, steps: int) -> WorkloadConfig:
    return cfg.model_copy(update={"sequence": cfg.sequence.model_copy(update={"steps": steps})})


def _generate(cfg: WorkloadConfig) -> float:
    with tempfile.TemporaryDirectory() as d:
        med, _ = time_call(lambda: generate_logical_traces(cfg, d), repeat=3, warmup=1)
    return med


def _stream_peak(cfg: WorkloadConfig) -> int:
    """Peak bytes traced while walking every window of the streaming form (each window dropped after use)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        for w in iter_windows(cfg, 3.0):
            del w
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


async def _http_window(cfg: WorkloadConfig, n: int) -> tuple[float, float, int]:
    """(first window incl. routing, median of n later windows, response bytes) over httpx.ASGITransport."""
    settings = Settings()
    client = async_asgi_client("workload", create_app(settings), settings)
    try:
        r = await client.request("POST", "/v1/traces", json={"workload": cfg.model_dump(mode="json"),
                                                             "window_ms": 3.0})
        summary = r.json()
        tid, n_windows = summary["trace_id"], summary["n_windows"]
        t0 = time.perf_counter()
        await client.request("GET", f"/v1/traces/{tid}/windows/0")
        first = time.perf_counter() - t0
        samples = []
        size = 0
        for i in range(n):
            k = (i * 37) % n_windows
            t0 = time.perf_counter()
            resp = await client.request("GET", f"/v1/traces/{tid}/windows/{k}")
            samples.append(time.perf_counter() - t0)
            size = len(resp.content)
        return first, statistics.median(samples), size
    finally:
        await client.aclose()


async def _http_ir(model: str, n: int) -> tuple[float, int]:
    """(median of n, response bytes) of POST /v1/ir for a zoo model over httpx.ASGITransport."""
    settings = Settings()
    client = async_asgi_client("workload", create_app(settings), settings)
    try:
        samples, size = [], 0
        for _ in range(n + 1):
            t0 = time.perf_counter()
            r = await client.request("POST", "/v1/ir", json={"model": model})
            samples.append(time.perf_counter() - t0)
            size = len(r.content)
        return statistics.median(samples[1:]), size
    finally:
        await client.aclose()


def bench() -> list[BenchRow]:
    cfg = load_workload(MIXTRAL)
    rows: list[BenchRow] = []
    gen = _generate(cfg)
    rows.append(BenchRow(f"Mixtral default trace ({cfg.sequence.steps} steps) -> CSVs, generate_logical_traces",
                         f"{fmt_s(gen)} median of 3", "< 2 s", gen < 2.0, "configs/workload_mixtral_8x7b.yaml"))
    n_win = sum(1 for _ in iter_windows(cfg, 3.0))
    med, _ = time_call(lambda: sum(len(w.memory) for w in iter_windows(cfg, 3.0)), repeat=3, warmup=1)
    rows.append(BenchRow(f"Mixtral default trace, streaming iter_windows ({n_win} LogicalWindows of 3 ms)",
                         f"{fmt_s(med)} median of 3"))
    first, one, size = asyncio.run(_http_window(cfg, 50))
    rows.append(BenchRow("one window over HTTP (ASGI), GET /v1/traces/{id}/windows/{k}",
                         f"{fmt_s(one)} median of 50", "< 20 ms", one < 0.020,
                         f"{size / 1e3:.0f} kB JSON; first window incl. routing {fmt_s(first)}"))
    replay = load_workload(REPLAY)
    zipf_t: list[float] = []
    rep_t: list[float] = []
    for i in range(6):  # alternated, so a load change on the shared machine hits both alike; the first is warm-up
        z = time_call(lambda: sum(len(w.compute) for w in iter_windows(cfg, 3.0)), repeat=1, warmup=0)[0]
        r = time_call(lambda: sum(len(w.compute) for w in iter_windows(replay, 3.0)), repeat=1, warmup=0)[0]
        if i:
            zipf_t.append(z)
            rep_t.append(r)
    zipf_s, rep_s = statistics.median(zipf_t), statistics.median(rep_t)
    rows.append(BenchRow("routing replayed from a recorded trace vs drawn (Zipf), every window of the default run",
                         f"{fmt_s(rep_s)} vs {fmt_s(zipf_s)} (ratio {rep_s / zipf_s:.2f})", "ratio <= 1",
                         rep_s <= zipf_s, "iter_windows over every window of 3 ms, median of 5 alternated runs each; "
                                          "configs/workload_mixtral_8x7b_replay.yaml"))
    ir_s, ir_size = asyncio.run(_http_ir("deepseek-v3", 10))
    rows.append(BenchRow("POST /v1/ir, DeepSeek-V3 (61 layers, MLA, 256 experts), over HTTP (ASGI)",
                         f"{fmt_s(ir_s)} median of 10", "< 100 ms", ir_s < 0.100, f"{ir_size / 1e3:.0f} kB JSON"))
    _stream_peak(_with_steps(cfg, 10))  # first use: the model zoo's and the routing law's caches, not the stream
    p100 = _stream_peak(_with_steps(cfg, 100))
    p500 = _stream_peak(_with_steps(cfg, 500))
    rows.append(BenchRow("streaming peak memory (tracemalloc), 100 vs 500 steps",
                         f"{p100 / 2**20:.1f} MiB vs {p500 / 2**20:.1f} MiB", "no growth with steps",
                         p500 <= 1.2 * p100, f"ratio {p500 / p100:.2f}"))
    return rows


if __name__ == "__main__":  # pragma: no cover
    for row in bench():
        print(row)
