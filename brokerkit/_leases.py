"""The lease scheduler, written once for backends that keep leases themselves.

A backend whose broker has no per-message lease (memory, Kafka, and a RabbitMQ or SQS
backend wherever it holds messages itself) keeps its items here. Each item is *ready*
(due now), *due later* (nacked with a delay), or *leased* (handed out, with a deadline
and a token); fifo_group items pass through a ``GroupGate``, so at most one item of a
group is leased or waiting out a nack delay, and a group's items come out in the order
they were added.

Tokens come from one sequence per process, so a receipt that outlived its lease never
matches the lease of anyone else (two books never hand out the same token).

The clock is the caller's: every method that depends on time takes ``now``. The book
does no I/O and never blocks; it is not thread-safe (use it from one event loop).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from brokerkit._errors import LeaseExpired
from brokerkit._fifo import GroupGate

K = TypeVar("K", bound=Hashable)

__all__ = ["LeaseBook", "Leased"]

_tokens = itertools.count(1)
"""One token sequence for every book in the process."""


class _Item:
    __slots__ = ("deadline", "fifo_group", "token")

    def __init__(self, fifo_group: str | None) -> None:
        self.fifo_group = fifo_group
        self.token = 0  # nonzero while leased
        self.deadline = 0.0


class Leased(Generic[K]):
    """What ``take`` hands out: the item's key and the token of this lease."""

    __slots__ = ("key", "token")

    def __init__(self, key: K, token: int) -> None:
        self.key = key
        self.token = token

    def __repr__(self) -> str:
        return f"Leased({self.key!r}, token={self.token})"


class LeaseBook(Generic[K]):
    """Ready, due-later and leased items of one consumer group's view of a queue.

    Invariants: an item is in exactly one of the three states; an item with a fifo_group
    is ready only when it is its group's head and the group is not taken; a stale token
    (lease ended, item settled or handed out again) is refused with LeaseExpired.
    """

    __slots__ = ("_gate", "_items", "_leases", "_order", "_ready")

    def __init__(self) -> None:
        self._items: dict[K, _Item] = {}
        self._ready: list[tuple[float, int, K]] = []  # (due, order, key), a heap
        self._leases: list[tuple[float, int, K]] = []  # (deadline, token, key), a heap
        self._gate: GroupGate[K] = GroupGate()
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def keys(self) -> Iterator[K]:
        return iter(self._items)

    def add(self, key: K, fifo_group: str | None, now: float) -> None:
        """A new item, ready at ``now`` (behind its group's earlier items)."""
        if key in self._items:
            raise KeyError(f"{key!r} is already in the book")
        self._items[key] = _Item(fifo_group)
        if fifo_group is None or self._gate.push(fifo_group, key):
            heapq.heappush(self._ready, (now, next(self._order), key))

    def take(self, max_items: int, now: float, lease: float) -> list[Leased[K]]:
        """Lease up to ``max_items`` due items for ``lease`` seconds, oldest due first.

        Leases that ended by ``now`` are reclaimed first (their items are due again).
        ``lease`` may be ``math.inf`` for items staged by the backend before the caller
        holds them; ``extend`` then starts the real lease.
        """
        self.reclaim(now)
        out: list[Leased[K]] = []
        ready, items, gate = self._ready, self._items, self._gate
        while ready and ready[0][0] <= now and len(out) < max_items:
            _, _, key = heapq.heappop(ready)
            item = items.get(key)
            if item is None or item.token:
                continue  # settled or already leased: a stale heap entry
            group = item.fifo_group
            if group is not None:
                if gate.is_busy(group) or gate.head(group) != key:
                    continue
                gate.take(group)
            item.token = token = next(_tokens)
            item.deadline = deadline = now + lease
            if deadline != math.inf:
                heapq.heappush(self._leases, (deadline, token, key))
            out.append(Leased(key, token))
        return out

    def reclaim(self, now: float) -> list[K]:
        """End the leases whose deadline passed: their items are due at once. Returns them."""
        leases, items = self._leases, self._items
        back: list[K] = []
        while leases and leases[0][0] <= now:
            _, token, key = heapq.heappop(leases)
            item = items.get(key)
            if item is None or item.token != token or item.deadline > now:
                continue  # settled, re-leased, or extended since
            self._unlease(key, item, now)
            back.append(key)
        return back

    def holds(self, key: K, token: int, now: float) -> bool:
        """True while ``token`` is the live lease of ``key``."""
        item = self._items.get(key)
        return item is not None and item.token == token and item.deadline >= now

    def _held(self, key: K, token: int, now: float) -> _Item:
        item = self._items.get(key)
        if item is None or item.token != token or item.deadline < now:
            raise LeaseExpired(f"the lease on {key!r} was lost")
        return item

    def settle(self, key: K, token: int, now: float) -> K | None:
        """Done with the item (ack, dead letter): it leaves the book; its group moves on.

        Returns the group's next item, which is ready now, if there is one.
        """
        item = self._held(key, token, now)
        return self.remove(key, item, now)

    def remove(self, key: K, item: _Item | None = None, now: float = 0.0) -> K | None:
        """Drop an item whatever its state (a settle, or the queue went away)."""
        item = item or self._items.get(key)
        if item is None:
            return None
        del self._items[key]
        group = item.fifo_group
        if group is None:
            return None
        if self._gate.head(group) != key:
            self._gate.discard(group, key)
            return None
        nxt = self._gate.done(group)
        if nxt is not None:
            heapq.heappush(self._ready, (now, next(self._order), nxt))
        return nxt

    def requeue(self, key: K, token: int, due: float, now: float) -> None:
        """Give the item back (nack): due again at ``due``, first of its group again.

        Its group stays held by it: nothing later of the group is due before it.
        """
        item = self._held(key, token, now)
        item.token = 0
        if item.fifo_group is not None:
            self._gate.give_back(item.fifo_group)
        heapq.heappush(self._ready, (due, next(self._order), key))

    def extend(self, key: K, token: int, deadline: float, now: float) -> None:
        """Move the lease's end to ``deadline``."""
        item = self._held(key, token, now)
        item.deadline = deadline
        heapq.heappush(self._leases, (deadline, token, key))

    def counts(self, now: float) -> tuple[int, int, int]:
        """``(ready, leased, delayed)``: due now (or waiting behind its group's head), under
        a live lease, or nacked with a delay not yet over. Costs one pass over the items."""
        due_later = {key for due, _, key in self._ready if due > now}
        leased = delayed = 0
        for key, item in self._items.items():
            if item.token and item.deadline >= now:
                leased += 1
            elif not item.token and key in due_later:
                delayed += 1
        return len(self._items) - leased - delayed, leased, delayed

    def next_wake(self) -> float | None:
        """The earliest time something becomes due (a ready item or a lease's end)."""
        times = [h[0][0] for h in (self._ready, self._leases) if h]
        return min(times) if times else None

    def _unlease(self, key: K, item: _Item, now: float) -> None:
        item.token = 0
        if item.fifo_group is not None:
            self._gate.give_back(item.fifo_group)
        heapq.heappush(self._ready, (now, next(self._order), key))
