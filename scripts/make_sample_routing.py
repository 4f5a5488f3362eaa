"""Make the shipped routing-trace sample (``services/workload/samples/``): ``python -m scripts.make_sample_routing``.

**Synthetic**, made here, not recorded from a model: it exists so the format, the importers and a replayed
experiment can be shown and tested without downloads. It has the shape of Mixtral-8x7B's routing (MoE layers 0..31,
8 experts, top-2, gate weights) and structure our Zipf generator does not have:
- popularity that sharpens with depth: layer ``j`` draws from ``p_r ∝ (r+1)^-s_j``, ``s_j = 0.2 + 1.4·j/31``, over a
  per-layer permutation of the ids;
- temporal locality along the token stream (a Markov chain): each of a token's k slots keeps the previous token's
  expert with probability ``0.45`` (when it is not already chosen), else draws from the layer's popularity;
- gates: a softmax over the chosen experts' logits ``N(0, 1)``, rounded to 4 decimals.
Seeded (``SEED``); the same files on every run. Writes the canonical CSV and the two import shapes:
``ids-json`` (per-token expert ids per layer) and ``topk-parquet`` (wide ``topk_ids_<layer>``/``topk_probs_<layer>``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from services.workload.recorded import RecordedRouting, write_routing

SEED = 20261124
TOKENS, LAYERS, EXPERTS, TOPK = 1024, 32, 8, 2
KEEP = 0.45
OUT = Path(__file__).resolve().parents[1] / "services" / "workload" / "samples"
NAME = "mixtral-8x7b-synthetic"


def make() -> RecordedRouting:
    rng = np.random.default_rng(SEED)
    experts = np.empty((TOKENS, LAYERS, TOPK), dtype=np.int64)
    for j in range(LAYERS):
        s = 0.2 + 1.4 * j / (LAYERS - 1)
        w = np.arange(1, EXPERTS + 1, dtype=np.float64) ** -s
        p = np.empty(EXPERTS)
        p[rng.permutation(EXPERTS)] = w / w.sum()
        prev: list[int] = []
        for t in range(TOKENS):
            chosen: list[int] = []
            for slot in range(TOPK):
                if prev and rng.random() < KEEP and prev[slot] not in chosen:
                    chosen.append(prev[slot])
                    continue
                q = p.copy()
                q[chosen] = 0.0
                chosen.append(int(rng.choice(EXPERTS, p=q / q.sum())))
            prev = chosen
            experts[t, j] = sorted(chosen)
    logits = rng.standard_normal((TOKENS, LAYERS, TOPK))
    g = np.exp(logits)
    gates = np.round(g / g.sum(axis=2, keepdims=True), 4)
    return RecordedRouting(layers=np.arange(LAYERS, dtype=np.int64), experts=experts, gates=gates,
                           source=f"{NAME}.csv")


def write_import_shapes(rec: RecordedRouting, out: Path) -> None:
    """The same selections in the two published shapes the importers read."""
    doc = {"layers": rec.layers.tolist(), "tokens": rec.experts.tolist()}
    (out / f"{NAME}.ids.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert rec.gates is not None
    cols = {}
    for j, layer in enumerate(rec.layers.tolist()):
        cols[f"topk_ids_{layer}"] = pa.array(list(rec.experts[:, j, :]), pa.list_(pa.int32()))
        cols[f"topk_probs_{layer}"] = pa.array(list(rec.gates[:, j, :]), pa.list_(pa.float32()))
    pq.write_table(pa.table(cols), out / f"{NAME}.topk.parquet", compression="zstd")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rec = make()
    write_routing(rec, OUT / f"{NAME}.csv")
    write_import_shapes(rec, OUT)
    for p in sorted(OUT.glob(f"{NAME}*")):
        print(f"{p.relative_to(OUT.parents[2])}: {p.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
