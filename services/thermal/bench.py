"""Thermal benchmarks (``make bench``): the default stack (64 × 64 grid, logic + 8 DRAM + TIM + spreader + sink) and
the HotSpot reference cases. Ratios are measured in the same run (shared, noisy machine)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from services.thermal import hotspot, solvers
from services.thermal.model import StackModel, build_model
from services.thermal.service import thermal_epoch, thermal_step
from services.thermal.spectral import SpectralSolver
from shared.bench import BenchRow, fmt_s, time_call
from shared.configs import ArchConfig
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.energy import deposit_of_events

REFERENCE = Path(os.environ.get("TASMOE_REFERENCE_DIR", Path(__file__).resolve().parents[2].parent / "shared" /
                                "reference"))
HOTSPOT_STEADY_S = {"S8": (5.7, 6.6)}  # HotSpot's own SuperLU steady time per case on this machine (measured)


def _cpu_median(fn: object, repeat: int) -> float:
    """Median process CPU time of ``fn()`` (s): less sensitive than wall time to other jobs on a shared machine."""
    import statistics

    assert callable(fn)
    samples = []
    for _ in range(repeat):
        c0 = time.process_time()
        fn()
        samples.append(time.process_time() - c0)
    return statistics.median(samples)


def _default_power(model_cores: int, dies: int, banks: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return 0.5 + 2.0 * rng.random(model_cores), 0.002 + 0.002 * rng.random((dies, banks))


def bench_default_stack(window_ms: float = 1.0, repeat: int = 30) -> list[BenchRow]:
    """The default stack: building the model, the spectral factorisation, the window step (exponential and TR-BDF2)
    with its error, the sparse-LU oracle's step, and the service's step and epoch calls."""
    arch = ArchConfig()
    rows: list[BenchRow] = []
    med_build, _ = time_call(lambda: build_model(arch), repeat=5, warmup=1)
    rows.append(BenchRow("thermal: build StackModel, default stack 64x64x12", f"{fmt_s(med_build)} median of 5",
                         "< 0.5 s", med_build < 0.5))
    model = build_model(arch)
    fast = SpectralSolver(model.net)
    t0 = time.perf_counter()
    fast.factor(0.0)
    rows.append(BenchRow("thermal: spectral steady factorisation (once per model)", fmt_s(time.perf_counter() - t0)))
    core_w, bank_w = _default_power(model.n_cores, len(model.dram_layers), model.n_banks_per_layer)
    node_w = model.node_power(core_w, bank_w)
    T0 = solvers.steady(fast, node_w) - 5.0
    med_fast = 0.0
    for wms in (window_ms, 3.0):
        med_fast = _bench_window_step(rows, model, fast, T0, core_w, bank_w, node_w, wms, repeat)
    rows.extend(_bench_sparse_oracle(model, fast, T0, core_w, bank_w, node_w, med_fast, repeat))
    rows.extend(_bench_service_calls(arch))
    return rows


def _bench_window_step(rows: list[BenchRow], model: StackModel, fast: SpectralSolver, T0: np.ndarray,
                       core_w: np.ndarray, bank_w: np.ndarray, node_w: np.ndarray, wms: float, repeat: int) -> float:
    """One window of ``wms`` ms: the exponential step as the service runs it and TR-BDF2, timed, with their errors
    against the exact solution; appends two rows and returns the exponential step's median (s)."""
    arch = model.arch
    degree = arch.thermal.exp_degree
    dt = wms * 1e-3
    n_sub = model.substeps(dt)
    model.step(T0, core_w, bank_w, dt)  # factor for this dt, compile/load the kernels
    model.step_trbdf2(T0, core_w, bank_w, dt, n_sub)
    # errors against the exact solution (degree 14: 9e-14 relative) from two starts: T0 (the steady state - 5 K,
    # smooth: slow modes only) and ambient (this window's power switched on: every mode)
    starts = (T0, np.full(model.net.n_nodes, model.net.ambient))
    exact = [solvers.step_exponential(fast, T, node_w, dt, 14) for T in starts]

    def run_fast() -> object:
        return model.step(T0, core_w, bank_w, dt)

    def run_trbdf2() -> object:
        return model.step_trbdf2(T0, core_w, bank_w, dt, n_sub)

    med_fast, _ = time_call(run_fast, repeat=repeat)
    cpu_fast = _cpu_median(run_fast, repeat)
    med_tr, _ = time_call(run_trbdf2, repeat=repeat)
    err_fast = [float(np.abs(model.step(T, core_w, bank_w, dt) - ex).max())
                for T, ex in zip(starts, exact, strict=True)]
    err_tr = [float(np.abs(model.step_trbdf2(T, core_w, bank_w, dt, n_sub) - ex).max())
              for T, ex in zip(starts, exact, strict=True)]
    rows.append(BenchRow(f"thermal: transient window step {wms:g} ms, exponential (degree {degree}: "
                         f"{degree // 2} complex solves), spectral, as the service runs it (StackModel.step: "
                         "block powers -> modes)",
                         f"{fmt_s(med_fast)} median of {repeat} (CPU {fmt_s(cpu_fast)})", "< 2 ms",
                         med_fast < 2e-3, "max error vs the exact solution from steady - 5 K / from ambient: "
                         f"{err_fast[0]:.1e} / {err_fast[1]:.1e} K"))
    rows.append(BenchRow(f"thermal: same window, TR-BDF2 with {n_sub} sub-steps (integrator: trbdf2, "
                         f"max_substep_ms {arch.thermal.max_substep_ms:g})",
                         f"{fmt_s(med_tr)} median of {repeat} ({med_tr / med_fast:.1f}x the exponential step)",
                         "", None, "max error vs the exact solution from steady - 5 K / from ambient: "
                         f"{err_tr[0]:.1e} / {err_tr[1]:.1e} K"))
    return med_fast


