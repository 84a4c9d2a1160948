"""AckBatch: a receiver's acks, gathered over one turn of the event loop and written at once.

``basic.ack`` has no reply, so an ack costs one frame write; acks made in the same turn
share one write (one ``multiple=True`` ack for the tags below the lowest still unacked,
single acks for the rest: ``_frames.send_acks``). When the channel is gone the broker has
taken the messages back (it redelivers them: at-least-once), so nothing is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiormq

from brokerkit.backends.rabbitmq import _frames as frames
from brokerkit.backends.rabbitmq._errors import MAPPED
from brokerkit.backends.rabbitmq._link import Link

__all__ = ["AckBatch"]

_log = logging.getLogger(__name__)


class AckBatch:
    """Delivery tags acked and not yet written, for one receiver's channel."""

    __slots__ = ("_flusher", "_link", "_where", "tags")

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

    def add(self, tag: int) -> None:
        """Ack ``tag`` at the next turn of the event loop, with every other ack of this one."""
        self.tags.append(tag)
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush())

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
