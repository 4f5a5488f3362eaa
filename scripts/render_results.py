"""``make docs``: ``docs/results.md`` rendered from the experiments' results, so that no number on it is typed by hand.

Two steps, both here:

- **collect** (``--collect NAME ...``): for each named experiment (``services/orchestrator/default_experiment.py``:
  default, quick, reference, flatout), copy the small files its tables need from its results folder
  (``results/default/`` ...) to ``docs/results/<name>/`` — ``summary.csv`` (one row per scenario), ``comparison.md``
  (its throttling line) and ``experiment.json`` (the configs it ran, read from a run's own log and checked against
  the experiment's config files) — and its figures (``plots/*.png``) to ``docs/figures/<name>/``. A results folder
  that is not there is skipped with a note: the committed copy, if any, stays and is rendered. A folder that ran
  other configs than the experiment's, or lacks a scenario, is an error (exit 2): its numbers would be labelled with
  the wrong name.
- **render** (always): ``docs/results.template.md`` with each experiment's block filled from ``docs/results/<name>/``
  and written to ``docs/results.md``. The template holds the prose; everything that is a number comes from the data
  through a placeholder. An experiment without committed files renders as a short note saying how to produce it.

Template syntax: a block ``<!-- experiment NAME: TITLE -->`` ... ``<!-- end experiment -->``; inside it ``{{configs}}``,
``{{serving_table}}``, ``{{thermal_table}}``, ``{{throttling}}``, ``{{figures}}``, ``{{command}}``, ``{{bound}}`` (the
best-spread bound, ``spread_bound.json``, computed at collect time from the unthrottled run's power), ``{{capacity}}``
(each scenario's SLO capacity, ``capacity.json``, collected from ``tasmoe capacity``'s folders under
``results/capacity/<experiment>/<scenario>/``: ``scripts/results_capacity.py``), ``{{fact KEY}}``
(a key of experiment.json, e.g. ``warmup_ms``; dotted for nested ones: ``serving.duration_ms``) and ``{{value
SCENARIO COLUMN [FORMAT]}}`` (one cell of summary.csv, e.g. ``{{value baseline T_peak_logic .1f}}``). An unknown
placeholder is an error.

``tests/platform/test_results_doc.py`` renders from the committed files and compares with the committed page: a
number edited by hand in ``docs/results.md`` fails it.

    python -m scripts.render_results                       # render only, from docs/results/
    python -m scripts.render_results --collect default reference quick    # copy from results/, then render
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in {None, ""}:  # `python scripts/render_results.py` as well as `python -m scripts.render_results`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.results_capacity import CAPACITY_FILE, CapacityError, capacity_text, collect_capacity

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
TEMPLATE = "results.template.md"
PAGE = "results.md"
DATA = "results"  # docs/results/<experiment>/
FIGURES = "figures"  # docs/figures/<experiment>/
COPIED = ("summary.csv", "comparison.md")
BOUND_SCENARIO = "unthrottled"  # whose power the best-spread bound spreads (the work at the top clock): tasmoe bound
FIGURE_KINDS = {  # plots/<kind>.png, in the page's order, with what each shows (services/metrics/plots.py)
    "temperature": "peak logic and DRAM temperature per scenario, and their series window by window",
    "performance": "served tokens per second, latency, bandwidth use and energy per token per scenario",
    "heatmap": "the logic die per core at each scenario's hottest window, and the hottest DRAM layer per vault",
    "power": "mean chip power by component per scenario",
}
COMMANDS = {"default": "make run", "quick": "make quick", "reference": "tasmoe run --experiment reference",
            "flatout": "tasmoe run --experiment flatout"}

BLOCK = re.compile(r"<!-- experiment (?P<name>[a-z]+): (?P<title>[^>]*?) -->\n(?P<body>.*?)<!-- end experiment -->\n?",
                   re.S)
TEMPLATE_NOTE = re.compile(r"<!-- template:.*?-->\n", re.S)  # about the template itself: not copied to the page
PLACEHOLDER = re.compile(r"\{\{\s*(?P<what>[a-z_]+)(?:\s+(?P<args>[^}]*?))?\s*\}\}")


class DocsError(Exception):
    """A results folder or a template the page cannot be rendered from truthfully."""


# --- collect: results/<out>/ -> docs/results/<name>/, docs/figures/<name>/ -----------------------------------------

def run_config(out: Path) -> dict[str, Any]:
    """The resolved configs a results folder ran (arch, workload, tas, seed, scenarios ...), from the ``config``
    line every run writes at its start to ``runs/<scenario>/run.log``."""
    from services.orchestrator.run_log import logged_config

    for log in sorted((out / "runs").glob("*/run.log")):
        ran = logged_config(log)
        if ran is not None:
            return ran
    raise DocsError(f"{out}: no run log with the run's configs (runs/<scenario>/run.log)")


def expected_configs(name: str) -> dict[str, Any]:
    """The resolved configs the experiment runs (arch with its warm-up, tas, workload), as a run's log records them."""
    from services.orchestrator.default_experiment import EXPERIMENTS
    from services.orchestrator.local import with_warmup
    from shared.configs import load_arch, load_tas

    exp = EXPERIMENTS[name]
    arch = load_arch(REPO / exp.arch)
    if exp.warmup_ms is not None:
        arch = with_warmup(arch, exp.warmup_ms)
    return {"arch": arch.model_dump(mode="json"), "tas": load_tas(REPO / exp.tas).model_dump(mode="json"),
            "workload": exp.workload_config(REPO / exp.workload).model_dump(mode="json")}


