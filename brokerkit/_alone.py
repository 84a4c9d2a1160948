"""A redelivered message's last attempt is handed out alone (issue 16), for ``Consumer``.

A message that comes back with ``attempt >= max_attempts`` may be the one that crashed
its last consumers, and may crash this one. Then no innocent neighbour must be pushed
past ``max_attempts`` with it, into the DLQ. Before its hand-out:

1. what the caller holds is settled (never waiting past those leases);
2. what was fetched ahead is given back, where the receiver's ``release_uncounted``
   says that counts no attempt (elsewhere a release would count one: it stays);
3. the acks made so far are recorded by the broker (``Receiver.flush_acks``; a backend
   without one gets ``capabilities.ack_flush_interval`` to flush them);

and nothing more is fetched or handed out until it is settled or its lease ends
(``blocks``). Earlier attempts get step 3 only: any redelivery may be the poison that
killed its last consumer, and an ack coalesced just before it and lost in the next
crash would bring a done message back with an attempt counted; after more crashes
(SQS also counts what a killed consumer held unseen) that comeback reached the DLQ.
Steps 1 and 2 stay with the last attempt: a neighbour that lost an attempt (fetched
ahead by a crashed consumer) still has attempts left, and the last one is where it
stops losing them. One past the last (``attempt > max_attempts``: delivered that often
and never settled, by crashes or hangs) goes to the DLQ.

Its own ack returns only once it is recorded too (``FlushedAck``): the next
message handed out may be a poison, and a crash that lost a coalesced ack would bring an
innocent last attempt back past ``max_attempts``, into the DLQ (Kafka and SQS coalesce).

It goes out before the first-time messages fetched behind it, not after them: any of
those may be a poison too, and a crash while this one waited in the buffer would count
its last attempt unseen (to the DLQ without its last try: measured on all five brokers,
2026-12-02, while first-time messages went first). They are given back (step 2).

Every redelivery, not only a last attempt, is shown to the receiver just before it goes
out (``Receiver.handing_out``, where ``wants_handing_out``): SQS, which counts every
message it hands over and cannot take a fifo group's count back, makes what it holds
besides come back after that message's lease, so a crash counts them once, not once per
crash of a poison they keep arriving with.

The consumer hands in what this needs (``AloneLink``: its fetch buffer, its dead-letter
step, and two views of what the caller holds); this module never imports it, and the
state lives in one ``LastAttempts`` per consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from brokerkit._dlq import REASON_MAX_ATTEMPTS
from brokerkit._errors import BrokerkitError, LeaseExpired
from brokerkit._fetchbuffer import FetchBuffer
from brokerkit.backends.base import Delivery, Receiver

_now = time.monotonic
_log = logging.getLogger(__name__)

REDELIVERY_FLUSH_WAIT = 0.5
"""Longest a redelivery that is not a last attempt waits for the acks before it (s)."""


@dataclass(frozen=True, slots=True)
class AloneLink:
    """What the policy needs of its consumer, handed in by the consumer."""

    buffer: FetchBuffer
    max_attempts: int
    dead_letter: Callable[[Delivery[Any], str, int], Awaitable[None]]
    """Move a delivery to the DLQ with this reason and attempt count."""
    holds: Callable[[Delivery[Any]], bool]
    """True while the caller holds this delivery (handed out, unsettled, lease alive)."""
    settle_held: Callable[[], Awaitable[None]]
    """Wait until what the caller holds is settled, its last lease ran out, or close."""
    ack_timeout: float
    """The consumer's lease: what a renewal (``Receiver.extend``) grants."""


