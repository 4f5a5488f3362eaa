"""Lowering benchmarks (``make bench``): GEMM costing versus SCALE-Sim's wall time, physicalizing a Mixtral window."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from services.lowering.costmodel import gemm_cost
from services.lowering.physicalize import physicalize_window
from services.lowering.synthetic import default_placement, synthetic_window
from shared.bench import BenchRow, fmt_s, time_call
from shared.configs.arch import ArchConfig
from shared.contracts.events import PhysicalState

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


def bench() -> list[BenchRow]:
    rows: list[BenchRow] = []
    med, _ = time_call(lambda: gemm_cost(1, 4096, 14336, array=(128, 128), dataflow="ws"), repeat=50)
    ref = _scalesim_wall_s("decode_m1_128x128_ws_CALC")
    note = f"SCALE-Sim took {ref:.0f} s for the same GEMM" if ref else "SCALE-Sim reference not found"
    rows.append(BenchRow("cost 1x4096x14336 GEMM on 128x128 (ws)", f"{fmt_s(med)} median of 50", "< 10 ms",
                         med < 10e-3, note))
    arch = ArchConfig()
    plc = default_placement(arch)
    lw = synthetic_window(0)
    freq = [2.0] * arch.mesh.n_cores
    med, _ = time_call(lambda: physicalize_window(0, lw, plc, None, PhysicalState(), arch, freq, 3.0, 1.0,
                                                  n_layers=32), repeat=20)
    rows.append(BenchRow("physicalize a Mixtral window (3 ms, 3 micro-batches x 32 layers)",
                         f"{fmt_s(med)} median of 20", "< 20 ms", med < 20e-3,
                         f"{len(lw.compute)} logical rows, {len(lw.memory)} memory rows (synthetic window)"))
    return rows


if __name__ == "__main__":  # pragma: no cover
    for r in bench():
        print(r)