def experiment_facts(name: str, out: Path) -> dict[str, Any]:
    """What the page says about the configs the folder ran: the experiment's config files, checked against the run's
    own snapshot of them (a folder run with other options is refused), and the numbers that describe the run."""
    from services.orchestrator.default_experiment import EXPERIMENTS

    exp = EXPERIMENTS[name]
    ran = run_config(out)
    expected = expected_configs(name)
    differ = [k for k, v in expected.items() if ran.get(k) != v]
    if differ:
        raise DocsError(f"{out} ran other {' and '.join(differ)} settings than the {name} experiment's "
                        f"({', '.join(getattr(exp, k) for k in differ)}); run it again with `{COMMANDS[name]}`")
    if set(ran.get("scenarios", [])) != set(exp.scenarios):
        raise DocsError(f"{out} ran the scenarios {ran.get('scenarios')}, the {name} experiment runs "
                        f"{list(exp.scenarios)}; run it again with `{COMMANDS[name]}`")
    wl = ran["workload"]
    return {"experiment": name, "arch": exp.arch, "workload": exp.workload, "tas": exp.tas,
            "model": wl["model"] if isinstance(wl["model"], str) else wl.get("name"),
            "seed": ran.get("seed"), "scenarios": list(ran["scenarios"]), "window_ms": ran["tas"]["tacs"]["window_ms"],
            "warmup_ms": ran["arch"]["thermal"]["warmup_ms"], "mesh": ran["arch"]["mesh"]["cores"],
            "serving": wl.get("serving"), "sequence": None if wl.get("serving") else wl.get("sequence")}


