"""RabbitBackend: URL and options, topology on first use, publishing with confirms."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

import aio_pika
import aiormq
from aiormq import exceptions as amqp
from pamqp.commands import Basic
from pydantic import ValidationError

from brokerkit.backends import (
    Backend,
    BrokerRefused,
    BrokerUnavailable,
    BrokerURL,
    Capabilities,
    ConfigError,
    Outgoing,
    PublishResult,
    QueueRef,
    QueueStats,
    ReceiverSettings,
    UnsupportedFeature,
    parse_options,
)
from brokerkit.backends.rabbitmq import _frames as frames
from brokerkit.backends.rabbitmq._attempts import AttemptBook
from brokerkit.backends.rabbitmq._codec import new_id, properties
from brokerkit.backends.rabbitmq._held import Source
from brokerkit.backends.rabbitmq._ledger import Ledger
from brokerkit.backends.rabbitmq._link import Link, main_queues
from brokerkit.backends.rabbitmq._options import RabbitOptions
from brokerkit.backends.rabbitmq._receiver import RabbitReceiver
from brokerkit.backends.rabbitmq._topology import Topology, partition_of, quorum_arguments

__all__ = ["RabbitBackend"]

_log = logging.getLogger(__name__)

_RESEND_ROUNDS = 6
_NOT_FOUND = 404
_CHUNK = 100
"""Publishes per socket write (when the aiormq channel allows batching)."""
ACK_FLUSH_INTERVAL = 0.01
"""Acks are written at the next turn of the event loop, many in one frame write: well
under this bound unless the loop itself is blocked."""
MAX_NACK_DELAY = 15 * 60.0
"""A nacked message waits unacked on its receiver's channel; RabbitMQ's consumer_timeout
(30 min by default) would close the channel on a longer hold."""


class RabbitBackend(Backend):
    """``amqp://`` / ``amqps://``: RabbitMQ quorum queues through aio-pika (see the package)."""

    schemes: ClassVar[tuple[str, ...]] = ("amqp", "amqps")

    def __init__(
        self,
        options: RabbitOptions,
        *,
        url: BrokerURL | None = None,
        connection: aio_pika.abc.AbstractConnection | None = None,
    ) -> None:
        self.options = options
        self._url = url
        self._link = Link(options, url=url, connection=connection)
        self._receivers: set[RabbitReceiver] = set()
        self._ledgers: dict[str, Ledger] = {}
        self._books: dict[str, AttemptBook] = {}
        self._window_ms = int(options.dedup_window * 1000)
        self.capabilities = Capabilities(
            max_message_bytes=options.max_message_bytes,
            dedup_window=options.dedup_window,
            dedup_window_configurable=True,
            fan_out=False,
            max_nack_delay=MAX_NACK_DELAY,
            redelivery_slack=1.0,
            ack_flush_interval=ACK_FLUSH_INTERVAL,
            extras={
                "partitions": options.partitions,
                "prefetch": options.prefetch,
                "max_held": options.max_held,
            },
        )

    def __repr__(self) -> str:
        where = self._url.redacted() if self._url else "<user connection>"
        return f"<RabbitBackend {where}>"

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: BrokerURL) -> RabbitBackend:
        """``amqp://user:pass@host[:port][/vhost]?options``; no I/O."""
        if len(url.hosts) > 1:
            raise ConfigError(f"{url.scheme}:// URL takes one host (got {len(url.hosts)})")
        options = parse_options(url, RabbitOptions)
        if url.scheme != "amqps" and (options.tls_ca or options.tls_cert):
            raise ConfigError("tls_ca / tls_cert / tls_key need an amqps:// URL")
        return cls(options, url=url)

    @classmethod
    def from_client(
        cls, connection: aio_pika.abc.AbstractConnection, **options: Any
    ) -> RabbitBackend:
        """Wrap the user's own connected aio-pika connection (``aclose`` leaves it open).

        ``options`` are the URL query options as keywords (``partitions=16`` ...). Use
        it as ``brokerkit.from_backend(RabbitBackend.from_client(connection))``.
        """
        try:
            parsed = RabbitOptions.model_validate(options)
        except ValidationError as exc:
            names = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})
            raise ConfigError(f"invalid RabbitMQ options: {', '.join(names)}") from None
        return cls(parsed, connection=connection)

    # -- lifecycle ----------------------------------------------------------------------

    async def open(self) -> None:
        await self._link.open()

    async def aclose(self) -> None:
        for receiver in list(self._receivers):
            await receiver.aclose()
        self._receivers.clear()
        for ledger in self._ledgers.values():
            await ledger.aclose()
        for book in self._books.values():
            await book.aclose()
        self._ledgers.clear()
        self._books.clear()
        await self._link.aclose()

    # -- topology -----------------------------------------------------------------------

    def _topology(self, queue: str) -> Topology:
        return Topology(self.options.prefix, queue)

    async def declare(self, queue: QueueRef, group: str | None = None) -> None:
        topology = self._topology(queue.name)
        partitions = await self._link.partitions(topology)
        await self._link.ensure_all(main_queues(topology, partitions))
        if group is not None:
            await self._claim(topology, group, queue.dead_letters)

    async def _claim(self, topology: Topology, group: str, dead_letters: bool) -> None:
        owner = await self._link.claim_group(topology, group, dead_letters)
        if owner != group:
            kind = "DLQ of queue" if dead_letters else "queue"
            raise UnsupportedFeature(
                f"the {kind} {topology.queue!r} is consumed by group {owner!r}: RabbitMQ "
                f"queues here have one consumer group each (capabilities.fan_out is False)"
            )

    async def delete_queue(self, queue: str) -> None:
        """Delete every RabbitMQ queue of ``queue``: free, partitions, DLQ, the ledger and
        attempts streams, markers."""
        topology = self._topology(queue)
        partitions = await self._link.partitions(topology)
        names = topology.everything(partitions)
        for log in (self._ledgers.pop(queue, None), self._books.pop(queue, None)):
            if log is not None:
                await log.aclose()

        async def delete(channel: aiormq.abc.AbstractChannel) -> None:
            for name in names:
                await channel.queue_delete(name)

        self._link.forget(names, queue)
        await self._link.admin(delete)
        self._link.forget(names, queue)

    async def stats(self, queue: QueueRef, group: str | None) -> QueueStats:
        """ready = the ``message_count`` of a passive ``queue.declare`` of each RabbitMQ queue
        (the free queue and every partition, or the DLQ): messages not delivered to any
        consumer. In flight and delayed are held by consumers and not visible over AMQP."""
        topology = self._topology(queue.name)

        async def count(names: list[str]) -> int:
            async def passive(channel: aiormq.abc.AbstractChannel) -> int:
                total = 0
                for name in names:
                    ok = await channel.queue_declare(name, passive=True)
                    total += int(ok.message_count or 0)
                return total

            return await self._link.admin(passive)

        try:
            # passive first: stats never creates the queue (nor its partition marker)
            ready = await count([topology.dlq if queue.dead_letters else topology.free])
            if not queue.dead_letters:
                partitions = await self._link.partitions(topology)
                ready += await count([topology.partition(i) for i in range(partitions)])
        except BrokerRefused as exc:
            if exc.code != _NOT_FOUND:
                raise
            ready = 0  # never declared: nothing in it
        return QueueStats(ready=ready)

    # -- publishing ---------------------------------------------------------------------

    async def publish(self, queue: QueueRef, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """basic.publish (persistent, mandatory) through the default exchange to the target
        queue; up to ``max_in_flight`` confirms awaited at once, in order."""
        topology = self._topology(queue.name)
        link = self._link
        if queue.dead_letters:
            await link.ensure_all(main_queues(topology, await link.partitions(topology)))
            targets = [topology.dlq] * len(messages)
        else:
            partitions = await link.partitions(topology)
            await link.ensure_all(main_queues(topology, partitions))
            targets = [
                topology.free
                if m.fifo_group is None
                else topology.partition(partition_of(m.fifo_group, partitions))
                for m in messages
            ]
        ids = [new_id() for _ in messages]
        window = self._window_ms
        items = [
            (target, m.body, properties(m, i, window))
            for target, m, i in zip(targets, messages, ids, strict=True)
        ]
        await self._send(items)
        return [PublishResult(i, duplicate=None) for i in ids]

    async def _send(self, items: Sequence[tuple[str, bytes, Basic.Properties]]) -> None:
        """Publish every item, then resend, in order, whatever is not confirmed yet: after a
        reconnect (the connection failed), after declaring again (returned unroutable:
        another client deleted the queue), after a pause (``basic.nack``: e.g. a quorum
        queue created a moment ago by another connection has no leader yet). A message
        resent after a lost confirm may be stored twice under one id (at-least-once)."""
        confirmed = [False] * len(items)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.options.request_timeout
        for round_ in itertools.count():
            todo = [i for i, ok in enumerate(confirmed) if not ok]
            last = round_ >= _RESEND_ROUNDS or loop.time() > give_up
            try:
                returned, nacked = await self._send_once(items, todo, confirmed)
            except BrokerUnavailable:
                if last:
                    raise
                _log.info("RabbitMQ connection lost while publishing: resending unconfirmed")
                continue
            if not returned and not nacked:
                return
            if last:
                if returned:
                    target = items[returned[0]][0]
                    raise BrokerRefused(f"RabbitMQ returned messages as unroutable ({target!r})")
                raise BrokerRefused("RabbitMQ did not accept messages (basic.nack)")
            if returned:
                targets = sorted({items[i][0] for i in returned})
                self._link.forget(targets)
                await self._link.ensure_all([(t, _arguments_of(t)) for t in targets])
            if nacked:
                await asyncio.sleep(min(0.05 * 2**round_, 1.0))

    async def _send_once(
        self,
        items: Sequence[tuple[str, bytes, Basic.Properties]],
        todo: Sequence[int],
        confirmed: list[bool],
    ) -> tuple[list[int], list[int]]:
        """One pass over ``todo`` with a sliding window; returns (unroutable, nacked)."""
        link = self._link
        window = self.options.max_in_flight
        channel = await link.publisher()
        pending: deque[tuple[int, asyncio.Future[Any]]] = deque()
        returned: list[int] = []
        nacked: list[int] = []

        def settle(index: int, confirm: Any) -> None:
            if isinstance(confirm, Basic.Ack):
                confirmed[index] = True
            elif isinstance(confirm, Basic.Nack):
                nacked.append(index)
            else:
                returned.append(index)  # basic.return: mandatory and no queue

        try:
            with link.errors:
                async with asyncio.timeout(self.options.request_timeout) as deadline:
                    loop = asyncio.get_running_loop()
                    batched = frames.supported(channel)
                    step = min(window, _CHUNK) if batched else 1
                    for at in range(0, len(todo), step):
                        chunk = todo[at : at + step]
                        while pending and len(pending) + len(chunk) > window:
                            first, fut = pending.popleft()
                            settle(first, await _confirmation(fut))
                            deadline.reschedule(loop.time() + self.options.request_timeout)
                        if batched:
                            futs = await frames.publish_batch(channel, [items[i] for i in chunk])
                            pending.extend(zip(chunk, futs, strict=True))
                        else:
                            target, body, props = items[chunk[0]]
                            publish = channel.basic_publish(
                                body, routing_key=target, properties=props, mandatory=True
                            )
                            pending.append((chunk[0], asyncio.ensure_future(publish)))
                    while pending:
                        first, fut = pending.popleft()
                        settle(first, await _confirmation(fut))
        finally:
            for _, fut in pending:
                if not fut.done():
                    fut.cancel()
        return returned, nacked

    # -- consuming ----------------------------------------------------------------------

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> RabbitReceiver:
        """Declare, claim the group, then consume the free queue and every partition (or
        the DLQ) on a channel of the receiver's own."""
        topology = self._topology(queue.name)
        await self.declare(queue, group)
        if queue.dead_letters:
            sources = [Source(topology.dlq, ordered=False)]
            ledger = None
        else:
            partitions = await self._link.partitions(topology)
            sources = [
                Source(topology.free, ordered=False),
                *(Source(topology.partition(i), ordered=True) for i in range(partitions)),
            ]
            ledger = self._ledger(topology)

        async def redeclare() -> None:
            partitions = await self._link.partitions(topology)
            self._link.forget([name for name, _ in main_queues(topology, partitions)])
            await self.declare(queue, group)

        receiver = RabbitReceiver(
            self._link,
            sources,
            settings,
            ledger=ledger,
            book=self._book(topology),
            dead_letters=queue.dead_letters,
            redeclare=redeclare,
        )
        self._receivers.add(receiver)
        return receiver

    def _book(self, topology: Topology) -> AttemptBook:
        book = self._books.get(topology.queue)
        if book is None:
            book = self._books[topology.queue] = AttemptBook(self._link, topology)
        return book

    def _ledger(self, topology: Topology) -> Ledger:
        ledger = self._ledgers.get(topology.queue)
        if ledger is None:
            ledger = Ledger(self._link, topology, self.options.dedup_window)
            self._ledgers[topology.queue] = ledger
        return ledger


async def _confirmation(fut: asyncio.Future[Any]) -> Any:
    """The broker's answer to one publish: Basic.Ack, Basic.Nack, or the returned message."""
    try:
        return await fut
    except amqp.DeliveryError as exc:  # aiormq raises a nack
        return exc.frame


def _arguments_of(name: str) -> dict[str, Any]:
    """The declare arguments of a free, partition or DLQ queue, from its name."""
    return quorum_arguments(single_active=_is_partition(name))


def _is_partition(name: str) -> bool:
    parts = name.rsplit(".", 2)
    return len(parts) == 3 and parts[1] == "p" and parts[2].isdigit()
