"""Continuous batching (``PhysicalizeRequest.serving``): the physicalizer as the scheduler of a serving system, at
iteration level as vLLM's, forming each micro-batch from the requests it holds when a pipeline lane is free.

State (`ServingCarry`, the wire form `ServingState`): the waiting queue (FCFS), the running requests (each with its
prefill progress, output tokens, first and latest token times, its lane, and whether a token of it is in flight), per
lane the micro-batch in flight on it, the composition of those micro-batches, the next micro-batch id and the run's
token offset. There are ``ctx.open_limit`` lanes (``arch.schedule``: 1 when attention runs on all cores, one per core
group with ``attention: group``); a lane has at most one micro-batch in flight, so the lanes' micro-batches always
pass admission.

A window ``[t0, t1)``:

1. **Formation** (`form`), at ``t0``: every free lane, in lane order, forms one micro-batch: first one decode token of
   each of its running requests whose prompt is prefilled (``context`` = prompt + generated − 1: the KV cache holds
   the prompt and every output token but the latest, the one decoded now), then prompt chunks: its partially
   prefilled requests first, then new requests from the head of the waiting queue (FCFS; they join the running set
   on this lane) while fewer than ``max_running`` run; each chunk at most ``prefill_chunk`` tokens and the batch at
   most ``max_batch_tokens``. A decode token and the chunk that completes a prompt ``emit`` an output token. A lane
   with nothing to do stays free. Micro-batch ids rise through the run, the id of lane ``l``'s micro-batches ≡ ``l``
   (mod lanes), so with ``attention: group`` (one lane per group) lane ``l`` runs on group ``l``. The rows come from
   the workload service (``POST /v1/traces/{id}/microbatches``, one call for all the window's micro-batches) and
   join admission as micro-batches arriving at ``t0``.
2. **Completion** (`credit`): each micro-batch finishing in the window credits its requests: prompt progress; an
   emitted token (generated + 1, the first token's time, a latency sample: the time since the request's previous
   token, or since its arrival for the first); a request whose last output token it was finishes (a
   ``RequestsDone`` record) and leaves the running set; the lane is free again.
3. **Arrivals** (`arrive`): the window's requests join the waiting queue at their arrival times; one arriving when
   ``queue_limit`` requests wait is shed (counted, with its output tokens). No request leaves the queue during the
   window (formation happens at its start), so the first ``queue_limit − waiting`` arrivals join and the rest are
   shed.

Formation at window boundaries: a lane freed at ``f`` forms its next micro-batch at the first window start ``≥ f``.
Each iteration is late by less than one window (3 ms against the ~100 ms iterations of these chips: ~1-3 %), a bias
toward longer TTFT and TPOT, the price of a window's schedule that never looks inside the window for new work.

The output tokens balance exactly (shared/token_balance.py): offered = completed + queued at the end + shed.
Everything is integer arithmetic on arrays in a fixed order: deterministic, and the same whichever epoch a window
falls in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from services.lowering.physical.columns import index_of
from shared.configs.workload import ServingConfig
from shared.contracts.events import BatchesInFlight, PendingTokens, RequestsDone, RunningRequests, ServingState
from shared.contracts.workload import (
    BatchSeqs,
    LogicalCompute,
    LogicalMemory,
    LogicalWindow,
    MicroBatchRows,
    MicroBatchSpec,
    Requests,
)
from shared.errors import BadInput

I64 = NDArray[np.int64]
B = NDArray[np.bool_]
MicroBatchFn = Callable[[str, Sequence[MicroBatchSpec]], MicroBatchRows]
"""The workload service's rows of micro-batches of a serving trace: ``(trace_id, batches) -> rows``."""

NONE = -1  # a time not reached yet, a free lane


def _ints(values: Sequence[int]) -> I64:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _bools(values: Sequence[bool]) -> B:
    return np.asarray(values, dtype=bool).reshape(-1)


