"""Serving workloads (``WorkloadConfig.serving``): requests from a recorded arrival trace, and the logical events of
the micro-batches a continuous-batching scheduler forms from them.

The workload service owns what a micro-batch computes and reads; the lowering service's scheduler owns which requests
go into it (that depends on the chip's timing). So a serving trace has two halves:

- **Arrivals** (``services.workload.arrivals``): the arrival trace ``serving.trace`` from ``serving.start_s`` on,
  its arrival times rescaled to ``serving.rate_rps``, its lengths unchanged. Window ``k`` carries the requests
  arriving in it (``LogicalWindow.requests``) and no events.
- **Micro-batches** (`ServingPlan.rows`): for each ``MicroBatchSpec`` the events of a fixed-arrival micro-batch
  (``services.workload.traces``: per layer ``attn``, ``router``, ``shared``, ``fc`` per routed expert with tokens,
  or ``dense``; ``head``), with its requests' own costs:

  - a request's ``new_tokens`` sit at positions ``context, …, context + new_tokens − 1`` of its sequence; the token at
    position ``p`` reads ``keys_per_query(layer, p)`` cached keys (``p`` at a full-attention layer, as a fixed-arrival
    decode step with a context of ``p`` does; its own key and value are written) and writes one token's KV;
  - the KV cache is read once per query block (``operators.attn.query_block`` = ``Q`` tokens of one request, from
    its first new token): the block's first token reads its keys, each later token of the block only its own new
    key (``min(keys, 1)``: the keys of consecutive positions are nested, or slide by one); ``Q`` = 1 (the default)
    reads every token's keys, so a prompt chunk of ``n`` tokens reads its context ``n`` times. The FLOPs are every
    query's, whatever ``Q``;
  - attention FLOPs per token are linear in the keys: ``a_l + b_l · keys``, ``a_l`` and ``b_l`` read off the model's
    decode WorkloadIR at two contexts (``keys_per_query`` 1 and 2; a layer whose keys do not vary, Mamba or a window
    of one, costs its one value); MLA is costed in its absorbed (decode) form for every token, which attends over
    the latent cache and so needs no decompression of a chunk's cached context;
  - a Mamba layer reads and writes its request's state once per micro-batch;
  - ``head`` (the LM head) runs for the requests that ``emit`` a token only; every other op for every token;
  - routing: the run's tokens form one stream, a micro-batch's tokens the positions ``[token_offset, token_offset +
    tokens)`` of it, in the order of ``seqs``. It is the fixed-arrival trace's stream (the same seed, the same draws:
    token ``p`` is slot ``p mod sequence.micro_batch`` of micro-batch ``p div sequence.micro_batch``), read at those
    positions (`RoutingStream.tokens_at`); a replayed file (``routing.trace``) gives its tokens at those positions.
    ``routing.locality`` must be 0 (the config says why);
  - event ids: ``mb_id · mb_event_stride + slot`` (``mb_event_stride``: the slots of one micro-batch), unique across
    the run and the same when a micro-batch is asked again; ``t_gen_ns`` = its ``t_ns``; tensor ids as a
    fixed-arrival micro-batch's with ``MB{mb_id}``.

  Each micro-batch is computed alone, so the answer does not depend on how micro-batches are grouped into calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from services.workload.arrivals import offered_requests
from services.workload.ir import ModelConfig, build_ir
from services.workload.recorded import ReplayStream
from services.workload.routing import FloatArray, IntArray, RoutingStream
from services.workload.traces import (
    ATTN,
    HEAD,
    MAX_WINDOW_ROWS,
    EventBlock,
    TracePlan,
    per_token_costs,
    serving_window,
    serving_window_count,
)
from shared.configs import WorkloadConfig
from shared.contracts.workload import LogicalWindow, MicroBatchRows, MicroBatchSpec
from shared.errors import BadInput

# Token-expert routing cells drawn for one call (micro-batches x the micro-batches of the stream their tokens span x
# experts x MoE layers): 4x a fixed-arrival window's, so that a 2048-token micro-batch of DeepSeek-V3 (58 MoE layers
# x 256 experts: ~31M cells) fits in one call
MAX_MICROBATCH_CELLS = 1 << 26
_IR_CONTEXTS = (1, 2)  # the decode IR is evaluated at these contexts; attention is linear in the keys between them


# --- costs --------------------------------------------------------------------------------------------------------
def keys_per_query(mc: ModelConfig, layer: int, pos: IntArray) -> IntArray:
    """`ModelConfig.keys_per_query` of every position in ``pos`` at ``layer`` (vectorised, the same rule)."""
    mixer = mc.layer_mixers[layer]
    if mixer == "mamba":
        return np.zeros_like(pos)
    if mixer == "sliding_attention" and mc.sliding_window is not None:
        out: IntArray = np.minimum(pos, mc.sliding_window)
        return out
    if mixer == "chunked_attention" and mc.attention_chunk_size is not None:
        chunked: IntArray = np.where(pos > 0, (pos - 1) % mc.attention_chunk_size + 1, 0)
        return chunked
    return pos


def keys_read_once_per_block(keys: IntArray, block_start: NDArray[np.bool_]) -> int:
    """The keys a run of consecutive query positions reads from the KV cache when each query block reads the keys
    its queries attend to once: ``keys[i]`` (`keys_per_query`) of the tokens that start a block, ``min(keys[i], 1)``
    of the others. A query at position ``p`` attends to ``[p − keys, p)``; both ends never decrease from one position
    to the next (full, sliding and chunked attention), so each later query of a block adds one key to what the block
    reads, its predecessor's own (none at a Mamba layer, which reads no keys)."""
    return int(np.where(block_start, keys, np.minimum(keys, 1)).sum())