def _bench_sparse_oracle(model: StackModel, fast: SpectralSolver, T0: np.ndarray, core_w: np.ndarray,
                         bank_w: np.ndarray, node_w: np.ndarray, med_fast: float, repeat: int) -> list[BenchRow]:
    """The same exponential step on the prefactored sparse LU (the oracle), default 3 ms window, against the
    spectral step (``med_fast``: its median, s)."""
    degree = model.arch.thermal.exp_degree
    dt = 3e-3
    oracle = solvers.SparseSolver(model.net)
    t0 = time.perf_counter()
    diff = float(np.abs(solvers.step_exponential(oracle, T0, node_w, dt, degree)
                        - model.step(T0, core_w, bank_w, dt)).max())
    t_fac = time.perf_counter() - t0
    med_nodes, _ = time_call(lambda: solvers.step_exponential(fast, T0, node_w, dt, degree), repeat=repeat)
    med_sparse, _ = time_call(lambda: solvers.step_exponential(oracle, T0, node_w, dt, degree), repeat=3)
    ratio = med_sparse / med_fast
    return [
        BenchRow("thermal: same step from a node power vector (solvers.step_exponential: + DCT of the power)",
                 f"{fmt_s(med_nodes)} median of {repeat}"),
        BenchRow("thermal: same step (3 ms window), prefactored sparse LU",
                 f"{fmt_s(med_sparse)} median of 3 (factorisations {fmt_s(t_fac)})", "", None,
                 f"max |spectral - sparse| = {diff:.1e} K"),
        BenchRow("thermal: spectral vs prefactored sparse-LU step (3 ms window)", f"{ratio:.0f}x", ">= 20x",
                 ratio >= 20),
    ]


