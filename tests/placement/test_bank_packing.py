"""Weight shards packed into banks by bytes (a bank holds as many shards as fit) by every policy: the default mapping,
TAPS (heuristic and MILP), TACS's migrations. A fine-grained MoE that fits the chip by bytes is placed by each; one
that does not is a 422 naming ``expert_bytes``; where every shard fills a bank the placements are the branch
point's, byte for byte.

The fine-grained model is Qwen3-30B-A3B (its Hugging Face config.json inline, read by the workload service): 48 MoE
layers of 128 routed experts, 6,144 experts of 9 MiB (3 x 2048 x 768 bf16), 54 GiB, on the default chip's 128 GiB
(2,048 banks of 64 MiB). Counting one bank per shard it needed 6,192 banks (with one replica per layer); packed, a
bank holds seven of its shards. Thermal kernels are synthetic (`synthetic_diffusion_kernel`) unless stated."""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from services.placement.default import default_placement
from services.placement.geometry import MIB, ChipGeometry, synthetic_diffusion_kernel
from services.placement.inputs import WorkloadInputs, workload_inputs, zipf_loads
from services.placement.placer import build_placement
from services.placement.service import placement_for
from services.placement.shards import pack_banks, shard_sizes, vault_copies
from services.placement.tacs import tacs_step
from services.placement.taps import assemble, build_problem
from services.root_app import embedded
from shared.configs import ArchConfig, TasParams, WorkloadConfig
from shared.contracts.ids import parse_weight_tensor_id
from shared.contracts.placement import ExpertPlacement, Placement, ReplicaState, Telemetry, TensorPlacement
from shared.contracts.placement_api import PlacementRequest
from shared.errors import BadInput
from shared.settings import Settings
from tests.conftest import CONFIGS, FIXTURES
from tests.placement.conftest import small_arch
from tests.placement.tacs_helpers import window

# Qwen/Qwen3-30B-A3B's config.json on the Hugging Face Hub
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 48, "attention_bias": False,
    "attention_dropout": 0.0, "hidden_act": "silu", "torch_dtype": "bfloat16",
}
FINE_FLOPS = 2 * 3 * 2048 * 768  # FLOPs a token costs in one of its experts
MIXTRAL_FLOPS = 2 * 3 * 4096 * 14336
MIXTRAL_BYTES = 3 * 4096 * 14336 * 2  # 336 MiB: five 64 MiB shards and one of 16 MiB
BRANCH_POINT = FIXTURES / "placement" / "bank_packing_branch_point.json"


@pytest.fixture(scope="module")
def fine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkloadConfig, WorkloadInputs]]:
    """The fine-grained model's workload (decode, top-8 as its config says) and what the workload service says of
    it: MoE layers, expected loads, FLOPs per token, expert bytes."""
    wl = WorkloadConfig.model_validate({
        "model": {"name": "qwen3-30b-a3b", "config": QWEN3_30B_A3B}, "phase": "decode",
        "routing": {"seed": 42, "zipf_s": 1.2, "locality": 0.0, "topk": 8},
        "sequence": {"tokens": 2048, "micro_batch": 32, "steps": 4, "step_interval_ms": 300.0},
        "tensors": {"weight_shard_mb": 64}})
    tmp = tmp_path_factory.mktemp("fine")
    with embedded(Settings(results_dir=tmp / "results", configs_dir=CONFIGS)) as emb:
        yield wl, workload_inputs(wl, emb.clients)


def bank_bytes(plc: Placement) -> Counter[str]:
    """Bytes each bank holds: every shard's copies (its bank and its replicas')."""
    out: Counter[str] = Counter()
    for tp in plc.tensors.values():
        for bank in [tp.dram_bank, *(tp.replica_banks or [])]:
            out[bank] += int(tp.size_bytes or 0)
    return out


def check_packed(plc: Placement, arch: ArchConfig) -> Counter[str]:
    """No bank over ``bank_capacity_mb``, every shard copy in the vault of the core that reads it, nothing noted
    over capacity or spilled; the bytes per bank."""
    used = bank_bytes(plc)
    assert max(used.values()) <= arch.dram.bank_capacity_mb * MIB
    geom = ChipGeometry.of(arch)
    for tid, tp in plc.tensors.items():
        layer, e, _ = parse_weight_tensor_id(tid)
        cores = plc.experts[f"L{layer}E{e}"].cores
        assert [geom.bank_core_slot(b)[0] for b in [tp.dram_bank, *(tp.replica_banks or [])]] == cores
    assert not any("capacity" in n or "spilled" in n for n in plc.meta.notes), plc.meta.notes
    return used


