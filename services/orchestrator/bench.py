"""Orchestrator benchmarks (``make bench``): the reference experiment (the 45 nm chip's Mixtral experiment, four
scenarios: ``make run``'s experiment until the hot chip became the default) against the 60 s goal with what each part
of an epoch costs, simulated time against wall time, the run database's size; the default experiment (``make run``:
the hot chip serving the trace, five scenarios) with the same figures; the seed chip's eventful runs in epochs against
the per-window loop, one window of DeepSeek-V3 and of Qwen3-235B, and the local cluster against the embedded mode."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

from services.orchestrator.acceptance import check_results, policy_findings
from services.orchestrator.default_experiment import DEFAULT, REFERENCE
from services.orchestrator.local import LocalResult, run_local
from services.orchestrator.run_files import run_dir_for
from shared.bench import BenchRow, fmt_s
from shared.configs import load_tas
from shared.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CLUSTER_WINDOWS = 1000  # windows per scenario of the embedded-vs-cluster comparison


def _cluster_run(tmp: Path, timeout_s: float = 1800.0) -> tuple[float, dict[str, int], dict[str, float], str]:
    """The same experiment on the local cluster (uvicorn per service + a Celery worker with 2 processes,
    PostgreSQL, Redis): (wall s, windows per scenario, loop s per scenario, status)."""
    import io
    import os

    from scripts import cluster
    from shared.client import ServiceClient

    os.environ["TASMOE_RESULTS_DIR"] = str(tmp / "cluster-results")
    cfg = cluster.ClusterConfig(host="127.0.0.1", base_port=18300, state_dir=tmp / "cluster",
                                database_url="postgresql+psycopg://postgres@127.0.0.1:5432/tasmoe_bench",
                                redis_url="redis://127.0.0.1:6379/13", timeout_s=240, worker_concurrency=2)
    cluster.up(cfg, out=io.StringIO())
    try:
        api = ServiceClient("orchestrator", cfg.url("orchestrator"), Settings())
        t0 = time.perf_counter()
        exp = api.post_json("/v1/experiments", {"arch": "arch_8x8_32x32x8.yaml",
                                                "workload": "workload_mixtral_8x7b.yaml", "tas": "tas_params.yaml",
                                                "windows": CLUSTER_WINDOWS})
        while True:
            view = api.get_json(f"/v1/experiments/{exp['id']}")
            if view["status"] in {"succeeded", "failed", "cancelled"} or time.perf_counter() - t0 > timeout_s:
                break
            time.sleep(0.5)
        wall = time.perf_counter() - t0
        api.close()
        return (wall, {r["scenario"]: r["window"] for r in view["runs"]},
                {r["scenario"]: r["compute_s"] for r in view["runs"]}, str(view["status"]))
    finally:
        cluster.down(cfg.state_dir, out=io.StringIO())


BIG_WINDOWS = 30  # windows of the one-window rows of the largest models
SEED_WINDOWS = 600  # windows of the seed chip's epochs-against-the-loop row
PHASES_RE = re.compile(r"(\d+) windows in (\d+) epochs, ([\d.]+) s; wall time per window by call \(ms\): (.*)$")


def epoch_parts(run_log: Path) -> tuple[int, int, float, dict[str, float]] | None:
    """(windows, epochs, loop wall s, ms per window by part) from a run's run.log (the window loop's last line of
    them), None when the run wrote none."""
    found = None
    for line in run_log.read_text(encoding="utf-8").splitlines():
        m = PHASES_RE.search(line)
        if m:
            parts = {k: float(v) for k, v in (p.strip().rsplit(" ", 1) for p in m.group(4).split(","))}
            found = (int(m.group(1)), int(m.group(2)), float(m.group(3)), parts)
    return found


def _one_window(tmp: Path, settings: Settings, workload: str, label: str) -> BenchRow:
    """One window of a large model, all calls included (baseline scenario, embedded, no trace files, no warm-up: the
    window loop's own time per window), against 400 ms."""
    res = run_local(arch=REPO / "configs/arch_8x8_32x32x8.yaml", workload=REPO / workload,
                    tas=REPO / "configs/tas_params.yaml", out=tmp / label, scenarios=["baseline"],
                    windows=BIG_WINDOWS, settings=settings, traces=False, warmup_ms=0.0,
                    database_url=f"sqlite:///{tmp / f'{label}.sqlite3'}")
    n, cs = res.windows.get("baseline", 0), res.compute_s.get("baseline", 0.0)
    per = cs / n if n else float("inf")
    return BenchRow(f"one {label} window (baseline, embedded, first {BIG_WINDOWS} windows, no trace files)",
                    fmt_s(per), "<= 400 ms", res.ok and per <= 0.4,
                    f"{n} windows, {cs:.1f} s in the window loop; {workload} (the default mapping: the model does not "
                    "fit the chip's DRAM, TAPS refuses it)")


def _default_experiment(tmp: Path, settings: Settings) -> list[BenchRow]:
    """``make run``'s experiment (the hot chip serving the trace, five scenarios): its wall time and, per scenario,
    simulated against wall time with the parts of an epoch."""
    t0 = time.perf_counter()
    res = run_local(arch=REPO / DEFAULT.arch, workload=REPO / DEFAULT.workload, tas=REPO / DEFAULT.tas,
                    out=tmp / "default", scenarios=DEFAULT.scenarios, settings=settings,
                    database_url=f"sqlite:///{tmp / 'default.sqlite3'}")
    wall = time.perf_counter() - t0
    note = "" if res.ok else "; ".join(f"{k}: {v}" for k, v in res.errors.items())[:200]
    window_ms = load_tas(REPO / DEFAULT.tas).tacs.window_ms
    return [BenchRow("embedded make run (the default: hot chip serving the trace, 5 scenarios)",
                     f"{wall:.1f} s, {sum(res.windows.values())} windows", "", None,
                     note or "two runs at a time on two cores"),
            *_epoch_rows(tmp / "default", res, window_ms=window_ms)]


def _seed_chip(tmp: Path, settings: Settings) -> list[BenchRow]:
    """configs/arch_seed.yaml, where DVFS, refresh and TACS act every few windows: the first SEED_WINDOWS windows
    of tas in adaptive epochs against the per-window loop (``--epoch 1``), each alone, the same files."""
    walls: dict[int | None, float] = {}
    for epoch in (1, None):
        t0 = time.perf_counter()
        res = run_local(arch=REPO / "configs/arch_seed.yaml", workload=REPO / "configs/workload_mixtral_8x7b.yaml",
                        tas=REPO / "configs/tas_params.yaml", out=tmp / f"seed-{epoch}", scenarios=["tas"],
                        windows=SEED_WINDOWS, settings=settings, warmup_ms=0.0, epoch=epoch,
                        database_url=f"sqlite:///{tmp / f'seed-{epoch}.sqlite3'}")
        if not res.ok:
            return [BenchRow("seed chip (eventful): epochs against the per-window loop", "did not run", "", False,
                             "; ".join(res.errors.values())[:200])]
        walls[epoch] = res.compute_s.get("tas", time.perf_counter() - t0)
    same = _tree(tmp / "seed-1") == _tree(tmp / "seed-None")
    parts = epoch_parts(run_dir_for(tmp / "seed-None", "tas") / "run.log")
    epochs = f"{parts[1]} epochs for {parts[0]} windows" if parts else "epochs not logged"
    ratio = walls[None] / walls[1] if walls[1] > 0 else float("inf")
    return [BenchRow(f"seed chip, tas, first {SEED_WINDOWS} windows: adaptive epochs against --epoch 1",
                     f"{walls[None]:.1f} s against {walls[1]:.1f} s ({ratio:.2f}x)", "<= 1.0x", ratio <= 1.0,
                     f"{epochs}; files byte-identical: {'yes' if same else 'NO'}")]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run.log"}


def _epoch_rows(out: Path, res: LocalResult, window_ms: float) -> list[BenchRow]:
    """Per scenario: simulated time against the loop's wall time, and what each part of an epoch costs."""
    rows = []
    for sc in res.windows:
        parts = epoch_parts(run_dir_for(out, sc) / "run.log")
        if parts is None:
            continue
        windows, epochs, wall, ms = parts
        speed = windows * window_ms / 1e3 / wall if wall > 0 else float("inf")
        rows.append(BenchRow(f"{sc}: simulated time against wall time (the window loop, 2 runs at a time)",
                             f"{speed:.2f}x real time", ">= 1x", speed >= 1.0,
                             f"{windows} windows in {epochs} epochs, {wall:.1f} s; ms a window by part: "
                             + ", ".join(f"{k} {v:.2f}" for k, v in ms.items())))
    return rows


def folder_sizes(root: Path) -> dict[str, int]:
    """Bytes per file under ``root``, by path relative to it (a run's results folder: no database in it)."""
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _folder_size(root: Path) -> BenchRow:
    sizes = folder_sizes(root)
    total = sum(sizes.values())
    kinds: dict[str, int] = {}
    for rel, n in sizes.items():
        name = rel.rsplit("/", 1)[-1]
        kind = name.split(".", 1)[1] if "." in name else name  # series.csv.gz, windows.jsonl.gz, png, ...
        kinds[kind] = kinds.get(kind, 0) + n
    top = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:6])
    return BenchRow("files that run wrote (its results folder: traces, series, plots, logs)", f"{total / 1e6:.1f} MB",
                    "<= 40 MB", total <= 40e6, f"MB by kind: {top}; physical events not asked for (--events)")