def _bench_service_calls(arch: ArchConfig) -> list[BenchRow]:
    """A whole ``/v1/step`` (power from events + step + snapshot), 3 ms window, with one read of the chip's last
    bank; and a control epoch of 64 such windows in one call against ``thermal_step`` window after window."""
    bx, by, bl = arch.dram.banks
    c = ComputeEvents.from_columns({"evt_id": list(range(64)), "t_start_ns": [0] * 64, "core_id": list(range(64)),
                                    "duration_cycles": [1] * 64, "flops": [2e9] * 64, "op": ["mm"] * 64,
                                    "dvfs_domain": ["all"] * 64, "power_hint": [0.0] * 64, "energy_j": [1.5e-3] * 64})
    m = MemoryEvents.from_columns({"evt_id": [0], "t_start_ns": [0], "src_core": [0],
                                   "dst_bank": [f"B({bx - 1},{by - 1},{bl - 1})"], "bytes": [1e6], "rw": ["r"],
                                   "hops": [14], "noc_qos": ["normal"]})
    first = thermal_step(arch, 0, 3.0, None, c, m)
    med_step, _ = time_call(lambda: thermal_step(arch, 1, 3.0, first.state, c, m), repeat=10)
    rows = [BenchRow("thermal: thermal_step() incl. power from events + snapshot, 3 ms window",
                     f"{fmt_s(med_step)} median of 10")]
    # a control epoch: 64 windows of that deposit in one call, against thermal_step window after window (state
    # decoded and encoded every window); process CPU per window
    deps = [deposit_of_events(c, m, arch)] * 64

    def sequential() -> None:
        state = first.state
        for j, dep in enumerate(deps):
            state = thermal_step(arch, 1 + j, 3.0, state, None, None, deposit=dep).state

    cpu_seq = _cpu_median(sequential, 5) / len(deps)
    cpu_epoch = _cpu_median(lambda: thermal_epoch(arch, 1, 3.0, first.state, deps, until_event=False), 5) / len(deps)
    rows.append(BenchRow("thermal: thermal_epoch() per window, 64 windows in one call (the snapshots and state of "
                         "thermal_step window after window, byte for byte)",
                         f"CPU {fmt_s(cpu_epoch)} a window, median of 5 (thermal_step window after window: "
                         f"{fmt_s(cpu_seq)})", "", None, f"{cpu_seq / cpu_epoch:.1f}x"))
    return rows


def bench_reference_steady() -> list[BenchRow]:
    ref = REFERENCE / "hotspot"
    rows: list[BenchRow] = []
    if not ref.is_dir():
        return [BenchRow("thermal: HotSpot reference steady", "skipped", note=f"no reference data at {ref}")]
    for stack, case in (("S2", "steady_b_hotcore"), ("S8", "steady_a_uniform"), ("S8", "steady_b_hotcore")):
        args = ["-c", str(ref / "hotspot.config"), "-p", str(ref / stack / f"{case}.ptrace"), "-grid_layer_file",
                str(ref / stack / "stack.lcf"), "-model_type", "grid"]
        opts = hotspot.parse_options(args)
        t0 = time.perf_counter()
        res = hotspot.run(opts, SpectralSolver)  # a fresh solver: parse + build + factor + solve
        t_cold = time.perf_counter() - t0
        fast = SpectralSolver(res.case.net)
        fast.factor(0.0)
        b = res.case.net.conductance @ res.steady  # the case's own P + g_amb·T_amb

        def run(b: np.ndarray = b, f: SpectralSolver = fast) -> object:
            return f.solve(0.0, b)

        med, _ = time_call(run, repeat=20)
        lo, hi = HOTSPOT_STEADY_S.get(stack, (None, None))
        if lo is not None and hi is not None:
            speed = lo / med
            rows.append(BenchRow(f"thermal: steady solve {stack} {case} (prefactored spectral)",
                                 f"{fmt_s(med)} median of 20; {speed:.0f}x vs HotSpot {lo}-{hi} s",
                                 ">= 100x", speed >= 100, f"cold run incl. parsing and factorisation {fmt_s(t_cold)} "
                                 f"({lo / t_cold:.0f}x)"))
        else:
            rows.append(BenchRow(f"thermal: steady solve {stack} {case} (prefactored spectral)",
                                 f"{fmt_s(med)} median of 20", note=f"cold run {fmt_s(t_cold)}"))
    return rows


def _tasmoe() -> list[str]:
    """The installed ``tasmoe`` command (what a user runs), else ``python -m services.cli``."""
    exe = Path(sys.executable).with_name("tasmoe")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "services.cli"]