@dataclass(frozen=True)
class Table:
    """Columns of equal length (a ``Columnar`` as numpy arrays)."""

    cols: dict[str, NDArray[Any]]

    def __len__(self) -> int:
        return int(next(iter(self.cols.values())).size)

    def __getitem__(self, name: str) -> NDArray[Any]:
        return self.cols[name]

    def take(self, idx: I64 | B) -> Table:
        return Table({k: v[idx] for k, v in self.cols.items()})

    def cat(self, other: Table) -> Table:
        if not len(other):
            return self
        return Table({k: np.concatenate([v, other.cols[k]]) for k, v in self.cols.items()})

    def with_(self, **cols: NDArray[Any]) -> Table:
        return Table({**self.cols, **cols})

    def lists(self) -> dict[str, list[Any]]:
        return {k: v.tolist() for k, v in self.cols.items()}


def _requests(r: Requests) -> Table:
    return Table({"request_id": _ints(r.request_id), "t_arrival_ns": _ints(r.t_arrival_ns),
                  "prompt_tokens": _ints(r.prompt_tokens), "output_tokens": _ints(r.output_tokens)})


def _running(r: RunningRequests) -> Table:
    cols: dict[str, NDArray[Any]] = {k: _ints(getattr(r, k)) for k in RunningRequests.columns() if k != "in_flight"}
    cols["in_flight"] = _bools(r.in_flight)
    return Table(cols)


def _batches(b: BatchesInFlight) -> Table:
    return Table({"mb_id": _ints(b.mb_id), "request_id": _ints(b.request_id), "new_tokens": _ints(b.new_tokens),
                  "emits": _bools(b.emits)})


@dataclass(frozen=True)
class ServingCarry:
    """`ServingState` as columns (see the module docstring); ``running`` in the order the requests started."""

    waiting: Table
    running: Table
    lanes: I64  # per lane: its micro-batch in flight (-1: free)
    batches: Table
    next_mb_id: int
    token_offset: int

    @classmethod
    def fresh(cls, n_lanes: int) -> ServingCarry:
        return cls.of(ServingState(), n_lanes)

    @classmethod
    def of(cls, st: ServingState, n_lanes: int) -> ServingCarry:
        """The wire state, checked: its lanes against ``n_lanes`` (an empty list: a fresh run's, all free), every
        micro-batch in flight on a lane, its requests running and marked in flight."""
        lanes = _ints(st.lanes) if st.lanes else np.full(n_lanes, NONE, dtype=np.int64)
        if lanes.size != n_lanes:
            raise BadInput(f"state.serving.lanes has {lanes.size} lanes, the arch's schedule {n_lanes}",
                           field="state.serving.lanes")
        sc = cls(waiting=_requests(st.waiting), running=_running(st.running), lanes=lanes,
                 batches=_batches(st.batches), next_mb_id=st.next_mb_id, token_offset=st.token_offset)
        b, r = sc.batches, sc.running
        on_lane = np.isin(b["mb_id"], lanes[lanes >= 0])
        if not on_lane.all():
            i = int(np.flatnonzero(~on_lane)[0])
            raise BadInput(f"micro-batch {int(b['mb_id'][i])} in flight on no lane", field=f"state.serving.batches"
                                                                                           f".mb_id[{i}]")
        pos = index_of(r["request_id"], b["request_id"])
        ok = pos >= 0
        ok[ok] = r["in_flight"][pos[ok]]
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise BadInput(f"request {int(b['request_id'][i])} of a micro-batch in flight is not running in flight",
                           field=f"state.serving.batches.request_id[{i}]")
        if ((r["lane"] < 0) | (r["lane"] >= n_lanes)).any():
            i = int(np.flatnonzero((r["lane"] < 0) | (r["lane"] >= n_lanes))[0])
            raise BadInput(f"lane {int(r['lane'][i])} outside 0..{n_lanes - 1}", field=f"state.serving.running.lane"
                                                                                          f"[{i}]")
        return sc

    def to_state(self) -> ServingState:
        return ServingState.model_construct(
            waiting=Requests.model_construct(None, **self.waiting.lists()),
            running=RunningRequests.model_construct(None, **self.running.lists()),
            lanes=self.lanes.tolist(), batches=BatchesInFlight.model_construct(None, **self.batches.lists()),
            next_mb_id=self.next_mb_id, token_offset=self.token_offset)


