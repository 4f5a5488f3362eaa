"""shared.lru.LRU: at most ``capacity`` entries, the least recently used evicted first (a get counts as a use)."""

from __future__ import annotations

from shared.lru import LRU


def test_the_least_recently_used_entry_goes_first() -> None:
    c: LRU[str, int] = LRU(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # "a" is now the most recent
    c.put("c", 3)
    assert c.get("b") is None and c.get("a") == 1 and c.get("c") == 3 and len(c) == 2
    c.put("a", 10)  # replacing a value keeps one entry
    assert c.get("a") == 10 and len(c) == 2
    assert LRU[str, int](0).capacity == 1
