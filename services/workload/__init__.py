"""The workload service."""
