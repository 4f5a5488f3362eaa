"""`freeze_heap` (window loop): long-lived objects leave the collector's generations, garbage is collected first."""

from __future__ import annotations

import gc

from services.orchestrator.window_loop import freeze_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_freeze_heap_collects_garbage_then_freezes_the_live_objects() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a reference cycle: only the collector can free it
    del a, b
    keep = [_Node() for _ in range(100)]
    try:
        freeze_heap()
        assert gc.get_freeze_count() >= len(keep)
        assert sum(type(o) is _Node for o in gc.get_objects()) == 0  # frozen: not in any generation
    finally:
        gc.unfreeze()
    assert sum(type(o) is _Node for o in gc.get_objects()) == len(keep)  # the cycle was collected, not frozen
