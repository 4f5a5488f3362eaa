"""WorkloadGraph: layers as nodes, data dependencies as edges (seed 003 ``graph.py``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkloadGraph:
    nodes: list[str]  # layer names
    edges: list[tuple[str, str]]  # (producer, consumer)

    @classmethod
    def chain(cls, names: list[str]) -> WorkloadGraph:
        """A decoder-only transformer is a chain of layers (residual adds stay inside a block)."""
        return cls(nodes=list(names), edges=list(itertools.pairwise(names)))

    def topological_order(self) -> list[str]:
        """Kahn's algorithm; raises ValueError on a cycle."""
        indeg = {n: 0 for n in self.nodes}
        succ: dict[str, list[str]] = {n: [] for n in self.nodes}
        for a, b in self.edges:
            succ[a].append(b)
            indeg[b] += 1
        ready = [n for n in self.nodes if indeg[n] == 0]
        order: list[str] = []
        while ready:
            n = ready.pop(0)
            order.append(n)
            for m in succ[n]:
                indeg[m] -= 1
                if indeg[m] == 0:
                    ready.append(m)
        if len(order) != len(self.nodes):
            raise ValueError("WorkloadGraph has a cycle")
        return order
