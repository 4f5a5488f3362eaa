"""Runnable scripts: run_all / run_single (seed §9.4), the main job, benchmarks, the local cluster."""
