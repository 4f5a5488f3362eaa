"""The WorkloadIR protocol and its implementation for decoder-only transformers (seed 003 ``ir.py``, ``models/llm``).

Every layer is built from the ``ModelConfig``'s per-layer structure: its mixer (full/sliding/chunked attention, MLA
in its prefill or absorbed decode form, Mamba) and its MLP (dense SwiGLU or MoE with optional shared experts).
``LlamaModel`` and ``DeepSeekModel`` are the same builder under the seed's names. Both take a ``ModelConfig``
through ``from_model_config`` and a forward-pass shape (phase, batch, seq_len). The layer list is: embedding, then
per block the mixer and the MLP, then the LM head.
"""

from __future__ import annotations

from functools import cached_property
from typing import Protocol, runtime_checkable

from services.workload.ir.breakdown import CommPattern, MemoryFootprint, OpsBreakdown
from services.workload.ir.graph import WorkloadGraph
from services.workload.ir.layer import Layer
from services.workload.ir.layers import (
    Shape,
    attention_layer,
    embedding_layer,
    ffn_layer,
    lm_head_layer,
    mamba_layer,
    mla_absorb_layer,
    mla_layer,
    moe_layer,
)
from services.workload.ir.metadata import ModelMetadata, Phase
from services.workload.ir.model_config import ModelConfig


@runtime_checkable
class WorkloadIR(Protocol):
    def get_layers(self) -> list[Layer]: ...
    def get_ops_breakdown(self) -> OpsBreakdown: ...
    def get_memory_footprint(self) -> MemoryFootprint: ...
    def get_communication_pattern(self) -> CommPattern: ...


class TransformerModel:
    """A decoder-only transformer for one forward-pass shape. Subclasses choose the attention layer."""

    def __init__(self, mc: ModelConfig, *, phase: Phase = "decode", batch: int = 1, seq_len: int = 2048) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        if seq_len < 1:
            raise ValueError("seq_len must be >= 1")
        self.config = mc
        self.shape = Shape(phase=phase, batch=batch, seq_len=seq_len)

    @classmethod
    def from_model_config(cls, mc: ModelConfig, *, phase: Phase = "decode", batch: int = 1,
                          seq_len: int = 2048) -> TransformerModel:
        return cls(mc, phase=phase, batch=batch, seq_len=seq_len)

    def attention(self, i: int) -> Layer:
        """The layer's mixer: attention (full, sliding, chunked), MLA or Mamba."""
        mixer = self.config.layer_mixers[i]
        if mixer == "mamba":
            return mamba_layer(self.config, self.shape, i)
        if mixer == "mla":
            if self.shape.phase == "decode":
                return mla_absorb_layer(self.config, self.shape, i)
            return mla_layer(self.config, self.shape, i)
        return attention_layer(self.config, self.shape, i)

    def ffn(self, i: int) -> Layer:
        mc = self.config
        return moe_layer(mc, self.shape, i) if mc.is_moe_layer(i) else ffn_layer(mc, self.shape, i)

    @cached_property
    def layers(self) -> list[Layer]:
        mc, s = self.config, self.shape
        out = [embedding_layer(mc, s)]
        for i in range(mc.num_hidden_layers):
            out += [self.attention(i), self.ffn(i)]
        out.append(lm_head_layer(mc, s))
        return out

    # --- WorkloadIR -------------------------------------------------------------------------------------------
    def get_layers(self) -> list[Layer]:
        return list(self.layers)

    def get_ops_breakdown(self) -> OpsBreakdown:
        cube = vec = scal = hau = 0
        by_op: dict[str, int] = {}
        by_layer: dict[str, int] = {}
        for layer in self.layers:
            for op in layer.ops:
                c = op.compute
                cube, vec, scal, hau = cube + c.cube_ops, vec + c.vector_ops, scal + c.scalar_ops, hau + c.hau_ops
                by_op[op.op_type] = by_op.get(op.op_type, 0) + c.total
                by_layer[layer.op_type] = by_layer.get(layer.op_type, 0) + c.total
        return OpsBreakdown(cube, vec, scal, hau, by_op_type=by_op, by_layer_type=by_layer)

    def get_memory_footprint(self) -> MemoryFootprint:
        mc, s = self.config, self.shape
        b = mc.dtype_bytes
        # per layer: the keys it keeps (context, window or chunk) x bytes per key, or a Mamba layer's state
        kv = s.batch * sum(mc.keys_per_query(i, s.seq_len) * mc.kv_bytes_per_token_layer(i)
                           + mc.state_bytes_per_sequence(i) for i in range(mc.num_hidden_layers))
        act_peak = max((op.memory.activation_bytes + op.memory.write_bytes for la in self.layers for op in la.ops),
                       default=0)
        return MemoryFootprint(weight_bytes=self.params_total * b, active_weight_bytes=self.params_active * b,
                               kv_cache_bytes=kv, activation_peak_bytes=act_peak)

    def get_communication_pattern(self) -> CommPattern:
        return CommPattern(entries=[(la.name, la.comm) for la in self.layers if la.comm is not None])

    # --- summaries --------------------------------------------------------------------------------------------
    def get_graph(self) -> WorkloadGraph:
        return WorkloadGraph.chain([la.name for la in self.layers])

    @property
    def metadata(self) -> ModelMetadata:
        mc, s = self.config, self.shape
        moe = mc.moe
        return ModelMetadata(
            name=mc.name, family=mc.family, phase=s.phase, batch=s.batch, seq_len=s.seq_len, tokens=s.tokens,
            dtype={1: "fp8", 2: "bf16", 4: "fp32"}.get(mc.dtype_bytes, "bf16"), num_layers=mc.num_hidden_layers,
            attention=mc.attention_kind, num_routed_experts=moe.num_routed_experts if moe else 0,
            num_activated_experts=moe.num_activated_experts if moe else 0,
            num_shared_experts=moe.num_shared_experts if moe else 0, moe_layers=tuple(mc.moe_layers))

    @property
    def params_total(self) -> int:
        """Every stored parameter (all experts; embedding and LM head counted separately unless tied)."""
        return sum(la.params_total for la in self.layers)

    @property
    def params_active(self) -> int:
        """Parameters one token uses: shared weights + the top-k activated routed experts."""
        return sum(la.params_active for la in self.layers)

    def flops_by_role(self) -> dict[str, int]:
        """Total ops (cube + vector + scalar) per logical-trace role over the forward pass."""
        out: dict[str, int] = {}
        for la in self.layers:
            for op in la.ops:
                role = str(op.attrs.get("role", "other"))
                out[role] = out.get(role, 0) + op.compute.total
        return out


class LlamaModel(TransformerModel):
    """LLaMA-2/3 and Mixtral: MHA/GQA attention, SwiGLU FFN or top-k MoE."""


class DeepSeekModel(TransformerModel):
    """DeepSeek-V2/V3: MLA (prefill form; absorbed form in decode), dense-first layers, MoE with shared experts."""


def build_ir(mc: ModelConfig, *, phase: Phase = "decode", batch: int = 1, seq_len: int = 2048) -> TransformerModel:
    cls: type[TransformerModel] = DeepSeekModel if mc.mla is not None else LlamaModel
    return cls.from_model_config(mc, phase=phase, batch=batch, seq_len=seq_len)