def collect(name: str, *, results_root: Path, docs: Path, say: Callable[[str], None]) -> bool:
    """Copy one experiment's summary files and figures into the docs; False (and a note) when its results folder is
    not there. Raises `DocsError` for a folder that cannot stand for the experiment."""
    from services.orchestrator.default_experiment import EXPERIMENTS

    out = results_root / EXPERIMENTS[name].out
    if not (out / "summary.csv").is_file():
        kept = (docs / DATA / name / "summary.csv").is_file()
        say(f"{name}: no {out / 'summary.csv'} (`{COMMANDS[name]}` writes it): "
            + ("the committed docs/results/" + name + "/ is rendered" if kept else "its section says it is not run"))
        return False
    rows = read_rows(out / "summary.csv")
    missing = set(EXPERIMENTS[name].scenarios) - {r["scenario"] for r in rows}
    if missing:
        raise DocsError(f"{out}/summary.csv has no row for {', '.join(sorted(missing))}: the run did not finish; "
                        f"run it again with `{COMMANDS[name]}`")
    facts = experiment_facts(name, out)
    data = docs / DATA / name
    kept_capacity = (json.loads((data / CAPACITY_FILE).read_text(encoding="utf-8"))
                     if (data / CAPACITY_FILE).is_file() else None)
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    for f in COPIED:
        if (out / f).is_file():
            shutil.copyfile(out / f, data / f)
    (data / "experiment.json").write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if BOUND_SCENARIO in EXPERIMENTS[name].scenarios:
        collect_bound(name, out, data, say)
    try:
        collect_capacity(name, results_root=results_root, data=data, scenarios=EXPERIMENTS[name].scenarios,
                         expected=expected_configs(name), kept=kept_capacity, run_config=run_config, say=say)
    except CapacityError as exc:
        raise DocsError(str(exc)) from None
    figures = docs / FIGURES / name
    if figures.exists():
        shutil.rmtree(figures)
    drawn = [k for k in FIGURE_KINDS if (out / "plots" / f"{k}.png").is_file()]
    if drawn:
        figures.mkdir(parents=True)
        for k in drawn:
            shutil.copyfile(out / "plots" / f"{k}.png", figures / f"{k}.png")
    say(f"{name}: {out} -> {data.relative_to(docs.parent)}/, {len(drawn)} figures -> "
        f"{figures.relative_to(docs.parent)}/")
    return True


def collect_bound(name: str, out: Path, data: Path, say: Callable[[str], None]) -> None:
    """``data/spread_bound.json``: the best spread of the unthrottled run's power (``tasmoe bound``) with the run's
    own field beside it; a note instead when the folder has no unthrottled power report."""
    from services.orchestrator.default_experiment import EXPERIMENTS
    from services.thermal.spread_bound_files import BOUND_FILE, bound_of_results, write_bound
    from shared.errors import TasmoeError

    if not any((out / BOUND_SCENARIO).glob("*.power.json")):
        say(f"{name}: no {BOUND_SCENARIO} power report in {out}: no best-spread bound")
        return
    try:
        bound = bound_of_results(out, BOUND_SCENARIO, under_c=None, arch_path=REPO / EXPERIMENTS[name].arch)
    except TasmoeError as exc:
        raise DocsError(f"{out}: the best-spread bound: {exc}") from None
    bound["arch"] = EXPERIMENTS[name].arch  # the repository's path, not this machine's
    write_bound(data / BOUND_FILE, {**bound, **run_field(out, BOUND_SCENARIO, under_c=bound["under_c"])})


def run_field(out: Path, scenario: str, *, under_c: float) -> dict[str, float]:
    """What the run's own core temperatures did, beside its best spread (every window of its window store,
    ``runs/<scenario>/``): the hottest core of the time-mean field (°C, dt-weighted), the hottest core of each window
    over time (mean, p50, p90, max °C; linear percentiles over windows) and the share of the time in which it was at or
    above ``under_c`` (the bound's temperature, the first DVFS trip); the chip's power per window (mean, max W)."""
    import numpy as np

    from services.orchestrator import window_store
    from services.orchestrator.run_files import run_dir_for

    run = run_dir_for(out, scenario)
    temps: list[list[float]] = []
    dt: list[float] = []
    power: list[float] = []
    for chunk in window_store.iter_chunks(run):
        for w in chunk:
            temps.append(w["temps_core_c"])
            dt.append(float(w["dt_ms"]))
            power.append(float(w["power_w"]))
    if not temps:
        raise DocsError(f"{run}: no windows in the run's window store")
    T, d, P = np.asarray(temps), np.asarray(dt), np.asarray(power)
    hottest = T.max(axis=1)
    return {"run_mean_field_peak_c": round(float((T * d[:, None]).sum(axis=0).max() / d.sum()), 4),
            "run_hottest_mean_c": round(float((hottest * d).sum() / d.sum()), 4),
            "run_hottest_p50_c": round(float(np.percentile(hottest, 50)), 4),
            "run_hottest_p90_c": round(float(np.percentile(hottest, 90)), 4),
            "run_hottest_max_c": round(float(hottest.max()), 4),
            "run_share_at_or_above": round(float(d[hottest >= under_c].sum() / d.sum()), 4),
            "run_power_mean_w": round(float((P * d).sum() / d.sum()), 4),
            "run_power_max_w": round(float(P.max()), 4)}


