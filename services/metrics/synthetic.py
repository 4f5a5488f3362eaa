"""Synthetic per-window metrics for tests, benchmarks and plot previews (NOT simulation results).

`synthetic_windows` draws a plausible run with a seeded ``numpy.random.default_rng``: an 8×8 (by default) core mesh
warming up from ambient towards a steady field with a hot spot, DRAM vault temperatures that fall off with distance
from the logic die, and token/bandwidth/NoC figures with noise. The four scenarios differ only in how strong and how
concentrated the hot spot is (baseline hottest, tas coolest), so plots show the expected ordering.
"""

from __future__ import annotations

import numpy as np

from shared.contracts.metrics import POLICIES, SCENARIOS, WindowMetrics
from shared.contracts.thermal import PowerBreakdown

# (hot-spot amplitude °C, hot-spot width in cores, throughput factor)
# share of the window's power by component (sums to 1), and the components dissipated on the logic die
_POWER_SPLIT = {"logic_dynamic": 0.12, "spm": 0.10, "logic_leakage": 0.14, "dram_dynamic": 0.38, "dram_refresh": 0.06,
                "dram_leakage": 0.15, "noc": 0.01, "dram_controller": 0.04}
_LOGIC_DIE = frozenset({"logic_dynamic", "spm", "logic_leakage", "noc", "dram_controller"})
_SCENARIO_SHAPE = {"baseline": (38.0, 1.2, 1.00), "taps": (30.0, 2.0, 0.98), "tacs": (31.0, 1.8, 0.97),
                   "tas": (26.0, 2.6, 0.96), "unthrottled": (40.0, 1.2, 1.05)}


def synthetic_windows(n_windows: int, scenario: str, *, seed: int = 0, mesh: tuple[int, int] = (8, 8),
                      dram_layers: int = 8, n_links: int = 112, dt_ms: float = 2.0, ambient_c: float = 45.0,
                      tokens_per_window: int = 64) -> list[WindowMetrics]:
    """``n_windows`` WindowMetrics of one scenario; same arguments give the same windows."""
    amp, width, speed = _SCENARIO_SHAPE[scenario]
    rng = np.random.default_rng([seed, SCENARIOS.index(scenario)])
    X, Y = mesh
    xs, ys = np.meshgrid(np.arange(X), np.arange(Y))  # row-major: core = y * X + x
    hx, hy = 0.3 * (X - 1), 0.35 * (Y - 1)
    d2 = ((xs - hx) ** 2 + (ys - hy) ** 2).ravel()
    steady = ambient_c + 8.0 + amp * np.exp(-d2 / (2 * width**2))  # (cores,)
    layer_drop = 1.5 * np.arange(dram_layers)  # °C cooler per DRAM die towards the sink
    out: list[WindowMetrics] = []
    for k in range(n_windows):
        rise = 1.0 - np.exp(-(k + 1) / 3.0)
        core = ambient_c + (steady - ambient_c) * rise + rng.normal(0.0, 0.3, steady.size)
        banks = (ambient_c + 0.8 * (core[:, None] - ambient_c) - layer_drop[None, :] * rise
                 + rng.normal(0.0, 0.2, (steady.size, dram_layers)))
        tokens = int(rng.integers(int(0.8 * tokens_per_window * speed), int(tokens_per_window * speed) + 1))
        lat = rng.gamma(4.0, 2.5 / speed, size=tokens)
        bw_eff = 4096.0 * (1.0 - 0.05 * rise)
        power_w = float(40.0 + 0.3 * (core.mean() - ambient_c) + rng.normal(0.0, 1.0))
        split = {c: f * power_w for c, f in _POWER_SPLIT.items()}  # fixed fractions: no draw from rng
        logic_w = sum(v for c, v in split.items() if c in _LOGIC_DIE)
        out.append(WindowMetrics(
            window=k,
            t_start_ms=k * dt_ms,
            dt_ms=dt_ms,
            temps_core_c=core.tolist(),
            temps_bank_c=banks.tolist(),
            T_peak_logic=float(core.max() + abs(rng.normal(0.0, 0.5))),
            T_peak_dram=float(banks.max() + abs(rng.normal(0.0, 0.3))),
            T_mean_logic=float(core.mean()),
            T_mean_dram=float(banks.mean()),
            power_w=power_w,
            power=PowerBreakdown(**split),
            power_layer_w={"logic": logic_w, **{f"dram_{i + 1}": (power_w - logic_w) / dram_layers
                                                 for i in range(dram_layers)}},
            freq_ghz=np.where(core > 85.0, 1.8, 2.0).tolist(),
            refresh_mhz=float(100.0 * (1.0 + (banks.mean() - ambient_c) / 20.0)),
            bytes_moved=float(bw_eff * 1e9 * dt_ms * 1e-3 * rng.uniform(0.3, 0.6)),
            bw_eff_gbps=bw_eff,
            noc_link_util=rng.uniform(0.05, 0.4 + (0.05 if scenario in {"tacs", "tas"} else 0.0), n_links).tolist(),
            tokens_completed=tokens,
            latencies_ms=lat.tolist(),
            queue_delay_ms=float(rng.uniform(0.0, 1.0)),
            migrations=int(rng.integers(0, 3)) if scenario in {"tacs", "tas"} else 0,
        ))
    return out


def synthetic_runs(n_windows: int, *, seed: int = 0, **kwargs: object) -> dict[str, list[WindowMetrics]]:
    """`synthetic_windows` for each of the four policies (the ``unthrottled`` reference: ask `synthetic_windows`)."""
    return {s: synthetic_windows(n_windows, s, seed=seed, **kwargs)  # type: ignore[arg-type]
            for s in POLICIES}
