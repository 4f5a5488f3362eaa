"""A stand-in for the workload service's micro-batch rows (``POST /v1/traces/{id}/microbatches``) whose timing is
known by hand: each micro-batch is one ``dense`` row of layer 0 (a one-layer model) over all its tokens, with
``flops_per_token`` FLOPs a token and no memory rows. At 0 FLOPs a micro-batch takes no time (the fold formula of no
MACs is 0 cycles): it completes at the instant it is formed. It keeps every micro-batch it was asked for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.contracts.workload import LogicalCompute, LogicalMemory, MicroBatchRows, MicroBatchSpec


@dataclass
class StubRows:
    flops_per_token: float = 0.0
    asked: list[MicroBatchSpec] = field(default_factory=list)
    calls: int = 0

    def __call__(self, trace_id: str, batches: Sequence[MicroBatchSpec]) -> MicroBatchRows:
        self.calls += 1
        self.asked.extend(batches)
        tok = [sum(b.seqs.new_tokens) for b in batches]
        return MicroBatchRows(
            compute=LogicalCompute(event_id=[b.mb_id for b in batches], t_gen_ns=[b.t_ns for b in batches],
                                   mb_id=[b.mb_id for b in batches], layer=[0] * len(batches),
                                   op_type=["dense"] * len(batches), expert=[-1] * len(batches), tokens=tok,
                                   flops=[self.flops_per_token * t for t in tok]),
            memory=LogicalMemory.empty())
