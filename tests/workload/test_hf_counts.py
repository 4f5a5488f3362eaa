"""Parameter counts of published checkpoints against transformers' own (issue 18, item 2).

``tests/fixtures/hf_models/<name>.json`` is each checkpoint's config.json and ``counts.json`` what transformers
counts for it on the meta device (made by ``tests/workload/hf_counts/make_counts.py``; its docstring says how to make
them again). Our counter never imports transformers: it reads the config.json with ``from_hf_config`` and sums the
WorkloadIR's weights. Total and active (shared weights + top-k routed experts) must agree within 0.1 %.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.workload.ir import SUPPORTED, build_ir, from_hf_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_models"
COUNTS: dict[str, Any] = json.loads((FIXTURES / "counts.json").read_text())["models"]


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_total_and_active_match_transformers(name: str) -> None:
    ref = COUNTS[name]
    mc = from_hf_config(json.loads((FIXTURES / f"{name}.json").read_text()), name=name)
    ir = build_ir(mc)
    assert ir.params_total == pytest.approx(ref["total"], rel=1e-3), (name, ir.params_total, ref["total"])
    assert ir.params_active == pytest.approx(ref["active"], rel=1e-3), (name, ir.params_active, ref["active"])
    assert len(mc.moe_layers) == ref["n_moe_layers"]
    if ref["experts"]:
        assert mc.moe is not None and mc.moe.num_routed_experts == ref["experts"]
        assert mc.moe.num_activated_experts == ref["topk"]


def test_every_family_has_a_checkpoint() -> None:
    families = {from_hf_config(json.loads((FIXTURES / f"{n}.json").read_text()), name=n).family for n in COUNTS}
    assert families >= set(SUPPORTED) - {"llama4_text"}, set(SUPPORTED) - families
