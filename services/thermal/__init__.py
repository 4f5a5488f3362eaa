"""The thermal service."""