# --- render: docs/results.template.md + docs/results/ -> docs/results.md -------------------------------------------

def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class Column:
    heading: str
    value: Callable[[dict[str, str]], float | None]
    fmt: str


def _col(key: str) -> Callable[[dict[str, str]], float | None]:
    def get(row: dict[str, str]) -> float | None:
        v = row.get(key, "")
        return float(v) if v != "" else None

    return get


def _energy_per_token(row: dict[str, str]) -> float | None:
    tokens = int(row.get("tokens") or 0)
    return 1e3 * float(row["energy_j"]) / tokens if tokens and row.get("energy_j") else None


SERVING_COLUMNS = (
    Column("served tok/s", _col("ips"), ".1f"), Column("goodput tok/s", _col("goodput_tok_s"), ".1f"),
    Column("tokens offered", _col("tokens_offered"), ".0f"), Column("served", _col("tokens_served"), ".0f"),
    Column("queued", _col("tokens_queued"), ".0f"), Column("shed", _col("tokens_shed"), ".0f"),
    Column("TTFT p50 ms", _col("ttft_p50_ms"), ".0f"), Column("TTFT p99 ms", _col("ttft_p99_ms"), ".0f"),
    Column("TPOT p50 ms", _col("tpot_p50_ms"), ".1f"), Column("TPOT p99 ms", _col("tpot_p99_ms"), ".1f"),
)
FIXED_COLUMNS = (  # a fixed-arrival run (no serving): completed tokens, and the latency of its micro-batches
    Column("tok/s", _col("ips"), ".1f"), Column("tokens", _col("tokens"), ".0f"),
    Column("latency p50 ms", _col("lat_p50_ms"), ".1f"), Column("latency p99 ms", _col("lat_p99_ms"), ".1f"),
)
THERMAL_COLUMNS = (
    Column("peak logic °C", _col("T_peak_logic"), ".1f"), Column("peak DRAM °C", _col("T_peak_dram"), ".1f"),
    Column("time above Thot ms", _col("time_above_thot_ms"), ".0f"),
    Column("mean clock GHz", _col("freq_avg_ghz"), ".3f"),
    Column("throttled ms", _col("time_throttled_ms"), ".0f"), Column("emergency ms", _col("time_emergency_ms"), ".0f"),
    Column("mean power W", _col("power_avg_w"), ".1f"), Column("energy mJ/token", _energy_per_token, ".0f"),
    Column("migrations", _col("migrations"), ".0f"),
)


def table(rows: list[dict[str, str]], columns: Sequence[Column]) -> str:
    """A Markdown table, one row per scenario; a column empty in every row is left out, an empty cell is ``–``."""
    cells = [[c.value(r) for c in columns] for r in rows]
    keep = [i for i in range(len(columns)) if any(row[i] is not None for row in cells)]
    head = "| scenario | " + " | ".join(columns[i].heading for i in keep) + " |"
    rule = "|---|" + "---:|" * len(keep)
    body = ["| " + r["scenario"] + " | " + " | ".join("–" if row[i] is None else format(row[i], columns[i].fmt)
                                                      for i in keep) + " |" for r, row in zip(rows, cells, strict=True)]
    return "\n".join([head, rule, *body])


def _ms(v: float) -> str:
    return f"{v:g} ms" if v < 1000 else f"{v / 1000:g} s"


