"""A thread-safe map that evicts the least recently used entries first: the in-process caches of content that can be
rebuilt (parsed files, built model configs, file hashes, registered run data, window states, thermal models and
solvers, pulse responses). One implementation; each cache says what it keeps and how many."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``capacity`` entries (at least 1); or, with ``over``, entries are evicted (oldest first) while
    ``over(values)`` holds, the newest always staying (a budget such as the grid nodes of the thermal models kept)."""

    def __init__(self, capacity: int | None = None, *, over: Callable[[Sequence[V]], bool] | None = None) -> None:
        if (capacity is None) == (over is None):
            raise ValueError("give capacity or over, exactly one")
        self.capacity = max(1, int(capacity)) if capacity is not None else None
        self._over = over
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key`` (replacing any), evicting the least recently used entries beyond the bound."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            self._evict()

    def keep(self, key: K, value: V) -> V:
        """The value already kept under ``key`` (now the most recently used), else ``value``, now kept: the first copy
        of an object stays (e.g. the one a cached index refers to)."""
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._items.move_to_end(key)
                return old
            self._items[key] = value
            self._evict()
            return value

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        """The value of ``key``, built by ``build()`` on a miss while this cache's lock is held: one build at a time
        (for values of GBs, which two concurrent builds must not both hold)."""
        with self._lock:
            value = self._items.get(key)
            if value is None:
                value = build()
                self._items[key] = value
            self._items.move_to_end(key)
            self._evict()
            return value

    def pop(self, key: K) -> V | None:
        """Forget ``key``; its value, or None."""
        with self._lock:
            return self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def _evict(self) -> None:  # with the lock held
        if self.capacity is not None:
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        else:
            assert self._over is not None
            while len(self._items) > 1 and self._over(list(self._items.values())):
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
