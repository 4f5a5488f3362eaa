"""Run one scenario of one workload embedded (seed 001 §14)::

    python scripts/run_single.py --scenario tas --out results/mixtral/
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in {None, ""}:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.run_all import main

if __name__ == "__main__":
    sys.exit(main(single=True, prog="run_single.py"))
