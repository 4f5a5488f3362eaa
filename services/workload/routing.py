"""MoE routing of a logical trace: which experts each token of each micro-batch uses at each MoE layer.

Model (ARCHITECTURE §5.1):
- Popularity: at MoE layer ``j`` expert ``perm_j[r]`` has probability ``p_r ∝ (r+1)^(-zipf_s)`` (rank ``r``; ``zipf_s``
  = 0 is uniform), ``perm_j`` a seeded per-layer permutation of the expert ids.
- Top-k without replacement by an exponential race (Plackett–Luce, equivalent to the Gumbel top-k trick): each token
  draws ``x_e = -ln(u_e) / p_e`` for every expert and takes the ``k`` smallest. Where ``1/p_r`` leaves the floats'
  comfortable range (above `LOG_RACE_ABOVE`: ``zipf_s`` above ~1000 / log2(rank), e.g. 1000 for rank 2; ``p_r`` may
  even underflow to 0) the race runs on ``ln x_e = ln(-ln u_e) - ln p_e`` instead, with ``ln p_r = -s·ln(r+1) - ln Z``
  and ``s`` at most 1e300 (same order, same draws), so the ranks past it still come in rank order rather than tying
  at infinity.
- Group-limited routing (DeepSeek ``n_group`` / ``topk_group``): experts are split into ``n_group`` contiguous groups
  of ids; a group's score is its best (smallest) ``x_e``; only the ``topk_group`` best groups are eligible.
- Temporal locality: with probability ``locality`` a token repeats the expert set it used at this layer in the previous
  micro-batch (token slot ``i`` of micro-batch ``m`` follows slot ``i`` of ``m-1``: the same sequence in decode).

Determinism: ``SeedSequence(routing.seed)`` spawns one child per MoE layer, each spawning a permutation stream and a
draw stream (``numpy.random.default_rng``). Every micro-batch consumes exactly ``T·(1+E)`` doubles of its layer's draw
stream (T locality draws, then T·E race draws), so generating micro-batches in chunks of any size gives the same
routing as generating them all at once.

Random access (`RoutingStream.tokens_at`): the same stream read as a sequence of tokens, token ``p`` being slot
``p mod T`` of micro-batch ``p div T``: the draw stream is advanced to that micro-batch (``PCG64.advance``, one 64-bit
output per double) instead of generated up to it, so the tokens ``[p, p + n)`` cost their own micro-batches' draws
whatever ``p``. Without locality only: a repeat chains a token to the one ``T`` positions earlier, back to the start.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Upper bound on the doubles drawn at once (per chunk, all layers): keeps peak memory bounded for big models.
MAX_DRAWS_PER_CHUNK = 4_000_000
# 1/p above this races in logs: -ln(u) <= 745 for a double u > 0, so the plain race's x = -ln(u)/p stays finite below
LOG_RACE_ABOVE = 1e300
LOG_RACE_MAX_S = 1e300  # s·ln(r+1) stays finite for any E; the ranks' gaps (~s/E) dwarf ln(-ln u), in (-37, 7)


def zipf_probabilities(n_experts: int, s: float, perm: IntArray) -> FloatArray:
    """Probability of each expert id: rank ``r`` has weight ``(r+1)^-s``, expert ``perm[r]`` gets rank ``r``."""
    w = np.arange(1, n_experts + 1, dtype=np.float64) ** (-s)
    p = np.empty(n_experts, dtype=np.float64)
    p[perm] = w / w.sum()
    return p


def zipf_log_inverse(n_experts: int, s: float, perm: IntArray) -> FloatArray:
    """``-ln p`` of each expert id, finite for every rank: ``s·ln(r+1) + ln Z``, ``ln Z = logsumexp(-s·ln(r+1))``
    (rank 1 has weight 1, so Z >= 1), ``s`` capped at `LOG_RACE_MAX_S` so that nothing overflows."""
    log_w = -min(s, LOG_RACE_MAX_S) * np.log(np.arange(1, n_experts + 1, dtype=np.float64))
    top = log_w.max()
    log_z = top + np.log(np.exp(log_w - top).sum())
    out = np.empty(n_experts, dtype=np.float64)
    out[perm] = log_z - log_w
    return out


class RoutingStream:
    """Sequential generator of expert choices, one micro-batch after the other (state: the previous choices)."""

    def __init__(self, *, seed: int, n_layers: int, n_experts: int, topk: int, tokens: int, zipf_s: float,
                 locality: float = 0.0, n_group: int | None = None, topk_group: int | None = None) -> None:
        if n_layers > 0 and topk > n_experts:
            raise ValueError(f"topk ({topk}) must be <= the number of experts ({n_experts})")
        self.n_layers, self.E, self.k, self.T = n_layers, n_experts, topk, tokens
        self.locality = float(locality)
        self.n_group, self.topk_group = n_group, topk_group
        root = np.random.SeedSequence(seed)
        self.perms: list[IntArray] = []
        self._rngs: list[np.random.Generator] = []
        self._draw_seeds: list[np.random.SeedSequence] = []  # each layer's draw stream from its start (tokens_at)
        inv_p = np.empty((n_layers, n_experts), dtype=np.float64)
        for j, child in enumerate(root.spawn(n_layers)):
            perm_ss, draw_ss = child.spawn(2)
            perm = np.random.default_rng(perm_ss).permutation(n_experts).astype(np.int64)
            self.perms.append(perm)
            with np.errstate(divide="ignore", over="ignore"):  # 1/p of a p_r that underflowed: the log race
                inv_p[j] = 1.0 / zipf_probabilities(n_experts, zipf_s, perm)
            self._rngs.append(np.random.default_rng(draw_ss))
            self._draw_seeds.append(draw_ss)
        self._inv_p = inv_p
        # the race in logs where some 1/p_r is too large (never at the skews of real routers: byte-identical there)
        self._log_inv_p: FloatArray | None = None
        if n_layers and n_experts and not (inv_p <= LOG_RACE_ABOVE).all():
            self._log_inv_p = np.stack([zipf_log_inverse(n_experts, zipf_s, perm) for perm in self.perms])
        self._prev: IntArray | None = None  # (n_layers, T, k) choices of the previous micro-batch
        self.position = 0  # micro-batches generated so far

    def probabilities(self) -> FloatArray:
        """(n_layers, E) popularity of each expert id."""
        p: FloatArray = 1.0 / self._inv_p
        out: FloatArray = p / p.sum(axis=1, keepdims=True)
        return out

    def _chunk_size(self) -> int:
        """Micro-batches per chunk: one layer's race of a chunk holds at most ``MAX_DRAWS_PER_CHUNK`` doubles."""
        per_mb = max(1, self.T * (1 + self.E))
        return max(1, MAX_DRAWS_PER_CHUNK // per_mb)

    def take(self, n_mb: int) -> IntArray:
        """Choices of the next ``n_mb`` micro-batches: int array (n_mb, n_layers, T, k), each row's experts sorted."""
        out = np.empty((n_mb, self.n_layers, self.T, self.k), dtype=np.int64)
        step = self._chunk_size()
        for a in range(0, n_mb, step):
            b = min(n_mb, a + step)
            out[a:b] = self._take_chunk(b - a)
        return out

    def _take_chunk(self, n: int) -> IntArray:
        """``n`` micro-batches, one layer at a time (peak memory: one layer's race, ``n·T·E`` doubles)."""
        L, T, E, k = self.n_layers, self.T, self.E, self.k
        picks = np.empty((n, L, T, k), dtype=np.int64)
        for j, rng in enumerate(self._rngs):
            u = rng.random((n, T * (1 + E)))
            u_loc = u[:, :T]
            pj = self._race(j, u[:, T:].reshape(n, T, E))
            if self.locality > 0.0:
                repeat = u_loc < self.locality
                prev = None if self._prev is None else self._prev[j]
                for m in range(n):
                    if prev is not None:
                        pj[m] = np.where(repeat[m][..., None], prev, pj[m])
                    prev = pj[m]
            picks[:, j] = pj
        if L:
            self._prev = picks[-1].copy()
        self.position += n
        return picks

    def _race(self, j: int, race: FloatArray) -> IntArray:
        """Layer ``j``'s top-k of each row of ``race`` (..., E): uniforms, overwritten by the race keys; the chosen
        expert ids sorted, (..., k)."""
        E, k = self.E, self.k
        with np.errstate(divide="ignore"):
            np.log(race, out=race)
            if self._log_inv_p is None:
                race *= -self._inv_p[j]  # x_e = -ln(u) / p_e (u = 0 -> +inf: never chosen)
            else:  # ln x_e = ln(-ln u) - ln p_e: the same order (u = 0 -> +inf; u < 1, so -ln u > 0)
                np.negative(race, out=race)
                np.log(race, out=race)
                race += self._log_inv_p[j]
        if self.n_group is not None and self.topk_group is not None and self.topk_group < self.n_group:
            G = self.n_group
            grouped = race.reshape(*race.shape[:-1], G, E // G)
            score = grouped.min(axis=-1)  # (..., G)
            keep = np.argpartition(score, self.topk_group - 1, axis=-1)[..., : self.topk_group]
            mask = np.ones(score.shape, dtype=bool)
            np.put_along_axis(mask, keep, False, axis=-1)
            grouped[mask] = np.inf
        if k < E:
            pj: IntArray = np.argpartition(race, k - 1, axis=-1)[..., :k]
        else:
            pj = np.broadcast_to(np.arange(E), (*race.shape[:-1], E)).copy()
        pj.sort(axis=-1)
        return pj

    def tokens_at(self, offset: int, n: int) -> IntArray:
        """Expert choices of the tokens at positions ``[offset, offset + n)`` of the stream (token ``p``: slot
        ``p mod T`` of micro-batch ``p div T``), (n_layers, n, k), each row sorted: exactly what `take` gives those
        slots, without generating the micro-batches before them and without moving the sequential position. Draws
        the whole micro-batches the tokens fall in (at most ``n + 2·(T − 1)`` tokens' draws), a chunk at a time."""
        if self.locality > 0.0:
            raise ValueError("tokens_at needs locality 0: a repeat chains a token to the micro-batches before it")
        if offset < 0 or n < 0:
            raise ValueError(f"tokens_at: offset ({offset}) and n ({n}) must be >= 0")
        L, T, E, k = self.n_layers, self.T, self.E, self.k
        out = np.empty((L, n, k), dtype=np.int64)
        if n == 0 or L == 0:
            return out
        m0, m1 = offset // T, (offset + n - 1) // T + 1
        per_mb = T * (1 + E)
        step = self._chunk_size()
        for j, seeds in enumerate(self._draw_seeds):
            bits = np.random.PCG64(seeds)
            bits.advance(m0 * per_mb)  # one 64-bit output per double: the state after m0 micro-batches' draws
            rng = np.random.Generator(bits)
            for a in range(m0, m1, step):
                b = min(m1, a + step)
                u = rng.random((b - a, per_mb))
                race = u[:, T:].reshape((b - a) * T, E)
                lo, hi = max(offset, a * T), min(offset + n, b * T)  # the wanted tokens within these micro-batches
                out[j, lo - offset:hi - offset] = self._race(j, race[lo - a * T:hi - a * T])
        return out


def expert_counts(picks: IntArray, n_experts: int) -> IntArray:
    """Tokens per expert: (n_mb, n_layers, T, k) choices -> (n_mb, n_layers, E) counts."""
    n, L = picks.shape[:2]
    if L == 0:
        return np.zeros((n, 0, n_experts), dtype=np.int64)
    base = (np.arange(n * L, dtype=np.int64) * n_experts).reshape(n, L, 1, 1)
    flat = np.bincount((picks + base).ravel(), minlength=n * L * n_experts)
    return flat.reshape(n, L, n_experts)
