"""A chip's serving capacity under an SLO, measured: the highest offered request rate at which a served run meets the
workload's SLO, found by bisection over runs of the experiment itself (`tasmoe capacity`).

A probe at rate ``r`` runs one scenario (baseline by default: what the chip does today, its DTM included) of the
serving workload with ``serving.rate_rps = r``, arrivals over ``duration_ms`` and then a drain without arrivals,
and meets the SLO ``serving.slo`` by the rule of shared/slo.py, the one the result row's ``slo_met`` is computed by:
nothing shed, nothing still queued at the end, p99 TTFT and p99 TPOT within their limits.

The drain is, unless ``drain_ms`` is given, the shortest that lets the rule judge every request the probe offers
(``shared.slo.drain_to_judge_ms``, as the workload service computes it for the probe's workload: the last deadline,
arrival + TTFT limit + the output's decode at the TPOT limit, after the arrivals end): a request still queued at the
end has then missed a limit on its own. A drain given is run as given; a probe that misses on tokens still queued
after a drain shorter than that says the drain may be why, and so does the verdict (the capacity found is then a
lower bound).

The capacity is the highest rate met: doubling from ``lo`` (at most to ``hi``) until a rate is missed, then bisection
in log rate between the last met and the first missed with the runs left of ``probes``, until they are one request
apart. A run offers a whole number of requests over its arrivals (``round(rate · duration)``,
services/workload/arrivals.py), so every rate tried is one: ``n / duration``; two rates that round to the same count
would run the same requests, so the search never runs both. Printed with the table of probes: how it was found. The
probes carry each run's ``bw_util``, the fraction of the DRAM bandwidth left after refresh that it used; the DRAM
roofline in tokens per second is the capacity estimate's (services/orchestrator/capacity.py), for a fixed batch.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from services.orchestrator.local import LocalResult, check_ok, drain_to_judge_ms, local_spec, run_local
from services.orchestrator.run_files import result_csv_path
from services.orchestrator.run_log import logged_config
from services.orchestrator.schemas import ExperimentSpec, Scenario
from services.orchestrator.service import set_dotted
from shared.configs import WorkloadConfig, load_arch, load_tas, load_workload
from shared.errors import BadInput, first_validation_error
from shared.settings import Settings
from shared.slo import slo_misses

M = TypeVar("M", bound=BaseModel)
SET_KINDS = ("arch", "tas", "workload")  # what ``--set KEY=VALUE`` may replace a value of
SEARCH_KEYS = ("workload.serving.rate_rps", "workload.serving.duration_ms", "workload.serving.drain_ms")


@dataclass(frozen=True)
class Probe:
    """One run at one offered rate and what it measured (times in ms, rates per second of simulated time)."""

    rate_rps: float
    met: bool
    why: str  # what failed ("" when met)
    tokens_offered: int
    tokens_served: int
    tokens_queued: int
    tokens_shed: int
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    goodput_tok_s: float | None
    bw_util: float | None
    T_peak_logic: float | None
    drain_ms: float | None = None  # the probe's drain, ms
    drain_needed_ms: float | None = None  # the drain that judges its requests (shared.slo.drain_to_judge_ms), ms

    @property
    def drain_short(self) -> bool:
        """A miss on tokens still queued after a drain shorter than its requests need, none shed: perhaps the
        drain's (a shed request is lost whatever the drain)."""
        return not self.met and _undecided(self.tokens_shed, self.tokens_queued, self.drain_ms, self.drain_needed_ms)


@dataclass
class SloCapacity:
    """The highest rate met (None: even ``lo`` was not), its offered output tokens per second, the probes in the order
    they ran, and a sentence on how it was found."""

    rate_rps: float | None
    tok_s: float | None
    probes: list[Probe] = field(default_factory=list)
    how: str = ""
    scenario: str = "baseline"
    duration_ms: float | None = None  # each probe's arrivals, ms
    drain_ms: float | None = None  # each probe's drain, ms (None: the drain that judges its requests, per probe)
    set: dict[str, Any] = field(default_factory=dict)  # the configs' values replaced (``--set``)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        if self.rate_rps is None:
            return f"SLO capacity: below the lowest rate tried ({self.how})"
        return f"SLO capacity {self.rate_rps:.3g} requests/s = {self.tok_s:.1f} output tok/s ({self.how})"


def _float(row: dict[str, str], key: str) -> float | None:
    v = row.get(key, "")
    return float(v) if v not in ("", None) else None


def _undecided(shed: int, queued: int, drain_ms: float | None, drain_needed_ms: float | None) -> bool:
    """Tokens still queued, none shed, after a drain shorter than the one that judges the requests."""
    return (not shed and queued > 0 and drain_ms is not None and drain_needed_ms is not None
            and drain_ms < drain_needed_ms)


def drain_left_it_undecided(probe: dict[str, Any]) -> bool:
    """``Probe.drain_short`` of a probe read back from ``slo_capacity.json`` (a search written before probes recorded
    their drains has no ``drain_needed_ms``: decided, as it was then)."""
    return not probe.get("met") and _undecided(int(probe.get("tokens_shed") or 0), int(probe.get("tokens_queued") or 0),
                                               probe.get("drain_ms"), probe.get("drain_needed_ms"))


def judge(rate_rps: float, row: dict[str, str], slo_ttft_ms: float, slo_tpot_ms: float, *,
          drain_ms: float | None = None, drain_needed_ms: float | None = None) -> Probe:
    """A probe's verdict from its result row (the metrics service's CSV columns), after a drain of ``drain_ms`` where
    ``drain_needed_ms`` judges its requests (either None: not said)."""
    shed, queued = int(float(row.get("tokens_shed") or 0)), int(float(row.get("tokens_queued") or 0))
    ttft, tpot = _float(row, "ttft_p99_ms"), _float(row, "tpot_p99_ms")
    why = slo_misses(tokens_shed=shed, tokens_queued=queued, ttft_p99_ms=ttft, tpot_p99_ms=tpot,
                     slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)
    if drain_ms is not None and drain_needed_ms is not None and _undecided(shed, queued, drain_ms, drain_needed_ms):
        why = [w + (f" (after {drain_ms / 1e3:g} s of drain, short of the {drain_needed_ms / 1e3:g} s that judges "
                    "its requests: they may yet have met the SLO)") if "still queued" in w else w for w in why]
    return Probe(rate_rps=rate_rps, met=not why, why="; ".join(why),
                 tokens_offered=int(float(row.get("tokens_offered") or 0)),
                 tokens_served=int(float(row.get("tokens_served") or 0)), tokens_queued=queued, tokens_shed=shed,
                 ttft_p99_ms=ttft, tpot_p99_ms=tpot, goodput_tok_s=_float(row, "goodput_tok_s"),
                 bw_util=_float(row, "bw_util"), T_peak_logic=_float(row, "T_peak_logic"),
                 drain_ms=drain_ms, drain_needed_ms=drain_needed_ms)


def _at_rate(workload: WorkloadConfig, rate_rps: float, duration_ms: float, drain_ms: float,
             drain_judged: bool = False) -> WorkloadConfig:
    """``workload`` offering ``rate_rps`` over ``duration_ms`` of arrivals, then ``drain_ms`` of drain, validated: a
    value out of the serving config's bounds is a bad input naming it (``drain_judged``: the drain is the one that
    judges the requests, not one given, and the error says so)."""
    sv = workload.serving
    if sv is None:
        raise BadInput("workload: the SLO capacity is measured on a serving workload (a `serving` section)",
                       field="workload.serving")
    knobs = {"rate_rps": rate_rps, "duration_ms": duration_ms, "drain_ms": drain_ms}
    try:
        checked = type(sv).model_validate({**sv.model_dump(), **knobs})
    except ValidationError as exc:
        fld, msg = first_validation_error(exc)
        if fld == "drain_ms" and drain_judged:
            msg = (f"the drain that judges every request at {rate_rps:g} requests/s, {drain_ms:g} ms, is out of "
                   f"bounds ({msg}): give --drain-ms")
        raise BadInput(f"{fld}: {msg}", field=fld) from None
    return workload.model_copy(update={"serving": checked})


ProbeRun = Callable[[WorkloadConfig, Path], LocalResult]
DrainToJudge = Callable[[WorkloadConfig], float]  # a probe's workload -> the drain that judges its requests, ms


def check_sets(sets: dict[str, Any]) -> None:
    """``--set`` keys start with ``arch.``, ``tas.`` or ``workload.`` and are not the search's own knobs."""
    for key in sets:
        if key.split(".", 1)[0] not in SET_KINDS or "." not in key:
            raise BadInput(f"set: {key!r} must start with arch., tas. or workload.", field=f"set.{key}")
        if key in SEARCH_KEYS:
            raise BadInput(f"set: {key} is what the search sets (--lo/--hi, --duration-ms, --drain-ms)",
                           field=f"set.{key}")