def configs_text(facts: dict[str, Any], rows: list[dict[str, str]]) -> str:
    """The experiment's configs and the run's extent, as a list."""
    sv, seq = facts.get("serving"), facts.get("sequence")
    if sv:
        slo = sv.get("slo") or {}
        load = (f"the `{sv['trace']}` trace"
                + (f" at {sv['rate_rps']:g} requests/s" if sv.get("rate_rps") else " at its own pace")
                + f", {_ms(sv['duration_ms'])} of arrivals"
                + (f" from {sv['start_s']:g} s" if sv.get("start_s") else "")
                + (f" then {_ms(sv['drain_ms'])} of drain" if sv.get("drain_ms") else ", no drain")
                + (f"; SLO: p99 TTFT ≤ {_ms(slo['ttft_p99_ms'])}, p99 TPOT ≤ {_ms(slo['tpot_p99_ms'])}" if slo else ""))
    elif seq:
        load = (f"fixed arrivals: a micro-batch of {seq['micro_batch']} tokens every {_ms(seq['step_interval_ms'])}, "
                f"{seq['steps']} steps")
    else:
        load = "the workload config's arrivals"
    windows = sorted({int(r["windows"]) for r in rows if r.get("windows")})
    sim = sorted({float(r["sim_time_ms"]) for r in rows if r.get("sim_time_ms")})
    mesh = "×".join(str(n) for n in facts.get("mesh") or [])
    lines = [
        f"- chip: `{facts['arch']}` ({mesh} cores); thermal warm-up {_ms(facts['warmup_ms'])} before the first window",
        f"- workload: `{facts['workload']}`, model `{facts['model']}`, {load}",
        f"- policies: `{facts['tas']}`, control window {_ms(facts['window_ms'])}; routing seed {facts['seed']}",
        f"- scenarios: {', '.join(facts['scenarios'])}",
    ]
    if windows and sim:
        span = str(windows[0]) if len(windows) == 1 else f"{windows[0]} to {windows[-1]}"
        lines.append(f"- simulated: {span} windows ({_ms(sim[-1])}) per scenario, after the warm-up")
    return "\n".join(lines)


def throttling_text(data: Path) -> str:
    """The comparison's throttling line: the loss to DVFS and the DTM limit, and what each policy recovers of it."""
    cmp_md = data / "comparison.md"
    if cmp_md.is_file():
        for line in cmp_md.read_text(encoding="utf-8").splitlines():
            if line.startswith("Throttling ("):
                return line
    return "No throttling line: this experiment has no `unthrottled` reference to measure the loss against."


def bound_text(data: Path, args: str) -> str:
    """``{{bound}}``: the best-spread bound's lines (``tasmoe bound``), as a list; ``{{bound KEY [FORMAT]}}``: one of
    its numbers (``max_share`` as a percentage with ``%``)."""
    from services.thermal.spread_bound_files import BOUND_FILE
    from services.thermal.spread_bound_files import bound_text as text_of

    path = data / BOUND_FILE
    if not path.is_file():
        raise DocsError(f"{{{{bound}}}}: no {path} (collected from a run with an {BOUND_SCENARIO} scenario)")
    bound = json.loads(path.read_text(encoding="utf-8"))
    parts = args.split()
    if not parts:
        return "\n".join(f"- {line}" for line in text_of(bound).splitlines())
    if len(parts) > 2 or parts[0] not in bound or isinstance(bound[parts[0]], (list, dict, str)):
        raise DocsError(f"{{{{bound {args}}}}}: expected KEY [FORMAT], KEY a number of {BOUND_FILE}")
    value = bound[parts[0]]
    if value is None:
        return "all"
    return format(float(value), parts[1] if len(parts) == 2 else "g")


def figures_text(name: str, docs: Path) -> str:
    found = [k for k in FIGURE_KINDS if (docs / FIGURES / name / f"{k}.png").is_file()]
    if not found:
        return "No figures were drawn for this run."
    return "\n\n".join(f"![{name}: {k}]({FIGURES}/{name}/{k}.png)\n*{k}: {FIGURE_KINDS[k]}*" for k in found)


def _fact(facts: dict[str, Any], key: str) -> str:
    v: Any = facts
    for part in key.split("."):
        if not isinstance(v, dict) or part not in v:
            raise DocsError(f"{{{{fact {key}}}}}: experiment.json has no {key!r}")
        v = v[part]
    return format(v, "g") if isinstance(v, float) else str(v)


def _value(rows: list[dict[str, str]], args: str) -> str:
    parts = args.split()
    if len(parts) not in (2, 3):
        raise DocsError(f"{{{{value {args}}}}}: expected SCENARIO COLUMN [FORMAT]")
    sc, col, fmt = parts[0], parts[1], parts[2] if len(parts) == 3 else "g"
    row = next((r for r in rows if r["scenario"] == sc), None)
    if row is None or col not in row:
        raise DocsError(f"{{{{value {args}}}}}: summary.csv has no {sc!r} row or no {col!r} column")
    return "–" if row[col] == "" else format(float(row[col]), fmt)