def bench() -> list[BenchRow]:
    tmp = Path(tempfile.mkdtemp(prefix="tasmoe-orch-bench-"))
    rows: list[BenchRow] = []
    try:
        settings = Settings(results_dir=tmp / "results", configs_dir=REPO / "configs")
        t0 = time.perf_counter()
        try:
            res = run_local(arch=REPO / REFERENCE.arch, workload=REPO / REFERENCE.workload, tas=REPO / REFERENCE.tas,
                            out=tmp / "mixtral", settings=settings, database_url=f"sqlite:///{tmp / 'run.sqlite3'}")
        except Exception as exc:  # a service broken: report it instead of a number
            rows.append(BenchRow("embedded reference experiment (4 scenarios, Mixtral, 45 nm)", "did not run",
                                 "<= 60 s", False, f"{type(exc).__name__}: {exc}"[:200]))
            return rows
        wall = time.perf_counter() - t0
        note = "" if res.ok else "; ".join(f"{k}: {v}" for k, v in res.errors.items())[:200]
        rows.append(BenchRow("embedded reference experiment (4 scenarios, Mixtral, 45 nm)",
                             f"{wall:.1f} s, {sum(res.windows.values())} windows", "<= 60 s", wall <= 60 and res.ok,
                             note or "the sustainable load: 9901 windows per scenario + a 1000-window warm-up, "
                             "two runs at a time on two cores"))
        rows += _epoch_rows(tmp / "mixtral", res, window_ms=3.0)
        db = (tmp / "run.sqlite3").stat().st_size
        rows.append(BenchRow("the run database after that run (SQLite file)", f"{db / 1e6:.2f} MB", "<= 50 MB",
                             db <= 50e6, "the runs' frontiers (dropped when a run succeeds) and the experiment; the "
                             "windows are the results folder's window store"))
        rows.append(_folder_size(tmp / "mixtral"))
        problems = check_results(tmp / "mixtral", workload="mixtral-8x7b", ambient_c=res.ambient_c)
        rows.append(BenchRow("science acceptance of that run (four CSVs, no NaN, >= ambient)",
                             "pass" if not problems else f"{len(problems)} problem(s)", "pass", not problems,
                             "; ".join(problems)[:300]))
        rows.append(BenchRow("policies against baseline in that run (a finding)", "see note", "", None,
                             "; ".join(policy_findings(tmp / "mixtral", workload="mixtral-8x7b"))[:300]))
        rows += _default_experiment(tmp, settings)
        rows += _seed_chip(tmp, settings)
        rows.append(_one_window(tmp, settings, "configs/workload_deepseek_v3.yaml", "DeepSeek-V3"))
        rows.append(_one_window(tmp, settings, "configs/workload_qwen3_235b.yaml", "Qwen3-235B-A22B"))
        # the cluster against embedded on the first CLUSTER_WINDOWS windows of the same experiment
        t0 = time.perf_counter()
        short = run_local(arch=REPO / "configs/arch_8x8_32x32x8.yaml",
                          workload=REPO / "configs/workload_mixtral_8x7b.yaml", tas=REPO / "configs/tas_params.yaml",
                          out=tmp / "mixtral-short", settings=settings, windows=CLUSTER_WINDOWS,
                          database_url=f"sqlite:///{tmp / 'short.sqlite3'}")
        wall = time.perf_counter() - t0
        rows.append(BenchRow(f"embedded, first {CLUSTER_WINDOWS} windows of that experiment",
                             f"{wall:.1f} s, {sum(short.windows.values())} windows", "", None))
        try:
            cwall, cwin, ccs, cstatus = _cluster_run(tmp)
        except Exception as exc:
            rows.append(BenchRow("local cluster, same experiment", "did not run", "<= 1.3x embedded", False,
                                 f"{type(exc).__name__}: {exc}"[:200]))
            return rows
        rows.append(BenchRow(f"local cluster, first {CLUSTER_WINDOWS} windows (Celery worker x2, PostgreSQL)",
                             f"{cwall:.1f} s ({cwall / wall:.2f}x embedded), {cstatus}", "<= 1.3x embedded",
                             cwall <= 1.3 * wall and cstatus == "succeeded"))
        for sc, n in cwin.items():
            cs = ccs.get(sc, 0.0)
            rows.append(BenchRow(f"windows/s, {sc} (cluster)", f"{n / cs if cs > 0 else 0.0:.1f} windows/s",
                                 note=f"{n} windows, {cs:.1f} s in the window loop"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows
