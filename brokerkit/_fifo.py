"""FIFO-group bookkeeping, written once for backends that emulate SQS-style groups."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class GroupGate(Generic[T]):
    """Each fifo_group's items in arrival order, and at most one of them out at a time.

    Invariant: an item is *eligible* only when it is the head of its group and
    the group is not taken. ``take`` marks the group busy; ``done`` pops the head
    (ack or dead-letter) and frees the group; ``give_back`` frees the group and
    keeps the head (nack, lease lost), so it is the next one out again.
    """

    __slots__ = ("_busy", "_groups")

    def __init__(self) -> None:
        self._groups: dict[str, deque[T]] = {}
        self._busy: set[str] = set()

    def push(self, group: str, item: T) -> bool:
        """Append ``item``; True when it became eligible at once."""
        items = self._groups.setdefault(group, deque())
        items.append(item)
        return len(items) == 1 and group not in self._busy

    def head(self, group: str) -> T | None:
        items = self._groups.get(group)
        return items[0] if items else None

    def is_busy(self, group: str) -> bool:
        return group in self._busy

    def take(self, group: str) -> T:
        """Mark the group busy and return its head (which must be eligible)."""
        if group in self._busy:
            raise RuntimeError(f"fifo group {group!r} is already taken")
        self._busy.add(group)
        return self._groups[group][0]

    def done(self, group: str) -> T | None:
        """Pop the head and free the group; return the next head, now eligible, if any."""
        self._busy.discard(group)
        items = self._groups.get(group)
        if items:
            items.popleft()
        if not items:
            self._groups.pop(group, None)
            return None
        return items[0]

    def give_back(self, group: str) -> T | None:
        """Free the group keeping its head; return the head, eligible again."""
        self._busy.discard(group)
        return self.head(group)

    def discard(self, group: str, item: T) -> None:
        """Forget a waiting item that is not the head (its queue went away)."""
        items = self._groups.get(group)
        if items is None:
            return
        try:
            items.remove(item)
        except ValueError:
            return
        if not items:
            self._groups.pop(group, None)

    def __len__(self) -> int:
        return sum(len(v) for v in self._groups.values())
