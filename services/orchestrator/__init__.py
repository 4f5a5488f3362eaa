"""The orchestrator service."""
