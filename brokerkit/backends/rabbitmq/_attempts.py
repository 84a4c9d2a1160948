"""AttemptBook: how often a redelivered message was really handed out, kept in RabbitMQ.

A quorum queue counts a delivery as failed (``x-delivery-count``) for every unacked
message of a consumer that dies, including what ``basic.qos`` let the broker push to it
and the receiver never handed out. A poison message that kills its consumers would so
push its neighbours past ``max_attempts``, into the DLQ (issue 16's crash behaviour);
and up to 4.2 even ``basic.nack`` counts, so nothing can be given back uncounted. The
receiver therefore keeps its own count of hand-outs, durable (a killed process cannot
write anything down afterwards) and shared by every process, in the stream ``P.Q.attempts``
(a ``StreamLog``)::

    {"k": "<source queue>/<message id>", "c": 1 | -1}

A first delivery (no ``x-delivery-count``) is attempt 1 and costs nothing: no record is
read or written. A redelivery is taken as handed out once before (a first delivery
leaves no record) and is attempt ``2 + c``, where ``c`` is the sum of its records before
this hand-out; the hand-out's own ``+1`` is appended and read back before the delivery
reaches the facade, so a crash right after the hand-out still counts it. A release (a
delivery handed to the facade, never to the caller) appends ``-1``: its next hand-out has
the same attempt. So does a closing receiver for each first delivery it gives back
never seen (``uncount``): the broker counts it, the ``-1`` takes that back. A message is
held by one receiver at a time, so its records are never written concurrently. Records
live ``ATTEMPTS_MAX_AGE`` (``_topology``); a message redelivered after that starts again
from attempt 2.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from brokerkit.backends import Delivery
from brokerkit.backends.rabbitmq._errors import MAPPED
from brokerkit.backends.rabbitmq._held import Held, Lease
from brokerkit.backends.rabbitmq._link import Link
from brokerkit.backends.rabbitmq._streamlog import StreamLog
from brokerkit.backends.rabbitmq._topology import Topology

__all__ = ["AttemptBook"]

_log = logging.getLogger(__name__)


class AttemptBook:
    """The hand-out counts of one queue's redeliveries, as read by one connection."""

    def __init__(self, link: Link, topology: Topology) -> None:
        self._counts: dict[str, int] = {}
        self._log = StreamLog(
            link,
            topology.attempts,
            start=lambda: "first",
            apply=self._apply,
            reset=self._counts.clear,
        )

    async def hand_out(self, redeliveries: Sequence[Delivery[Lease]]) -> None:
        """Record one hand-out of each redelivery and set its attempt from the book;
        raises (nothing set) when the record cannot be written and read back."""
        keys = [d.receipt.held.key for d in redeliveries]
        await self._log.append([{"k": key, "c": 1} for key in keys])
        counts = self._counts
        for delivery, key in zip(redeliveries, keys, strict=True):
            held = delivery.receipt.held
            held.booked = True
            held.attempt = delivery.attempt = 1 + counts.get(key, 1)

    async def give_back(self, released: Sequence[Held]) -> None:
        """Take back the recorded hand-outs among ``released`` (never seen by the caller);
        one that cannot be written stays counted (one attempt too many, never too few)."""
        booked = [held for held in released if held.booked]
        for held in booked:
            held.booked = False  # its next hand-out is recorded again
        await self._minus_one(booked, "releases")

    async def uncount(self, unseen: Sequence[Held]) -> None:
        """First deliveries a closing receiver gives back unseen: the broker counts a
        delivery for each (3.x counts even ``basic.nack``), so their next hand-out would be
        attempt 2. A ``-1`` each keeps it at 1. One that cannot be written stays counted."""
        first = [held for held in unseen if held.incoming.attempt == 1 and not held.booked]
        await self._minus_one(first, "unseen give-backs")

    async def _minus_one(self, helds: Sequence[Held], what: str) -> None:
        if not helds:
            return
        try:
            await self._log.append([{"k": held.key, "c": -1} for held in helds])
        except (*MAPPED, TimeoutError) as exc:
            _log.warning("attempt book: %s not recorded (%r)", what, exc)

    def _apply(self, record: dict[str, Any]) -> None:
        # kept at 0 and below too: -1 (given back unseen at close) then +1 is attempt 1
        key = str(record["k"])
        self._counts[key] = self._counts.get(key, 0) + int(record["c"])

    async def aclose(self) -> None:
        await self._log.aclose()