def with_sets(model: M, kind: str, sets: dict[str, Any]) -> M:
    """``model`` (the ``kind`` config) with the values of ``sets`` under ``kind.`` replaced (the sweep's dotted keys,
    `service.set_dotted`), validated again; an unknown key or a bad value is a `BadInput` naming ``set.<key>``."""
    mine = {k: v for k, v in sets.items() if k.startswith(kind + ".")}
    if not mine:
        return model
    d = {kind: model.model_dump(mode="json")}
    for key, value in mine.items():
        set_dotted(d, key, value, where="set", source={kind: model})
    try:
        return type(model).model_validate(d[kind])
    except ValidationError as exc:
        fld, msg = first_validation_error(exc)
        raise BadInput(f"set: {kind}.{fld}: {msg}", field=f"set.{kind}.{fld}") from None


def _configs_with_sets(arch: str | Path, tas: str | Path, sets: dict[str, Any], out: Path
                       ) -> tuple[str | Path, str | Path]:
    """The arch and tas configs the probes run: the files given, or with ``--set`` values written to
    ``<out>/arch.json`` / ``<out>/tas.json`` (the search's own record of what it ran)."""
    paths: list[str | Path] = []
    for kind, path, load in (("arch", arch, load_arch), ("tas", tas, load_tas)):
        if not any(k.startswith(kind + ".") for k in sets):
            paths.append(path)
            continue
        model = with_sets(load(path), kind, sets)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{kind}.json").write_text(model.model_dump_json(), encoding="utf-8")
        paths.append(out / f"{kind}.json")
    return paths[0], paths[1]


def probe_paths(out: Path, rate_rps: float) -> tuple[Path, Path]:
    """A probe's results folder ``<out>/probe-<rate>`` and the workload file it runs,
    ``<out>/probe-<rate>.workload.json`` (one per rate: the rate's decimal point is not a suffix to replace)."""
    where = out / f"probe-{rate_rps:.6g}"
    return where, where.parent / f"{where.name}.workload.json"


def finished_probe(where: Path, scenario: str, spec: ExperimentSpec, *, drain_given: bool = True,
                   drain_needed_ms: float | None = None) -> dict[str, str] | None:
    """The result row of a probe an earlier search finished in ``where`` (an interrupted search run again with the
    same ``--out`` reads it instead of running it again), or None when it did not finish (what it left is then
    removed, `_clear_probe`). A folder holding anything else, a probe whose run log records other configs than
    ``spec`` or another scenario's or workload's run (an earlier search of another chip, policy, scenario or workload
    in the same folder), is refused, naming ``out``: its verdict would stand for configs it did not run, and it is
    not this search's to remove. ``drain_given`` / ``drain_needed_ms``: whether this search's drain is ``--drain-ms``
    and the drain that judges the probe's requests, so that a refusal over the drain alone says how to resume."""
    csv_path = result_csv_path(where, scenario, spec.workload.label)
    others = sorted({p.parent.name for p in where.glob("runs/*/run.log")} - {scenario}) + sorted(
        str(p.relative_to(where)) for p in where.glob("*/*.csv") if p != csv_path)
    if others:
        raise BadInput(f"out: {where} holds runs this search did not make ({', '.join(others)}); search into another "
                       "folder (or remove that one)", field="out")
    if not csv_path.is_file():
        return None
    ran = logged_config(where / "runs" / scenario / "run.log")
    want = spec.for_scenario(scenario).model_dump(mode="json")
    if ran != want:
        raise BadInput(f"out: {where} holds a finished probe of other configs than this search's"
                       f"{_only_the_drain(ran, want, drain_given, drain_needed_ms)}; search into another folder "
                       "(or remove that one)", field="out")
    with csv_path.open(encoding="utf-8") as fh:
        return next(csv.DictReader(fh))


def _only_the_drain(ran: dict[str, Any] | None, want: dict[str, Any], drain_given: bool,
                    drain_needed_ms: float | None) -> str:
    """When a finished probe differs from this search's only in its drain: the words that say so and how to resume
    it (a search that drained each probe until its requests were judged resumes without ``--drain-ms``; one of a
    fixed drain, with that drain)."""
    def drain(cfg: dict[str, Any] | None) -> Any:
        return (((cfg or {}).get("workload") or {}).get("serving") or {}).get("drain_ms")

    old, new = drain(ran), drain(want)
    if ran is None or old is None or new is None or old == new:
        return ""
    same = json.loads(json.dumps(ran))
    same["workload"]["serving"]["drain_ms"] = new
    if same != want:
        return ""
    if drain_given and drain_needed_ms is not None and float(old) == drain_needed_ms:
        how = "without --drain-ms (each probe drained until its requests are judged) resumes it"
    else:
        how = f"--drain-ms {float(old):.10g} resumes it, if every probe of that search drained as long"
    return (f": only its drain differs, {float(old) / 1e3:.10g} s against this search's {float(new) / 1e3:.10g} s "
            f"({how})")