def _alloc(caps: I64, budget: int) -> I64:
    """Tokens given to each of ``caps`` in order out of ``budget``: each its cap while the budget lasts (the first
    one it runs out on gets the rest, the later ones 0)."""
    before = np.cumsum(caps) - caps
    out: I64 = np.clip(budget - before, 0, caps)
    return out


# ---- 1. formation ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Formed:
    """The state after formation and the micro-batches formed (in lane order)."""

    carry: ServingCarry
    specs: list[MicroBatchSpec]


def form(sc: ServingCarry, sv: ServingConfig, t0: int) -> Formed:
    """Every free lane forms its micro-batch at ``t0`` (module docstring, 1.)."""
    n_lanes = sc.lanes.size
    running, waiting = sc.running, sc.waiting
    lanes = sc.lanes.copy()
    next_id, offset = sc.next_mb_id, sc.token_offset
    specs: list[MicroBatchSpec] = []
    new_batches: list[Table] = []
    for lane in np.flatnonzero(lanes < 0).tolist():
        mine = np.flatnonzero(running["lane"] == lane)
        pre, prompt = running["prefilled"][mine], running["prompt_tokens"][mine]
        dec = mine[pre >= prompt]
        part = mine[pre < prompt]
        budget = sv.max_batch_tokens - dec.size
        c_part = _alloc(np.minimum(sv.prefill_chunk, running["prompt_tokens"][part] - running["prefilled"][part]),
                        budget)
        budget -= int(c_part.sum())
        room = max(0, sv.max_running - len(running))
        head = waiting.take(np.arange(min(room, len(waiting))))
        c_new = _alloc(np.minimum(sv.prefill_chunk, head["prompt_tokens"]), budget)
        n_new = int(np.count_nonzero(c_new))  # a prefix of the queue: the budget runs out once
        part, c_part = part[c_part > 0], c_part[c_part > 0]
        c_new = c_new[:n_new]
        if not dec.size and not part.size and not n_new:
            continue
        joined = head.take(np.arange(n_new))
        waiting = waiting.take(np.arange(n_new, len(waiting)))
        z = np.zeros(n_new, dtype=np.int64)
        running = running.cat(Table({
            **joined.cols, "prefilled": z, "generated": z, "t_first_token_ns": z + NONE, "t_last_token_ns": z + NONE,
            "lane": z + lane, "in_flight": np.zeros(n_new, dtype=bool)}))
        new_pos = np.arange(len(running) - n_new, len(running))
        rows = np.concatenate([dec, part, new_pos])
        new_tok = np.concatenate([np.ones(dec.size, dtype=np.int64), c_part, c_new])
        context = np.concatenate([running["prompt_tokens"][dec] + running["generated"][dec] - 1,
                                  running["prefilled"][part], z])
        done_prompt = running["prefilled"][rows] + new_tok >= running["prompt_tokens"][rows]
        emits = np.concatenate([np.ones(dec.size, dtype=bool), done_prompt[dec.size:]])
        fly = running["in_flight"].copy()
        fly[rows] = True
        running = running.with_(in_flight=fly)
        mb = next_id + (lane - next_id) % n_lanes
        next_id = mb + 1
        lanes[lane] = mb
        rid = running["request_id"][rows]
        specs.append(MicroBatchSpec.model_construct(
            mb_id=mb, t_ns=t0, token_offset=offset,
            seqs=BatchSeqs.model_construct(request_id=rid.tolist(), new_tokens=new_tok.tolist(),
                                           context=context.tolist(), emits=emits.tolist())))
        offset += int(new_tok.sum())
        new_batches.append(Table({"mb_id": np.full(rows.size, mb, dtype=np.int64), "request_id": rid,
                                  "new_tokens": new_tok, "emits": emits}))
    if not specs:
        return Formed(carry=sc, specs=[])
    batches = sc.batches
    for t in new_batches:
        batches = batches.cat(t)
    return Formed(carry=ServingCarry(waiting=waiting, running=running, lanes=lanes, batches=batches,
                                     next_mb_id=next_id, token_offset=offset), specs=specs)


