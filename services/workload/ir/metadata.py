"""ModelMetadata: what a WorkloadIR describes (seed 003 ``metadata.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Phase = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    family: str
    phase: Phase
    batch: int  # sequences
    seq_len: int  # prefill: prompt length; decode: context length (KV-cache tokens)
    tokens: int  # tokens processed by one forward pass: batch·seq_len (prefill) or batch (decode)
    dtype: str
    num_layers: int
    attention: str  # "mha" | "gqa" | "mla"
    num_routed_experts: int
    num_activated_experts: int
    num_shared_experts: int
    moe_layers: tuple[int, ...]