def _process_median(argv: list[str], repeat: int, cwd: Path) -> float:
    """Median wall time (s) of a whole process, start to exit (one run first, not counted: it warms the OS caches)."""
    import subprocess

    med, _ = time_call(lambda: subprocess.run(argv, cwd=cwd, check=True, capture_output=True), repeat=repeat,
                       warmup=1)
    return med


def bench_whole_process(repeat: int = 5, n_batch: int = 8) -> list[BenchRow]:
    """``tasmoe hotspot`` as a HotSpot user runs it, a whole process per case, and in batch mode."""
    import tempfile

    ref = REFERENCE / "hotspot"
    rows: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="tasmoe-bench-") as tmp:
        d = Path(tmp)
        t_help = _process_median([*_tasmoe(), "--help"], repeat, d)
        rows.append(BenchRow("thermal: `tasmoe --help`, whole process", f"{fmt_s(t_help)} median of {repeat}",
                             note="imports no service (services/commands.py)"))
        if not ref.is_dir():
            return [*rows, BenchRow("thermal: whole-process HotSpot case", "skipped", note=f"no reference at {ref}")]
        base = [*_tasmoe(), "hotspot", "-c", str(ref / "hotspot.config"), "-grid_layer_file",
                str(ref / "S8" / "stack.lcf"), "-model_type", "grid"]
        one = ref / "S8" / "steady_a_uniform.ptrace"
        t_one = _process_median([*base, "-p", str(one), "-steady_file", str(d / "a.steady")], repeat, d)
        opts = hotspot.parse_options(["-c", str(ref / "hotspot.config"), "-p", str(one), "-grid_layer_file",
                                      str(ref / "S8" / "stack.lcf"), "-model_type", "grid"])
        t_in, _ = time_call(lambda: hotspot.run(opts, SpectralSolver), repeat=repeat, warmup=1)
        lo = HOTSPOT_STEADY_S["S8"][0]
        rows.append(BenchRow("thermal: `tasmoe hotspot` S8 steady_a_uniform, whole process (start, parse, build, "
                             "factor, solve, write)", f"{fmt_s(t_one)} median of {repeat}; {lo / t_one:.1f}x vs "
                             f"HotSpot's {lo} s", "<= 0.4 s (>= 14x)", t_one <= 0.4,
                             f"the same case in process (parse + build + factor + solve): {fmt_s(t_in)}; the rest "
                             "of the whole process is the interpreter's start and numpy's import (scipy is not "
                             "imported on the spectral path)"))
        # batch: n traces (the reference map scaled), one process, against one case per process
        header, values = one.read_text().splitlines()[:2]
        traces = d / "traces"
        traces.mkdir()
        rng = np.random.default_rng(0)
        for k in range(n_batch):
            row = np.array(values.split(), dtype=float) * (0.5 + rng.random())
            (traces / f"case_{k}.ptrace").write_text(header + "\n" + "\t".join(f"{v:.6f}" for v in row) + "\n")
        t_batch = _process_median([*base, "--batch", str(traces), "-steady_file", str(d / "out")], repeat, d)
        per_case = (t_batch - t_one) / (n_batch - 1)
        rows.append(BenchRow(f"thermal: `tasmoe hotspot --batch` S8, {n_batch} steady cases in one process",
                             f"{fmt_s(t_batch)} median of {repeat}; {fmt_s(per_case)} per added case",
                             note=f"one case per process: {fmt_s(t_one)} each ({n_batch} = {fmt_s(n_batch * t_one)})"))
    return rows


def bench() -> list[BenchRow]:
    return [*bench_default_stack(), *bench_reference_steady(), *bench_whole_process()]


if __name__ == "__main__":  # pragma: no cover
    from shared.blas import limit_blas_threads
    from shared.settings import load_settings

    limit_blas_threads(load_settings().blas_threads)
    for row in bench():
        print(f"{row.name:80s} {row.value:55s} {row.target:8s} {row.met} {row.note}")
