"""The HBM-on-logic chip (configs/arch_hbm_on_logic.yaml): every derived constant recomputed from its source's own
figures (docs/chip_hbm_on_logic.md tables them), so that the file and its derivation cannot drift apart.

The sources' figures are written here as the sources give them: Stillmaker & Baas's energy fits (Integration 2017,
as transcribed in UCLA NanoCAD's nodeScale), NVIDIA's H100 SXM5 figures (TDP, HBM3 bandwidth and capacity, and its
idle draw as public nvidia-smi logs read it), Micron's HBM3E 12-high part, JEDEC's HBM3 organisation and HBM3E cube
height, 3D-ICE's BEOL layer, HotSpot's package, Ramulator2's HBM3 refresh timings.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from scripts.full_load_steady import full_load
from services.cli import main
from services.thermal.power import compute_power_from_events
from shared.chip import vault_bw_raw_gbps
from shared.configs import ArchConfig, load_arch, load_tas
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.energy import KELVIN, T_LEAK_REF, EnergyModel, liao, spm_accesses
from tests.conftest import CONFIGS

PATH = CONFIGS / "arch_hbm_on_logic.yaml"
GIB = 1 << 30
MIB = 1 << 20

# Stillmaker & Baas 2017, energy E(V) = a V^2 + b V + c per node (HP: the high-performance PTM/ITRS models)
HP45 = (1.018, -0.3107, 0.1539)
HP32 = (0.8367, -0.4341, 0.1701)
HP7 = (0.1776, -0.09097, 0.02447)
N65 = (3.755, -4.398, 1.975)
V_ANCHOR = 0.9  # the 45 nm anchors' supply (Horowitz ISSCC 2014; energy_anchors.csv)
V_7NM = 0.7  # 7 nm nominal (PTM NMOS model)

# NVIDIA H100 SXM5 (Hopper whitepaper): SMs, dense BF16 FMA per SM per clock, dense BF16 TFLOPS, die, TDP, FP32 lanes,
# BF16 vector FMA TFLOPS at the 1.98 GHz boost
H100_SMS, H100_FMA_PER_SM, H100_BF16_TFLOPS = 132, 2048, 989.4
H100_DIE_MM2, H100_TDP_W = 814.0, 700.0
H100_FP32_LANES, H100_BF16_VFMA_TFLOPS, H100_BOOST_GHZ = 16896, 133.8, 1.98
# H100 SXM5's HBM3 (datasheet): 3.35 TB/s, 80 GB (five 16 GB stacks, 80 GiB of DRAM); priced at the config's 3.9 pJ/bit
H100_HBM_TBPS, H100_HBM_GIB = 3.35, 80
# H100 SXM5 idle (P0, no process, 0-4 MiB used): eight nvidia-smi logs posted in public GitHub repositories, W and degC
H100_IDLE_W = (69, 72, 71, 70, 75, 69, 70, 71)
H100_IDLE_C = (32, 33, 25, 34, 25, 29, 26, 36)

# HBM3E 12-high (Micron: 36 GB of twelve 24 Gb dies, > 9.2 Gb/s per pin, > 1.2 TB/s); JESD238: 16 channels of 64 bits;
# four stacks (imec)
DIE_GBIT, DIES, PIN_GBPS, CHANNELS, STACKS = 24, 12, 9.2, 16, 4
TILES_PER_CHANNEL_DIE = 3  # the model's tile: a third of a channel's share of a die (512 Mb, the default chip's bank)
CUBE_HEIGHT_UM = 720.0  # JEDEC HBM height through HBM3E


def energy(coeffs: tuple[float, float, float], v: float) -> float:
    a, b, c = coeffs
    return a * v * v + b * v + c


F_E = energy(HP7, V_7NM) / energy(HP45, V_ANCHOR)  # 45 nm at the anchors' 0.9 V -> 7 nm at 0.7 V


@pytest.fixture(scope="module")
def arch() -> ArchConfig:
    return load_arch(PATH)


def test_the_scaling_rule_as_published() -> None:
    """The transcription of Stillmaker & Baas's table agrees with the authors' erratum (its example's two factors:
    HP32 at 0.9 V and 65 nm at 1.3 V), and the 45 -> 7 nm energy factor is 0.0684."""
    assert energy(HP32, 0.9) == pytest.approx(0.4571, abs=1e-4)
    assert energy(N65, 1.3) == pytest.approx(2.604, abs=1e-3)
    assert energy(HP7, V_7NM) / energy(HP45, V_ANCHOR) == pytest.approx(0.06842, rel=1e-4)


def test_it_loads_and_the_cli_validates_it(arch: ArchConfig) -> None:
    assert main(["config", "arch", str(PATH)]) == 0
    kinds = [layer.kind for layer in arch.geometry.expanded_stack()]
    assert kinds == ["logic", "other", "other", "other"] + ["other", "dram"] * DIES + ["tim"]
    assert arch.geometry.layer_names("dram") == tuple(f"dram_{i}" for i in range(1, DIES + 1))


def test_per_op_energies_are_the_45nm_anchors_scaled(arch: ArchConfig) -> None:
    """Scratchpad, vector op and NoC: the 45 nm anchors by F_E (the MAC and the leakage are H100's: below)."""
    p = arch.power
    assert p.spm_pj_per_access == pytest.approx(20.0 * F_E, rel=1e-3)  # 32 KB SRAM, 64-bit access
    assert p.vector_pj_per_op == pytest.approx(0.4 * F_E, rel=1e-3)  # fp16 add
    em = EnergyModel.from_arch(arch)
    assert em.mac_j == pytest.approx(p.mac_pj * 1e-12)
    # NoC: the ISAAC router (20.74 pJ per 256-bit flit, 32 nm) by the 32 -> 7 nm factor, plus 0.1 pJ/bit/mm of wire
    # (45 nm) by (0.7 / 0.9)^2 over one core pitch
    router = 20.74 / 256 * energy(HP7, V_7NM) / energy(HP32, 0.9)
    pitch_mm = arch.geometry.die_mm[0] / arch.mesh.cores[0]
    wire = 0.1 * (V_7NM / V_ANCHOR) ** 2 * pitch_mm
    assert arch.mesh.noc.pj_per_bit_hop == pytest.approx(router + wire, rel=2e-3)


def test_the_core_array_clock_and_leakage_are_h100s(arch: ArchConfig) -> None:
    rows, cols = arch.core.array
    assert rows * cols * arch.mesh.n_cores == H100_SMS * H100_FMA_PER_SM  # 4224 MACs per core, 64 cores
    top = arch.dvfs.domains[0].steps_ghz[0]
    assert top == pytest.approx(H100_BF16_TFLOPS * 1e12 / (2 * H100_SMS * H100_FMA_PER_SM) / 1e9, rel=1e-3)
    assert arch.dvfs.domains[0].steps_ghz == pytest.approx(tuple(top * r for r in (1.0, 0.9, 0.8, 0.6)))  # seed ratios
    assert (arch.dvfs.domains[0].trip_c, arch.dvfs.domains[0].hysteresis_c) == ((80, 85, 90), 3.0)  # seed 001 §2.1
    assert arch.core.vector_width == H100_FP32_LANES * 2 // arch.mesh.n_cores
    vfma_flops = H100_FP32_LANES * 2 * 2 * H100_BOOST_GHZ * 1e9  # BF16 pairs, FMA = 2 FLOPs
    assert vfma_flops == pytest.approx(H100_BF16_VFMA_TFLOPS * 1e12, rel=1e-3)
    die_mm2 = arch.geometry.die_mm[0] * arch.geometry.die_mm[1]
    assert die_mm2 == pytest.approx(H100_DIE_MM2, rel=1e-3)
    assert arch.geometry.macro_size_mm[0] * arch.geometry.macro_size_mm[1] * arch.mesh.n_cores == \
        pytest.approx(die_mm2, rel=1e-3)


def h100_hbm_w(arch: ArchConfig) -> tuple[float, float]:
    """(W in H100 SXM5's HBM3 devices at full bandwidth, W of their controllers on the GPU die): the config's pJ/bit
    split by its dram.energy_split, plus standby and refresh of 80 GiB of 512 Mb tiles at the config's prices (45 degC,
    normal refresh)."""
    access = H100_HBM_TBPS * 1e12 * 8 * arch.dram.pj_per_bit * 1e-12
    ctrl = access * arch.dram.energy_split.controller
    tiles = H100_HBM_GIB * GIB // (arch.dram.bank_capacity_mb * MIB)
    static = tiles * (arch.dram.leak_w_per_bank + arch.refresh.refresh_energy_nj * 1e-9 / (arch.refresh.tref_base_us
                                                                                            * 1e-6))
    return access - ctrl + static, ctrl


def h100_static_w(arch: ArchConfig) -> float:
    """The GPU die's static power at 45 degC: the idle logs' median less the HBM3's standby and refresh, scaled from
    the logs' median temperature to 45 degC by the config's leakage fit (Liao, at V0)."""
    hbm_static = h100_hbm_w(arch)[0] - H100_HBM_TBPS * 1e12 * 8 * arch.dram.pj_per_bit * 1e-12 * (
        1 - arch.dram.energy_split.controller)
    idle_c = float(np.median(H100_IDLE_C))
    scale = float(liao(np.array(T_LEAK_REF), arch.power.v0) / liao(np.array(idle_c + KELVIN), arch.power.v0))
    return (float(np.median(H100_IDLE_W)) - hbm_static) * scale


def test_the_logic_leakage_is_h100s_idle_draw(arch: ArchConfig) -> None:
    """logic_leak_w_per_core: H100 SXM5's idle draw (median 70.5 W at 30.5 degC) less its HBM3's standby and refresh,
    at 45 degC, over the 64 cores; 100 x the node-scaled MAC-array leakage it replaces."""
    assert float(np.median(H100_IDLE_W)) == 70.5 and float(np.median(H100_IDLE_C)) == 30.5
    static = h100_static_w(arch)
    assert static == pytest.approx(75.32, abs=0.01)
    assert arch.power.logic_leak_w_per_core == pytest.approx(static / arch.mesh.n_cores, rel=1e-3)
    rows, cols = arch.core.array
    top = arch.dvfs.domains[0].steps_ghz[0]
    node_scaled = rows * cols * (0.08 / 4 + 0.0023) * F_E * 1e-12 * top * 1e9  # idle 16-bit MACs (Aladdin) by F_E
    assert node_scaled == pytest.approx(0.0118, rel=5e-3)
    assert arch.power.logic_leak_w_per_core / node_scaled > 99


def test_the_mac_energy_is_h100s_tdp_per_mac(arch: ArchConfig) -> None:
    """mac_pj, all-in: H100 SXM5's 700 W less its HBM3 devices at full bandwidth is the GPU die at full tensor load;
    less its static power and memory controllers, over 989.4 TFLOPS / 2, per MAC; less what the model prices per MAC
    besides mac_pj (the scratchpad at this array's dataflow and the DMA of 3.35 TB/s). The rest above the scaled fp16
    MAC is the instruction overhead: ~9 x the MAC."""
    hbm_dev, ctrl = h100_hbm_w(arch)
    assert hbm_dev == pytest.approx(98.59, abs=0.01)
    assert ctrl == pytest.approx(10.45, abs=0.01)
    die = H100_TDP_W - hbm_dev
    assert die == pytest.approx(601.41, abs=0.01)
    mac_rate = H100_BF16_TFLOPS * 1e12 / 2
    all_in = (die - h100_static_w(arch) - ctrl) / mac_rate * 1e12
    assert all_in == pytest.approx(1.0423, abs=1e-4)
    rows, cols = arch.core.array
    elem = 2  # bf16
    acc = spm_accesses(np.array([mac_rate]), np.array([H100_HBM_TBPS * 1e12]), rows, cols, elem)[0] / mac_rate
    priced = acc * arch.power.spm_pj_per_access
    assert priced == pytest.approx(0.02122 + 0.00232, abs=2e-5)  # operands + DMA
    assert arch.power.mac_pj == pytest.approx(all_in - priced, abs=1e-4)
    overhead = arch.power.mac_pj - (1.1 + 0.4) * F_E  # the fp16 mult + add (Horowitz 2014) by F_E
    assert overhead == pytest.approx(0.9161, abs=1e-4)
    assert overhead / ((1.1 + 0.4) * F_E) == pytest.approx(8.93, abs=0.01)
    em = EnergyModel.from_arch(arch)
    assert em.mac_j == pytest.approx(arch.power.mac_pj * 1e-12)  # one owner: every event's MACs at mac_pj


def test_taps_capacity_is_this_chips_core() -> None:
    """configs/tas_params_hbm_on_logic.yaml: the default TAS parameters with TAPS's per-core capacity at this chip's
    core peak (2 x 4224 MACs x 1.83 GHz) and TACS's look-ahead on over its residency (min_residency_ms / window_ms
    windows: acting before DTM trips), nothing else changed."""
    arch = load_arch(PATH)
    tas = load_tas(CONFIGS / "tas_params_hbm_on_logic.yaml")
    default = load_tas(CONFIGS / "tas_params.yaml")
    rows, cols = arch.core.array
    peak = 2 * rows * cols * arch.dvfs.domains[0].steps_ghz[0] * 1e9
    assert tas.taps.capacity.core_flops_tps == pytest.approx(peak, rel=1e-3)
    assert tas.taps.capacity.core_flops_tps * arch.mesh.n_cores == pytest.approx(H100_BF16_TFLOPS * 1e12, rel=1e-3)
    assert tas.tacs.lookahead_windows == round(tas.tacs.min_residency_ms / tas.tacs.window_ms)
    same = tas.model_copy(update={"taps": tas.taps.model_copy(update={"capacity": default.taps.capacity}),
                                  "tacs": tas.tacs.model_copy(update={"lookahead_windows": 0})})
    assert same == default


def test_the_dram_is_four_hbm3e_12_high_stacks(arch: ArchConfig) -> None:
    d = arch.dram
    bx, by, dies = d.banks
    assert dies == DIES
    assert arch.mesh.n_cores == STACKS * CHANNELS  # one channel per core
    assert d.vault_bw_gbps == pytest.approx(64 * PIN_GBPS / 8)  # one 64-bit channel
    assert CHANNELS * d.vault_bw_gbps / 1e3 == pytest.approx(1.2, rel=0.02)  # Micron's "> 1.2 TB/s" per stack
    assert d.bank_capacity_mb * MIB * 8 == DIE_GBIT * GIB // (CHANNELS * TILES_PER_CHANNEL_DIE)
    assert d.bank_capacity_mb == load_arch(CONFIGS / "arch_8x8_32x32x8.yaml").dram.bank_capacity_mb
    assert bx * by * d.bank_capacity_mb * MIB * 8 == STACKS * DIE_GBIT * GIB  # one layer = one die of each stack
    vault_banks = (bx // arch.mesh.cores[0]) * (by // arch.mesh.cores[1]) * dies
    assert vault_banks * d.bank_capacity_mb * MIB == 36 * GIB // CHANNELS  # a vault = one channel of a 36 GB stack
    assert d.pj_per_bit == 3.9  # HBM3E (Samsung)
    assert d.leak_w_per_bank == pytest.approx(0.030 * 1.2 / 16)  # DDR4 8 Gb IDD2N over its 16 banks of 512 Mb


def test_the_stack_fits_an_hbm3e_cube_with_3d_ice_faces(arch: ArchConfig) -> None:
    layers = {layer.name: layer for layer in arch.geometry.expanded_stack()}
    faces = [layers["base_face"]] + [layers[f"face_{i}"] for i in range(1, DIES + 1)]
    silicon = [layers["base"]] + [layers[f"dram_{i}"] for i in range(1, DIES + 1)]
    assert sum(x.thickness_um for x in faces + silicon) == pytest.approx(CUBE_HEIGHT_UM, rel=1e-3)
    for face in faces:  # 3D-ICE's BEOL: 2.25e-6 W/(um K), 2.175e-12 J/(um^3 K), 10 um
        assert face.thickness_um == 10.0
        assert face.k_wmk == pytest.approx(2.25e-6 * 1e6)
        assert face.rho_c_jm3k == pytest.approx(2.175e-12 * 1e18)
    for die in silicon:  # 3D-ICE's SILICON: 1.30e-4 W/(um K), 1.628e-12 J/(um^3 K)
        assert die.k_wmk == pytest.approx(1.30e-4 * 1e6)
        assert die.rho_c_jm3k == pytest.approx(1.628e-12 * 1e18)
    face_r = faces[0].thickness_um * 1e-6 / faces[0].k_wmk
    assert 2e-3 * face_r > 1 / 150e6  # the bonded SiOx-SiOx interface (TDTR: >= 150 MW/(m^2 K)) is not a layer
    ubump = layers["ubump"]  # CoMeT's die-to-die layer: 20 um at 0.25 m K/W
    assert (ubump.thickness_um, 1 / ubump.k_wmk, ubump.rho_c_jm3k) == (20.0, 0.25, 4.0e6)


def test_cooling_is_a_cold_plate_on_top(arch: ArchConfig) -> None:
    cool = arch.geometry.cooling
    assert 1.0 / (cool.h_wmk2k * (cool.sink.side_mm * 1e-3) ** 2) == pytest.approx(0.0278, rel=1e-3)
    assert max(arch.geometry.die_mm) <= cool.spreader.side_mm  # HotSpot's 30 mm spreader covers the die
    assert arch.geometry.expanded_stack()[-1].kind == "tim"  # the sink sits on the DRAM stack


def test_refresh_is_hbm3s_with_jedecs_curve(arch: ArchConfig) -> None:
    r = arch.refresh
    assert (r.tref_base_us, r.trfc_ns) == (3.9, 450.0)  # Ramulator2 HBM3: nREFI 3900 at tCK 1 ns; tRFC(16 Gb)
    assert r.tref_curve == ((85.0, 1.0), (95.0, 2.0)) and r.tref_interp == "step"
    # the default chip's ~5 nJ per 512 Mb bank: (IDD5B - IDD3N) 0.2 A x 1.2 V x 350 ns over a DDR4 8 Gb die's 16 banks
    assert r.refresh_energy_nj == load_arch(CONFIGS / "arch_8x8_32x32x8.yaml").refresh.refresh_energy_nj
    assert r.refresh_energy_nj == pytest.approx(0.2 * 1.2 * 350e-9 / 16 * 1e9, rel=0.05)
    n_banks = math.prod(arch.dram.banks)
    n, (bx, by, dies) = arch.mesh.n_cores, arch.dram.banks
    empty_c = ComputeEvents.from_columns({k: [] for k in ComputeEvents.model_fields})
    empty_m = MemoryEvents.from_columns({k: [] for k in MemoryEvents.model_fields})

    def refresh_w(bank_c: float) -> float:
        p = compute_power_from_events(empty_c, empty_m, arch, core_temp_c=np.full(n, 60.0),
                                      bank_temp_c=np.full((dies, bx * by), bank_c), freq_ghz=np.full(n, 1.83),
                                      window_s=1e-3)
        return p.breakdown.dram_refresh

    assert refresh_w(60.0) == pytest.approx(n_banks * 5e-9 / 3.9e-6)
    assert refresh_w(90.0) == pytest.approx(2 * refresh_w(60.0))


def test_full_load_power_and_steady_peak_as_documented(arch: ArchConfig) -> None:
    """docs/chip_hbm_on_logic.md's numbers (scripts/full_load_steady.py): the configured cores at full MAC load and
    the DRAM at full bandwidth dissipate 893.0 W, 128 % of H100's 700 W TDP, and peak at 176.6 degC in steady state
    (no DVFS: the script holds the top step). With its leakage at 45 degC the logic die is H100's 601.4 W plus what
    this chip's wider memory adds (controllers and DMA of 4.71 TB/s against 3.35): the excess over the TDP is the
    leakage of a die at 177 degC and four HBM3E stacks at 4.71 TB/s. The peak is the thermal model's: a change of the
    model moves it (then re-run the script and update the docs)."""
    load = full_load(arch)
    b = load.power.breakdown
    assert load.logic_w == pytest.approx(743.9, abs=0.1)
    assert load.total_w == pytest.approx(893.0, abs=0.1)
    assert load.total_w / H100_TDP_W == pytest.approx(1.276, abs=1e-3)
    assert b.logic_dynamic == pytest.approx(504.0, abs=0.1)  # mac_pj, all-in
    assert b.logic_leakage == pytest.approx(213.1, abs=0.1)
    _, h100_ctrl = h100_hbm_w(arch)
    vault_tbps = vault_bw_raw_gbps(arch) / 1e3
    dma_w = 2 * (vault_tbps - H100_HBM_TBPS) * 1e12 / 8 * arch.power.spm_pj_per_access * 1e-12
    at_45c = load.logic_w - b.logic_leakage + h100_static_w(arch)
    assert at_45c - (b.dram_controller - h100_ctrl) - dma_w == pytest.approx(H100_TDP_W - h100_hbm_w(arch)[0],
                                                                             abs=0.05)
    logic = load.result.peak_c["logic"]
    assert logic == pytest.approx(176.56, abs=0.05)
    assert logic > arch.dvfs.domains[0].trip_c[-1]  # above the last trip: in a run, full load throttles
