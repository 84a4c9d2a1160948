"""A redelivered message's last attempt is handed out alone (issue 16), for ``Consumer``.

A message that comes back with ``attempt >= max_attempts`` (and not because this
consumer nacked it) may be the one that crashed its last consumers, and may crash
this one. Then no innocent neighbour must be pushed past ``max_attempts`` with it,
into the DLQ. Before its hand-out:

1. first-time messages fetched behind it go first (once: it must not wait out its lease);
2. what the caller holds is settled (never waiting past those leases);
3. what was fetched ahead is given back, where the receiver's ``release_uncounted``
   says that counts no attempt (elsewhere a release would count one: it stays);
4. the acks made so far get ``capabilities.ack_flush_interval`` to reach the broker;

and nothing more is fetched or handed out until it is settled or its lease ends.
Earlier attempts need none of this: a neighbour that lost an attempt (fetched ahead
by a crashed consumer, or its coalesced ack lost with it) still has attempts left,
and the last one is where it stops losing them. The cost falls on last attempts only.

This module reaches into the consumer's fetch buffer (``_batch``, ``_buffer``, ...):
it is the consumer's own policy, kept apart to keep ``_consumer.py`` small; it never
imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from brokerkit._errors import LeaseExpired
from brokerkit.backends.base import Delivery, Receiver

_now = time.monotonic
_REMEMBER = 10_000  # ids remembered (deferred, nacked here), then forgotten at once


class LastAttempt:
    """One consumer's state for the policy: the message held alone, if any."""

    __slots__ = ("_deferred", "_nacked", "_seen", "held", "last_settle", "pending")

    def __init__(self) -> None:
        self.held: Any = None  # the Message handed out alone, until settled
        self.pending: Delivery[Any] | None = None  # the delivery about to be handed out alone
        self.last_settle = 0.0
        self._deferred: set[str] = set()
        self._nacked: dict[str, int] = {}  # id -> attempt, of messages nacked here
        self._seen: asyncio.Event | None = None

    def nacked(self, message_id: str, attempt: int) -> None:
        if len(self._nacked) >= _REMEMBER:
            self._nacked.clear()
        self._nacked[message_id] = attempt

    def settled(self) -> None:
        self.last_settle = _now()
        if self._seen is not None:
            self._seen.set()

    def suspect(self, delivery: Delivery[Any], consumer: Any) -> bool:
        """True if ``delivery`` is a last attempt that must be handed out alone."""
        if not 1 < delivery.attempt >= consumer.max_attempts or consumer.dead_letters:
            return False
        return self._nacked.pop(delivery.id, None) != delivery.attempt - 1

    def defer(self, delivery: Delivery[Any], deadline: float, consumer: Any) -> bool:
        """Put ``delivery`` behind the first-time messages fetched after it (once)."""
        if delivery.id in self._deferred:
            self._deferred.discard(delivery.id)
            return False
        behind = consumer._batch[consumer._batch_pos :]
        if not any(d.attempt == 1 for d in behind) and not any(
            d.attempt == 1 for _, batch in consumer._buffer for d in batch
        ):
            return False
        if len(self._deferred) >= _REMEMBER:
            self._deferred.clear()
        self._deferred.add(delivery.id)
        consumer._buffer.append((deadline, [delivery]))
        consumer._buffered += 1
        return True

    async def isolate(
        self, delivery: Delivery[Any], deadline: float, receiver: Receiver[Any], consumer: Any
    ) -> None:
        """Steps 2-4 above; cancel-safe (``delivery`` goes back to the buffer's front)."""
        try:
            if consumer._held:
                last = max(m._deadline for m in consumer._held)
                await self._until(lambda: not consumer._held, last)
            fetch = consumer._fetch
            if fetch is not None:
                await asyncio.wait([fetch])
                consumer._collect(fetch)
            if receiver.release_uncounted:
                now = _now()
                rest = consumer._batch[consumer._batch_pos :]
                rest = rest if consumer._batch_deadline > now else []
                for lease_end, batch in consumer._buffer:
                    if lease_end > now:
                        rest += batch
                consumer._batch, consumer._batch_pos, consumer._buffered = [], 0, 0
                consumer._buffer.clear()
                if rest:
                    with contextlib.suppress(LeaseExpired):
                        await receiver.release(rest)
            backend = consumer._backend
            flush = backend.capabilities.ack_flush_interval if backend is not None else 0.0
            wait = self.last_settle + flush - _now()
            if wait > 0:
                await asyncio.sleep(wait)
        except asyncio.CancelledError:
            consumer._buffer.appendleft((deadline, [delivery]))
            consumer._buffered += 1
            raise
        self.pending = delivery

    def hand_out(self, message: Any) -> None:
        """``message`` (of the pending delivery) is handed out: hold everything else."""
        self.pending = None
        self.held = message

    async def until_settled(self) -> None:
        """Hand out nothing more while the message handed out alone is held."""
        message = self.held
        await self._until(lambda: message.settled or message._state == "lost", message._deadline)
        if self.held is message:
            self.held = None

    async def _until(self, done: Callable[[], bool], deadline: float) -> None:
        """Wait until ``done()`` (re-checked at every settle) or ``deadline``."""
        while not done():
            left = deadline - _now()
            if left <= 0:
                return
            seen = self._seen = asyncio.Event()
            waiter = asyncio.ensure_future(seen.wait())
            try:
                await asyncio.wait([waiter], timeout=left)
            finally:
                waiter.cancel()
                if self._seen is seen:
                    self._seen = None
