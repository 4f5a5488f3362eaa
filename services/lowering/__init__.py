"""The lowering service."""