def rows_window(logical: LogicalWindow, specs: Sequence[MicroBatchSpec], microbatches: MicroBatchFn) -> LogicalWindow:
    """The window with the rows of the micro-batches formed at its start (the workload service's, one call) in
    place of its own (none); its requests are the scheduler's, not admission's."""
    if specs:
        got = microbatches(logical.trace_id, specs)
        compute, memory = got.compute, got.memory
    else:
        compute, memory = LogicalCompute.empty(), LogicalMemory.empty()
    return LogicalWindow.model_construct(trace_id=logical.trace_id, window=logical.window, t0_ns=logical.t0_ns,
                                         t1_ns=logical.t1_ns, compute=compute, memory=memory, tokens_generated=0,
                                         requests=Requests.empty())


# ---- 2. completion --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Credited:
    """What the micro-batches completing in the window gave: output tokens emitted, one latency sample each (ms, in
    completion order), and the requests that finished."""

    tokens: int
    latencies_ms: list[float]
    done: RequestsDone


def credit(sc: ServingCarry, done: Sequence[PendingTokens]) -> tuple[ServingCarry, Credited]:
    """Credit the micro-batches ``done`` (completing in the window, by finish time then id) to their requests
    (module docstring, 2.); a completed micro-batch that is not the scheduler's (none in a serving run) credits
    nothing."""
    none = Credited(tokens=0, latencies_ms=[], done=RequestsDone.empty())
    if not done or not len(sc.batches):
        return sc, none
    d_mb = _ints([p.mb_id for p in done])
    d_fin = _ints([p.finish_ns for p in done])
    b = sc.batches
    k = index_of(d_mb, b["mb_id"])
    sel = np.flatnonzero(k >= 0)
    if not sel.size:
        return sc, none
    sel = sel[np.lexsort((b["mb_id"][sel], d_fin[k[sel]]))]  # by completion, then micro-batch, then its order
    fin = d_fin[k[sel]]
    r = sc.running
    pos = index_of(r["request_id"], b["request_id"][sel])
    new, emits = b["new_tokens"][sel], b["emits"][sel]
    pre, gen = r["prefilled"].copy(), r["generated"].copy()
    first, last, fly = r["t_first_token_ns"].copy(), r["t_last_token_ns"].copy(), r["in_flight"].copy()
    prefilling = pre[pos] < r["prompt_tokens"][pos]
    pre[pos[prefilling]] += new[prefilling]
    e_pos, e_fin = pos[emits], fin[emits]
    since = np.where(gen[e_pos] == 0, r["t_arrival_ns"][e_pos], last[e_pos])
    first[e_pos] = np.where(gen[e_pos] == 0, e_fin, first[e_pos])
    last[e_pos] = e_fin
    gen[e_pos] += 1
    fly[pos] = False
    finished = e_pos[gen[e_pos] >= r["output_tokens"][e_pos]]
    records = RequestsDone.model_construct(
        request_id=r["request_id"][finished].tolist(), t_arrival_ns=r["t_arrival_ns"][finished].tolist(),
        t_first_token_ns=first[finished].tolist(), t_done_ns=last[finished].tolist(),
        output_tokens=r["output_tokens"][finished].tolist())
    keep = np.ones(len(r), dtype=bool)
    keep[finished] = False
    running = r.with_(prefilled=pre, generated=gen, t_first_token_ns=first, t_last_token_ns=last,
                      in_flight=fly).take(keep)
    lanes = np.where(np.isin(sc.lanes, d_mb), NONE, sc.lanes)
    batches = b.take(k < 0)
    samples = ((e_fin - since) / 1e6).tolist()
    return (replace(sc, running=running, lanes=lanes, batches=batches),
            Credited(tokens=int(e_pos.size), latencies_ms=samples, done=records))


