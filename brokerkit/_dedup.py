"""An expiring memory of dedup ids, for backends that emulate deduplication in-process."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class DedupWindow:
    """Remembers ``key -> value`` for ``window`` seconds after it was first claimed.

    ``claim`` is check-and-set in one step, so (within one process and one
    event loop) concurrent publishers of the same key get one winner. ``clock`` gives the
    current time in the unit of ``window`` (``time.monotonic`` by default; Kafka passes
    the timestamp of the record being judged, in ms). An entry counts until ``window``
    after its claim, also when a clock that went back put a younger one before it.
    """

    __slots__ = ("_clock", "_entries", "window")

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, str]] = OrderedDict()

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            key, (expires, _) = next(iter(entries.items()))
            if expires > now:
                break
            del entries[key]

    def get(self, key: str) -> str | None:
        now = self._clock()
        self._expire(now)
        hit = self._entries.get(key)
        return hit[1] if hit is not None and hit[0] > now else None

    def claim(self, key: str, value: str) -> str | None:
        """Remember ``key`` unless known; return the earlier value for a known key, else None."""
        now = self._clock()
        self._expire(now)
        entries = self._entries
        hit = entries.get(key)
        if hit is not None:
            if hit[0] > now:
                return hit[1]
            # expired, but kept behind a younger entry (a clock that went back, e.g.
            # record timestamps from producers whose clocks differ): claimed anew
            entries.move_to_end(key)
        entries[key] = (now + self.window, value)
        return None

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._entries)