def test_the_fine_grained_model_is_6144_experts_of_9_mib(fine: tuple[WorkloadConfig, WorkloadInputs],
                                                           arch: ArchConfig) -> None:
    _, inp = fine
    assert inp.expert_bytes == 9 * MIB and len(inp.moe_layers) == 48 and {len(r) for r in inp.loads} == {128}
    assert 6144 * inp.expert_bytes == 54 * 2**30
    geom = ChipGeometry.of(arch)
    assert geom.n_cores * geom.vault_banks == 2048 and arch.dram.bank_capacity_mb == 64
    assert pack_banks([9 * MIB], 6192, 64 * MIB) == math.ceil(6192 / 7)  # seven 9 MiB shards to a 64 MiB bank


def test_the_default_mapping_fills_a_bank_before_the_next(fine: tuple[WorkloadConfig, WorkloadInputs],
                                                          arch: ArchConfig) -> None:
    """Owner's vault, slot order, as many shards in a bank as fit: core c's experts (96 of them) in the first 14
    banks of its vault, seven to a bank."""
    wl, inp = fine
    plc = default_placement(arch, inp.moe_layers, 128, wl.tensors.weight_shard_mb, inp.expert_bytes)
    used = check_packed(plc, arch)
    geom = ChipGeometry.of(arch)
    assert len(used) == 64 * 14
    slots = {geom.bank_core_slot(b): n for b, n in used.items()}
    assert {s for _, s in slots} == set(range(14))
    assert all(n == (7 if s < 13 else 96 - 13 * 7) * 9 * MIB for (_, s), n in slots.items())
    in_order = [geom.bank_core_slot(tp.dram_bank) for tid, tp in plc.tensors.items()]  # experts in index order
    assert [s for c, s in in_order if c == 0][:15] == [0] * 7 + [1] * 7 + [2]


