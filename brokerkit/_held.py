"""The messages a consumer handed out that the caller has not settled (``max_in_flight``)."""

from __future__ import annotations

from sys import getrefcount
from typing import TypeVar

__all__ = ["Held"]

T = TypeVar("T")


def _counts(items: set[T]) -> list[tuple[int, T]]:
    return [(getrefcount(m), m) for m in items]


_HELD_ONLY = _counts({object()})[0][0]
"""What ``_counts`` reads for an item nothing but the set refers to, measured here rather
than assumed: interpreters differ in the references they borrow."""


class Held(set[T]):
    """A plain set on the hot path (add, discard, len); ``forget_dropped`` is read only
    while the bound is reached, so a message the caller dropped unsettled frees its slot
    without a weak reference per message."""

    __slots__ = ()

    def forget_dropped(self) -> None:
        """Forget the messages the caller dropped unsettled (only this set refers to them:
        CPython's reference count)."""
        self.difference_update([m for count, m in _counts(self) if count <= _HELD_ONLY])
