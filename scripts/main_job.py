"""`make run`: the four scenarios of the default Mixtral experiment, embedded (scripts/run_all.py with the default
configs), writing ``results/mixtral/<scenario>/mixtral-8x7b.csv``."""

from __future__ import annotations

import sys

from scripts.run_all import main

if __name__ == "__main__":
    sys.exit(main(["--arch", "configs/arch_8x8_32x32x8.yaml", "--workload", "configs/workload_mixtral_8x7b.yaml",
                   "--tas", "configs/tas_params.yaml", "--out", "results/mixtral/", *sys.argv[1:]],
                  prog="make run"))
