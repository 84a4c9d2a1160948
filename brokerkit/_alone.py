"""A redelivered message's last attempt is handed out alone (issue 16), for ``Consumer``.

A message that comes back with ``attempt >= max_attempts`` may be the one that crashed
its last consumers, and may crash this one. Then no innocent neighbour must be pushed
past ``max_attempts`` with it, into the DLQ. Before its hand-out:

1. first-time messages fetched behind it go first (once: it must not wait out its lease);
2. what the caller holds is settled (never waiting past those leases);
3. what was fetched ahead is given back, where the receiver's ``release_uncounted``
   says that counts no attempt (elsewhere a release would count one: it stays);
4. the acks made so far get ``capabilities.ack_flush_interval`` to reach the broker;

and nothing more is fetched or handed out until it is settled or its lease ends
(``blocks``). Earlier attempts need none of this: a neighbour that lost an attempt
(fetched ahead by a crashed consumer, or its coalesced ack lost with it) still has
attempts left, and the last one is where it stops losing them. The cost falls on last
attempts only. One past the last (``attempt > max_attempts``: delivered that often and
never settled, by crashes or hangs) goes to the DLQ.

This module reaches into the consumer's fetch buffer (``_batch``, ``_buffer``, ...):
it is the consumer's own policy, kept apart to keep ``_consumer.py`` small; it never
imports it. Its state lives here, per consumer, in a weak mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from brokerkit._dlq import REASON_MAX_ATTEMPTS
from brokerkit._errors import LeaseExpired
from brokerkit.backends.base import Delivery

_now = time.monotonic
_REMEMBER = 10_000  # deferred ids remembered, then forgotten at once


@dataclass(slots=True)
class _State:
    held: Delivery[Any] | None = None  # the delivery handed out alone, until settled
    deferred: set[str] = field(default_factory=set)


_STATES: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()


def blocks(consumer: Any) -> bool:
    """True while a message handed out alone is still held: hand out and fetch nothing."""
    state = _STATES.get(consumer)
    if state is None or state.held is None:
        return False
    held = state.held
    if any(m._delivery is held for m in consumer._held):
        return True
    state.held = None  # settled, or its lease ran out (the consumer swept it)
    return False


async def last_attempt(delivery: Delivery[Any], deadline: float, consumer: Any) -> bool:
    """For a delivery with ``attempt >= max_attempts``: True to hand it out now (alone),
    False when it went to the DLQ, was put behind first-time messages, or its lease ran
    out meanwhile. Cancel-safe: a cancelled call puts the delivery back in front."""
    if delivery.attempt > consumer.max_attempts:
        # delivered max_attempts times and never settled (crashes, hangs): to the DLQ
        await consumer.move_to_dlq(delivery, REASON_MAX_ATTEMPTS, attempts=delivery.attempt - 1)
        return False
    if delivery.attempt == 1:
        return True  # max_attempts=1: a first delivery is no redelivery
    state = _STATES.get(consumer)
    if state is None:
        state = _STATES[consumer] = _State()
    if _defer(state, delivery, deadline, consumer):
        return False
    try:
        await _isolate(consumer)
    except asyncio.CancelledError:
        consumer._buffer.appendleft((deadline, [delivery]))
        consumer._buffered += 1
        raise
    if _now() > deadline:
        return False
    state.held = delivery
    return True


def _defer(state: _State, delivery: Delivery[Any], deadline: float, consumer: Any) -> bool:
    """Put ``delivery`` behind the first-time messages fetched after it (once)."""
    if delivery.id in state.deferred:
        state.deferred.discard(delivery.id)
        return False
    behind = consumer._batch[consumer._batch_pos :]
    if not any(d.attempt == 1 for d in behind) and not any(
        d.attempt == 1 for _, batch in consumer._buffer for d in batch
    ):
        return False
    if len(state.deferred) >= _REMEMBER:
        state.deferred.clear()
    state.deferred.add(delivery.id)
    consumer._buffer.append((deadline, [delivery]))
    consumer._buffered += 1
    return True


async def _isolate(consumer: Any) -> None:
    """Steps 2-4 of the module's docstring."""
    if consumer._held:
        last = max(m._deadline for m in consumer._held)
        while consumer._held and _now() < last and not consumer._closing:
            await consumer._wait_for_slot()  # wakes at each settle, at most _POLL_WAIT later
    fetch = consumer._fetch
    if fetch is not None:
        await asyncio.wait([fetch])
        consumer._collect(fetch)
    receiver = consumer._receiver
    if receiver is not None and receiver.release_uncounted:
        now = _now()
        rest = consumer._batch[consumer._batch_pos :] if consumer._batch_deadline > now else []
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
    if flush > 0:
        await asyncio.sleep(flush)  # acks already made reach the broker before it goes out