class LastAttempts:
    """The policy's state for one consumer: the delivery handed out alone."""

    __slots__ = ("_link", "held")

    def __init__(self, link: AloneLink) -> None:
        self._link = link
        self.held: Delivery[Any] | None = None
        """The delivery handed out alone, until settled (checked by ``blocks``)."""

    def blocks(self) -> bool:
        """True while a message handed out alone is still held: hand out and fetch nothing."""
        held = self.held
        if held is None:
            return False
        if self._link.holds(held):
            return True
        self.held = None  # settled, or its lease ran out (the consumer swept it)
        return False

    async def hand_out(
        self, delivery: Delivery[Any], deadline: float, receiver: Receiver[Any], flush: float
    ) -> float | None:
        """For a redelivery (``attempt > 1``): the lease end to hand it out with now
        (alone at ``attempt >= max_attempts``, else after ``_flush_bounded``), None when
        it went to the DLQ or its lease was lost meanwhile. ``flush`` is the backend's
        ``capabilities.ack_flush_interval``. Cancel-safe: a cancelled call puts the
        delivery back in front."""
        link = self._link
        last = delivery.attempt >= link.max_attempts
        if delivery.attempt > link.max_attempts:
            # delivered max_attempts times and never settled (crashes, hangs): to the DLQ
            await link.dead_letter(delivery, REASON_MAX_ATTEMPTS, delivery.attempt - 1)
            return None
        try:
            if last:
                deadline = await self._isolate_renewing(delivery, deadline, receiver, flush)
            elif receiver.wants_handing_out:  # a broker that counts unseen hand-outs (SQS):
                # an earlier attempt may be a poison too, and there a done message whose
                # coalesced ack dies with it can reach the DLQ; so the acks so far are
                # recorded first. Elsewhere it has attempts left, and a flush per redelivery
                # held Kafka's commits back past their 10 s bound under a nack storm (soak).
                await _flush_bounded(receiver, flush, deadline)
            if receiver.wants_handing_out:
                await receiver.handing_out(delivery, link.buffer.buffered())
        except asyncio.CancelledError:
            link.buffer.put_back_front(delivery, deadline)
            raise
        if not last:
            return deadline
        if _now() > deadline:
            return None
        self.held = delivery
        return deadline

    async def _isolate_renewing(
        self, delivery: Delivery[Any], deadline: float, receiver: Receiver[Any], flush: float
    ) -> float:
        """``_isolate``, renewing the delivery's lease whenever half of what is left ran
        out meanwhile: settling what the caller holds may take those messages' whole
        leases (longer still if they are renewed), and a last attempt whose lease ran out
        before its hand-out would come back past ``max_attempts``, into the DLQ, never
        tried. Returns the lease end (in the past if a renewal failed)."""
        isolating = asyncio.ensure_future(self._isolate(receiver, flush))
        try:
            while True:
                left = deadline - _now()
                await asyncio.wait((isolating,), timeout=max(left / 2, 0.0))
                if isolating.done():
                    isolating.result()
                    return deadline
                started = _now()
                try:
                    await receiver.extend(delivery, self._link.ack_timeout)
                except BrokerkitError as exc:  # lost: the broker redelivers it
                    _log.debug("lease of a last attempt not renewed: %s", exc)
                    await isolating
                    return -math.inf
                deadline = started + self._link.ack_timeout
        finally:
            if not isolating.done():
                isolating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await isolating

    async def _isolate(self, receiver: Receiver[Any], flush: float) -> None:
        """Steps 1-3 of the module's docstring."""
        await self._link.settle_held()
        buffer = self._link.buffer
        await buffer.finish_fetch()
        if receiver.release_uncounted:
            for rest in buffer.drain(_now()):
                if rest:
                    with contextlib.suppress(LeaseExpired):
                        await receiver.release(rest)
        await _flush_before(receiver, flush)


async def _flush_before(receiver: Receiver[Any], flush: float) -> None:
    """Step 3: the acks made so far are recorded before a redelivery goes out."""
    try:
        await flush_acks(receiver, flush)
    except BrokerkitError as exc:  # it goes out anyway: its own ack says if the broker is gone
        _log.debug("acks before a redelivery not confirmed: %s", exc)


async def _flush_bounded(receiver: Receiver[Any], flush: float, deadline: float) -> None:
    """Step 3 for a redelivery that is not a last attempt: waited for at most
    ``REDELIVERY_FLUSH_WAIT`` and half of its lease left (it is not renewed meanwhile),
    then it goes out anyway while the flush finishes by itself. A flush that cannot end
    soon (a Kafka consumer thread that sits in a revoke waiting for this very lease)
    must not hold a redelivery back past its slack or its lease."""
    wait = min(REDELIVERY_FLUSH_WAIT, (deadline - _now()) / 2)
    if wait <= 0:
        return
    flushing = asyncio.ensure_future(_flush_before(receiver, flush))
    try:
        await asyncio.wait((flushing,), timeout=wait)
    except asyncio.CancelledError:
        _let_finish(flushing)
        raise
    if flushing.done():
        flushing.result()  # a broker error was logged by _flush_before; anything else raises
        return
    _log.debug("acks before a redelivery not confirmed within %.2fs", wait)
    _let_finish(flushing)


_finishing: set[asyncio.Future[None]] = set()
"""Flushes left to finish by themselves (a strong reference: the loop keeps a weak one)."""


def _let_finish(task: asyncio.Future[None]) -> None:
    if task.done():
        _finished(task)
        return
    _finishing.add(task)
    task.add_done_callback(_finished)


def _finished(task: asyncio.Future[None]) -> None:
    _finishing.discard(task)
    exc = None if task.cancelled() else task.exception()
    if exc is not None:  # a broker error is logged by _flush_before and not raised
        _log.warning("acks before a redelivery: the flush failed: %r", exc)


async def flush_acks(receiver: Receiver[Any], interval: float) -> None:
    """``receiver.flush_acks()``; for a backend that coalesces acks (``interval`` > 0)
    without overriding it, wait the coalescing window out instead."""
    if type(receiver).flush_acks is not Receiver.flush_acks:
        await receiver.flush_acks()
    elif interval > 0:
        await asyncio.sleep(interval)


class FlushedAck(Receiver[Any]):
    """The receiver, for the message handed out alone: its ``ack`` returns once the broker
    recorded it (``flush_acks``), so a crash in the next hand-out cannot lose it.
    Everything else goes straight to the receiver."""

    def __init__(self, receiver: Receiver[Any], flush: float) -> None:
        self._receiver = receiver
        self._flush = flush

    async def ack(self, delivery: Delivery[Any]) -> None:
        await self._receiver.ack(delivery)
        await flush_acks(self._receiver, self._flush)

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Any]]:
        return await self._receiver.receive(max_messages, wait)

    async def nack(self, delivery: Delivery[Any], delay: float) -> None:
        await self._receiver.nack(delivery, delay)

    async def extend(self, delivery: Delivery[Any], ack_timeout: float) -> None:
        await self._receiver.extend(delivery, ack_timeout)

    async def release(self, deliveries: Sequence[Delivery[Any]]) -> None:
        await self._receiver.release(deliveries)

    async def flush_acks(self) -> None:
        await flush_acks(self._receiver, self._flush)
