"""TAS-MoE Lab shared package: wire contracts, settings, HTTP client, logging, errors and config models.

Nothing service-specific lives here; every service imports its schemas from this package.
"""

SERVICES: tuple[str, ...] = ("orchestrator", "workload", "placement", "lowering", "thermal", "metrics")
"""The six services, in port order (orchestrator 8000 ... metrics 8005)."""

DEFAULT_PORTS: dict[str, int] = {name: 8000 + i for i, name in enumerate(SERVICES)}

__version__ = "0.1.0"
