"""Lowering benchmarks (``make bench``): GEMM costing versus SCALE-Sim's wall time, physicalizing a Mixtral window."""

from __future__ import annotations

import csv
import functools
import os
from pathlib import Path

from services.lowering.costmodel import gemm_cost
from services.lowering.physical import physicalize_window
from services.lowering.synthetic import default_placement, synthetic_window
from shared.bench import BenchRow, fmt_s, time_call
from shared.client import ServiceClients
from shared.configs.arch import ArchConfig
from shared.contracts.events import PhysicalState
from shared.contracts.workload import LogicalWindow

REFERENCE = Path(os.environ.get("TASMOE_REFERENCE_DIR", Path(__file__).resolve().parents[3] / "shared" / "reference"))


def _scalesim_wall_s(run: str) -> float | None:
    path = REFERENCE / "scalesim" / "scalesim_gemm.csv"
    if not path.is_file():
        return None
    with path.open() as fh:
        for r in csv.DictReader(fh):
            if r["run"] == run and r.get("wall_s"):
                return float(r["wall_s"])
    return None


def bench(clients: ServiceClients | None = None) -> list[BenchRow]:
    """``clients``: the services (``make bench`` runs them in process); the Mixtral windows come from the workload
    service through them."""
    rows: list[BenchRow] = []
    med, _ = time_call(lambda: gemm_cost(1, 4096, 14336, array=(128, 128), dataflow="ws"), repeat=50)
    ref = _scalesim_wall_s("decode_m1_128x128_ws_CALC")
    note = f"SCALE-Sim took {ref:.0f} s for the same GEMM" if ref else "SCALE-Sim reference not found"
    rows.append(BenchRow("cost 1x4096x14336 GEMM on 128x128 (ws)", f"{fmt_s(med)} median of 50", "< 10 ms",
                         med < 10e-3, note))
    arch = ArchConfig()
    plc = default_placement(arch)
    windows, source = _mixtral_windows(12, clients)
    freq = [2.0] * arch.mesh.n_cores
    lw = windows[0]
    med, _ = time_call(lambda: physicalize_window(0, lw, plc, None, PhysicalState(), arch, freq, 3.0, 1.0),
                       repeat=20)
    rows.append(BenchRow("physicalize a Mixtral window (3 ms, 3 micro-batches x 32 layers), empty queue",
                         f"{fmt_s(med)} median of 20", "<= 15 ms", med <= 15e-3,
                         f"{len(lw.compute)} logical rows, {len(lw.memory)} memory rows ({source})"))
    # later windows: the queue carries the open and running work of the earlier ones (default admission, and 16
    # micro-batches in flight: the largest state this bench knows)
    for label, a in (("default admission", arch),
                     ("16 micro-batches in flight", ArchConfig.model_validate({"schedule": {"max_open_mb": 16}}))):
        st = PhysicalState()
        for k, w in enumerate(windows[:-1]):
            st = physicalize_window(k, w, plc, None, st, a, freq, 3.0, 1.0)[2]
        k_last, last = len(windows) - 1, windows[-1]
        med, _ = time_call(functools.partial(physicalize_window, k_last, last, plc, None, st, a, freq, 3.0, 1.0),
                           repeat=20)
        rows.append(BenchRow(f"physicalize Mixtral window {k_last}, carried state ({label})",
                             f"{fmt_s(med)} median of 20", "<= 15 ms", med <= 15e-3,
                             f"{len(st.queue.running_compute)} running pieces, {len(st.queue.open_compute)} open rows"))
    return rows


def _mixtral_windows(n: int, clients: ServiceClients | None) -> tuple[list[LogicalWindow], str]:
    """The first windows of the shipped Mixtral workload from the workload service (over HTTP), else synthetic ones
    (``clients`` None: the benchmark run alone)."""
    if clients is None:
        return [synthetic_window(k) for k in range(n)], "synthetic window"
    from shared.configs import load_workload

    cfg = load_workload(Path(__file__).resolve().parents[2] / "configs" / "workload_mixtral_8x7b.yaml")
    tid = clients["workload"].post_json("/v1/traces", {"workload": cfg.model_dump(mode="json"),
                                                       "window_ms": 3.0})["trace_id"]
    windows = [LogicalWindow.model_validate(clients["workload"].get_json(f"/v1/traces/{tid}/windows/{k}"))
               for k in range(n)]
    return windows, "configs/workload_mixtral_8x7b.yaml via the workload service"


if __name__ == "__main__":  # pragma: no cover
    for r in bench():
        print(r)
