"""The SLO capacity of each scenario of an experiment on ``docs/results.md``: collected from ``tasmoe capacity``'s
folders, rendered by the ``{{capacity ...}}`` placeholders of ``scripts/render_results.py``.

- **collect**: ``results/capacity/<experiment>/<scenario>/`` (``tasmoe capacity --scenario S --out`` that folder) holds
  ``slo_capacity.json`` and one results folder per probe (``probe-<rate>/``). Every probe is checked to have run the
  experiment's chip and policies, its one scenario, and the experiment's workload with only the offered rate, the
  arrivals and the drain replaced (the capacity search's three knobs); a probe that ran anything else is an error. The
  verdicts go to ``docs/results/<experiment>/capacity.json`` with a digest of the configs they ran, so that a later
  collect of the experiment keeps them only while its configs are the same.
- **render**: ``{{capacity}}`` the table (one row per scenario searched: the highest rate met, the lowest missed, and
  the met probe's figures), ``{{capacity throttling}}`` the sentence on what throttling costs in capacity (the
  brackets of the unthrottled reference and of baseline), ``{{capacity SCENARIO KEY [FORMAT]}}`` one number
  (``rate_rps``, ``first_missed_rps``, ``tok_s``, ``bracket_pct`` or a field of the met probe).

A capacity is known to the probes' resolution only: the highest rate met and the lowest rate missed bracket it. A
miss on tokens still queued after a drain shorter than the one that judges the probe's requests
(``services.orchestrator.slo_capacity.Probe.drain_short``) decides nothing: it is listed as undecided, never taken as
the lowest rate missed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

CAPACITY_OUT = "results/capacity"  # results/capacity/<experiment>/<scenario>/: tasmoe capacity --out
CAPACITY_FILE = "capacity.json"  # docs/results/<experiment>/capacity.json
SEARCH_KNOBS = ("rate_rps", "duration_ms", "drain_ms")  # what a probe replaces of the experiment's serving workload


class CapacityError(Exception):
    """A capacity folder that cannot stand for the experiment, or a placeholder the data cannot fill."""


def configs_digest(expected: dict[str, Any]) -> str:
    """A digest of the configs a capacity search ran, its own knobs left out: arch, tas and the workload without
    ``serving.rate_rps``, ``duration_ms`` and ``drain_ms``."""
    wl = json.loads(json.dumps(expected["workload"]))
    for k in SEARCH_KNOBS:
        (wl.get("serving") or {}).pop(k, None)
    canon = json.dumps({"arch": expected["arch"], "tas": expected["tas"], "workload": wl}, sort_keys=True)
    return hashlib.sha256(canon.encode()).hexdigest()


def scenario_config(expected: dict[str, Any], scenario: str) -> dict[str, Any]:
    """The configs a run of ``scenario`` records: the experiment's, with the unthrottled reference's chip for
    ``unthrottled`` (``shared.configs.arch.unthrottled``: no DVFS trips, no DTM limit)."""
    if scenario != "unthrottled":
        return expected
    from shared.configs import ArchConfig
    from shared.configs.arch import unthrottled

    return {**expected, "arch": unthrottled(ArchConfig.model_validate(expected["arch"])).model_dump(mode="json")}


def _check_probe(probe_dir: Path, scenario: str, rate: float, expected: dict[str, Any],
                 run_config: Callable[[Path], dict[str, Any]]) -> float:
    """Check one probe's run log against ``expected`` (`scenario_config`: the configs a run of ``scenario`` records);
    its arrivals, ms."""
    ran = run_config(probe_dir)
    if list(ran.get("scenarios", [])) != [scenario]:
        raise CapacityError(f"{probe_dir} ran the scenarios {ran.get('scenarios')}, not [{scenario!r}]")
    for key in ("arch", "tas"):
        if ran.get(key) != expected[key]:
            raise CapacityError(f"{probe_dir} ran another {key} config than the experiment's")
    want = json.loads(json.dumps(expected["workload"]))
    got_sv = (ran.get("workload") or {}).get("serving") or {}
    if want.get("serving") is None:
        raise CapacityError(f"{probe_dir}: the experiment's workload has no serving section: no SLO capacity")
    for k in SEARCH_KNOBS:
        want["serving"][k] = got_sv.get(k)
    if ran.get("workload") != want:
        raise CapacityError(f"{probe_dir} ran another workload than the experiment's (besides its rate, arrivals "
                            "and drain)")
    if got_sv.get("rate_rps") is None or abs(float(got_sv["rate_rps"]) - rate) > 1e-9 * rate:
        raise CapacityError(f"{probe_dir} ran {got_sv.get('rate_rps')} requests/s, its verdict says {rate:g}")
    return float(got_sv["duration_ms"])


def _verdict(folder: Path, scenario: str, expected: dict[str, Any],
             run_config: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """One scenario's search, its probes checked (module docstring). A rate is reported as the run offered it: a
    whole number of requests over the arrivals (``requests_offered``), and two probes of the same count are one."""
    from services.orchestrator.slo_capacity import drain_left_it_undecided, requests_offered

    found = json.loads((folder / "slo_capacity.json").read_text(encoding="utf-8"))
    raw = sorted(found.get("probes") or [], key=lambda p: float(p["rate_rps"]))
    if not raw:
        raise CapacityError(f"{folder}/slo_capacity.json has no probes")
    by_count: dict[int, dict[str, Any]] = {}
    duration_ms = None
    want = scenario_config(expected, scenario)
    for p in raw:
        rate = float(p["rate_rps"])
        duration_ms = _check_probe(folder / f"probe-{rate:.6g}", scenario, rate, want, run_config)
        n = requests_offered(rate, duration_ms)
        same = by_count.get(n)
        if same is not None and same["met"] != p["met"]:
            raise CapacityError(f"{folder}: two probes of {n} requests, one met and one missed")
        by_count[n] = {**p, "rate_rps": n / (duration_ms * 1e-3), "requests": n}
    probes = [by_count[n] for n in sorted(by_count)]
    met = [p for p in probes if p["met"]]
    best = met[-1] if met else None
    above = [p for p in probes if not p["met"] and (best is None or p["requests"] > best["requests"])]
    undecided = [p["rate_rps"] for p in above if drain_left_it_undecided(p)]
    missed = [p["rate_rps"] for p in above if not drain_left_it_undecided(p)]
    top = [p for p in raw if p["met"]]
    if (found.get("rate_rps") is None) != (best is None) or (
            top and found.get("rate_rps") != max(float(p["rate_rps"]) for p in top)):
        raise CapacityError(f"{folder}/slo_capacity.json: its capacity is not its highest met probe")
    tok_s = None if best is None or duration_ms is None else best["tokens_offered"] / (duration_ms * 1e-3)
    return {"scenario": scenario, "rate_rps": None if best is None else best["rate_rps"], "tok_s": tok_s,
            "first_missed_rps": min(missed) if missed else None, "undecided_rps": undecided,
            "how": found.get("how", ""),
            "duration_ms": duration_ms, "best": best, "probes": probes, "runs": len(raw)}


def collect_capacity(name: str, *, results_root: Path, data: Path, scenarios: tuple[str, ...],
                     expected: dict[str, Any], kept: dict[str, Any] | None,
                     run_config: Callable[[Path], dict[str, Any]], say: Callable[[str], None]) -> None:
    """``data/capacity.json`` from ``results/capacity/<name>/<scenario>/`` for each scenario searched; without any, the
    ``kept`` verdicts (the committed file read before the folder was renewed) while they ran the same configs."""
    root = results_root / CAPACITY_OUT / name
    digest = configs_digest(expected)
    found = {sc: _verdict(root / sc, sc, expected, run_config) for sc in scenarios
             if (root / sc / "slo_capacity.json").is_file()}
    if not found:
        if kept is not None and kept.get("configs_sha256") == digest:
            (data / CAPACITY_FILE).write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            say(f"{name}: no {root}/<scenario>/slo_capacity.json: the committed capacities are kept (same configs)")
        elif kept is not None:
            say(f"{name}: the committed capacities ran other configs and are dropped; `tasmoe capacity --scenario S "
                f"--out {CAPACITY_OUT}/{name}/S` measures them again")
        return
    out = {"configs_sha256": digest, "scenarios": found}
    (data / CAPACITY_FILE).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    say(f"{name}: SLO capacity of {', '.join(found)} -> {data / CAPACITY_FILE}")


# --- render ---------------------------------------------------------------------------------------------------------

def _load(data: Path) -> dict[str, dict[str, Any]]:
    path = data / CAPACITY_FILE
    if not path.is_file():
        raise CapacityError(f"{{{{capacity}}}}: no {path} (`tasmoe capacity --scenario S --out "
                            f"{CAPACITY_OUT}/<experiment>/S`, then collect)")
    out: dict[str, dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["scenarios"]
    return out


def _num(v: Any, fmt: str) -> str:
    return "–" if v is None else format(float(v), fmt)


def _bracket_pct(v: dict[str, Any]) -> float | None:
    """The width of a capacity's bracket, % of the lowest rate missed."""
    lo, hi = v.get("rate_rps"), v.get("first_missed_rps")
    return None if lo is None or hi is None else 100.0 * (1.0 - float(lo) / float(hi))