@dataclass(frozen=True)
class KeyCosts:
    """Per-token costs of a serving micro-batch as functions of the keys a token reads, from the decode WorkloadIR
    (or the config's ``operators`` overrides)."""

    attn_base: FloatArray  # (layers,) attention (mixer) FLOPs of one token that do not depend on its keys
    attn_per_key: FloatArray  # (layers,) attention FLOPs per key read
    kv_bytes: IntArray  # (layers,) KV bytes of one cached token: each key read, and the one written (0: Mamba)
    state_bytes: IntArray  # (layers,) Mamba state one request reads and writes per micro-batch (0: attention)
    slot_flops: FloatArray  # FLOPs per token of every slot of the plan (attention slots: replaced per micro-batch)


def key_costs(cfg: WorkloadConfig, mc: ModelConfig, plan: TracePlan) -> KeyCosts:
    """`KeyCosts` of ``cfg``'s model: the decode IR at two contexts; the slope of each layer's attention FLOPs over
    its keys between them, its intercept at 0 keys (a layer whose keys do not change between them: its one value)."""
    c1, c2 = _IR_CONTEXTS
    at = [per_token_costs(cfg, build_ir(mc, phase="decode", batch=1, seq_len=c)) for c in (c1, c2)]
    L = mc.num_hidden_layers
    base, per_key = np.zeros(L), np.zeros(L)
    kv, state = np.zeros(L, dtype=np.int64), np.zeros(L, dtype=np.int64)
    for li in range(L):
        k1, k2 = mc.keys_per_query(li, c1), mc.keys_per_query(li, c2)
        f1, f2 = at[0].layer_flops.get((li, ATTN), 0.0), at[1].layer_flops.get((li, ATTN), 0.0)
        per_key[li] = (f2 - f1) / (k2 - k1) if k2 != k1 else 0.0
        base[li] = f1 - per_key[li] * k1
        if mc.layer_mixers[li] == "mamba":
            state[li] = at[0].kv_write[li]
        else:
            kv[li] = at[0].kv_write[li]
    lf = at[0].layer_flops
    slot_flops = np.asarray([lf.get((li, o), 0.0) for li, o in
                             zip(plan.slot_layer.tolist(), plan.slot_op.tolist(), strict=True)], dtype=np.float64)
    return KeyCosts(attn_base=base, attn_per_key=per_key, kv_bytes=kv, state_bytes=state, slot_flops=slot_flops)


