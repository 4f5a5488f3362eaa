"""Layer builders: embedding, attention (MHA/GQA), MLA (prefill) and MLA-absorbed (decode), SwiGLU FFN, MoE, LM head.

Counting rules (seed 003 "Op 计算量估算"), per forward pass of ``T`` tokens:
- MatMul ``[M,K]·[K,N]``: cube_ops ``2·M·N·K``; weight bytes ``K·N·b``; activation bytes ``M·K·b``; writes ``M·N·b``
  (``b`` = dtype bytes).
- Attention scores and score·V: ``2·T·ctx·d·H`` each (``ctx`` = keys per query: the context length in decode, the
  prompt length in prefill, counted as a full square as in the seed's softmax formula); K/V reads from the cache.
- Softmax: vector ops ``5·elements``, memory ``2·elements·b``; RMSNorm: vector ops ``3·T·h``, memory ``2·T·h·b``.
- SiLU(gate)·up: vector ops ``5·T·I`` (sigmoid 3, two multiplies).
- Router: gate matmul ``2·T·h·E`` + scoring/top-k vector ops ``6·T·E`` (softmax or sigmoid 5/elem, selection 1/elem).
- MoE experts: only the activated top-k count (rows ``T·k`` through each expert GEMM); the expert weights read are
  those of ``min(E, T·k)`` experts (an upper bound on the distinct experts a batch touches).
- Dispatch/combine: ``CommSpec(all2all)`` with ``T·k·h·b`` bytes each, combine's weighted sum ``2·T·k·h`` vector ops.

Every op carries ``attrs["role"]`` (which logical trace op it belongs to: attn, router, shared, expert, dense, head,
embed) and ``params_total`` / ``params_active`` (weight elements stored / used by one token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.workload.ir.layer import Layer
from services.workload.ir.metadata import Phase
from services.workload.ir.model_config import ModelConfig
from services.workload.ir.op import Op
from services.workload.ir.specs import CommSpec, ComputeSpec, MemorySpec
from services.workload.ir.tensor import TensorDesc


@dataclass(frozen=True, slots=True)
class Shape:
    """One forward pass: ``batch`` sequences; prefill processes ``seq_len`` tokens each, decode one token each with a
    KV cache of ``seq_len`` tokens."""

    phase: Phase
    batch: int
    seq_len: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len if self.phase == "prefill" else self.batch

    @property
    def ctx(self) -> int:
        """Keys each query attends to."""
        return self.seq_len


def _dtype(b: int) -> str:
    return {1: "fp8", 2: "bf16", 4: "fp32"}.get(b, "bf16")


def matmul(name: str, M: int, K: int, N: int, b: int, *, role: str, params_total: int | None = None,
           params_active: int | None = None, weight_read_elems: int | None = None, bias: bool = False,
           **attrs: Any) -> Op:
    """A weight GEMM ``[M,K]·[K,N]`` (+ a bias of ``N``: ``M·N`` vector adds). ``weight_read_elems`` overrides the
    weights read (MoE: touched experts; per-head GEMMs: all heads' matrices); ``params_total`` / ``params_active``
    override ``K·N`` (+ ``N``)."""
    w_elems = (K * N + (N if bias else 0)) if weight_read_elems is None else weight_read_elems
    pt = (K * N + (N if bias else 0)) if params_total is None else params_total
    dt = _dtype(b)
    return Op(
        name=name, op_type="matmul",
        compute=ComputeSpec(cube_ops=2 * M * N * K, vector_ops=M * N if bias else 0),
        memory=MemorySpec(weight_bytes=w_elems * b, activation_bytes=M * K * b, read_bytes=(w_elems + M * K) * b,
                          write_bytes=M * N * b),
        inputs=[TensorDesc(f"{name}.in", (M, K), dt), TensorDesc(f"{name}.weight", (K, N), dt)],
        outputs=[TensorDesc(f"{name}.out", (M, N), dt)],
        attrs={"dtype_bytes": b, "role": role, "params_total": pt,
               "params_active": pt if params_active is None else params_active, **attrs},
    )


def act_matmul(name: str, flops: int, read_bytes: int, write_bytes: int, b: int, *, role: str) -> Op:
    """Activation x activation (attention scores, score·V): no weights, reads the KV cache."""
    return Op(name=name, op_type="matmul", compute=ComputeSpec(cube_ops=flops),
              memory=MemorySpec(activation_bytes=read_bytes, read_bytes=read_bytes, write_bytes=write_bytes),
              attrs={"dtype_bytes": b, "role": role})


def rmsnorm(name: str, T: int, h: int, b: int, *, role: str) -> Op:
    dt = _dtype(b)
    return Op(name=name, op_type="rmsnorm", compute=ComputeSpec(vector_ops=3 * T * h),
              memory=MemorySpec(weight_bytes=h * b, activation_bytes=T * h * b, read_bytes=(T * h + h) * b,
                                write_bytes=T * h * b),
              inputs=[TensorDesc(f"{name}.in", (T, h), dt)], outputs=[TensorDesc(f"{name}.out", (T, h), dt)],
              attrs={"dtype_bytes": b, "role": role, "params_total": h})


def norm(mc: ModelConfig, name: str, T: int, h: int, *, role: str) -> Op:
    """The model's block norm over ``[T, h]``: RMSNorm (``h`` weights, 3 ops/element) or LayerNorm (weights and,
    unless ``layernorm_nobias``, biases; 5 ops/element: mean, centre, variance, scale, shift)."""
    b = mc.dtype_bytes
    if mc.norm == "rms":
        return rmsnorm(name, T, h, b, role=role)
    params = 2 * h if mc.norm == "layernorm" else h
    dt = _dtype(b)
    return Op(name=name, op_type="layernorm", compute=ComputeSpec(vector_ops=5 * T * h),
              memory=MemorySpec(weight_bytes=params * b, activation_bytes=T * h * b,
                                read_bytes=(T * h + params) * b, write_bytes=T * h * b),
              inputs=[TensorDesc(f"{name}.in", (T, h), dt)], outputs=[TensorDesc(f"{name}.out", (T, h), dt)],
              attrs={"dtype_bytes": b, "role": role, "params_total": params})


def vector(name: str, op_type: str, ops: int, read_bytes: int, write_bytes: int, b: int, *, role: str,
           **attrs: Any) -> Op:
    return Op(name=name, op_type=op_type, compute=ComputeSpec(vector_ops=ops),
              memory=MemorySpec(activation_bytes=read_bytes, read_bytes=read_bytes, write_bytes=write_bytes),
              attrs={"dtype_bytes": b, "role": role, **attrs})


def _io(name: str, T: int, h: int, b: int) -> tuple[list[TensorDesc], list[TensorDesc]]:
    dt = _dtype(b)
    return [TensorDesc(f"{name}.in", (T, h), dt)], [TensorDesc(f"{name}.out", (T, h), dt)]


def embedding_layer(mc: ModelConfig, s: Shape) -> Layer:
    T, h, b, V = s.tokens, mc.hidden_size, mc.dtype_bytes, mc.vocab_size
    op = Op(name="embed.gather", op_type="gather", compute=ComputeSpec(),
            memory=MemorySpec(weight_bytes=T * h * b, read_bytes=T * h * b + T * 4, write_bytes=T * h * b),
            inputs=[TensorDesc("embed.ids", (T,), "int32"), TensorDesc("embed.weight", (V, h), _dtype(b))],
            outputs=[TensorDesc("embed.out", (T, h), _dtype(b))],
            attrs={"dtype_bytes": b, "role": "embed", "params_total": V * h, "params_active": V * h})
    return Layer(name="embed", op_type="embedding", inputs=op.inputs[:1], outputs=op.outputs, ops=[op],
                 params={"layer": -1, "vocab_size": V, "hidden_size": h})


def attention_layer(mc: ModelConfig, s: Shape, i: int) -> Layer:
    """MHA/GQA block half: input norm, q/k/v projections (biases when ``attention_bias``; per-head or whole q/k
    RMSNorm when ``qk_norm``), scores, softmax, score·V, output projection. Keys per query: the context, or its
    last ``sliding_window`` / current ``attention_chunk_size`` tokens (``ModelConfig.keys_per_query``)."""
    T, h, b = s.tokens, mc.hidden_size, mc.dtype_bytes
    H, Hkv, d = mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim
    ctx = mc.keys_per_query(i, s.ctx)
    n = f"layers.{i}.attn"
    kv_read = s.batch * ctx * Hkv * d * b  # one of K or V for every sequence's context
    qkv_bias = mc.attention_bias
    ops = [
        norm(mc, f"{n}.input_layernorm", T, h, role="attn"),
        matmul(f"{n}.q_proj", T, h, H * d, b, role="attn", bias=qkv_bias),
        matmul(f"{n}.k_proj", T, h, Hkv * d, b, role="attn", bias=qkv_bias),
        matmul(f"{n}.v_proj", T, h, Hkv * d, b, role="attn", bias=qkv_bias),
    ]
    if mc.qk_norm == "head":  # RMSNorm over each head's d elements, one weight vector for q and one for k
        ops += [_rms_rows(f"{n}.q_norm", T * H, d, b), _rms_rows(f"{n}.k_norm", T * Hkv, d, b)]
    elif mc.qk_norm == "full":  # RMSNorm over the whole projected q (H·d) and k (Hkv·d)
        ops += [_rms_rows(f"{n}.q_norm", T, H * d, b), _rms_rows(f"{n}.k_norm", T, Hkv * d, b)]
    ops += [
        act_matmul(f"{n}.qk", 2 * T * ctx * d * H, T * H * d * b + kv_read, T * H * ctx * b, b, role="attn"),
        vector(f"{n}.softmax", "softmax", 5 * T * ctx * H, T * H * ctx * b, T * H * ctx * b, b, role="attn",
               **({"params_total": H} if mc.attention_sinks else {})),  # a sink logit per head joins the softmax
        act_matmul(f"{n}.sv", 2 * T * ctx * d * H, T * H * ctx * b + kv_read, T * H * d * b, b, role="attn"),
        matmul(f"{n}.o_proj", T, H * d, h, b, role="attn", bias=mc.o_proj_bias),
    ]
    ins, outs = _io(n, T, h, b)
    return Layer(name=n, op_type="attention", inputs=ins, outputs=outs, ops=ops,
                 params={"layer": i, "hidden_size": h, "num_heads": H, "num_kv_heads": Hkv, "head_dim": d,
                         "mixer": mc.layer_mixers[i], "kv_bytes_per_token": mc.kv_bytes_per_token_layer(i),
                         "ctx": ctx})


def _rms_rows(name: str, rows: int, width: int, b: int) -> Op:
    """RMSNorm applied to ``rows`` vectors of ``width`` (one weight vector of ``width``)."""
    return rmsnorm(name, rows, width, b, role="attn")


def mamba_layer(mc: ModelConfig, s: Shape, i: int) -> Layer:
    """Mamba mixer (Jamba), one recurrent step per token (decode) or a scan over the prompt (prefill), per token:

    - in_proj ``h → 2·di`` (x and the gate z), out_proj ``di → h``, x_proj ``di → R + 2·N``, dt_proj ``R → di``
      (``di`` = d_inner, ``N`` = d_state, ``R`` = dt_rank): GEMMs;
    - depthwise causal conv of width ``K``: ``2·di·K`` ops, reading the sequence's last ``K−1`` inputs;
    - selective scan: ``8·di·N`` ops (Δ·A, exp, Δ·B, ·x, Ā·h, +, C·h, sum) + ``2·di`` (D skip) + ``5·di`` (y·SiLU(z));
      the SSM state ``di·N`` of each sequence is read and written once per step;
    - Jamba's RMSNorms over Δ (R), B and C (N each).
    """
    assert mc.mamba is not None
    m, T, h, b = mc.mamba, s.tokens, mc.hidden_size, mc.dtype_bytes
    di, N, K, R = m.d_inner, m.d_state, m.d_conv, m.dt_rank
    n = f"layers.{i}.mamba"
    seqs = s.batch
    state = seqs * m.state_elems * b
    ops = [norm(mc, f"{n}.input_layernorm", T, h, role="attn"),
           matmul(f"{n}.in_proj", T, h, 2 * di, b, role="attn", bias=m.proj_bias),
           vector(f"{n}.conv1d", "conv1d", 2 * T * di * K, T * di * b + seqs * di * (K - 1) * b, T * di * b, b,
                  role="attn", params_total=di * K + (di if m.conv_bias else 0)),
           matmul(f"{n}.x_proj", T, di, R + 2 * N, b, role="attn")]
    if m.inner_norms:
        ops += [rmsnorm(f"{n}.dt_layernorm", T, R, b, role="attn"), rmsnorm(f"{n}.b_layernorm", T, N, b, role="attn"),
                rmsnorm(f"{n}.c_layernorm", T, N, b, role="attn")]
    ops += [matmul(f"{n}.dt_proj", T, R, di, b, role="attn", bias=True),
            vector(f"{n}.selective_scan", "selective_scan", T * di * (8 * N + 7), T * di * (3 + 2 * N) * b + state,
                   T * di * b + state, b, role="attn", params_total=di * N + di),  # A_log, D
            matmul(f"{n}.out_proj", T, di, h, b, role="attn", bias=m.proj_bias)]
    ins, outs = _io(n, T, h, b)
    return Layer(name=n, op_type="mamba", inputs=ins, outputs=outs, ops=ops,
                 params={"layer": i, "hidden_size": h, "d_inner": di, "d_state": N, "mixer": "mamba",
                         "state_bytes_per_sequence": mc.state_bytes_per_sequence(i), "kv_bytes_per_token": 0})


def _mla_q(mc: ModelConfig, n: str, T: int) -> list[Op]:
    assert mc.mla is not None
    m, h, b, H = mc.mla, mc.hidden_size, mc.dtype_bytes, mc.num_attention_heads
    if m.q_lora_rank is None:
        return [matmul(f"{n}.wq", T, h, H * m.qk_head_dim, b, role="attn", bias=mc.attention_bias)]
    return [matmul(f"{n}.wq_a", T, h, m.q_lora_rank, b, role="attn", bias=mc.attention_bias),
            rmsnorm(f"{n}.q_norm", T, m.q_lora_rank, b, role="attn"),
            matmul(f"{n}.wq_b", T, m.q_lora_rank, H * m.qk_head_dim, b, role="attn")]


def mla_layer(mc: ModelConfig, s: Shape, i: int) -> Layer:
    """MLA, prefill form: K and V decompressed from the latent (wkv_b) for every context token, then plain MHA."""
    assert mc.mla is not None
    m, T, h, b, H, ctx = mc.mla, s.tokens, mc.hidden_size, mc.dtype_bytes, mc.num_attention_heads, s.ctx
    n = f"layers.{i}.mla"
    kl, rope, nope, v = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
    ops = [norm(mc, f"{n}.input_layernorm", T, h, role="attn"), *_mla_q(mc, n, T),
           matmul(f"{n}.wkv_a", T, h, kl + rope, b, role="attn", bias=mc.attention_bias),
           rmsnorm(f"{n}.kv_norm", T, kl, b, role="attn"),
           matmul(f"{n}.wkv_b", T, kl, H * (nope + v), b, role="attn"),
           act_matmul(f"{n}.qk", 2 * T * ctx * H * (nope + rope), (T + s.batch * ctx) * H * (nope + rope) * b,
                      T * H * ctx * b, b, role="attn"),
           vector(f"{n}.softmax", "softmax", 5 * T * ctx * H, T * H * ctx * b, T * H * ctx * b, b, role="attn"),
           act_matmul(f"{n}.sv", 2 * T * ctx * H * v, (T * H * ctx + s.batch * ctx * H * v) * b, T * H * v * b, b,
                      role="attn"),
           matmul(f"{n}.wo", T, H * v, h, b, role="attn", bias=mc.o_proj_bias)]
    ins, outs = _io(n, T, h, b)
    return Layer(name=n, op_type="mla", inputs=ins, outputs=outs, ops=ops,
                 params={"layer": i, "hidden_size": h, "num_heads": H, "kv_lora_rank": kl, "q_lora_rank": m.q_lora_rank,
                         "kv_bytes_per_token": mc.kv_bytes_per_token_layer(i), "ctx": ctx})


def mla_absorb_layer(mc: ModelConfig, s: Shape, i: int) -> Layer:
    """MLA, absorbed decode form: W_UK folded into the query, W_UV applied after attention over the latent cache
    (``kv_lora_rank + qk_rope_head_dim`` elements per cached token)."""
    assert mc.mla is not None
    m, T, h, b, H, ctx = mc.mla, s.tokens, mc.hidden_size, mc.dtype_bytes, mc.num_attention_heads, s.ctx
    n = f"layers.{i}.mla_absorb"
    kl, rope, nope, v = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
    latent_read = s.batch * ctx * (kl + rope) * b
    ops = [norm(mc, f"{n}.input_layernorm", T, h, role="attn"), *_mla_q(mc, n, T),
           matmul(f"{n}.wkv_a", T, h, kl + rope, b, role="attn", bias=mc.attention_bias),
           rmsnorm(f"{n}.kv_norm", T, kl, b, role="attn"),
           # q_nope[T,H,nope] · W_UK[H,nope,kl]: one GEMM per head, M=T
           matmul(f"{n}.q_absorb", T * H, nope, kl, b, role="attn", weight_read_elems=H * nope * kl,
                  params_total=H * nope * kl),
           act_matmul(f"{n}.qk", 2 * T * ctx * H * (kl + rope), T * H * (kl + rope) * b + latent_read,
                      T * H * ctx * b, b, role="attn"),
           vector(f"{n}.softmax", "softmax", 5 * T * ctx * H, T * H * ctx * b, T * H * ctx * b, b, role="attn"),
           act_matmul(f"{n}.sv", 2 * T * ctx * H * kl, T * H * ctx * b + latent_read, T * H * kl * b, b, role="attn"),
           matmul(f"{n}.v_up", T * H, kl, v, b, role="attn", weight_read_elems=H * kl * v, params_total=H * kl * v),
           matmul(f"{n}.wo", T, H * v, h, b, role="attn", bias=mc.o_proj_bias)]
    ins, outs = _io(n, T, h, b)
    return Layer(name=n, op_type="mla_absorb", inputs=ins, outputs=outs, ops=ops,
                 params={"layer": i, "hidden_size": h, "num_heads": H, "kv_lora_rank": kl, "q_lora_rank": m.q_lora_rank,
                         "kv_bytes_per_token": mc.kv_bytes_per_token_layer(i), "ctx": ctx})


def _swiglu(n: str, T: int, h: int, inter: int, b: int, *, role: str, params_active_scale: float = 1.0,
            weight_read_elems: int | None = None, rows: int | None = None, total_scale: int = 1,
            bias: bool = False) -> list[Op]:
    """gate_proj, up_proj, SiLU·mul, down_proj over ``rows`` token rows (default T); ``bias``: each projection
    has one (gpt-oss experts, a dense MLP with ``mlp_bias``). ``total_scale`` copies are stored (routed experts),
    ``params_active_scale`` of them used per token."""
    M = T if rows is None else rows
    pt_in = (h * inter + (inter if bias else 0)) * total_scale
    pt_out = (inter * h + (h if bias else 0)) * total_scale
    pa_in = int((h * inter + (inter if bias else 0)) * params_active_scale)
    pa_out = int((inter * h + (h if bias else 0)) * params_active_scale)
    wr = weight_read_elems
    return [matmul(f"{n}.gate_proj", M, h, inter, b, role=role, params_total=pt_in, params_active=pa_in,
                   weight_read_elems=wr, bias=bias),
            matmul(f"{n}.up_proj", M, h, inter, b, role=role, params_total=pt_in, params_active=pa_in,
                   weight_read_elems=wr, bias=bias),
            vector(f"{n}.silu_mul", "silu_mul", 5 * M * inter, 2 * M * inter * b, M * inter * b, b, role=role),
            matmul(f"{n}.down_proj", M, inter, h, b, role=role, params_total=pt_out, params_active=pa_out,
                   weight_read_elems=wr, bias=bias)]


def ffn_layer(mc: ModelConfig, s: Shape, i: int) -> Layer:
    T, h, b, inter = s.tokens, mc.hidden_size, mc.dtype_bytes, mc.intermediate_size
    n = f"layers.{i}.ffn"
    ops = [norm(mc, f"{n}.post_attention_layernorm", T, h, role="dense"),
           *_swiglu(n, T, h, inter, b, role="dense", bias=mc.mlp_bias)]
    ins, outs = _io(n, T, h, b)
    return Layer(name=n, op_type="ffn", inputs=ins, outputs=outs, ops=ops,
                 params={"layer": i, "hidden_size": h, "intermediate_size": inter})


def moe_layer(mc: ModelConfig, s: Shape, i: int) -> Layer:
    """Router (gate GEMM + scoring/top-k), dispatch (all2all), shared experts (and their sigmoid gate, Qwen2-MoE),
    activated routed experts, combine."""
    assert mc.moe is not None
    moe, T, h, b = mc.moe, s.tokens, mc.hidden_size, mc.dtype_bytes
    E, k, mi, ns = moe.num_routed_experts, moe.num_activated_experts, moe.moe_intermediate_size, moe.num_shared_experts
    n = f"layers.{i}.moe"
    a2a = T * k * h * b
    dispatch = CommSpec("all2all", a2a, E, "ep_group")
    combine = CommSpec("all2all", a2a, E, "ep_group")
    touched = min(E, T * k)
    ops = [norm(mc, f"{n}.post_attention_layernorm", T, h, role="router"),
           matmul(f"{n}.gate", T, h, E, b, role="router", bias=moe.router_bias),
           vector(f"{n}.topk", "topk", 6 * T * E, T * E * 4, T * k * 8, b, role="router", score_func=moe.score_func),
           vector(f"{n}.dispatch", "dispatch", 0, a2a, a2a, b, role="router", comm=dispatch)]
    if moe.shared_width:
        ops += _swiglu(f"{n}.shared_experts", T, h, moe.shared_width, b, role="shared")
    if moe.shared_expert_gate:  # sigmoid(x · w_g) scales the shared expert's output: a [h, 1] GEMM + 4 ops/token
        ops += [matmul(f"{n}.shared_expert_gate", T, h, 1, b, role="shared"),
                vector(f"{n}.shared_expert_scale", "sigmoid_mul", 4 * T + T * h, T * h * b, T * h * b, b,
                       role="shared")]
    ops += _swiglu(f"{n}.experts", T, h, mi, b, role="expert", rows=T * k, params_active_scale=k,
                   weight_read_elems=touched * h * mi, total_scale=E, bias=moe.expert_bias)
    ops.append(vector(f"{n}.combine", "combine", 2 * T * k * h, a2a, T * h * b, b, role="expert", comm=combine))
    ins, outs = _io(n, T, h, b)
    return Layer(name=n, op_type="moe", inputs=ins, outputs=outs, ops=ops,
                 comm=CommSpec("all2all", 2 * a2a, E, "ep_group"),
                 params={"layer": i, "hidden_size": h, "num_routed_experts": E, "num_activated_experts": k,
                         "num_shared_experts": ns, "moe_intermediate_size": mi, "n_group": moe.n_group,
                         "topk_group": moe.topk_group, "expert_params": mc.expert_params})


def lm_head_layer(mc: ModelConfig, s: Shape) -> Layer:
    T, h, b, V = s.tokens, mc.hidden_size, mc.dtype_bytes, mc.vocab_size
    n = "lm_head"
    # A tied head shares the embedding matrix: no extra parameters (its bias, if any, is its own).
    head = matmul(f"{n}.proj", T, h, V, b, role="head", bias=mc.lm_head_bias,
                  params_total=(V if mc.lm_head_bias else 0) if mc.tie_word_embeddings else None)
    ops = [norm(mc, "norm", T, h, role="head"), head]
    ins, outs = _io(n, T, h, b)
    outs = [TensorDesc(f"{n}.logits", (T, V), _dtype(b))]
    return Layer(name=n, op_type="lm_head", inputs=ins, outputs=outs, ops=ops,
                 params={"layer": mc.num_hidden_layers, "hidden_size": h, "vocab_size": V})