# ---- 3. arrivals ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arrived:
    """The window's arrivals: how many, their output tokens, and of those the ones the full queue shed."""

    requests: int
    tokens: int
    shed: int
    tokens_shed: int


def arrive(sc: ServingCarry, requests: Requests, queue_limit: int, t0: int, t1: int) -> tuple[ServingCarry, Arrived]:
    """The window's requests join the waiting queue in arrival order while fewer than ``queue_limit`` wait; the
    rest are shed (module docstring, 3.). Each must arrive in ``[t0, t1)`` with an id not already held."""
    new = _requests(requests)
    n = len(new)
    if not n:
        return sc, Arrived(0, 0, 0, 0)
    t = new["t_arrival_ns"]
    bad = np.flatnonzero((t < t0) | (t >= t1))
    if bad.size:
        i = int(bad[0])
        raise BadInput(f"request arriving at {int(t[i])} ns outside its window [{t0}, {t1})",
                       field=f"logical.requests.t_arrival_ns[{i}]")
    if (np.diff(t) < 0).any():
        i = int(np.flatnonzero(np.diff(t) < 0)[0]) + 1
        raise BadInput("requests must be in arrival order", field=f"logical.requests.t_arrival_ns[{i}]")
    bad = np.flatnonzero((new["prompt_tokens"] < 1) | (new["output_tokens"] < 1))
    if bad.size:
        i = int(bad[0])
        raise BadInput("a request has at least one prompt and one output token",
                       field=f"logical.requests.prompt_tokens[{i}]")
    rid = new["request_id"]
    held = np.isin(rid, np.concatenate([sc.waiting["request_id"], sc.running["request_id"]]))
    first = np.zeros(n, dtype=bool)
    first[np.unique(rid, return_index=True)[1]] = True
    dup = held | ~first
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise BadInput(f"request {int(rid[i])} is already waiting or running, or arrives twice",
                       field=f"logical.requests.request_id[{i}]")
    room = max(0, queue_limit - len(sc.waiting))
    joined, shed = new.take(np.arange(min(room, n))), new.take(np.arange(min(room, n), n))
    out = new["output_tokens"]
    return (replace(sc, waiting=sc.waiting.cat(joined)),
            Arrived(requests=n, tokens=int(out.sum()), shed=len(shed), tokens_shed=int(shed["output_tokens"].sum())))


# ---- the window's report ----------------------------------------------------------------------------------------

def report(sc: ServingCarry, cr: Credited, ar: Arrived, t1: float) -> dict[str, Any]:
    """The serving fields of the window's `WindowTiming` from the state at its end: the counts, the tokens
    completed with their latency samples, the requests finished, and the age of the oldest output token not yet
    generated (since its request's previous token, or its arrival)."""
    w, r = sc.waiting, sc.running
    queued = int(w["output_tokens"].sum()) + int((r["output_tokens"] - r["generated"]).sum())
    since = np.concatenate([w["t_arrival_ns"], np.where(r["generated"] > 0, r["t_last_token_ns"],
                                                        r["t_arrival_ns"])])
    oldest = max(0.0, (t1 - float(since.min())) / 1e6) if since.size else 0.0
    return {"tokens_completed": cr.tokens, "latencies_ms": cr.latencies_ms, "requests_done": cr.done,
            "requests_arrived": ar.requests, "requests_shed": ar.shed, "tokens_offered": ar.tokens,
            "tokens_shed": ar.tokens_shed, "requests_waiting": len(w), "requests_running": len(r),
            "tokens_queued": queued, "oldest_inflight_ms": oldest}


__all__ = ["Arrived", "Credited", "Formed", "MicroBatchFn", "ServingCarry", "arrive", "credit", "form", "report",
           "rows_window"]
