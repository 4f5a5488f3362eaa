"""The placement service."""
