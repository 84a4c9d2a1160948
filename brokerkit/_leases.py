"""The lease scheduler, written once for backends that keep leases themselves.

A backend whose broker has no per-message lease (memory, Kafka, and a RabbitMQ or SQS
backend wherever it holds messages itself) keeps its items here. Each item is *ready*
(due now), *due later* (nacked with a delay), or *leased* (handed out, with a deadline
and a token); fifo_group items pass through a ``GroupGate``, so at most one item of a
group is leased or waiting out a nack delay, and a group's items come out in the order
they were added.

Tokens are unique in the process (each book draws its own block from one process-wide
sequence), so a receipt that outlived its lease never matches the lease of anyone else.
Within one ``take`` the tokens are consecutive, and one lease-heap entry per take names
the run of them: a settled item is forgotten at once, not when its old deadline passes,
and a batch costs one heap push, not one per item.

The clock is the caller's: every method that depends on time takes ``now``. The book
does no I/O and never blocks; it is not thread-safe (use it from one event loop).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

from brokerkit._errors import LeaseExpired
from brokerkit._fifo import GroupGate

K = TypeVar("K", bound=Hashable)

__all__ = ["LeaseBook", "Leased"]

_books = itertools.count(1)
"""One sequence for every book in the process: a book's tokens carry its number."""
_TOKEN_BITS = 40
"""A book hands out up to 2**40 tokens; its number sits above them."""