def render_block(name: str, title: str, body: str, docs: Path) -> str:
    """One experiment's block with its placeholders filled, or a note when its files are not committed."""
    data = docs / DATA / name
    if not (data / "summary.csv").is_file() or not (data / "experiment.json").is_file():
        return (f"## {title}\n\nNot rendered yet: run `{COMMANDS.get(name, 'tasmoe run --experiment ' + name)}`, then "
                "`make docs`.\n\n")
    rows = read_rows(data / "summary.csv")
    facts = json.loads((data / "experiment.json").read_text(encoding="utf-8"))
    serving = facts.get("serving") is not None
    fill: dict[str, Callable[[str], str]] = {
        "configs": lambda _: configs_text(facts, rows),
        "serving_table": lambda _: table(rows, SERVING_COLUMNS if serving else FIXED_COLUMNS),
        "thermal_table": lambda _: table(rows, THERMAL_COLUMNS),
        "throttling": lambda _: throttling_text(data),
        "figures": lambda _: figures_text(name, docs),
        "bound": lambda args: bound_text(data, args),
        "capacity": lambda args: capacity_text(data, args, [r["scenario"] for r in rows]),
        "command": lambda _: COMMANDS[name],
        "fact": lambda args: _fact(facts, args),
        "value": lambda args: _value(rows, args),
    }

    def sub(m: re.Match[str]) -> str:
        what = m.group("what")
        if what not in fill:
            raise DocsError(f"{name}: unknown placeholder {m.group(0)} (known: {', '.join(fill)})")
        try:
            return fill[what](m.group("args") or "")
        except CapacityError as exc:
            raise DocsError(f"{name}: {exc}") from None

    return f"## {title}\n\n" + PLACEHOLDER.sub(sub, body)


def render(docs: Path = DOCS) -> str:
    """``docs/results.md`` as the template and the committed files under ``docs`` make it."""
    template = TEMPLATE_NOTE.sub("", (docs / TEMPLATE).read_text(encoding="utf-8"))
    page = BLOCK.sub(lambda m: render_block(m.group("name"), m.group("title"), m.group("body"), docs), template)
    stray = PLACEHOLDER.search(page)
    if stray is not None:
        raise DocsError(f"{TEMPLATE}: {stray.group(0)} outside an experiment block")
    return page


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="render_results", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--collect", nargs="+", default=[], metavar="EXPERIMENT",
                    help="first copy these experiments' summary files and figures from their results folders "
                         "(default, quick, reference, flatout)")
    ap.add_argument("--results-root", default=str(REPO), help="the folder the experiments' results/ paths are under "
                                                              "(default: the checkout)")
    ap.add_argument("--docs", default=str(DOCS), help="the docs folder (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when docs/results.md is stale")
    args = ap.parse_args(argv)
    docs = Path(args.docs)
    from services.orchestrator.default_experiment import EXPERIMENTS

    if args.check and args.collect:  # collecting writes docs/results/ and docs/figures/: not a check
        print("render_results: error: --check writes nothing; give it without --collect", file=sys.stderr)
        return 2
    unknown = [n for n in args.collect if n not in EXPERIMENTS]
    if unknown:
        print(f"render_results: unknown experiment {', '.join(unknown)} (known: {', '.join(EXPERIMENTS)})",
              file=sys.stderr)
        return 2
    try:
        for name in args.collect:
            collect(name, results_root=Path(args.results_root), docs=docs, say=lambda s: print(s, file=sys.stderr))
        page = render(docs)
    except DocsError as exc:
        print(f"render_results: error: {exc}", file=sys.stderr)
        return 2
    target = docs / PAGE
    if args.check:
        stale = not target.is_file() or target.read_text(encoding="utf-8") != page
        print(f"{target}: {'stale: run make docs' if stale else 'up to date'}", file=sys.stderr)
        return 1 if stale else 0
    target.write_text(page, encoding="utf-8")
    print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
