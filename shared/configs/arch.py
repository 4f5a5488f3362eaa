"""Architecture config: the 3D-stacked near-memory chip (seed 001 §2.1, extended with an explicit stack).

Units at this edge follow the key suffix (``_um``, ``_mm``, ``_wmk`` = W/(m·K), ``_jm3k`` = J/(m³·K), ``_c`` = °C,
``_ghz``, ``_pj``); code converts to SI inside.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import Field, model_validator

from shared.configs.base import StrictModel

Count = Annotated[int, Field(ge=1)]

# Upper bounds: what one request may ask the simulator to build, so that no config exceeds the memory and CPU of one
# service process (a request is validated before anything is allocated). The thermal grid holds
# grid_x · grid_y · (layers + 3) nodes; the default is 64·64·(10+3) = 53k; MAX_THERMAL_NODES is 20× that.
MAX_MESH_SIDE = 64  # cores per mesh side (64·64 = 4096 cores)
MAX_CORES = 1024
MAX_BANK_SIDE = 512  # banks per side of a DRAM die
MAX_DRAM_LAYERS = 32
MAX_STACK_LAYERS = 64  # after `count` expansion
MAX_GRID_SIDE = 512
MAX_THERMAL_NODES = 1 << 20
# TR-BDF2 sub-steps one request may take (a window / max_substep_ms, a transient solve, a HotSpot trace's lines x
# its sub-steps): ~0.1-1 ms each on the default grid, so a request stays under a minute or two
MAX_TRANSIENT_SUBSTEPS = 100_000
MeshSide = Annotated[int, Field(ge=1, le=MAX_MESH_SIDE)]
BankSide = Annotated[int, Field(ge=1, le=MAX_BANK_SIDE)]
Millimetres = Annotated[float, Field(ge=0.1, le=1e3)]
Celsius = Annotated[float, Field(ge=-273.15, le=1e4)]
Multiplier = Annotated[float, Field(ge=1e-3, le=1e3)]


class NocConfig(StrictModel):
    topology: Literal["mesh"] = "mesh"
    width_bits: int = Field(default=256, ge=1, le=65536)
    link_latency_ns: float = Field(default=5.0, ge=1e-3, le=1e6)
    link_freq_ghz: float = Field(default=1.0, ge=1e-3, le=1e3)  # link bandwidth = width_bits · link_freq (bits/s)
    # ISAAC router 0.081 pJ/bit + the wire of one hop at 0.1 pJ/bit/mm x the 3.16 mm core pitch (energy_anchors.csv)
    pj_per_bit_hop: float = Field(default=0.40, ge=0, le=1e3)


class MeshConfig(StrictModel):
    cores: tuple[MeshSide, MeshSide] = (8, 8)
    noc: NocConfig = NocConfig()

    @property
    def n_cores(self) -> int:
        return self.cores[0] * self.cores[1]


class DramEnergySplit(StrictModel):
    """Where a DRAM access's energy (``pj_per_bit``) is dissipated; the three fractions sum to 1.

    Source: O'Connor, Chatterjee et al., "Fine-Grained DRAM", MICRO-50 2017 (the paper the 3.9 pJ/bit HBM2 anchor
    cites), whose HBM2 breakdown puts most of the energy in row activation plus on-die data movement from the array to
    the die's I/O, and the rest in the I/O (TSVs and their drivers). We read it as array (activate + on-die movement)
    0.60, TSV/IO 0.30; the logic-die memory controller (not part of the DRAM device's pJ/bit in that paper) is given
    0.10. The reading is approximate (docs/chip.md, "Where the defaults depart from the seed (and why)"): change it
    here, never per scenario.
    """

    array: float = Field(default=0.60, ge=0, le=1)  # in the accessed bank
    tsv_io: float = Field(default=0.30, ge=0, le=1)  # the vault's TSV/IO column of the accessed die
    controller: float = Field(default=0.10, ge=0, le=1)  # the vault's controller on the logic die

    @model_validator(mode="after")
    def _sums_to_one(self) -> DramEnergySplit:
        total = self.array + self.tsv_io + self.controller
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"dram.energy_split fractions must sum to 1, got {total:g}")
        return self


class DramConfig(StrictModel):
    # x, y, layers: 16 x 16 banks of 512 Mb per 640 mm^2 die (0.2 Gb/mm^2, configs/arch_8x8_32x32x8.yaml)
    banks: tuple[BankSide, BankSide, Annotated[int, Field(ge=1, le=MAX_DRAM_LAYERS)]] = (16, 16, 8)
    page_kb: float = Field(default=8.0, ge=1e-3, le=1e4)
    bank_capacity_mb: float = Field(default=64.0, ge=1e-3, le=1e6)
    # raw bandwidth of one vault, GB/s: one HBM3 channel, 64 bit x 6.4 Gb/s
    vault_bw_gbps: float = Field(default=51.2, ge=1e-3, le=1e6)
    pj_per_bit: float = Field(default=3.9, ge=0, le=1e3)  # HBM2 3.9 pJ/bit (energy_anchors.csv, Accelergy/FGDRAM)
    # standby power per bank at 45 °C (scaled by the leakage model): DDR4 8 Gb IDD2N ~30 mA x 1.2 V / 16 banks
    leak_w_per_bank: float = Field(default=0.00225, ge=0, le=1e3)
    energy_split: DramEnergySplit = DramEnergySplit()

    @property
    def n_layers(self) -> int:
        return self.banks[2]


LayerKind = Literal["logic", "dram", "tim", "other"]


class StackLayer(StrictModel):
    """One die or interface layer. The stack lists layers from the one farthest from the heat sink to the nearest."""

    name: str
    kind: LayerKind
    # physical ranges: 0.1 µm .. 10 mm thick; k from aerogel-like 1e-3 to 1e4 W/(m·K) (above diamond, ~2200);
    # ρc from 1e3 to 1e8 J/(m³·K) (solids are ~1e6). Outside them the network's conductances under- or overflow.
    thickness_um: float = Field(ge=0.1, le=1e4)
    k_wmk: float = Field(ge=1e-3, le=1e4)
    rho_c_jm3k: float = Field(default=1.6303e6, ge=1e3, le=1e8)  # silicon-like default (HotSpot reference dies)
    count: int = Field(default=1, ge=1, le=MAX_STACK_LAYERS)  # repeat this layer `count` times (DRAM dies)


class PackagePart(StrictModel):
    side_mm: float = Field(ge=0.1, le=1e3)
    thickness_mm: float = Field(ge=1e-3, le=1e3)
    k_wmk: float = Field(default=400.0, ge=1e-3, le=1e4)  # copper
    rho_c_jm3k: float = Field(default=3.55e6, ge=1e3, le=1e8)


class CoolingConfig(StrictModel):
    type: Literal["air", "liquid"] = "air"
    # convection coefficient on the sink top, W/(m²·K): 0.1 (still air is ~5) to 1e7 (beyond two-phase cooling)
    # default: HotSpot 7's air-cooled package, r_convec 0.1 K/W over the 60 mm sink: h = 1/(0.1 · 0.06²)
    h_wmk2k: float = Field(default=2777.8, ge=0.1, le=1e7)
    ambient_c: float = Field(default=45.0, ge=-50, le=150)
    spreader: PackagePart = PackagePart(side_mm=30.0, thickness_mm=1.0)
    sink: PackagePart = PackagePart(side_mm=60.0, thickness_mm=6.9)


def _default_stack() -> tuple[StackLayer, ...]:
    return (
        StackLayer(name="logic", kind="logic", thickness_um=50, k_wmk=120),
        StackLayer(name="dram", kind="dram", thickness_um=50, k_wmk=130, count=8),
        StackLayer(name="tim", kind="tim", thickness_um=20, k_wmk=4.0, rho_c_jm3k=4.0e6),  # HotSpot 7 defaults
    )


class GeometryConfig(StrictModel):
    macro_size_mm: tuple[Millimetres, Millimetres] = (5.0, 2.0)  # seed default macro size (kept for reference)
    # 64 cores x the 10 mm² macro = 640 mm², square (fits HotSpot's 30 mm spreader)
    die_mm: tuple[Millimetres, Millimetres] = (25.3, 25.3)
    stack: tuple[StackLayer, ...] = Field(default_factory=_default_stack)
    cooling: CoolingConfig = CoolingConfig()

    def _unrolled(self) -> Iterator[tuple[str, StackLayer]]:
        """(name, layer) with `count` unrolled, farthest-from-sink first: a repeated layer's copies are named
        ``<name>_1`` ... ``<name>_n`` (DRAM dies: ``dram_1`` ...)."""
        for layer in self.stack:
            for i in range(layer.count):
                yield (layer.name if layer.count == 1 else f"{layer.name}_{i + 1}"), layer

    def expanded_stack(self) -> list[StackLayer]:
        """The stack with `count` unrolled, farthest-from-sink first; DRAM dies named ``dram_1`` ... ``dram_n``."""
        return [layer.model_copy(update={"name": name, "count": 1}) for name, layer in self._unrolled()]

    def layer_names(self, kind: LayerKind) -> tuple[str, ...]:
        """The names of the expanded stack's layers of ``kind`` (the thermal model's layer names: the keys of a
        snapshot's ``peak_c`` / ``mean_c``), whatever the config called them."""
        return tuple(name for name, layer in self._unrolled() if layer.kind == kind)


# a thermal state file named by thermal.init: a bare file name (no directory), resolved in the configs directory
InitFile = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.json$")]


class ThermalModelConfig(StrictModel):
    # >= 2: the network needs a border row and column on each side (thermal/network.py)
    grid: tuple[Annotated[int, Field(ge=2, le=MAX_GRID_SIDE)], Annotated[int, Field(ge=2, le=MAX_GRID_SIDE)]] = (64, 64)
    variant: Literal["physical", "hotspot"] = "physical"  # see services/thermal: named variants of one builder
    solver: Literal["auto", "spectral", "sparse"] = "auto"
    # window step: "exponential" is exact in time for the window's constant power up to the rational approximation
    # of exp of degree exp_degree (|error| <= 2.0e-6 x the distance to the window's steady state at 6; cost
    # exp_degree/2 complex solves whatever the window length); "trbdf2" is TR-BDF2 with ceil(window/max_substep_ms)
    # sub-steps (second order; 6e-4 x that distance at 0.25 ms). services/thermal/solvers.py
    integrator: Literal["exponential", "trbdf2"] = "exponential"
    # Where window 0 starts (Science II; services/thermal/README.md "Warm start"). "ambient": every node at
    # the ambient temperature. "steady" (default): the run's operating point. The stack's slowest modes (sink,
    # spreader) take seconds, so a sub-second run from ambient reports a cold-start transient, not the chip. With
    # warmup_ms > 0, a warm-up pass simulates the run's first warmup_ms (from the steady state of window 0's power
    # spread over each layer), and the run then starts over at window 0 from the steady state of the warm-up's MEAN
    # power map (per core and per bank, leakage at the warm-up's temperatures); the warm-up pass is not in the
    # results. With warmup_ms = 0: the steady state of window 0's layer-spread power. The warm-up should span several
    # arrival intervals of the workload: the default, 3 s, is 10 of the default workload's (300 ms).
    # "<name>.json": a thermal state file in the configs directory (a file NAME, never a path), e.g. the
    # thermal_final.json a run writes beside its run.log: the run starts from that field (same arch).
    init: Literal["ambient", "steady"] | InitFile = "steady"
    warmup_ms: float = Field(default=3000.0, ge=0, le=1e5)
    exp_degree: Literal[2, 4, 6, 8, 10, 12, 14] = 6
    max_substep_ms: float = Field(default=0.25, ge=1e-4, le=1e4)

    def warmup_windows(self, window_ms: float) -> int:
        """Windows of the warm-up pass: ``ceil(warmup_ms / window_ms)``; 0 unless ``init`` is "steady"."""
        if self.init != "steady" or self.warmup_ms <= 0:
            return 0
        return max(1, math.ceil(self.warmup_ms / window_ms - 1e-9))


class DvfsDomain(StrictModel):
    cores: Literal["all"] | tuple[int, ...] = "all"
    steps_ghz: tuple[Annotated[float, Field(ge=1e-3, le=1e3)], ...] = (2.0, 1.8, 1.6, 1.2)
    trip_c: tuple[float, ...] = (80.0, 85.0, 90.0)
    hysteresis_c: float = Field(default=3.0, ge=0, le=1e3)
    # per step; None -> V proportional to f, V0 = 1.0 at steps[0]
    volts: tuple[Annotated[float, Field(ge=1e-3, le=1e3)], ...] | None = None

    @model_validator(mode="after")
    def _check(self) -> DvfsDomain:
        if len(self.trip_c) != len(self.steps_ghz) - 1:
            raise ValueError("trip_c must have one entry fewer than steps_ghz")
        if list(self.steps_ghz) != sorted(self.steps_ghz, reverse=True):
            raise ValueError("steps_ghz must be in descending order")
        if list(self.trip_c) != sorted(self.trip_c):
            raise ValueError("trip_c must be in ascending order")
        if self.volts is not None and len(self.volts) != len(self.steps_ghz):
            raise ValueError("volts must have one entry per step")
        return self


class DvfsConfig(StrictModel):
    domains: tuple[DvfsDomain, ...] = Field(default=(DvfsDomain(),), min_length=1)  # at least one (every core's)


# Clock modulation duty cycles below the last DVFS step: halvings down to 1/16, the finest granularity of Intel's
# on-demand clock modulation (Intel SDM vol. 3B §14.7.3: duty cycle in 12.5 % steps, 6.25 % with the extension of
# §14.7.3.1) and the first halving NVIDIA's hardware slowdown applies ("reducing the core clocks by a factor of 2 or
# more", NVML nvmlClocksThrottleReasonHwSlowdown).
DEFAULT_DUTY: tuple[float, ...] = (0.5, 0.25, 0.125, 0.0625)


class DtmConfig(StrictModel):
    """Dynamic thermal management's hard limit (services/thermal/dtm.py): no cell of the stack, logic or DRAM, ever
    ends a window above ``limit_c``. After each window the thermal service bounds the next window's peak at the
    levels the DVFS trips chose, every core at its maximum power; while the bound exceeds the limit every core steps
    one level deeper, past the last DVFS step into clock modulation: ``duty[i]`` of the last step's clock at the last
    step's voltage (Intel's TCC clock modulation, NVIDIA's hardware slowdown). A section of its own rather than fields
    of ``dvfs``: the limit is a property of the stack (its hottest cell, DRAM included), the DVFS domains are per
    core, and the duty cycles apply below every domain's last step alike."""

    limit_c: Celsius
    duty: tuple[Annotated[float, Field(gt=0, lt=1)], ...] = Field(default=DEFAULT_DUTY, min_length=1, max_length=16)

    @model_validator(mode="after")
    def _check(self) -> DtmConfig:
        if list(self.duty) != sorted(set(self.duty), reverse=True):
            raise ValueError("dtm.duty must be strictly descending (each step deeper than the one before)")
        return self


class RefreshConfig(StrictModel):
    """DRAM refresh: ``tREFI(T) = tref_base_us / multiplier(T)``.

    Default: JEDEC (JESD79-4 DDR4, and JESD235 HBM likewise): tREFI = 7.8 µs up to 85 °C, halved (2× refresh) in the
    extended range (85, 95] °C: ``tref_curve = ((85, 1), (95, 2))`` read as a step (``tref_interp: step``: the
    multiplier of the first point at or above T; beyond the last point, the last one). The seed's curve (1× at 40 °C,
    2× at 55, 4× at 70, 8× at 85, interpolated linearly) is kept in configs/arch_seed.yaml.
    """

    tref_base_us: float = Field(default=7.8, ge=1e-3, le=1e6)  # JEDEC DDR4/HBM tREFI at <= 85 °C
    tref_curve: tuple[tuple[Celsius, Multiplier], ...] = ((85.0, 1.0), (95.0, 2.0))
    tref_interp: Literal["step", "linear"] = "step"
    trfc_ns: float = Field(default=350.0, ge=1e-3, le=1e6)  # DDR4 8Gb tRFC1 (energy_anchors.csv, Micron datasheet)
    # Energy of one refresh command in one bank: a DDR4 8Gb all-bank REF is ~(IDD5B-IDD3N)·VDD·tRFC
    # ≈ 0.2 A·1.2 V·350 ns ≈ 84 nJ for 16 banks of 512 Mb, ~5 nJ per bank (our banks are 512 Mb too).
    refresh_energy_nj: float = Field(default=5.0, ge=0, le=1e6)

    @model_validator(mode="after")
    def _check(self) -> RefreshConfig:
        temps = [t for t, _ in self.tref_curve]
        if not self.tref_curve:
            raise ValueError("tref_curve needs at least one (temperature, multiplier) point")
        if not all(math.isfinite(t) and math.isfinite(m) for t, m in self.tref_curve):
            raise ValueError("tref_curve temperatures and multipliers must be finite")
        if temps != sorted(temps):
            raise ValueError("tref_curve temperatures must be ascending")
        return self


class CoreConfig(StrictModel):
    """Device profile of one logic core: systolic array, scratchpad, DMA and vector unit."""

    array: tuple[Annotated[int, Field(ge=1, le=4096)], Annotated[int, Field(ge=1, le=4096)]] = (32, 32)
    dataflow: Literal["os", "ws"] = "ws"
    spm_kb: int = Field(default=512, ge=1, le=1 << 20)
    dma_bytes_per_cycle: int = Field(default=64, ge=1, le=1 << 20)
    dma_burst_bytes: int = Field(default=64, ge=1, le=1 << 20)
    vector_width: int = Field(default=64, ge=1, le=1 << 16)
    dtype: Literal["fp16", "bf16", "fp32", "int8"] = "bf16"


class PowerConfig(StrictModel):
    """Energy constants (defaults cite ../shared/reference/energy/energy_anchors.csv).

    ``mac_pj`` is the one energy every MAC is charged (lowering prices events with it, thermal reports it as
    ``logic_dynamic``, TAPS and TACS price work with it); the scratchpad accesses are priced apart. The default is the
    bare fp16 MAC; a config may fold into it what its accelerator spends per MAC beyond the array and the scratchpad
    (instruction issue, operand delivery, caches, clock tree), as configs/arch_hbm_on_logic.yaml does from H100's TDP.
    """

    mac_pj: float = Field(default=1.5, ge=0, le=1e6)  # fp16 mult 1.1 + add 0.4 pJ (Horowitz ISSCC 2014, 45 nm)
    # 512 KB as 16 banks of 32 KB: 64-bit access (Horowitz)
    spm_pj_per_access: float = Field(default=20.0, ge=0, le=1e6)
    vector_pj_per_op: float = Field(default=0.4, ge=0, le=1e6)  # fp16 add (Horowitz)
    v0: float = Field(default=1.0, ge=1e-3, le=1e3)
    logic_leak_w_per_core: float = Field(default=0.05, ge=0, le=1e3)  # at 45 °C
    leak_model: Literal["liao", "exp", "none"] = "liao"  # Liao-He-Lepak TCAD 2005 fit, or exp(beta·ΔT)
    leak_beta_per_k: float = Field(default=0.009, ge=0, le=1)  # ~0.9 %/K near 85 °C (energy_anchors.csv)


class ScheduleConfig(StrictModel):
    """How the physicalizer maps a micro-batch's work onto cores (services/lowering/physical/).

    ``attention``: where a micro-batch's non-expert ops (attention, router, shared/dense FFN, head) run: ``"all"`` =
    split over every core as a GEMM split over N (the seed's mapping); ``"group"`` = split over the
    ``group_cores`` consecutive cores of group ``mb_id mod (cores / group_cores)``, so that micro-batches in different
    groups overlap. ``max_open_mb``: admission limit: micro-batches in flight at once; a micro-batch arriving when
    this many are open is shed and counted in ``tokens_dropped`` (a server's bounded batch queue). ``None`` = one per
    attention group (1 for ``"all"``): with a micro-batch's non-expert work on every core of its group, a second
    micro-batch on the same group waits for the first one's stages on those cores, so it adds latency to both and no
    throughput (measured; docs/chip.md, "Where the defaults depart from the seed (and why)", admission).
    """

    attention: Literal["all", "group"] = "all"
    group_cores: int = Field(default=8, ge=1, le=MAX_CORES)
    max_open_mb: int | None = Field(default=None, ge=1, le=1 << 30)
    # Routed experts striped over ``expert_stripe`` consecutive cores (cores g·k .. g·k + k − 1 of group g): an
    # expert's weights spread over the group's vaults and its GEMMs split tensor-parallel over its cores, each
    # reading its own vault (placement policy ``stripe``; services/lowering/physical/assign.py). 1: every expert on
    # one core, its weights in one vault (the seed's mapping). Left out of the dump at 1, so that an arch without it
    # keeps its canonical JSON and content hash.
    expert_stripe: int = Field(default=1, ge=1, le=MAX_CORES, exclude_if=lambda v: v == 1)

    def open_limit(self, n_cores: int) -> int:
        if self.max_open_mb is not None:
            return self.max_open_mb
        return 1 if self.attention == "all" else n_cores // self.group_cores


class ArchConfig(StrictModel):
    mesh: MeshConfig = MeshConfig()
    dram: DramConfig = DramConfig()
    geometry: GeometryConfig = GeometryConfig()
    thermal: ThermalModelConfig = ThermalModelConfig()
    dvfs: DvfsConfig = DvfsConfig()
    # None: no hard limit (DVFS trips only). Left out of the dump when None, so that an arch without it has the
    # canonical JSON and the content hash it had before the section existed.
    dtm: DtmConfig | None = Field(default=None, exclude_if=lambda v: v is None)
    refresh: RefreshConfig = RefreshConfig()
    core: CoreConfig = CoreConfig()
    power: PowerConfig = PowerConfig()
    schedule: ScheduleConfig = ScheduleConfig()

    @model_validator(mode="after")
    def _check(self) -> ArchConfig:
        n_layers = sum(layer.count for layer in self.geometry.stack)  # before expanding anything
        if n_layers > MAX_STACK_LAYERS:
            raise ValueError(f"geometry.stack expands to {n_layers} layers; at most {MAX_STACK_LAYERS}")
        if self.mesh.n_cores > MAX_CORES:
            raise ValueError(f"mesh.cores gives {self.mesh.n_cores} cores; at most {MAX_CORES}")
        gx, gy = self.thermal.grid
        if gx * gy * (n_layers + 3) > MAX_THERMAL_NODES:
            raise ValueError(f"thermal.grid {gx}x{gy} over {n_layers} layers is {gx * gy * (n_layers + 3)} nodes; at "
                             f"most {MAX_THERMAL_NODES}")
        stack = self.geometry.expanded_stack()
        n_logic = sum(1 for layer in stack if layer.kind == "logic")
        n_dram = sum(1 for layer in stack if layer.kind == "dram")
        if n_logic != 1:
            raise ValueError(f"geometry.stack must contain exactly one logic layer, found {n_logic}")
        if n_dram != self.dram.banks[2]:
            raise ValueError(f"geometry.stack has {n_dram} DRAM layers but dram.banks[2] = {self.dram.banks[2]}")
        bx, by, _ = self.dram.banks
        cx, cy = self.mesh.cores
        if bx % cx or by % cy:
            raise ValueError(f"dram.banks {bx}x{by} must be a multiple of mesh.cores {cx}x{cy} (one vault per core)")
        n = self.mesh.n_cores
        if self.schedule.attention == "group" and n % self.schedule.group_cores:
            raise ValueError(f"schedule.group_cores = {self.schedule.group_cores} must divide the {n} cores")
        if n % self.schedule.expert_stripe:
            raise ValueError(f"schedule.expert_stripe = {self.schedule.expert_stripe} must divide the {n} cores")
        for d, dom in enumerate(self.dvfs.domains):
            if dom.cores != "all":
                bad = [c for c in dom.cores if not 0 <= c < n]
                if bad:
                    raise ValueError(f"dvfs.domains[{d}].cores: core {bad[0]} outside the mesh (0..{n - 1})")
        return self


def unthrottled(arch: ArchConfig) -> ArchConfig:
    """The same chip with nothing that slows it for heat: each DVFS domain held at its top step (no trips) and no
    DTM limit. Refresh still rises with temperature (it is the DRAM's own need, not a policy). The reference the
    throttling loss is measured against (scenario ``unthrottled``)."""
    domains = tuple(d.model_copy(update={"steps_ghz": d.steps_ghz[:1], "trip_c": (),
                                         "volts": d.volts[:1] if d.volts is not None else None})
                    for d in arch.dvfs.domains)
    return arch.model_copy(update={"dvfs": arch.dvfs.model_copy(update={"domains": domains}), "dtm": None})
