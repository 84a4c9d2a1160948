"""Deadlines: a receiver's lease ends and nack due times, in the order they fall due.

RabbitMQ has no lease of its own (its ``consumer_timeout`` closes a whole channel after
30 min), so the receiver returns an expired delivery itself and returns a nacked one at
its due time. Entries are never removed early: each carries the delivery's token, and
one whose delivery moved on (settled, re-leased, extended) is skipped when it surfaces.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from brokerkit.backends.rabbitmq._held import DELAYED, LEASED, Held

__all__ = ["Deadlines"]


class Deadlines:
    """Leases in hand-out order, extended leases and nack dues (each a heap)."""

    __slots__ = ("_dues", "_extended", "leases")

    def __init__(self) -> None:
        self.leases: deque[tuple[float, int, Held]] = deque()
        """(deadline, token, held) in hand-out order: deadlines never decrease (one
        ``ack_timeout``, a rising clock); appended to by the receiver's hand-out."""
        self._extended: list[tuple[float, int, Held]] = []
        self._dues: list[tuple[float, int, Held]] = []

    def clear(self) -> None:
        self.leases.clear()
        self._extended.clear()
        self._dues.clear()

    def extend(self, held: Held) -> None:
        """``held.deadline`` was moved later."""
        heapq.heappush(self._extended, (held.deadline, held.token, held))

    def due(self, when: float, held: Held) -> None:
        """``held`` (DELAYED) goes back to the broker at ``when``."""
        heapq.heappush(self._dues, (when, held.token, held))

    def next_due(self) -> float | None:
        return self._dues[0][0] if self._dues else None

    def expired(self, now: float) -> Iterator[Held]:
        """Each delivery still leased whose lease ran out by ``now`` (popped as it goes)."""
        leases, extended = self.leases, self._extended
        while leases:
            deadline, token, held = leases[0]
            if held.state == LEASED and held.token == token and deadline > now:
                break  # the oldest live lease has time left
            leases.popleft()  # settled, re-leased, extended or expired
            if held.state == LEASED and held.token == token and held.deadline <= now:
                yield held
        while extended and extended[0][0] <= now:
            _, token, held = heapq.heappop(extended)
            if held.state == LEASED and held.token == token and held.deadline <= now:
                yield held

    def fired(self, now: float, grace: float) -> Iterator[Held]:
        """Each nacked delivery due by ``now - grace`` (popped as it goes)."""
        dues = self._dues
        while dues and dues[0][0] + grace <= now:
            _, token, held = heapq.heappop(dues)
            if held.state == DELAYED and held.token == token:
                yield held