def _clear_probe(where: Path) -> None:
    """Remove what an unfinished probe left (its results folder and database): it runs again from the start."""
    shutil.rmtree(where, ignore_errors=True)
    for db in where.parent.glob(f"{where.name}.sqlite3*"):
        db.unlink()


def _drain_words(done: list[Probe], drain_ms: float | None, limits: tuple[float, float]) -> str:
    """How long the probes drained, for the verdict's sentence."""
    if drain_ms is not None:
        return f"{drain_ms / 1e3:g} s of drain"
    spans = sorted(p.drain_ms for p in done if p.drain_ms is not None)
    span = f"{spans[0] / 1e3:g} s" if spans[0] == spans[-1] else f"{spans[0] / 1e3:g} to {spans[-1] / 1e3:g} s"
    return (f"the drain that judges every request it offers (the last deadline, arrival + {limits[0]:g} ms + the "
            f"output's decode at {limits[1]:g} ms a token, after the arrivals: {span})")


def requests_offered(rate_rps: float, duration_ms: float) -> int:
    """The requests a run at ``rate_rps`` is offered over ``duration_ms`` of arrivals: ``round(rate · duration)``
    (services/workload/arrivals.py), so the rate a run offers is a whole number of requests over its arrivals."""
    return round(rate_rps * round(duration_ms * 1e6) * 1e-9)


def _search(one: Callable[[int], Probe], lo: int, hi: int, probes: int) -> tuple[list[Probe], Probe | None]:
    """The probes in the order they ran and the best met, in whole requests over the arrivals (``one(n)`` runs the
    rate of ``n`` requests). Up from ``lo``, doubling (never past ``hi``) while met, then bisection in log rate
    between the last met and the first missed until they are one request apart (two rates that round to the same
    count would run the same requests): an overloaded probe (slow to simulate: its queues only grow) is run once,
    not at every step."""
    done: list[Probe] = []
    n, best, a = lo, None, lo
    while len(done) < probes:
        p = one(n)
        done.append(p)
        if not p.met:
            break
        best, a = p, n
        if n >= hi:
            return done, best
        n = min(2 * n, hi)
    if best is None:
        return done, None
    b = n
    while len(done) < probes and b - a > 1:
        mid = min(b - 1, max(a + 1, round(math.sqrt(a * b))))
        p = one(mid)
        done.append(p)
        if p.met:
            a, best = mid, p
        else:
            b = mid
    return done, best