# --- the plan -----------------------------------------------------------------------------------------------------
class ServingPlan:
    """A serving trace: its offered requests (windows) and the rows of the micro-batches a scheduler forms from them.
    Built on the trace's `TracePlan` (slots, memory templates, routing); everything here is fixed by the config."""

    def __init__(self, plan: TracePlan) -> None:
        sv = plan.cfg.serving
        if sv is None:
            raise BadInput("not a serving workload (no serving section)", field="serving")
        self.plan, self.sv = plan, sv
        self.offered = offered_requests(sv, plan.sources.arrivals.load(sv.trace))
        self.costs = key_costs(plan.cfg, plan.mc, plan)
        self.stream: RoutingStream | ReplayStream = plan.routing_stream()
        self.stride = len(plan.slot_op)  # event-id slots of one micro-batch
        mc = plan.mc
        self.n_layers = mc.num_hidden_layers
        self.query_block = plan.cfg.operators.attn.query_block
        self._mixer_layers: dict[str, list[int]] = {}  # layers by mixer: keys computed once per mixer
        for li, m in enumerate(mc.layer_mixers):
            self._mixer_layers.setdefault(m, []).append(li)
        tpl_slot = np.repeat(np.arange(self.stride, dtype=np.int64), plan.slot_mem_count)
        self._tpl_layer = plan.slot_layer[tpl_slot]
        attn = plan.slot_op[tpl_slot] == ATTN  # an attention slot's rows: its KV read, then its KV write
        access = plan.tpl_access_obj
        self._tpl_kv_read = attn & (access == "read")
        self._tpl_kv_write = attn & (access == "write")
        self._attn_slots = np.flatnonzero(plan.slot_op == ATTN)
        self._head_slots = np.flatnonzero(plan.slot_op == HEAD)
        worst = self.cells(plan.T - 1, sv.max_batch_tokens)  # a full budget straddling the most stream micro-batches
        if worst > MAX_MICROBATCH_CELLS:
            raise BadInput(f"serving.max_batch_tokens {sv.max_batch_tokens}: one micro-batch of {mc.name} draws up "
                           f"to {worst} token-expert routing cells, at most {MAX_MICROBATCH_CELLS} (a smaller "
                           "budget, or a smaller sequence.micro_batch: the routing stream's draw unit)",
                           field="serving.max_batch_tokens")

    # --- windows ------------------------------------------------------------------------------------------------
    def window_count(self, window_ms: float) -> int:
        """Windows of ``window_ms`` covering the arrivals ``[0, duration)`` and the drain after them, checked."""
        return serving_window_count(self.offered, window_ms, self.sv.drain_ms)

    def window(self, trace_id: str, k: int, w_ns: int) -> LogicalWindow:
        """Window ``k`` (``[k·w_ns, (k+1)·w_ns)``): the requests arriving in it, no events."""
        return serving_window(self.offered, trace_id, k, w_ns)

    # --- micro-batches ------------------------------------------------------------------------------------------
    def cells(self, token_offset: int, tokens: int) -> int:
        """Token-expert routing cells drawn for ``tokens`` tokens from ``token_offset``: the whole micro-batches of
        the stream they fall in (drawn), or the tokens themselves (replayed)."""
        L, E = len(self.plan.moe_layers), self.plan.E
        if not L or not E or tokens < 1:
            return 0
        if isinstance(self.stream, ReplayStream):
            return tokens * E * L
        T = self.plan.T
        span = (token_offset + tokens - 1) // T - token_offset // T + 1
        return span * T * E * L

    def check(self, batches: Sequence[MicroBatchSpec]) -> None:
        """The bounds of one call and the config's scheduler knobs; `BadInput` naming ``batches[i]...``."""
        sv, plan = self.sv, self.plan
        seen: set[int] = set()
        cells = 0
        for i, b in enumerate(batches):
            f = f"batches[{i}]"
            if b.mb_id in seen:
                raise BadInput(f"{f}.mb_id {b.mb_id} appears twice in this call", field=f"{f}.mb_id")
            seen.add(b.mb_id)
            new = np.asarray(b.seqs.new_tokens, dtype=np.int64)
            n = int(new.sum())
            if n > sv.max_batch_tokens:
                raise BadInput(f"{f}: {n} tokens, more than serving.max_batch_tokens ({sv.max_batch_tokens})",
                               field=f"{f}.seqs.new_tokens")
            big = np.flatnonzero(new > sv.prefill_chunk)
            if len(big):
                j = int(big[0])
                raise BadInput(f"{f}.seqs.new_tokens[{j}] = {int(new[j])}: more than serving.prefill_chunk "
                               f"({sv.prefill_chunk})", field=f"{f}.seqs.new_tokens[{j}]")
            rid = np.asarray(b.seqs.request_id, dtype=np.int64)
            if len(np.unique(rid)) != len(rid):
                raise BadInput(f"{f}.seqs.request_id: a request appears twice in one micro-batch",
                               field=f"{f}.seqs.request_id")
            cells += self.cells(b.token_offset, n)
        if cells > MAX_MICROBATCH_CELLS:
            raise BadInput(f"batches: {len(batches)} micro-batches draw {cells} token-expert routing cells, at most "
                           f"{MAX_MICROBATCH_CELLS} in one call (fewer micro-batches a call)", field="batches")
        rows = len(batches) * plan.slot_rows
        if rows > MAX_WINDOW_ROWS:
            raise BadInput(f"batches: {len(batches)} micro-batches of up to {plan.slot_rows} event rows each make "
                           f"{rows}, at most {MAX_WINDOW_ROWS} in one call "
                           f"({max(1, MAX_WINDOW_ROWS // plan.slot_rows)} micro-batches a call)", field="batches")

    def expert_counts(self, token_offset: int, tokens: int) -> IntArray:
        """(MoE layers, E) tokens per expert of the stream's tokens ``[token_offset, token_offset + tokens)``."""
        L, E = len(self.plan.moe_layers), self.plan.E
        if not L or not E:
            return np.zeros((L, E), dtype=np.int64)
        picks = self.stream.tokens_at(token_offset, tokens)  # (L, tokens, k)
        base = (np.arange(L, dtype=np.int64) * E)[:, None, None]
        counts: IntArray = np.bincount((picks + base).ravel(), minlength=L * E).reshape(L, E)
        return counts

    def _batch(self, b: MicroBatchSpec) -> tuple[IntArray, FloatArray, IntArray, IntArray]:
        """One micro-batch: tokens and FLOPs of every slot (S,), KV bytes read and written per layer (layers,)."""
        plan, c = self.plan, self.costs
        new = np.asarray(b.seqs.new_tokens, dtype=np.int64)
        ctx = np.asarray(b.seqs.context, dtype=np.int64)
        n_tok, n_seq = int(new.sum()), len(new)
        n_emit = int(np.count_nonzero(b.seqs.emits))
        first = np.cumsum(new) - new
        within = np.arange(n_tok, dtype=np.int64) - np.repeat(first, new)  # each token's index in its request's run
        pos = np.repeat(ctx, new) + within  # each token's place
        # a token's first key read of its query block (query_block tokens of one sequence share one read of the keys
        # they attend to: the block's first token reads its keys, each later one only its own new key)
        block_start = within % self.query_block == 0
        keys = np.zeros(self.n_layers, dtype=np.int64)  # keys attended by the batch's tokens, per layer (FLOPs)
        keys_read = np.zeros(self.n_layers, dtype=np.int64)  # keys read from the KV cache, per layer (bytes)
        for layers in self._mixer_layers.values():
            kq = keys_per_query(plan.mc, layers[0], pos)
            keys[layers] = int(kq.sum())
            keys_read[layers] = keys_read_once_per_block(kq, block_start)
        tok = np.full(self.stride, n_tok, dtype=np.int64)
        tok[self._head_slots] = n_emit
        if len(plan.fc_slots):
            tok[plan.fc_slots] = self.expert_counts(b.token_offset, n_tok).ravel()
        flops = tok * c.slot_flops
        attn_layers = plan.slot_layer[self._attn_slots]
        flops[self._attn_slots] = n_tok * c.attn_base[attn_layers] + c.attn_per_key[attn_layers] * keys[attn_layers]
        kv_read = keys_read * c.kv_bytes + n_seq * c.state_bytes
        kv_write = n_tok * c.kv_bytes + n_seq * c.state_bytes
        return tok, flops, kv_read, kv_write

    def block(self, batches: Sequence[MicroBatchSpec]) -> EventBlock:
        """The events of ``batches`` in their order, each micro-batch's in slot order (`TracePlan.events`' layout)."""
        plan = self.plan
        parts = [self._batch(b) for b in batches]
        nb, S = len(batches), self.stride
        tok = np.stack([p[0] for p in parts]) if parts else np.zeros((0, S), dtype=np.int64)
        flops = np.stack([p[1] for p in parts]) if parts else np.zeros((0, S))
        kv_read = np.stack([p[2] for p in parts]) if parts else np.zeros((0, self.n_layers), dtype=np.int64)
        kv_write = np.stack([p[3] for p in parts]) if parts else np.zeros((0, self.n_layers), dtype=np.int64)
        mb_ids = np.asarray([b.mb_id for b in batches], dtype=np.int64).reshape(nb)
        t_ns = np.asarray([b.t_ns for b in batches], dtype=np.int64).reshape(nb)
        rel, slot = np.nonzero(tok > 0)
        tokens = tok[rel, slot]
        mb = mb_ids[rel]
        ev = mb * S + slot
        rep = plan.slot_mem_count[slot]
        total = int(rep.sum())
        first = np.cumsum(rep) - rep
        within = np.arange(total, dtype=np.int64) - np.repeat(first, rep)
        tpl = np.repeat(plan.slot_mem_start[slot], rep) + within
        m_rel = np.repeat(rel, rep)
        m_bytes = plan.tpl_static[tpl] + plan.tpl_tok[tpl] * np.repeat(tokens, rep)
        rd, wr = self._tpl_kv_read[tpl], self._tpl_kv_write[tpl]
        m_bytes[rd] = kv_read[m_rel[rd], self._tpl_layer[tpl[rd]]]
        m_bytes[wr] = kv_write[m_rel[wr], self._tpl_layer[tpl[wr]]]
        return EventBlock(
            c_event=ev, c_slot=slot.astype(np.int64), c_t=t_ns[rel], c_mb=mb, c_layer=plan.slot_layer[slot],
            c_op=plan.slot_op[slot], c_expert=plan.slot_expert[slot], c_tokens=tokens,
            c_flops=flops[rel, slot], m_event=np.repeat(ev, rep), m_tpl=tpl, m_mb=np.repeat(mb, rep),
            m_bytes=m_bytes)

    def rows(self, batches: Sequence[MicroBatchSpec]) -> MicroBatchRows:
        """The logical events of ``batches`` (checked first): `MicroBatchRows`."""
        self.check(batches)
        compute, memory = self.plan.to_rows(self.block(batches))
        return MicroBatchRows.model_construct(compute=compute, memory=memory)

