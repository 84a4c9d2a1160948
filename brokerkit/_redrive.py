"""Redrive: dead letters back to their queue, oldest death first, each group in order.

A backend's DLQ receiver hands out what is due, but not necessarily in the order of
death across its internal streams or partitions (Redis reads its plain and its fifo
stream apart, NATS its partition subjects). So redrive keeps a small window of leased
dead letters and always moves the one that died first; after each move it takes in what
became due (the next of that message's fifo_group), so a group's next message competes
with the rest as soon as it can. What is left in the window when the move ends is given
back (``release``); a window entry held longer than ``_HOLD`` is given back and fetched
again, so no lease runs out under a long redrive. Filling the window waits up to
``_SETTLE`` for more after a receive that brought some (a backend may hand out its
streams or partitions in turns), and after moving a grouped message for its group's
next: a redrive costs up to about 0.2 s per fifo_group on top of its moves. The first
fill waits longer, ``_FIRST_SETTLE``: it decides which message is the oldest, and a
loaded broker may answer for its other partitions later than 0.2 s (NATS did, under a
parallel test run, and ``limit=1`` moved a younger message first).

Each message is republished (without its dedup id, which would suppress it, and with
the fifo_group it died with), then acked in the DLQ: a crash in between leaves a copy
in both, never in neither. A move that fails (the republish refused) raises, and gives
back what the window held, that message included: the next redrive finds it at once.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from brokerkit._dlq import split_envelope
from brokerkit._message import Outgoing
from brokerkit.backends.base import Backend, Delivery, QueueRef, Receiver, ReceiverSettings

LEASE = 60.0
"""The lease on dead letters in the window."""
_HOLD = LEASE / 3
"""Longest a dead letter stays in the window before it is given back and fetched anew."""
WINDOW = 100
"""Dead letters leased at once while choosing the oldest."""
_SETTLE = 0.2
"""After a receive that brought some, how long to wait for more before choosing."""
_FIRST_SETTLE = 1.0
"""The same for the first fill of the window (and a refill of an empty one)."""
_NEVER = datetime.min.replace(tzinfo=UTC)


def _died_at(delivery: Delivery[Any]) -> datetime:
    _, info = split_envelope(delivery.headers)
    return info.died_at if info is not None else _NEVER


async def redrive(
    backend: Backend, queue: str, group: str, *, limit: int | None, first_wait: float
) -> int:
    """Move up to ``limit`` (None: all) dead letters of ``queue``; return how many moved."""
    ref = QueueRef(queue)
    receiver: Receiver[Any] = await backend.subscribe(ref.dlq, group, ReceiverSettings(LEASE))
    window: list[tuple[datetime, int, float, Delivery[Any]]] = []  # (died, order, fetched, d)
    order = 0
    moved = 0

    async def take_in(wait: float, settle: float = _SETTLE) -> None:
        """Fill the window: wait up to ``wait`` for the first, then take in what follows
        within ``settle`` (a backend may hand out its streams or partitions in turns)."""
        nonlocal order
        while len(window) < WINDOW:
            now = time.monotonic()
            got = await receiver.receive(WINDOW - len(window), wait)
            for delivery in got:
                window.append((_died_at(delivery), order, now, delivery))
                order += 1
            if not got:
                return
            wait = settle if wait > 0 else 0.0

    try:
        await take_in(first_wait, _FIRST_SETTLE)
        while window and (limit is None or moved < limit):
            stale = [w for w in window if time.monotonic() - w[2] > _HOLD]
            if stale:
                window[:] = [w for w in window if w not in stale]
                await receiver.release([w[3] for w in stale])
                await take_in(first_wait)
                continue
            oldest = min(window)
            window.remove(oldest)
            delivery = oldest[3]
            headers, info = split_envelope(delivery.headers)
            fifo_group = info.fifo_group if info else delivery.fifo_group
            try:
                await backend.publish(ref, [Outgoing(delivery.body, fifo_group, None, headers)])
            except BaseException:
                window.append(oldest)  # not moved: given back below, due again at once
                raise
            await receiver.ack(delivery)
            moved += 1
            if limit is not None and moved >= limit:
                break
            # an ungrouped move makes nothing due; a grouped one makes its group's next due
            await take_in(_SETTLE if fifo_group is not None else 0.0)
            if not window:
                await take_in(first_wait, _FIRST_SETTLE)
    finally:
        if window:  # what is left, or all a failed move held: never leased for a minute
            try:
                await receiver.release([w[3] for w in window])
            finally:
                await receiver.aclose()
        else:
            await receiver.aclose()
    return moved
