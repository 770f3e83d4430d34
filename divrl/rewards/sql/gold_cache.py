"""A least-recently-used cache of gold results bounded by bytes, not entries."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

# share of the worker's memory cap the gold cache may use by default
CACHE_SHARE_OF_WORKER_MEMORY = 0.125
_FALLBACK_MB = 512  # when workers have no memory cap


def default_cache_bytes() -> int:
    """``DIVRL_SQL_GOLD_CACHE_MB`` if set, else 1/8 of the worker memory cap (512 MB if none)."""
    explicit = os.environ.get("DIVRL_SQL_GOLD_CACHE_MB")
    if explicit:
        return max(0, int(float(explicit) * 1024 * 1024))
    from divrl.rewards.pool import DEFAULT_WORKER_MEMORY_MB

    cap_mb = int(os.environ.get("DIVRL_REWARD_WORKER_MEMORY_MB", DEFAULT_WORKER_MEMORY_MB))
    mb = cap_mb * CACHE_SHARE_OF_WORKER_MEMORY if cap_mb > 0 else _FALLBACK_MB
    return int(mb * 1024 * 1024)


class ByteBoundedCache:
    """LRU map whose entries' declared sizes never sum above ``max_bytes``.

    An entry larger than ``max_bytes`` is not stored (it is recomputed when needed).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.total_bytes = 0
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Any, default: Any = None) -> Any:
        item = self._items.get(key)
        if item is None:
            return default
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: Any, value: Any, nbytes: int) -> bool:
        """Store ``value``; returns False when it is too large to keep."""
        if key in self._items:
            self.total_bytes -= self._items.pop(key)[1]
        if nbytes > self.max_bytes:
            return False
        while self._items and self.total_bytes + nbytes > self.max_bytes:
            self.total_bytes -= self._items.popitem(last=False)[1][1]
        self._items[key] = (value, nbytes)
        self.total_bytes += nbytes
        return True

    def clear(self) -> None:
        self._items.clear()
        self.total_bytes = 0
