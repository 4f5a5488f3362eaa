"""``tasmoe hotspot ... --compare HOTSPOT_OUTPUT``: our solution of a HotSpot input set against HotSpot's own output
of the same inputs, block by block (K).

HotSpot's output is read by its shape: a block steady file (``<block>\\t<K>`` per line, ``-steady_file``) is compared
with our steady solution, every layer's blocks and the package nodes (``inode_*``); a transient trace (a header of
block names, then one line per sampling interval, ``-o``) with our transient of the same run (which needs ``-o``).
Our values are taken at full precision; HotSpot prints two decimals, so differences below 0.005 K are rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.thermal.hotspot import HotspotResult, steady_blocks
from services.thermal.hotspot_io import parse_temp_file, parse_ttrace
from shared.errors import BadInput


@dataclass(frozen=True)
class Comparison:
    source: str
    kind: str  # "steady" | "transient"
    blocks: tuple[str, ...]
    ours: np.ndarray  # (blocks,) K; for a transient, at the step where the block differs most
    theirs: np.ndarray
    steps: np.ndarray | None = None  # for a transient: that step (0-based) per block

    @property
    def diff(self) -> np.ndarray:
        out: np.ndarray = self.ours - self.theirs
        return out


def _is_ttrace(text: str) -> bool:
    for line in text.splitlines():
        tok = line.split()
        if tok and not tok[0].startswith("#"):
            if len(tok) != 2:
                return True
            try:
                float(tok[1])
            except ValueError:
                return True
            return False
    return False


def compare(res: HotspotResult, path: Path) -> Comparison:
    """Read HotSpot's output ``path`` and pair its blocks with ours (every block on both sides, or an error naming the
    first one missing)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInput(f"--compare {path}: {exc.strerror}", field="compare") from None
    source = str(path)
    if not text.strip():
        raise BadInput(f"--compare {path}: empty file", field="compare")
    if not _is_ttrace(text):
        theirs = parse_temp_file(text, source)
        ours = steady_blocks(res)
        for name in theirs:
            if name not in ours:
                raise BadInput(f"{source}: block {name} is not in our model of these inputs", field=name)
        for name in ours:
            if name not in theirs:
                raise BadInput(f"{source}: no temperature for block {name}", field=name)
        names = tuple(ours)
        return Comparison(source, "steady", names, np.array([ours[n] for n in names]),
                          np.array([theirs[n] for n in names]))
    if res.transient is None:
        raise BadInput(f"--compare {path}: a transient trace; run with -o to compare transients", field="compare")
    names, vals = parse_ttrace(text, source)
    index = {n: k for k, n in enumerate(res.trace_names)}
    for name in names:
        if name not in index:
            raise BadInput(f"{source}: block {name} is not in the power trace", field=name)
    if len(names) != len(index):
        missing = next(n for n in res.trace_names if n not in set(names))
        raise BadInput(f"{source}: no column for block {missing}", field=missing)
    if vals.shape[0] != res.transient.shape[0]:
        raise BadInput(f"{source}: {vals.shape[0]} steps, our run has {res.transient.shape[0]}", field="compare")
    ours_t = res.transient[:, [index[n] for n in names]]
    worst = np.argmax(np.abs(ours_t - vals), axis=0)
    cols = np.arange(len(names))
    return Comparison(source, "transient", tuple(names), ours_t[worst, cols], vals[worst, cols], worst)


def format_report(c: Comparison) -> str:
    """A summary line (worst block, max/mean/RMS of |ours − HotSpot|), then every block, worst first."""
    d = c.diff
    a = np.abs(d)
    order = np.argsort(-a, kind="stable")
    w = int(order[0])
    at = f" at step {int(c.steps[w])}" if c.steps is not None else ""
    lines = [
        f"compared with {c.source} ({c.kind}, {len(c.blocks)} blocks): worst {c.blocks[w]}{at}: ours "
        f"{c.ours[w]:.3f} K, HotSpot {c.theirs[w]:.3f} K, difference {d[w]:+.4f} K; |difference| max "
        f"{a.max():.4f} K, mean {a.mean():.4f} K, RMS {float(np.sqrt(np.mean(d * d))):.4f} K (HotSpot prints two "
        "decimals: 0.005 K is rounding)",
        "block\tours_K\thotspot_K\tdiff_K" + ("\tstep" if c.steps is not None else ""),
    ]
    for k in order:
        row = f"{c.blocks[k]}\t{c.ours[k]:.4f}\t{c.theirs[k]:.2f}\t{d[k]:+.4f}"
        lines.append(row + (f"\t{int(c.steps[k])}" if c.steps is not None else ""))
    return "\n".join(lines) + "\n"
