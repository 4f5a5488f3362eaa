"""`make run`: the default experiment, embedded (``tasmoe run`` with no arguments: the hot chip serving the Azure
trace, the four policies and the unthrottled reference; ``services/orchestrator/default_experiment.py``), writing
``results/default/<scenario>/<workload>.csv``."""

from __future__ import annotations

import sys

from services.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
