"""The calibrated default chip (configs/arch_8x8_32x32x8.yaml, Science II): every constant equals the unit
conversion of its published source, computed here from the source's own figures (docs/chip.md, "The reference chip
(45 nm)")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.thermal.hotspot_files import export_files
from services.thermal.power import compute_power_from_events
from shared.configs import ArchConfig, load_arch
from shared.contracts.events import ComputeEvents, MemoryEvents
from shared.energy import EnergyModel
from tests.conftest import CONFIGS

GB = 1 << 30
MIB = 1 << 20


@pytest.fixture(scope="module")
def arch() -> ArchConfig:
    return load_arch(CONFIGS / "arch_8x8_32x32x8.yaml")


def test_the_default_file_is_the_default_model(arch: ArchConfig) -> None:
    """One owner: a request that omits a field gets what the default config file says (dataflow aside: the file
    picks output-stationary for decode, the model keeps the seed's weight-stationary)."""
    assert arch.model_copy(update={"core": arch.core.model_copy(update={"dataflow": "ws"})}) == ArchConfig()


def test_die_area_and_dram_density(arch: ArchConfig) -> None:
    macro_mm2 = arch.geometry.macro_size_mm[0] * arch.geometry.macro_size_mm[1]  # the seed's 5 x 2 mm macro
    die_mm2 = arch.geometry.die_mm[0] * arch.geometry.die_mm[1]
    assert die_mm2 == pytest.approx(arch.mesh.n_cores * macro_mm2, rel=1e-3)  # 640 mm², square
    bx, by, dies = arch.dram.banks
    gbit_per_die = bx * by * arch.dram.bank_capacity_mb * MIB * 8 / GB
    assert gbit_per_die == pytest.approx(128.0)  # 16 GiB per die, 128 GiB per stack
    hbm3e_density = 24 / (11.0 * 11.0)  # a 24 Gb HBM3E die in the 11 x 11 mm HBM3 footprint (JESD238A), Gb/mm²
    assert gbit_per_die / die_mm2 == pytest.approx(hbm3e_density, rel=0.02)
    assert arch.dram.bank_capacity_mb * MIB * 8 == 8 * GB // 16  # a DDR4 8 Gb die's bank: 512 Mb (16 banks)
    assert dies == 8
    # a vault (the banks above one core) holds 2 x 2 x 8 banks = 2 GiB: one Mixtral expert (336 MiB) fits in 6 banks
    assert (bx // arch.mesh.cores[0]) * (by // arch.mesh.cores[1]) * dies * arch.dram.bank_capacity_mb == 2048


def test_vault_bandwidth_is_one_hbm3_channel(arch: ArchConfig) -> None:
    assert arch.dram.vault_bw_gbps == pytest.approx(64 * 6.4 / 8)  # 64-bit channel at 6.4 Gb/s per pin (JESD238)


def test_cooling_is_hotspots_default_air_sink(arch: ArchConfig) -> None:
    cfg = export_files(arch, [1.0] * arch.mesh.n_cores)["hotspot.config"]
    r_convec = float(cfg.split("-r_convec")[1].split()[0])
    assert r_convec == pytest.approx(0.1, rel=1e-4)  # HotSpot 7 temperature.c default_thermal_config
    cool = arch.geometry.cooling
    assert (cool.sink.side_mm, cool.sink.thickness_mm, cool.spreader.side_mm, cool.spreader.thickness_mm) == \
        (60.0, 6.9, 30.0, 1.0)  # HotSpot 7 defaults s_sink, t_sink, s_spreader, t_spreader
    assert cool.ambient_c + 273.15 == pytest.approx(318.15)
    assert max(arch.geometry.die_mm) <= cool.spreader.side_mm  # the spreader covers the die
    tim = next(layer for layer in arch.geometry.stack if layer.kind == "tim")
    assert (tim.thickness_um, tim.k_wmk, tim.rho_c_jm3k) == (20.0, 4.0, 4.0e6)  # HotSpot 7 interface defaults
    liquid = load_arch(CONFIGS / "arch_liquid.yaml")
    assert 1.0 / (liquid.geometry.cooling.h_wmk2k * 0.06**2) == pytest.approx(0.0278, rel=1e-3)
    assert liquid.model_copy(update={"geometry": arch.geometry}) == arch  # nothing else differs


def test_energy_constants_convert_to_si(arch: ArchConfig) -> None:
    em = EnergyModel.from_arch(arch)
    assert em.mac_j == pytest.approx((1.1 + 0.4) * 1e-12)  # fp16 mult + add, Horowitz ISSCC 2014, 45 nm
    assert em.spm_j_per_access == pytest.approx(20e-12)  # 32 KB SRAM, 64-bit access (Horowitz)
    assert em.dram_j_per_byte == pytest.approx(3.9e-12 * 8)  # HBM2 3.9 pJ/bit
    pitch_mm = arch.geometry.die_mm[0] / arch.mesh.cores[0]
    assert arch.mesh.noc.pj_per_bit_hop == pytest.approx(20.74 / 256 + 0.1 * pitch_mm, abs=0.005)  # ISAAC + wire
    assert em.noc_j_per_byte_hop == pytest.approx(arch.mesh.noc.pj_per_bit_hop * 8e-12)
    # logic leakage: 1024 MACs idling at (0.08 / 4 + 0.0023) pJ/cycle at 2 GHz (Aladdin tables), W per core
    leak = arch.core.array[0] * arch.core.array[1] * (0.08 / 4 + 0.0023) * 1e-12 * 2e9
    assert arch.power.logic_leak_w_per_core == pytest.approx(leak, rel=0.15)
    # DRAM standby: DDR4 8 Gb IDD2N 30 mA x VDD 1.2 V over 16 banks
    assert arch.dram.leak_w_per_bank == pytest.approx(0.030 * 1.2 / 16)


def test_refresh_constants(arch: ArchConfig) -> None:
    r = arch.refresh
    assert (r.tref_base_us, r.trfc_ns) == (7.8, 350.0)  # JEDEC DDR4 8 Gb: tREFI 7.8 us, tRFC1 350 ns
    # 5 nJ per bank per REF = (IDD5B - IDD3N) 0.2 A x 1.2 V x 350 ns over a DDR4 8 Gb die's 16 banks
    assert r.refresh_energy_nj == pytest.approx(0.2 * 1.2 * 350e-9 / 16 * 1e9, rel=0.05)
    # at <= 85 °C every bank refreshes once per tREFI: the chip's refresh power is banks x E / tREFI
    n_banks = math.prod(arch.dram.banks)
    empty_c = ComputeEvents.from_columns({k: [] for k in ComputeEvents.model_fields})
    empty_m = MemoryEvents.from_columns({k: [] for k in MemoryEvents.model_fields})
    p = compute_power_from_events(empty_c, empty_m, arch, core_temp_c=np.full(64, 60.0),
                                  bank_temp_c=np.full((8, 256), 60.0), freq_ghz=np.full(64, 2.0), window_s=1e-3)
    assert p.breakdown.dram_refresh == pytest.approx(n_banks * 5e-9 / 7.8e-6)
    hot = compute_power_from_events(empty_c, empty_m, arch, core_temp_c=np.full(64, 60.0),
                                    bank_temp_c=np.full((8, 256), 90.0), freq_ghz=np.full(64, 2.0), window_s=1e-3)
    assert hot.breakdown.dram_refresh == pytest.approx(2 * p.breakdown.dram_refresh)  # 2x in (85, 95] °C