def capacity_table(found: dict[str, dict[str, Any]], order: list[str]) -> str:
    head = ("| scenario | capacity req/s (highest met) | lowest missed req/s | output tok/s asked (over the arrivals) "
            "| goodput tok/s (whole run) | TTFT p99 ms | TPOT p99 ms | peak logic °C | DRAM bandwidth use | runs |")
    rule = "|---|" + "---:|" * 9
    rows = []
    for sc in [s for s in order if s in found]:
        v, best = found[sc], found[sc].get("best") or {}
        rows.append(f"| {sc} | {_num(v['rate_rps'], '.3g')} | {_num(v['first_missed_rps'], '.3g')} "
                    f"| {_num(v['tok_s'], '.1f')} | {_num(best.get('goodput_tok_s'), '.1f')} "
                    f"| {_num(best.get('ttft_p99_ms'), '.0f')} | {_num(best.get('tpot_p99_ms'), '.1f')} "
                    f"| {_num(best.get('T_peak_logic'), '.1f')} | {_num(best.get('bw_util'), '.2f')} "
                    f"| {v['runs']} |")
    by_how: dict[str, list[str]] = {}
    for sc in [s for s in order if s in found] + sorted(set(found) - set(order)):
        by_how.setdefault(found[sc]["how"].replace(f"runs of {sc},", "runs,"), []).append(sc)
    how = "How each was found: " + "; ".join(f"{', '.join(scs)}: {h}" for h, scs in by_how.items()) + "." \
        if by_how else ""
    undecided = [f"{sc} at {', '.join(format(float(r), '.3g') for r in found[sc]['undecided_rps'])} requests/s"
                 for sc in [s for s in order if s in found] if found[sc].get("undecided_rps")]
    if undecided:
        how += (" Missed but not decided (tokens still queued after a drain short of the one that judges their "
                "requests; not taken as the lowest missed): " + "; ".join(undecided) + ".")
    return "\n".join([head, rule, *rows]) + ("\n\n" + how.strip() if how else "")


