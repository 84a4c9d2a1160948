"""AckBatch: a receiver's acks, gathered over one turn of the event loop and written at once.

``basic.ack`` has no reply, so an ack costs one frame write; acks made in the same turn
share one write (one ``multiple=True`` ack for the tags below the lowest still unacked,
single acks for the rest: ``_frames.send_acks``). When the channel is gone the broker has
taken the messages back (it redelivers them: at-least-once), so nothing is written.

Because it has no reply, an ack written into a connection that died unnoticed (a broker
killed mid-stream) would return as done and its message come back. So an ack returns at
once only while the broker was heard from on this channel within ``EVIDENCE`` (a delivery
or a barrier reply: ``heard``); otherwise it waits for a *barrier*: the acks are written,
then a ``basic.qos`` (a synchronous method with no other effect here: each consumer of
the receiver was created after its own ``basic.qos``) whose ``qos-ok`` means the broker
processed every frame before it on the channel. No answer within ``BARRIER_TIMEOUT``:
the ack raises ``BrokerUnavailable`` (a closed channel: ``LeaseExpired``) and the message
may come back. One barrier covers every ack queued before it was sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiormq

from brokerkit.backends import BrokerUnavailable, LeaseExpired
from brokerkit.backends.rabbitmq import _frames as frames
from brokerkit.backends.rabbitmq._errors import MAPPED
from brokerkit.backends.rabbitmq._link import Link

__all__ = ["AckBatch"]

_log = logging.getLogger(__name__)

EVIDENCE = 0.05
"""An ack returns at once only if the broker was heard from on the channel this recently."""
BARRIER_TIMEOUT = 5.0


class AckBatch:
    """Delivery tags acked and not yet written, for one receiver's channel."""

    __slots__ = ("_barrier", "_covered", "_flusher", "_link", "_queued", "_where", "heard", "tags")

    def __init__(
        self,
        link: Link,
        where: Callable[[], tuple[aiormq.abc.AbstractChannel | None, Mapping[int, Any]]],
    ) -> None:
        self._link = link
        self._where = where
        """The receiver's channel now, and its unacked deliveries by tag (in tag order)."""
        self.tags: list[int] = []
        self._flusher: asyncio.Task[None] | None = None
        self.heard = 0.0
        """When the broker was last heard from on the channel (loop time): set by the
        receiver at each delivery, and here at each barrier reply."""
        self._queued = 0  # acks queued so far (a sequence number)
        self._covered = 0  # acks queued before the last barrier that was answered
        self._barrier = asyncio.Lock()

    def add(self, tag: int) -> None:
        """Ack ``tag`` at the next turn of the event loop, with every other ack of this one."""
        self.tags.append(tag)
        self._queued += 1
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush())

    async def ack(self, tag: int, qos: int) -> None:
        """Ack ``tag``; return once it is written behind recent evidence that the broker is
        alive, or behind a barrier (``qos``: the channel's current ``basic.qos``)."""
        self.add(tag)
        if asyncio.get_running_loop().time() - self.heard > EVIDENCE:
            await self.barrier(qos)

    async def barrier(self, qos: int) -> None:
        """Return once the broker processed every ack queued so far: they are written,
        then a ``basic.qos`` (``qos``) answered behind them, unless one sent since was."""
        loop = asyncio.get_running_loop()
        mine = self._queued
        async with self._barrier:
            if self._covered >= mine:
                return  # a barrier sent after this ack was queued was answered
            sent = self._queued
            await self.write()
            channel, _ = self._where()
            if channel is None or channel.is_closed:
                raise LeaseExpired("the channel closed: the broker took the message back")
            try:
                with self._link.errors:
                    await asyncio.wait_for(channel.basic_qos(prefetch_count=qos), BARRIER_TIMEOUT)
            except TimeoutError:
                raise BrokerUnavailable(
                    f"RabbitMQ did not confirm an ack within {BARRIER_TIMEOUT:.0f}s; the "
                    "message may be delivered again"
                ) from None
            self._covered = sent
            self.heard = loop.time()

    def drop(self) -> None:
        """The channel closed: its tags must never be written on a new one."""
        self.tags = []

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)  # let the acks of this turn of the loop gather
        finally:
            self._flusher = None
            await self.write()

    async def write(self) -> None:
        """Write what is queued now."""
        acks, self.tags = self.tags, []
        channel, unacked = self._where()
        if not acks or channel is None or channel.is_closed:
            return  # the channel is gone: the broker redelivers them (at-least-once)
        lowest = next(iter(unacked), None)  # dict order is delivery-tag order
        try:
            with self._link.errors:
                await frames.send_acks(channel, acks, lowest)
        except MAPPED as exc:
            _log.debug("acks not written (the broker redelivers them): %s", exc)
