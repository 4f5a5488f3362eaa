"""shared.lru.LRU: at most ``capacity`` entries, the least recently used evicted first (a get counts as a use)."""

from __future__ import annotations

import pytest

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


def test_keep_returns_the_first_copy_and_counts_as_a_use() -> None:
    c: LRU[str, list[int]] = LRU(2)
    first = [1]
    assert c.keep("a", first) is first
    assert c.keep("a", [2]) is first  # the first copy stays (an index may refer to it)
    c.put("b", [3])
    c.keep("a", [4])  # a use of "a": "b" is now the oldest
    c.put("c", [5])
    assert "b" not in c and "a" in c and c.get("a") is first
    assert c.pop("a") is first and c.pop("a") is None and len(c) == 1
    c.clear()
    assert len(c) == 0


def test_get_or_build_builds_once_per_key() -> None:
    c: LRU[str, int] = LRU(4)
    calls: list[str] = []

    def build(k: str) -> int:
        calls.append(k)
        return len(calls)

    assert c.get_or_build("x", lambda: build("x")) == 1
    assert c.get_or_build("x", lambda: build("x")) == 1
    assert c.get_or_build("y", lambda: build("y")) == 2
    assert calls == ["x", "y"]


def test_a_budget_evicts_the_oldest_while_over_and_keeps_the_newest() -> None:
    c: LRU[str, int] = LRU(over=lambda vs: sum(vs) > 10)  # e.g. the grid nodes of the thermal models kept
    c.put("a", 4)
    c.put("b", 5)
    assert len(c) == 2
    c.put("c", 3)  # 12 > 10: "a" goes
    assert "a" not in c and c.get("b") == 5 and c.get("c") == 3
    c.put("huge", 50)  # over on its own: everything older goes, the newest stays
    assert len(c) == 1 and c.get("huge") == 50
    with pytest.raises(ValueError):
        LRU(2, over=lambda vs: False)
    with pytest.raises(ValueError):
        LRU()
