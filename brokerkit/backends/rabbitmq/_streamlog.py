"""StreamLog: one RabbitMQ stream used as a totally ordered, shared log of JSON records.

What the dedup ledger (``_ledger``) and the attempt book (``_attempts``) have in common:
every client tails the stream from a start offset and applies each record, in stream
order, to its own in-memory view; a client appends records with publisher confirms and
waits until its own tail has read the last of them back, so every record appended
before them (by any client) has been applied too. A view built that way is the same in
every process, and survives any crash of a reader: the stream is the state.

The tail (a channel of its own) starts with the first append and again after its
channel closed (the view is cleared and rebuilt from the start offset); appends waiting
for their read-back then fail at once instead of waiting out ``request_timeout``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import aiormq
from pamqp.commands import Basic

from brokerkit.backends import BrokerRefused, BrokerUnavailable
from brokerkit.backends.rabbitmq._codec import new_id
from brokerkit.backends.rabbitmq._link import Link
from brokerkit.backends.rabbitmq._topology import stream_arguments

__all__ = ["StreamLog"]

_log = logging.getLogger(__name__)

_PREFETCH = 1000
_NONCE = "n"


class StreamLog:
    """A stream tailed from ``start()`` (an ``x-stream-offset``); ``apply`` sees each record,
    ``reset`` is called before the view is rebuilt."""

    def __init__(
        self,
        link: Link,
        stream: str,
        *,
        start: Callable[[], Any],
        apply: Callable[[dict[str, Any]], None],
        reset: Callable[[], None],
    ) -> None:
        self._link = link
        self.stream = stream
        self._start_offset = start
        self._apply = apply
        self._reset = reset
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._starting: asyncio.Future[None] | None = None

    async def started(self) -> None:
        """Tail the stream (again, after a lost channel); returns once consuming."""
        channel = self._channel
        if channel is not None and not channel.is_closed:
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def append(self, records: Sequence[dict[str, Any]]) -> None:
        """Append ``records`` (confirmed), then wait until the tail applied them all."""
        if not records:
            return
        await self.started()
        nonce = new_id()  # on the last record: the stream is one ordered log, so reading
        # it back means every earlier record (ours and anyone's) was applied too
        self._waiting[nonce] = seen = asyncio.get_running_loop().create_future()
        last = len(records) - 1
        bodies = [
            json.dumps({**r, _NONCE: nonce} if i == last else r, separators=(",", ":")).encode()
            for i, r in enumerate(records)
        ]
        timeout = self._link.options.request_timeout
        try:
            publisher = await self._link.publisher()
            with self._link.errors:
                confirms = await asyncio.gather(
                    *(
                        publisher.basic_publish(
                            body,
                            routing_key=self.stream,
                            properties=Basic.Properties(delivery_mode=2),
                            mandatory=True,
                            timeout=timeout,
                        )
                        for body in bodies
                    )
                )
            if not all(isinstance(confirm, Basic.Ack) for confirm in confirms):
                raise BrokerRefused(f"the stream {self.stream!r} refused a record")
            await asyncio.wait_for(asyncio.shield(seen), timeout)
        finally:
            self._waiting.pop(nonce, None)

    async def _start(self) -> None:
        link = self._link
        await link.ensure(self.stream, stream_arguments())
        self._reset()  # rebuilt from the start offset
        channel, _ = await link.channel()
        channel.closing.add_done_callback(lambda _: self._lost(channel))
        with link.errors:
            await channel.basic_qos(prefetch_count=_PREFETCH)
            await channel.basic_consume(
                self.stream,
                lambda message: self._on_record(channel, message),
                arguments={"x-stream-offset": self._start_offset()},
            )
        self._channel = channel

    def _lost(self, channel: aiormq.abc.AbstractChannel) -> None:
        """The tail's channel closed: what waits for a read-back will not get it."""
        if self._channel is channel:
            self._channel = None
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(BrokerUnavailable(f"lost the tail of {self.stream!r}"))

    async def _on_record(
        self, channel: aiormq.abc.AbstractChannel, message: aiormq.abc.DeliveredMessage
    ) -> None:
        try:
            record = json.loads(message.body)
        except ValueError:
            record = None
        if isinstance(record, dict):
            try:
                self._apply(record)
            except (KeyError, TypeError, ValueError):
                _log.debug("skipped a malformed record of %s", self.stream)
            seen = self._waiting.pop(str(record.get(_NONCE, "")), None)
            if seen is not None and not seen.done():
                seen.set_result(None)
        tag = getattr(message.delivery, "delivery_tag", None)
        if isinstance(tag, int) and not channel.is_closed:
            await channel.basic_ack(tag, wait=False)

    async def aclose(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None and not channel.is_closed:
            try:
                await asyncio.wait_for(channel.close(), 5)
            except (aiormq.exceptions.AMQPError, OSError, TimeoutError, RuntimeError):
                pass
