"""Buffers a check makes once and keeps for the next check of the same shape."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class KeptPool(Generic[T]):
    """Free buffers by key (a parameter count, a list of shapes): taken by a check and given
    back after, so two checks running at once never share one. At most ``keys`` keys and
    ``per_key`` buffers a key are kept; past that many keys the pool starts over."""

    def __init__(self, keys: int, per_key: int = 2) -> None:
        self.keys = keys
        self.per_key = per_key
        self._free: dict[Hashable, list[T]] = {}

    def take(self, key: Hashable) -> T | None:
        free = self._free.get(key)
        if free:
            try:
                return free.pop()
            except IndexError:  # another thread took it
                pass
        return None

    def give(self, key: Hashable, item: T) -> None:
        free = self._free.get(key)
        if free is None:
            if len(self._free) >= self.keys:
                self._free.clear()
            free = self._free.setdefault(key, [])
        if len(free) < self.per_key:
            free.append(item)