@pytest.mark.parametrize("method", ["heuristic", "milp"])
def test_taps_places_the_fine_grained_model(fine: tuple[WorkloadConfig, WorkloadInputs], arch: ArchConfig,
                                            tas: TasParams, kernel64: np.ndarray, method: str) -> None:
    """TAPS (the heuristic; the MILP with a small time limit, which hands a problem this size to the heuristic)
    places every expert, its shards in its core's vault within the banks' bytes, each vault's shards over all of
    its columns (the bank book's spread)."""
    wl, inp = fine
    taps = tas.taps.model_copy(update={"milp_time_limit_s": 2.0})
    plc = build_placement(arch, wl, taps, inp.loads, inp.expert_flops_per_token, kernel64,
                          moe_layers=inp.moe_layers, expert_bytes=inp.expert_bytes, method=method)
    assert plc.meta.method == ("heuristic" if method == "heuristic" else "milp-fallback-heuristic")
    assert len(plc.experts) == 6144 and len(plc.tensors) == 6144
    used = check_packed(plc, arch)
    geom = ChipGeometry.of(arch)
    L = geom.n_dram_layers
    per_vault: dict[int, set[int]] = {}
    for b in used:
        core, slot = geom.bank_core_slot(b)
        per_vault.setdefault(core, set()).add(slot // L)
    shards = Counter(geom.bank_core_slot(tp.dram_bank)[0] for tp in plc.tensors.values())
    assert all(per_vault[v] == set(range(geom.vault_banks // L)) for v, n in shards.items() if n >= 4)
    print(f"{method}: {len(used)} banks used, at most {max(used.values()) // (9 * MIB)} shards in one")


def test_the_milp_keeps_each_vault_within_the_copies_its_banks_hold(tas: TasParams) -> None:
    """A chip where the vault constraint binds and the MILP solves: 2 x 2 cores, vaults of four 32 MiB banks, 9 MiB
    experts (three to a bank: 12 to a vault, 48 on the chip), 40 of them (one bank per shard: 40 banks of 16)."""
    arch = small_arch(2, 2, (4, 4, 1), bank_mb=32.0)
    wl = WorkloadConfig.model_validate({"routing": {"topk": 2}})
    taps = tas.taps.model_copy(update={"replicate_hot_k": 0, "milp_time_limit_s": 20.0})
    H = synthetic_diffusion_kernel(2, 2)
    assert vault_copies([9 * MIB], 32 * MIB, 4) == 12
    plc = build_placement(arch, wl, taps, zipf_loads(1, 40), FINE_FLOPS, H, expert_bytes=9 * MIB, method="milp")
    assert plc.meta.method == "milp"
    per_core = Counter(c for ep in plc.experts.values() for c in ep.cores)
    assert sum(per_core.values()) == 40 and max(per_core.values()) <= 12
    check_packed(plc, arch)


def test_a_model_that_does_not_fit_is_a_422_naming_expert_bytes(arch: ArchConfig, tas: TasParams,
                                                                  kernel64: np.ndarray) -> None:
    """14,400 experts of 9 MiB are 126.6 GiB, under the chip's 128 GiB, but a shard is never split: seven to a
    bank, they need 2,058 banks of the 2,048. 14,700 are more bytes than the chip has. Both are refused, naming
    ``expert_bytes`` and the numbers; the default mapping (the baseline) keeps its owner's-vault rule and notes the
    banks it puts over capacity."""
    wl = WorkloadConfig.model_validate({"routing": {"topk": 8}})
    for n_e, why in ((144, "never split"), (147, "more than the chip's")):
        req = PlacementRequest(arch=arch, workload=wl, tas=tas, method="heuristic", expert_load=[[1.0] * n_e] * 100,
                               expert_flops_per_token=FINE_FLOPS, expert_bytes=9 * MIB, H=kernel64.tolist())
        with pytest.raises(BadInput) as e:
            placement_for(req)
        assert e.value.field == "expert_bytes" and why in e.value.message, e.value.message
        assert f"{100 * n_e} expert copies" in e.value.message and "the chip has 2048" in e.value.message
    plc = default_placement(arch, 100, 147, 64.0, 9 * MIB)
    assert any("banks hold more than bank_capacity_mb" in n for n in plc.meta.notes)


def test_replicas_that_do_not_fit_are_not_tried(tas: TasParams) -> None:
    """A model that fits the chip but not with a second copy of its hottest experts: placed without replicas
    (noted), not refused."""
    arch = small_arch(2, 2, (4, 4, 1), bank_mb=32.0)  # 48 copies of a 9 MiB expert
    wl = WorkloadConfig.model_validate({"routing": {"topk": 2}})
    taps = tas.taps.model_copy(update={"replicate_hot_k": 1})
    H = synthetic_diffusion_kernel(2, 2)
    plc = build_placement(arch, wl, taps, zipf_loads(2, 24), FINE_FLOPS, H, expert_bytes=9 * MIB)
    assert all(len(ep.cores) == 1 for ep in plc.experts.values())
    assert any("not tried, 50 expert copies do not fit the chip's 16 banks" in n for n in plc.meta.notes)
    check_packed(plc, arch)


def test_pack_banks_is_first_fit_decreasing() -> None:
    """`pack_banks` against first-fit decreasing shard by shard, on random shard sizes, copies and banks."""
    def ffd(items: list[int], cap: int) -> int:
        free: list[int] = []
        for z in sorted(items, reverse=True):
            i = next((k for k, f in enumerate(free) if f >= z), None)
            if i is None:
                free.append(cap - z)
            else:
                free[i] -= z
        return len(free)

    rng = random.Random(7)
    for _ in range(2000):
        cap = rng.choice([64, 48, 100])
        n, s = rng.randint(1, 5), rng.randint(1, cap)
        sizes = [s] * (n - 1) + [rng.randint(1, s)]
        q = rng.randint(0, 40)
        assert pack_banks(sizes, q, cap) == ffd(sizes * q, cap), (sizes, q, cap)
    assert pack_banks([65], 1, 64) == math.inf
    sizes = shard_sizes(MIXTRAL_BYTES, 64.0)
    assert sizes == [64 * MIB] * 5 + [16 * MIB]
    assert vault_copies(sizes, 64 * MIB, 32) == 6  # 30 whole banks and six 16 MiB remainders in two


def _sha(plc: Placement) -> str:
    return hashlib.sha256(json.dumps(plc.model_dump(mode="json", exclude_none=True), sort_keys=True).encode()
                          ).hexdigest()


def test_placements_where_shards_fill_their_banks_are_the_branch_points(arch: ArchConfig, mixtral: WorkloadConfig,
                                                                         tas: TasParams,
                                                                         kernel64: np.ndarray) -> None:
    """Byte for byte the placements of the branch point (their SHA-256 in the fixture): the default mapping of
    Mixtral-8x7B (its 64 MiB shards take a bank each, its 16 MiB remainders a bank each too: a vault holds four
    experts, 24 shards, in its 32 banks); TAPS where every shard fills a bank (experts of five 64 MiB shards);
    TAPS's bank book on Mixtral's experts for one assignment. (TAPS's own assignment of Mixtral changes: a vault
    now holds six of its experts, 30 whole banks and the six remainders packed in two, where counting a bank per
    shard it held five.)"""
    want = json.loads(Path(BRANCH_POINT).read_text())
    assert _sha(default_placement(arch, list(range(32)), 8, 64.0, MIXTRAL_BYTES)) == want["default_mixtral"]
    loads = zipf_loads(32, 8)
    plc = build_placement(arch, mixtral, tas.taps, loads, MIXTRAL_FLOPS, kernel64, expert_bytes=5 * 64 * MIB)
    assert _sha(plc) == want["taps_full_banks"]
    pb = build_problem(arch, mixtral, tas.taps, loads, MIXTRAL_FLOPS, kernel64, expert_bytes=float(MIXTRAL_BYTES))
    book = assemble(pb, np.arange(pb.m) % 64, arch=arch, expert_bytes=MIXTRAL_BYTES, weight_shard_mb=64.0,
                    bank_bw_gbps=tas.taps.capacity.bank_bw_gbps, method="heuristic")
    assert _sha(book) == want["taps_book_mixtral"]


def _crowded(arch: ArchConfig, free_mb: int) -> Placement:
    """Expert L0E0 (two 9 MiB shards) on core 6; every other vault full but for ``free_mb`` MiB in its last bank
    (an idle expert on each core holds the rest)."""
    geom = ChipGeometry.of(arch)
    experts = {"L0E0": ExpertPlacement(cores=[6])}
    tensors = {f"W_L0E0_{k}": TensorPlacement(dram_bank=geom.slot_bank_id(6, k), size_bytes=9 * MIB)
               for k in range(2)}
    for c in range(geom.n_cores):
        if c == 6:
            continue
        experts[f"L1E{c}"] = ExpertPlacement(cores=[c])
        for k in range(geom.vault_banks):
            size = (64 - (free_mb if k == geom.vault_banks - 1 else 0)) * MIB
            tensors[f"W_L1E{c}_{k}"] = TensorPlacement(dram_bank=geom.slot_bank_id(c, k), size_bytes=size)
    return Placement(experts=experts, tensors=tensors)


def test_tacs_packs_a_migrated_experts_shards_into_a_bank_with_room(tas: TasParams) -> None:
    """A hot core's expert, two 9 MiB shards; every other vault has one bank with room, 24 MiB: TACS moves the
    expert and writes both shards into that bank (free bytes, not free banks). Within one window a bank takes the
    bytes ``bank_bw_gbps`` writes in it: at 4 GB/s (12 MB in 3 ms) one shard, not two, so no move."""
    arch = small_arch(4, 4, (8, 8, 2))
    H = synthetic_diffusion_kernel(4, 4, self_kw=2.0, length=1.0, base_kw=0.05)
    plc = _crowded(arch, 24)
    hot = [60.0] * 16
    hot[6] = 81.0
    late = window(10, {"L0E0": 3.0})
    tele = Telemetry(temps_core=hot, util_core=[0.5] * 16)
    ov, state, _ = tacs_step(tele, plc, ReplicaState(), tas.tacs, arch, H, late, None, late.t0_ns)
    rows = [(oid, dst) for typ, oid, dst in zip(ov.migrate.obj_type, ov.migrate.obj_id, ov.migrate.dst,
                                                  strict=True) if typ == "weight"]
    assert [oid for oid, _ in rows] == ["W_L0E0_0", "W_L0E0_1"]
    assert rows[0][1] == rows[1][1] == state.experts["L0E0"].shard_banks[0]  # type: ignore[index]
    geom = ChipGeometry.of(arch)
    assert geom.bank_core_slot(rows[0][1])[1] == geom.vault_banks - 1
    ov, _, _ = tacs_step(tele, plc, ReplicaState(), tas.tacs, arch, H, late, None, late.t0_ns, bank_bw_gbps=4.0)
    assert ov.is_empty()
    ov, _, _ = tacs_step(tele, _crowded(arch, 16), ReplicaState(), tas.tacs, arch, H, late, None, late.t0_ns)
    assert ov.is_empty()  # 16 MiB free in each vault: one shard fits, not the expert