def measure_slo_capacity(*, arch: str | Path, workload: str | Path, tas: str | Path, out: Path, lo_rps: float,
                         hi_rps: float, probes: int = 7, duration_ms: float = 20_000.0, drain_ms: float | None = None,
                         scenario: Scenario = "baseline", settings: Settings | None = None,
                         run: ProbeRun | None = None, on_probe: Callable[[Probe], None] | None = None,
                         sets: dict[str, Any] | None = None, drain_to_judge: DrainToJudge | None = None
                         ) -> SloCapacity:
    """Bisect the offered rate between ``lo_rps`` and ``hi_rps`` (see the module docstring); each probe's results
    folder is ``<out>/probe-<rate>``, and ``<out>/slo_capacity.json`` and ``slo_capacity.csv`` hold the verdict."""
    if not 0 < lo_rps < hi_rps:
        raise BadInput("lo_rps: 0 < lo < hi is needed", field="lo_rps")
    if not 2 <= probes <= 64:
        raise BadInput("probes: 2 (the two ends) to 64 runs", field="probes")
    sets = dict(sets or {})
    check_sets(sets)
    base = with_sets(load_workload(workload), "workload", sets)
    if run is None:
        arch, tas = _configs_with_sets(arch, tas, sets, out)
    slo = _at_rate(base, lo_rps, duration_ms, drain_ms or 0.0).serving
    assert slo is not None
    limits = (slo.slo.ttft_p99_ms, slo.slo.tpot_p99_ms)
    judge_drain = drain_to_judge or (lambda wl: drain_to_judge_ms(wl, settings))
    lo_n, hi_n = max(1, requests_offered(lo_rps, duration_ms)), requests_offered(hi_rps, duration_ms)
    if hi_n <= lo_n:
        raise BadInput(f"hi_rps: {hi_rps:g} requests/s offers no more requests over {duration_ms:g} ms of arrivals "
                       f"than lo_rps {lo_rps:g} ({lo_n}): a rate is a whole number of requests over the arrivals",
                       field="hi_rps")

    def _probe_spec(wl: WorkloadConfig) -> ExperimentSpec:
        # as the probe's run reads it: from its workload file (a YAML reader; an inline model's free-form config
        # keeps what the file round trip makes of it)
        with tempfile.TemporaryDirectory() as tmp:
            wl_path = Path(tmp) / "workload.json"
            wl_path.write_text(wl.model_dump_json(), encoding="utf-8")
            return local_spec(arch=arch, workload=wl_path, tas=tas, scenarios=[scenario], traces=False,
                              settings=settings)

    def _run_probe(wl: WorkloadConfig, where: Path, wl_file: Path) -> dict[str, str]:
        if run is not None:
            res = run(wl, where)
        else:
            _clear_probe(where)
            wl_file.parent.mkdir(parents=True, exist_ok=True)
            wl_file.write_text(wl.model_dump_json(), encoding="utf-8")
            res = run_local(arch=arch, workload=wl_file, tas=tas, out=where, scenarios=[scenario], traces=False,
                            settings=settings, database_url=f"sqlite:///{where}.sqlite3")
        check_ok(res)
        with res.csvs[scenario].open(encoding="utf-8") as fh:
            return next(csv.DictReader(fh))

    def one(n: int) -> Probe:
        rate = n / (duration_ms * 1e-3)  # n requests over the arrivals
        needed = judge_drain(_at_rate(base, rate, duration_ms, 0.0))
        drain = needed if drain_ms is None else drain_ms
        wl = _at_rate(base, rate, duration_ms, drain, drain_judged=drain_ms is None)
        where, wl_file = probe_paths(out, rate)
        row = None if run is not None else finished_probe(where, scenario, _probe_spec(wl),
                                                          drain_given=drain_ms is not None, drain_needed_ms=needed)
        if row is None:
            row = _run_probe(wl, where, wl_file)
        verdict = judge(rate, row, *limits, drain_ms=drain, drain_needed_ms=needed)
        if on_probe is not None:
            on_probe(verdict)
        return verdict

    done, best = _search(one, lo_n, hi_n, probes)
    per = 1.0 / (duration_ms * 1e-3)  # requests/s of one request over the arrivals
    how = (f"doubling from {lo_n * per:g} requests/s up to {hi_n * per:g} until a rate is missed, then bisection in "
           f"log rate until the highest met and the lowest missed are one request apart (every rate a whole number "
           f"of requests over the arrivals: steps of {per:g} requests/s); {len(done)} runs of {scenario}, each "
           f"{duration_ms / 1e3:g} s of arrivals and {_drain_words(done, drain_ms, limits)}; met = no request shed, "
           f"every request finished, p99 TTFT <= {limits[0]:g} ms and p99 TPOT <= {limits[1]:g} ms")
    if sets:
        how += "; configs with " + ", ".join(f"{k} = {v}" for k, v in sets.items())
    if best is not None and all(p.met for p in done):
        how += "; every rate tried was met: the capacity is at least the highest (a bound)"
    short = [p for p in done if p.drain_short]
    if short:
        how += ("; " + ", ".join(f"{p.rate_rps:g}" for p in short) + " requests/s missed on tokens still queued after "
                "a drain short of the one that judges their requests: perhaps the drain's miss, not the chip's"
                + (", so the capacity is at least the one found (a bound)" if best is not None else ""))
    tok_s = (best.tokens_offered / (duration_ms * 1e-3)) if best is not None else None
    result = SloCapacity(rate_rps=best.rate_rps if best is not None else None, tok_s=tok_s, probes=done, how=how,
                         scenario=scenario, duration_ms=duration_ms, drain_ms=drain_ms, set=sets)
    out.mkdir(parents=True, exist_ok=True)
    (out / "slo_capacity.json").write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    with (out / "slo_capacity.csv").open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(asdict(done[0])))
        w.writeheader()
        for p in sorted(done, key=lambda x: x.rate_rps):
            w.writerow(asdict(p))
    return result