class _Item:
    __slots__ = ("deadline", "due", "fifo_group", "token")

    def __init__(self, fifo_group: str | None, due: float) -> None:
        self.fifo_group = fifo_group
        self.token = 0  # nonzero while leased
        self.deadline = 0.0
        self.due = due
        """Not to be handed out before this time while waiting (due later, or behind its
        group's head); 0.0 once in the ready FIFO."""


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

    __slots__ = ("_by_token", "_gate", "_items", "_later", "_leases", "_next", "_order", "_ready")

    def __init__(self) -> None:
        self._items: dict[K, _Item] = {}
        self._ready: deque[K] = deque()
        """Keys due now, in the order they became due (an entry is stale when its item
        is gone, leased, or due later again, ``due != 0``: ``take`` skips it). Whether an
        item is due never depends on the ``now`` of a take, so a caller's clocks may
        differ by a little between calls without losing an item."""
        self._later: list[tuple[float, int, K]] = []  # (due, order, key), a heap
        self._leases: list[tuple[float, int, int, int]] = []
        """(deadline, order, first token, end token), a heap: one entry per take (or extend)."""
        self._by_token: dict[int, K] = {}
        """The key of every live lease, by its token."""
        self._gate: GroupGate[K] = GroupGate()
        self._order = itertools.count()
        self._next = (next(_books) << _TOKEN_BITS) + 1

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def keys(self) -> Iterator[K]:
        return iter(self._items)

    def add(self, key: K, fifo_group: str | None, now: float, due: float | None = None) -> None:
        """A new item, ready at ``due`` (default ``now``), behind its group's earlier items."""
        if key in self._items:
            raise KeyError(f"{key!r} is already in the book")
        item = self._items[key] = _Item(fifo_group, now if due is None else due)
        if fifo_group is None or self._gate.push(fifo_group, key):
            self._schedule(key, item, now)

    def add_many(self, keys: Iterable[tuple[K, str | None]], now: float) -> None:
        """``add`` for each ``(key, fifo_group)``, all ready at ``now``: one call per batch."""
        items, ready, gate = self._items, self._ready, self._gate
        for key, group in keys:
            if key in items:
                raise KeyError(f"{key!r} is already in the book")
            item = items[key] = _Item(group, now)
            if group is None or gate.push(group, key):
                item.due = 0.0
                ready.append(key)

    def take(self, max_items: int, now: float, lease: float) -> list[Leased[K]]:
        """Lease up to ``max_items`` due items for ``lease`` seconds, oldest due first.

        Leases that ended by ``now`` are reclaimed first (their items are due again).
        ``lease`` may be ``math.inf`` for items staged by the backend before the caller
        holds them; ``extend_many`` then starts the real lease.
        """
        keys, first = self.take_keys(max_items, now, lease)
        return [Leased(key, token) for token, key in enumerate(keys, first)]

    def take_keys(self, max_items: int, now: float, lease: float) -> tuple[list[K], int]:
        """``take`` without a ``Leased`` per item, for a backend whose receipt is the token:
        the keys, and the first token (the i-th key's token is ``first + i``)."""
        if self._leases and self._leases[0][0] <= now:
            self.reclaim(now)
        later, ready = self._later, self._ready
        while later and later[0][0] <= now:
            due, _, key = heapq.heappop(later)
            waiting = self._items.get(key)
            if waiting is not None and waiting.due == due and not waiting.token:
                waiting.due = 0.0
                ready.append(key)
        first = token = self._next
        out: list[K] = []
        if not ready or max_items <= 0:
            return out, first
        items, gate, by_token = self._items, self._gate, self._by_token
        deadline = now + lease
        left = max_items
        popleft, append = ready.popleft, out.append
        while ready:
            key = popleft()
            item = items.get(key)
            if item is None or item.token or item.due:
                continue  # settled, already leased, or due later: a stale entry
            group = item.fifo_group
            if group is not None:
                if gate.is_busy(group) or gate.head(group) != key:
                    continue
                gate.take(group)
            item.token = token
            item.deadline = deadline
            by_token[token] = key
            append(key)
            token += 1
            left -= 1
            if not left:
                break
        self._next = token
        if token != first and deadline != math.inf:
            heapq.heappush(self._leases, (deadline, next(self._order), first, token))
        return out, first

    def reclaim(self, now: float) -> list[K]:
        """End the leases whose deadline passed: their items are due at once. Returns them."""
        leases, items, by_token = self._leases, self._items, self._by_token
        back: list[K] = []
        while leases and leases[0][0] <= now:
            _, _, first, end = heapq.heappop(leases)
            for token in range(first, end):
                key = by_token.get(token)
                if key is None:
                    continue  # settled or given back since
                item = items[key]
                if item.deadline > now:
                    continue  # extended: a later entry names it
                del by_token[token]
                self._unlease(key, item, now)
                back.append(key)
        return back

    # -- by lease: a ``Leased`` receipt (key + token), or the token alone --------------------

    def key_of(self, token: int) -> K | None:
        """The key ``token`` leases now (whether or not its deadline passed), or None."""
        return self._by_token.get(token)

    def holds(self, key: K, token: int, now: float) -> bool:
        """True while ``token`` is the live lease of ``key``."""
        item = self._items.get(key)
        return item is not None and item.token == token and item.deadline >= now

    def holds_token(self, token: int, now: float) -> bool:
        """True while ``token`` is a live lease."""
        key = self._by_token.get(token)
        return key is not None and self._items[key].deadline >= now

    def leased(self, key: K) -> bool:
        """True while ``key`` is leased (whether or not its deadline passed)."""
        item = self._items.get(key)
        return item is not None and item.token != 0

    def _held(self, token: int, now: float, key: object = None) -> tuple[K, _Item]:
        held = self._by_token.get(token)
        if held is not None and (key is None or held == key):
            item = self._items[held]
            if item.deadline >= now:
                return held, item
        what = f"token {token}" if key is None else repr(key)
        raise LeaseExpired(f"the lease on {what} was lost")

    def settle(self, key: K, token: int, now: float) -> K | None:
        """Done with the item (ack, dead letter): it leaves the book; its group moves on.

        Returns the group's next item, which is due now (or at its own due time), if any.
        """
        _, item = self._held(token, now, key)
        return self.remove(key, item, now)

    def settle_token(self, token: int, now: float) -> K:
        """``settle`` by the token alone; returns the settled key."""
        key, item = self._held(token, now)
        if item.fifo_group is None:  # remove(), inlined for the common case
            del self._by_token[token]
            del self._items[key]
        else:
            self.remove(key, item, now)
        return key

    def remove(self, key: K, item: _Item | None = None, now: float = 0.0) -> K | None:
        """Drop an item whatever its state (a settle, or the queue went away)."""
        item = item or self._items.get(key)
        if item is None:
            return None
        del self._items[key]
        if item.token:
            self._by_token.pop(item.token, None)
        group = item.fifo_group
        if group is None:
            return None
        gate = self._gate
        if gate.head(group) != key:
            gate.discard(group, key)
            return None
        nxt = gate.done(group)
        if nxt is not None:
            self._schedule(nxt, self._items[nxt], now)
        return nxt

    def requeue(self, key: K, token: int, due: float, now: float) -> None:
        """Give the item back (nack): due again at ``due``, first of its group again.

        Its group stays held by it: nothing later of the group is due before it.
        """
        self._held(token, now, key)
        self.requeue_token(token, due, now)

    def requeue_token(self, token: int, due: float, now: float) -> K:
        """``requeue`` by the token alone; returns the key."""
        key, item = self._held(token, now)
        del self._by_token[token]
        item.token = 0
        if item.fifo_group is not None:
            self._gate.give_back(item.fifo_group)
        item.due = due
        self._schedule(key, item, now)
        return key

    def extend(self, key: K, token: int, deadline: float, now: float) -> None:
        """Move the lease's end to ``deadline``."""
        self._held(token, now, key)
        self.extend_token(token, deadline, now)

    def extend_token(self, token: int, deadline: float, now: float) -> K:
        """``extend`` by the token alone; returns the key."""
        key, item = self._held(token, now)
        item.deadline = deadline
        heapq.heappush(self._leases, (deadline, next(self._order), token, token + 1))
        return key

    def extend_many(self, tokens: Iterable[int], deadline: float, now: float) -> list[int]:
        """``extend`` each lease still live to ``deadline`` (e.g. staged items handed over at
        last); returns those tokens, skipping the ones lost meanwhile. One heap entry per
        run of consecutive tokens."""
        items, by_token = self._items, self._by_token
        out: list[int] = []
        heap, order = self._leases, self._order
        first = end = 0
        for token in tokens:
            key = by_token.get(token)
            if key is None:
                continue
            item = items[key]
            if item.deadline < now:
                continue
            item.deadline = deadline
            out.append(token)
            if token != end:  # a gap: a new run
                if end:
                    heapq.heappush(heap, (deadline, next(order), first, end))
                first = token
            end = token + 1
        if end:
            heapq.heappush(heap, (deadline, next(order), first, end))
        return out

    def counts(self, now: float) -> tuple[int, int, int]:
        """``(ready, leased, delayed)``: due now (or waiting behind its group's head), under
        a live lease, or nacked with a delay not yet over. Costs one pass over the items."""
        leased = delayed = 0
        for item in self._items.values():
            if item.token and item.deadline >= now:
                leased += 1
            elif not item.token and item.due > now:
                delayed += 1
        return len(self._items) - leased - delayed, leased, delayed

    def next_wake(self) -> float | None:
        """The earliest time something becomes due (a ready item or a lease's end)."""
        if self._ready:
            return -math.inf
        times = [h[0][0] for h in (self._later, self._leases) if h]
        return min(times) if times else None

    def _schedule(self, key: K, item: _Item, now: float) -> None:
        """``key`` became eligible: ready now, or due later at its own time."""
        due = item.due
        if due <= now:
            item.due = 0.0  # in the ready FIFO
            self._ready.append(key)
        else:
            heapq.heappush(self._later, (due, next(self._order), key))

    def _unlease(self, key: K, item: _Item, now: float) -> None:
        item.token = 0
        if item.fifo_group is not None:
            self._gate.give_back(item.fifo_group)
        item.due = 0.0
        self._ready.append(key)
