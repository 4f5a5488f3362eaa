"""Fused graph → atomic-op DAG, hardware-driven fusion and parallel strategy (seed 004).

- Op kinds are a typed enum (``OpKind``); strings exist only at the API edge (``FusedKind`` parses them).
- Expansion (GAP-A): FlashAttention (MHA), GQA (grouped K/V heads), MLA (DeepSeek low-rank latent attention with a
  decoupled RoPE key) and SwiGLU expand to DAGs of MatMul / RmsNorm / RoPE / Concat / Softmax / Silu / Mul / Add.
- Op classes are derived from the kind (GAP-14): GEMM, elementwise, binary elementwise, injective (RoPE, Concat:
  fusable into a consumer but never a GEMM epilogue), reduction (norms, softmax).
- Fusion, given the device profile:
  1. Epilogues: a chain of elementwise consumers (bias, activation, residual add, gate multiply) of a GEMM output
     with a single consumer becomes that GEMM's epilogue; a binary op takes its other operand as its one extra input
     (GAP-12), and only when that operand is produced before the GEMM.
  2. Producer → consumer edges: a producer whose output fits in ``0.75 × SPM`` stays resident (ComputeRoot: no DRAM
     store/load round trip); a larger one feeding a GEMM's row (A) operand fuses at tile level (TileLevelFusion,
     ``tile_rows`` = MC rows whose slice fits the 0.75 × SPM scratch, a multiple of the array rows); anything else
     is materialised in DRAM.
  3. Parallel strategy (GAP-15): GEMM → split N over the cores; elementwise / reduction → rows split evenly;
     small ops (< ``SEQUENTIAL_BYTES``) → sequential.
- Cost: DRAM bytes of the unfused DAG (every intermediate stored and re-read) versus the plan; cycles from the
  analytic GEMM / vector models, divided over the cores of each op's parallel split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.lowering.costmodel import RESIDENT_FRACTION, dtype_bytes, gemm_cost_for_arch, vector_cost
from shared.configs.arch import ArchConfig
from shared.dvfs import top_freqs
from shared.errors import BadInput
from shared.limits import MAX_ITEMS, Dim, DimOrZero

SEQUENTIAL_BYTES = 64 * 1024


class OpKind(StrEnum):
    MATMUL = "MatMul"
    RMSNORM = "RmsNorm"
    LAYERNORM = "LayerNorm"
    SOFTMAX = "Softmax"
    SILU = "Silu"
    GELU = "Gelu"
    MUL = "Mul"
    ADD = "Add"
    BIAS_ADD = "BiasAdd"
    ROPE = "RoPE"
    CONCAT = "Concat"


class OpClass(StrEnum):
    GEMM = "gemm"
    ELEMWISE = "elementwise"
    BINARY = "binary_elementwise"
    INJECTIVE = "injective"
    REDUCTION = "reduction"


OP_CLASS: dict[OpKind, OpClass] = {
    OpKind.MATMUL: OpClass.GEMM,
    OpKind.RMSNORM: OpClass.REDUCTION, OpKind.LAYERNORM: OpClass.REDUCTION, OpKind.SOFTMAX: OpClass.REDUCTION,
    OpKind.SILU: OpClass.ELEMWISE, OpKind.GELU: OpClass.ELEMWISE,
    OpKind.MUL: OpClass.BINARY, OpKind.ADD: OpClass.BINARY, OpKind.BIAS_ADD: OpClass.BINARY,
    OpKind.ROPE: OpClass.INJECTIVE, OpKind.CONCAT: OpClass.INJECTIVE,
}
_VE_OP = {OpKind.RMSNORM: "rmsnorm", OpKind.LAYERNORM: "layernorm", OpKind.SOFTMAX: "softmax", OpKind.SILU: "silu",
          OpKind.GELU: "gelu", OpKind.MUL: "mul", OpKind.ADD: "add", OpKind.BIAS_ADD: "add", OpKind.ROPE: "mul",
          OpKind.CONCAT: "copy"}


class FusedKind(StrEnum):
    FLASH_ATTENTION = "FlashAttention"
    GQA = "GQA"
    MLA = "MLA"
    SWIGLU = "SwiGLU"


@dataclass(frozen=True)
class Tensor:
    name: str
    rows: int
    cols: int
    is_input: bool = False  # graph input or weight (read from DRAM, never produced here)

    def nbytes(self, eb: int) -> int:
        return self.rows * self.cols * eb


@dataclass
class Node:
    id: str
    kind: OpKind
    inputs: list[str]
    output: str
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def op_class(self) -> OpClass:
        return OP_CLASS[self.kind]


@dataclass
class Dag:
    tensors: dict[str, Tensor] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)

    def inp(self, name: str, rows: int, cols: int) -> str:
        self.tensors[name] = Tensor(name, rows, cols, is_input=True)
        return name

    def op(self, kind: OpKind, inputs: list[str], out: str, rows: int, cols: int, **attrs: Any) -> str:
        self.tensors[out] = Tensor(out, rows, cols)
        self.nodes.append(Node(f"n{len(self.nodes)}", kind, inputs, out, attrs))
        return out

    def matmul(self, a: str, b: str, out: str, *, transpose_b: bool = False, batch: int = 1) -> str:
        ta, tb = self.tensors[a], self.tensors[b]
        K = ta.cols
        N = tb.rows if transpose_b else tb.cols
        kb = tb.cols if transpose_b else tb.rows
        if kb * (batch if transpose_b else 1) != K and kb != K:
            raise BadInput(f"MatMul {a}·{b}: inner dimensions {ta.cols} and {kb} differ", field="shape")
        return self.op(OpKind.MATMUL, [a, b], out, ta.rows, N * (batch if transpose_b else 1),
                       M=ta.rows, K=K // batch if transpose_b else K, N=N, batch=batch, transpose_b=transpose_b)

    def producer(self) -> dict[str, Node]:
        return {n.output: n for n in self.nodes}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {t: [] for t in self.tensors}
        for n in self.nodes:
            for t in n.inputs:
                out[t].append(n)
        return out


# ---- expansion ---------------------------------------------------------------------------------------------------
class FusedOpSpec(BaseModel):
    """One fused op at the API edge. ``kind`` is parsed into ``FusedKind``; unused fields are ignored per kind."""

    model_config = ConfigDict(extra="forbid")

    kind: FusedKind
    tokens: Dim = 1  # M / S: rows processed
    d: Dim = 4096
    f: Dim = 14336  # SwiGLU hidden
    heads: Dim = 32
    kv_heads: Dim | None = None  # GQA; default = heads (FlashAttention) or heads/4 (GQA)
    head_dim: Dim = 128
    kv_cached: DimOrZero = 0
    residual: bool = True
    # MLA (DeepSeek-V2/V3 defaults)
    q_lora_rank: Dim = 1536
    kv_lora_rank: Dim = 512
    qk_nope_head_dim: Dim = 128
    qk_rope_head_dim: Dim = 64
    v_head_dim: Dim = 128


def expand_swiglu(s: FusedOpSpec) -> Dag:
    g = Dag()
    M, d, f = s.tokens, s.d, s.f
    x = g.inp("X", M, d)
    gate = g.matmul(x, g.inp("Wg", d, f), "gate")
    up = g.matmul(x, g.inp("Wu", d, f), "up")
    act = g.op(OpKind.SILU, [gate], "silu", M, f)
    h = g.op(OpKind.MUL, [act, up], "h", M, f, extra_input_idx=0)
    y = g.matmul(h, g.inp("Wd", f, d), "down")
    if s.residual:
        g.op(OpKind.ADD, [y, x], "out", M, d, extra_input_idx=1)
    return g


def expand_attention(s: FusedOpSpec, kv_heads: int) -> Dag:
    """FlashAttention / GQA: pre-norm, Q/K/V projections, RoPE, KV concat with the cache, QKᵀ, softmax, ·V, Wo."""
    if s.heads % kv_heads:
        raise BadInput(f"heads ({s.heads}) must be a multiple of kv_heads ({kv_heads})", field="kv_heads")
    g = Dag()
    S, d, H, hd, L = s.tokens, s.d, s.heads, s.head_dim, s.kv_cached + s.tokens
    x = g.inp("X", S, d)
    xn = g.op(OpKind.RMSNORM, [x, g.inp("gamma", 1, d)], "x_norm", S, d, extra_input_idx=1)
    q = g.matmul(xn, g.inp("Wq", d, H * hd), "q")
    k = g.matmul(xn, g.inp("Wk", d, kv_heads * hd), "k")
    v = g.matmul(xn, g.inp("Wv", d, kv_heads * hd), "v")
    qr = g.op(OpKind.ROPE, [q], "q_rope", S, H * hd)
    kr = g.op(OpKind.ROPE, [k], "k_rope", S, kv_heads * hd)
    if s.kv_cached:
        k_all = g.op(OpKind.CONCAT, [g.inp("K_cache", s.kv_cached, kv_heads * hd), kr], "k_all", L, kv_heads * hd)
        v_all = g.op(OpKind.CONCAT, [g.inp("V_cache", s.kv_cached, kv_heads * hd), v], "v_all", L, kv_heads * hd)
    else:
        k_all, v_all = kr, v
    # per head: scores (S × L) · H heads, the K/V head shared by heads/kv_heads query heads
    sc = g.op(OpKind.MATMUL, [qr, k_all], "scores", S, H * L, M=S, K=hd, N=L, batch=H, transpose_b=True,
              group=H // kv_heads)
    p = g.op(OpKind.SOFTMAX, [sc], "probs", S, H * L, reduce_len=L)
    o = g.op(OpKind.MATMUL, [p, v_all], "attn_out", S, H * hd, M=S, K=L, N=hd, batch=H, group=H // kv_heads)
    y = g.matmul(o, g.inp("Wo", H * hd, d), "proj")
    if s.residual:
        g.op(OpKind.ADD, [y, x], "out", S, d, extra_input_idx=1)
    return g


def expand_mla(s: FusedOpSpec) -> Dag:
    """DeepSeek MLA: low-rank Q and KV latents (each RmsNorm'ed), a decoupled RoPE key shared by all heads."""
    g = Dag()
    S, d, H, L = s.tokens, s.d, s.heads, s.kv_cached + s.tokens
    dn, dr, dv = s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim
    x = g.inp("X", S, d)
    xn = g.op(OpKind.RMSNORM, [x, g.inp("gamma", 1, d)], "x_norm", S, d, extra_input_idx=1)
    cq = g.matmul(xn, g.inp("W_dq", d, s.q_lora_rank), "c_q")
    cqn = g.op(OpKind.RMSNORM, [cq, g.inp("gamma_q", 1, s.q_lora_rank)], "c_q_norm", S, s.q_lora_rank,
               extra_input_idx=1)
    q = g.matmul(cqn, g.inp("W_uq", s.q_lora_rank, H * (dn + dr)), "q")
    qr = g.op(OpKind.ROPE, [q], "q_rope", S, H * (dn + dr), rope_cols=H * dr)
    ckv = g.matmul(xn, g.inp("W_dkv", d, s.kv_lora_rank), "c_kv")
    ckvn = g.op(OpKind.RMSNORM, [ckv, g.inp("gamma_kv", 1, s.kv_lora_rank)], "c_kv_norm", S, s.kv_lora_rank,
                extra_input_idx=1)
    kpe = g.matmul(xn, g.inp("W_kr", d, dr), "k_pe")
    kper = g.op(OpKind.ROPE, [kpe], "k_pe_rope", S, dr)
    if s.kv_cached:
        ckvn = g.op(OpKind.CONCAT, [g.inp("ckv_cache", s.kv_cached, s.kv_lora_rank), ckvn], "c_kv_all", L,
                    s.kv_lora_rank)
        kper = g.op(OpKind.CONCAT, [g.inp("kpe_cache", s.kv_cached, dr), kper], "k_pe_all", L, dr)
    kn = g.matmul(ckvn, g.inp("W_uk", s.kv_lora_rank, H * dn), "k_nope")
    v = g.matmul(ckvn, g.inp("W_uv", s.kv_lora_rank, H * dv), "v")
    k = g.op(OpKind.CONCAT, [kn, kper], "k", L, H * dn + dr)
    sc = g.op(OpKind.MATMUL, [qr, k], "scores", S, H * L, M=S, K=dn + dr, N=L, batch=H, transpose_b=True)
    p = g.op(OpKind.SOFTMAX, [sc], "probs", S, H * L, reduce_len=L)
    o = g.op(OpKind.MATMUL, [p, v], "attn_out", S, H * dv, M=S, K=L, N=dv, batch=H)
    y = g.matmul(o, g.inp("Wo", H * dv, d), "proj")
    if s.residual:
        g.op(OpKind.ADD, [y, x], "out", S, d, extra_input_idx=1)
    return g


def expand(s: FusedOpSpec) -> Dag:
    if s.kind == FusedKind.SWIGLU:
        return expand_swiglu(s)
    if s.kind == FusedKind.FLASH_ATTENTION:
        return expand_attention(s, s.kv_heads or s.heads)
    if s.kind == FusedKind.GQA:
        kvh = s.kv_heads or max(1, s.heads // 4)
        if kvh >= s.heads:
            raise BadInput("GQA needs kv_heads < heads", field="kv_heads")
        return expand_attention(s, kvh)
    return expand_mla(s)


# ---- fusion ------------------------------------------------------------------------------------------------------
def _depends_on(tensor: str, target: str, prod: dict[str, Node]) -> bool:
    """Whether ``tensor`` is computed (transitively) from ``target``."""
    stack, seen = [tensor], set()
    while stack:
        t = stack.pop()
        if t == target:
            return True
        if t in seen or t not in prod:
            continue
        seen.add(t)
        stack.extend(prod[t].inputs)
    return False


Decision = Literal["epilogue", "compute_root", "tile_level", "materialize"]


class EdgePlan(BaseModel):
    tensor: str
    producer: str
    consumer: str
    decision: Decision
    bytes: int
    tile_rows: int | None = None


class GroupPlan(BaseModel):
    id: str
    root: str  # node id
    root_kind: str
    nodes: list[str]
    epilogue: list[str]  # op kinds absorbed as the GEMM epilogue
    extra_inputs: list[str]
    parallel: str  # "gemm_n" | "elementwise" | "sequential"
    splits: int
    cycles: float


class NodeOut(BaseModel):
    id: str
    kind: str
    op_class: str
    inputs: list[str]
    output: str
    shape: tuple[int, int]
    attrs: dict[str, Any]


class GraphPlan(BaseModel):
    kind: str
    nodes: list[NodeOut]
    groups: list[GroupPlan]
    edges: list[EdgePlan]
    cost: dict[str, float]


@dataclass(frozen=True)
class FusionProfile:
    spm_bytes: int
    array: tuple[int, int]
    dtype: str
    n_cores: int

    @classmethod
    def from_arch(cls, arch: ArchConfig) -> FusionProfile:
        return cls(arch.core.spm_kb * 1024, arch.core.array, arch.core.dtype, arch.mesh.n_cores)


def fuse(dag: Dag, prof: FusionProfile, arch: ArchConfig, kind: str = "") -> GraphPlan:
    """The fusion plan of a DAG, in four passes: GEMM epilogues absorbed into groups, the decision on every edge
    between groups, each group's parallel strategy and cycles, and the DRAM bytes with and without fusion."""
    eb = dtype_bytes(prof.dtype)
    cons = dag.consumers()
    groups, group_of = _epilogue_groups(dag, cons)
    edges = _edge_plans(dag, prof, groups, group_of)
    out_groups = [_group_plan(dag, prof, arch, g, i) for i, g in enumerate(groups.values())]
    cyc_total = 0.0
    for gp in out_groups:
        cyc_total += gp.cycles
    unfused, fused = _dram_bytes(dag, eb, cons, edges)
    # DRAM time added to compute (groups run one after another; all vaults stream in parallel), in cycles of the
    # slowest core's top DVFS step (shared.dvfs.top_freqs): a group split over every core ends with its slowest one
    f_ghz = min(top_freqs(arch))
    bw = arch.dram.vault_bw_gbps / f_ghz * prof.n_cores  # bytes per core cycle, all vaults
    cost = {
        "dram_bytes_unfused": float(unfused),
        "dram_bytes_fused": float(fused),
        "compute_cycles": cyc_total,
        "cycles_unfused": cyc_total + unfused / bw,
        "cycles_fused": cyc_total + fused / bw,
        "groups": float(len(out_groups)),
    }
    pos_of = {n.id: i for i, n in enumerate(dag.nodes)}
    out_groups.sort(key=lambda g: pos_of[g.nodes[-1]])  # execution order: a group runs once its last input exists
    for i, gp in enumerate(out_groups):
        gp.id = f"g{i}"
    nodes = [NodeOut(id=n.id, kind=n.kind.value, op_class=n.op_class.value, inputs=n.inputs, output=n.output,
                     shape=(dag.tensors[n.output].rows, dag.tensors[n.output].cols), attrs=n.attrs)
             for n in dag.nodes]
    return GraphPlan(kind=kind, nodes=nodes, groups=out_groups, edges=edges, cost=cost)


@dataclass
class _Group:
    """A fusion group: its root node and the element-wise/binary nodes absorbed as the root GEMM's epilogue."""

    root: Node
    nodes: list[str]
    epilogue: list[str] = field(default_factory=list)  # op kinds absorbed as the GEMM epilogue
    extra: list[str] = field(default_factory=list)  # the epilogue's other operands


def _epilogue_groups(dag: Dag, cons: dict[str, list[Node]]) -> tuple[dict[str, _Group], dict[str, str]]:
    """Pass 1, epilogues: every node roots a group unless absorbed; a GEMM absorbs the chain of element-wise or
    binary nodes that alone consume its output (a binary node's other operand must not depend on the GEMM).
    Returns (groups by root id, the group of each node)."""
    prod = dag.producer()
    group_of: dict[str, str] = {}
    groups: dict[str, _Group] = {}
    for n in dag.nodes:
        if n.id in group_of:
            continue
        g = _Group(root=n, nodes=[n.id])
        groups[n.id] = g
        group_of[n.id] = n.id
        if n.op_class != OpClass.GEMM:
            continue
        cur = n
        while True:
            cs = cons[cur.output]
            if len(cs) != 1:
                break
            c = cs[0]
            if c.op_class not in (OpClass.ELEMWISE, OpClass.BINARY) or c.id in group_of:
                break
            others = [t for t in c.inputs if t != cur.output]
            if len(others) > 1:
                break
            if others and _depends_on(others[0], n.output, prod):
                break  # the extra operand needs this GEMM's result: absorbing it would make a cycle
            g.nodes.append(c.id)
            g.epilogue.append(c.kind.value)
            g.extra.extend(others)
            group_of[c.id] = n.id
            cur = c
    return groups, group_of


def _edge_plans(dag: Dag, prof: FusionProfile, groups: dict[str, _Group], group_of: dict[str, str]
                ) -> list[EdgePlan]:
    """Pass 2, edges between groups: inside a group an epilogue; else compute-root when the tensor fits the
    scratch share of the SPM, tile-level when its consumer reads it by rows and a row tile fits, else materialized
    in DRAM."""
    eb = dtype_bytes(prof.dtype)
    prod = dag.producer()
    by_id = {n.id: n for n in dag.nodes}
    out_of_group = {gid: by_id[g.nodes[-1]].output for gid, g in groups.items()}
    edges: list[EdgePlan] = []
    scratch = RESIDENT_FRACTION * prof.spm_bytes
    R = prof.array[0]
    for n in dag.nodes:
        for pos, t in enumerate(n.inputs):
            if t not in prod:
                continue
            p = prod[t]
            pg, cg = group_of[p.id], group_of[n.id]
            nbytes = dag.tensors[t].nbytes(eb)
            if pg == cg:
                edges.append(EdgePlan(tensor=t, producer=p.id, consumer=n.id, decision="epilogue", bytes=0))
                continue
            if out_of_group[pg] != t:
                raise BadInput(f"tensor {t} escapes its fusion group", field="graph")  # pragma: no cover
            tile_rows = None
            # row-tiled consumption: the A (row) operand of a GEMM, or any operand of a row-wise op
            row_consumer = (n.op_class == OpClass.GEMM and pos == 0) or n.op_class != OpClass.GEMM
            mc = int(scratch // (dag.tensors[t].cols * eb))
            if nbytes <= scratch:
                dec: Decision = "compute_root"
            elif row_consumer and mc >= 1:
                dec = "tile_level"
                tile_rows = (mc // R) * R if mc >= R else mc
            else:
                dec = "materialize"
            edges.append(EdgePlan(tensor=t, producer=p.id, consumer=n.id, decision=dec,
                                  bytes=0 if dec != "materialize" else nbytes, tile_rows=tile_rows))
    return edges


def _group_plan(dag: Dag, prof: FusionProfile, arch: ArchConfig, g: _Group, index: int) -> GroupPlan:
    """Pass 3, one group's parallel strategy and cycles: a GEMM split over output column tiles (and batches), its
    epilogue on the output; a vector op sequential when small, else element-wise (a reduction over rows)."""
    eb = dtype_bytes(prof.dtype)
    root = g.root
    out_t = dag.tensors[root.output]
    if root.op_class == OpClass.GEMM:
        M, K, N = int(root.attrs["M"]), int(root.attrs["K"]), int(root.attrs["N"])
        batch = int(root.attrs.get("batch", 1))
        gc = gemm_cost_for_arch(M, K, N, arch)
        work = gc.total_cycles * batch
        if batch > 1:
            par, splits = "gemm_n", min(prof.n_cores, batch * math.ceil(N / prof.array[1]))
        else:
            par, splits = "gemm_n", min(prof.n_cores, math.ceil(N / prof.array[1]))
        for k_ in g.epilogue:
            work += vector_cost(_VE_OP[OpKind(k_)], float(out_t.rows * out_t.cols),
                                vector_width=arch.core.vector_width).cycles
    else:
        elems = float(out_t.rows * out_t.cols)
        work = vector_cost(_VE_OP[root.kind], elems, vector_width=arch.core.vector_width).cycles
        if out_t.nbytes(eb) < SEQUENTIAL_BYTES:
            par, splits = "sequential", 1
        else:
            par, splits = "elementwise", min(prof.n_cores, out_t.rows if root.op_class == OpClass.REDUCTION
                                             else prof.n_cores)
    return GroupPlan(id=f"g{index}", root=root.id, root_kind=root.kind.value, nodes=g.nodes, epilogue=g.epilogue,
                     extra_inputs=g.extra, parallel=par, splits=splits, cycles=work / splits)


def _dram_bytes(dag: Dag, eb: int, cons: dict[str, list[Node]], edges: list[EdgePlan]) -> tuple[int, int]:
    """Pass 4, DRAM bytes (unfused, fused): inputs/weights read by each consumer, intermediates per the plan (each
    written once and read by every consumer when unfused; the materialized ones and the edges' bytes when fused),
    graph outputs written once."""
    inputs_read = sum(dag.tensors[t].nbytes(eb) for n in dag.nodes for t in n.inputs if dag.tensors[t].is_input)
    inter = [t for t in dag.tensors.values() if not t.is_input]
    finals = [t for t in inter if not cons[t.name]]
    unfused = inputs_read + sum(t.nbytes(eb) * (1 + len(cons[t.name])) for t in inter if cons[t.name]) + \
        sum(t.nbytes(eb) for t in finals)
    materialized = {e.tensor for e in edges if e.decision == "materialize"}
    fused = inputs_read + sum(dag.tensors[t].nbytes(eb) for t in materialized) + \
        sum(e.bytes for e in edges) + sum(t.nbytes(eb) for t in finals)
    return unfused, fused


class GraphRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ops: list[FusedOpSpec] = Field(min_length=1, max_length=MAX_ITEMS)
    arch: ArchConfig = Field(default_factory=ArchConfig)


class GraphResponse(BaseModel):
    plans: list[GraphPlan]


def plan_graph(req: GraphRequest) -> GraphResponse:
    """The fusion plan of every op in order. A plan is a function of its op and the arch alone, so an op repeated
    in the request (a model's layers are) is planned once and its plan reused: a request of the same op thousands of
    times costs one plan, not thousands."""
    prof = FusionProfile.from_arch(req.arch)
    plans = []
    planned: dict[str, GraphPlan] = {}
    for i, spec in enumerate(req.ops):
        key = spec.model_dump_json()
        if key not in planned:
            try:
                planned[key] = fuse(expand(spec), prof, req.arch, spec.kind.value)
            except BadInput as exc:
                raise BadInput(exc.message, field=f"ops[{i}].{exc.field}" if exc.field else f"ops[{i}]") from None
        plans.append(planned[key])
    return GraphResponse(plans=plans)