def throttling_sentence(found: dict[str, dict[str, Any]]) -> str:
    """What throttling costs in capacity: baseline's bracket against the unthrottled reference's."""
    u, b = found.get("unthrottled"), found.get("baseline")
    if u is None or b is None:
        return "No throttling line: the capacity of baseline and of the unthrottled reference are both needed."
    ul, uh, bl, bh = (x if x is None else float(x) for x in
                      (u["rate_rps"], u["first_missed_rps"], b["rate_rps"], b["first_missed_rps"]))
    said = (f"Throttling at the SLO: the unthrottled chip meets it at {_num(ul, '.3g')} requests/s and misses it at "
            f"{_num(uh, '.3g')}; baseline meets it at {_num(bl, '.3g')} and misses it at {_num(bh, '.3g')}. ")
    if ul is None or bl is None or uh is None:
        return said + "A bracket is open, so the loss is not bounded by these probes."
    most = max(0.0, 100.0 * (1.0 - bl / uh))  # baseline's lowest possible against the reference's highest
    least = 0.0 if bh is None else max(0.0, 100.0 * (1.0 - bh / ul))
    if (ul, uh) == (bl, bh):
        return said + (f"The same bracket: throttling costs no capacity these probes resolve (less than "
                       f"{most:.1f} % of the reference's).")
    return said + f"Throttling costs between {least:.1f} % and {most:.1f} % of the reference's capacity."


def capacity_text(data: Path, args: str, order: list[str]) -> str:
    """``{{capacity}}``, ``{{capacity throttling}}`` or ``{{capacity SCENARIO KEY [FORMAT]}}`` (module docstring)."""
    found = _load(data)
    parts = args.split()
    if not parts:
        return capacity_table(found, order)
    if parts == ["throttling"]:
        return throttling_sentence(found)
    if len(parts) not in (2, 3) or parts[0] not in found:
        raise CapacityError(f"{{{{capacity {args}}}}}: expected SCENARIO KEY [FORMAT] with SCENARIO one of "
                            f"{', '.join(found)}")
    v, key, fmt = found[parts[0]], parts[1], parts[2] if len(parts) == 3 else "g"
    best = v.get("best") or {}
    if key == "bracket_pct":
        value = _bracket_pct(v)
    elif key in ("rate_rps", "first_missed_rps", "tok_s"):
        value = v[key]
    elif key in best:
        value = best[key]
    else:
        raise CapacityError(f"{{{{capacity {args}}}}}: no {key!r} in {parts[0]}'s capacity")
    return _num(value, fmt)
