"""``Cache``: a bounded mapping, least recently used first out.

The client keeps two per mesh: the metadata of operations' results (the
fast path of ``Controller.cached``) and what ``propagate='cached'`` learned
of remote functions.  Their keys hold Python scalars, which a long job may
change at every step (a learning-rate schedule, a step counter): unbounded,
such a cache grows without end.  The bound is ``MONARCH_TENSOR_OP_CACHE_SIZE``.
Not thread-safe by itself: the controller's callers hold its lock, or race
only to fill an entry twice.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterator


class Cache:
    """At most ``size`` entries (0: none is kept); ``get`` makes an entry the most recently used."""

    __slots__ = ("size", "_d")

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"a cache of {size} entries: the size is a count, 0 or more")
        self.size = size
        self._d: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (now the most recently used), or ``default``."""
        d = self._d
        v = d.get(key, default)
        if v is not default:
            d.move_to_end(key)
        return v

    def __setitem__(self, key: Hashable, value: Any) -> None:
        d = self._d
        d[key] = value
        d.move_to_end(key)
        while len(d) > self.size:
            d.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self) -> Iterator[Hashable]:
        """The keys, least recently used first (a snapshot)."""
        return iter(list(self._d))

    def clear(self) -> None:
        self._d.clear()

    def __repr__(self) -> str:
        return f"<Cache {len(self._d)}/{self.size}>"
