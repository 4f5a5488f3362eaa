"""The metrics service."""
