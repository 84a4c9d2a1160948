"""The connection context shared by the backend, its receivers and the dedup ledger.

A ``Link`` owns (or borrows, for ``from_client``) one aio-pika connection and works on
the aiormq channels under it: the publish channel (confirms on), one channel per
receiver, a short-lived channel per declare. It reconnects when the connection is gone
(bounded retry, then BrokerUnavailable naming host:port), and counts connections in
``generation`` so that a receipt from an earlier connection is never settled on a later
one (its delivery tag would name another message). It also caches what was declared.

Nothing here imports the backend or the receiver: both are handed a Link.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote

import aio_pika
import aiormq
from aiormq import exceptions as amqp

from brokerkit.backends import BrokerURL, ConfigError, HostPort, ResourceClosed, retry_unavailable
from brokerkit.backends.rabbitmq._errors import error_map, is_transient, stored_value
from brokerkit.backends.rabbitmq._options import RabbitOptions
from brokerkit.backends.rabbitmq._topology import Topology, marker_arguments, quorum_arguments

__all__ = ["Link", "close_channel_quietly", "main_queues"]

_log = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_PORT = {"amqp": 5672, "amqps": 5671}
PARTITIONS_MARK = "partitions="
GROUP_MARK = "group="


class Link:
    """One AMQP connection and everything cached about the server through it."""

    def __init__(
        self,
        options: RabbitOptions,
        *,
        url: BrokerURL | None = None,
        connection: aio_pika.abc.AbstractConnection | None = None,
    ) -> None:
        self.options = options
        self._url = url
        hosts: tuple[HostPort, ...] = ()
        if url is not None:
            port = DEFAULT_PORT.get(url.scheme, 5672)
            hosts = tuple(HostPort(h.host, h.port or port) for h in url.hosts) or (
                HostPort("127.0.0.1", port),
            )
        self.hosts = hosts
        self.errors = error_map(hosts)
        self._connection = connection
        self._owns = connection is None
        self.generation = 0
        self._publisher: aiormq.abc.AbstractChannel | None = None
        self._publisher_lock = asyncio.Lock()
        self._reconnect_lock = asyncio.Lock()
        self._declared: dict[str, asyncio.Future[None]] = {}
        self._partitions: dict[str, asyncio.Future[int]] = {}
        self.closed = False

    # -- connection -----------------------------------------------------------------------

    def where(self) -> str:
        return ", ".join(str(h) for h in self.hosts) or "RabbitMQ"

    async def open(self) -> None:
        if self._connection is None:
            await self._reconnect(None)
        else:
            self.generation = max(self.generation, 1)

    async def _connect_once(self) -> aio_pika.abc.AbstractConnection:
        url = self._url
        assert url is not None
        opts = self.options
        host = self.hosts[0]
        path = url.path
        vhost = unquote(path[1:]) if path not in ("", "/") else "/"
        context: ssl.SSLContext | None = None
        if url.scheme == "amqps":
            context = ssl.create_default_context(cafile=opts.tls_ca)
            if not opts.tls_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if opts.tls_cert and opts.tls_key:
                context.load_cert_chain(opts.tls_cert, opts.tls_key)
        kwargs: dict[str, Any] = {"heartbeat": opts.heartbeat}
        if opts.name:
            kwargs["name"] = opts.name
        connection: aio_pika.abc.AbstractConnection = await aio_pika.connect(
            host=host.host,
            port=host.port or DEFAULT_PORT.get(url.scheme, 5672),
            login=url.username or "guest",
            password=url.password or "guest",
            virtualhost=vhost,
            ssl=context is not None,
            ssl_context=context,
            timeout=opts.connect_timeout,
            **kwargs,
        )
        return connection

    async def _reconnect(self, seen: int | None) -> None:
        """Connect again, unless another task already did since generation ``seen``."""
        async with self._reconnect_lock:
            if self.closed:
                raise ResourceClosed("the RabbitMQ backend is closed")
            if seen is not None and self.generation != seen and self._alive():
                return
            if not self._owns:
                if self._alive():
                    self.generation += 1
                    return
                raise self.errors.translate(amqp.ConnectionClosed(320, "connection closed")) or (
                    ResourceClosed("the user's aio-pika connection is closed")
                )
            old, self._connection = self._connection, None
            if old is not None:
                await _close_quietly(old)
            with self.errors:  # credentials refused: ConfigError, not retried
                self._connection = await retry_unavailable(
                    self._connect_once, what="RabbitMQ", hosts=self.hosts, is_transient=is_transient
                )
            self.generation += 1
            self._publisher = None
            self._declared.clear()  # a restarted server may have lost non-durable state

    def _alive(self) -> bool:
        conn = self._connection
        transport = getattr(conn, "transport", None) if conn is not None else None
        return bool(conn is not None and not conn.is_closed and transport is not None)

    def amqp(self) -> aiormq.abc.AbstractConnection | None:
        conn = self._connection
        transport = getattr(conn, "transport", None) if conn is not None else None
        if conn is None or conn.is_closed or transport is None:
            return None
        raw = transport.connection
        if not isinstance(raw, aiormq.abc.AbstractConnection) or raw.is_closed:
            return None
        return raw

    async def channel(self) -> tuple[aiormq.abc.AbstractChannel, int]:
        """A new channel (and the generation it belongs to), reconnecting if needed."""
        if self.closed:
            raise ResourceClosed("the RabbitMQ backend is closed")
        with self.errors:
            raw = self.amqp()
            if raw is None:
                await self._reconnect(self.generation)
                raw = self.amqp()
                if raw is None:
                    raise amqp.ConnectionClosed(320, "connection closed")
            generation = self.generation
            channel = await raw.channel(publisher_confirms=True, on_return_raises=False)
            return channel, generation

    async def publisher(self) -> aiormq.abc.AbstractChannel:
        """The shared publish channel (confirms on), reopened when it was closed."""
        channel = self._publisher
        if channel is not None and not channel.is_closed:
            return channel
        async with self._publisher_lock:
            channel = self._publisher
            if channel is None or channel.is_closed:
                channel, _ = await self.channel()
                self._publisher = channel
            return channel

    async def admin(self, operation: Callable[[aiormq.abc.AbstractChannel], Awaitable[T]]) -> T:
        """Run one declare/delete on a channel of its own (a 406 closes only that one)."""
        channel, _ = await self.channel()
        try:
            with self.errors:
                return await asyncio.wait_for(operation(channel), self.options.request_timeout)
        finally:
            if not channel.is_closed:
                await close_channel_quietly(channel)

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        publisher, self._publisher = self._publisher, None
        if publisher is not None and not publisher.is_closed:
            await close_channel_quietly(publisher)
        conn, self._connection = self._connection, None
        if conn is not None and self._owns:
            await _close_quietly(conn)

    # -- declarations (cached per connection) ---------------------------------------------

    async def ensure(self, name: str, arguments: dict[str, Any]) -> None:
        """Declare a durable queue once per connection (concurrent first uses share one)."""
        fut = self._declared.get(name)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):

            async def declare(channel: aiormq.abc.AbstractChannel) -> None:
                await channel.queue_declare(name, durable=True, arguments=arguments)

            fut = asyncio.ensure_future(self.admin(declare))
            self._declared[name] = fut
        await asyncio.shield(fut)

    async def ensure_all(self, names: Sequence[tuple[str, dict[str, Any]]]) -> None:
        missing = [(n, a) for n, a in names if not _done_ok(self._declared.get(n))]
        if missing:
            await asyncio.gather(*(self.ensure(n, a) for n, a in missing))

    def forget(self, names: Sequence[str], queue: str | None = None) -> None:
        for name in names:
            self._declared.pop(name, None)
        if queue is not None:
            self._partitions.pop(queue, None)

    async def marker(self, name: str, value: str) -> str:
        """Declare a marker queue holding ``value``; return the value the server holds."""

        async def declare(channel: aiormq.abc.AbstractChannel) -> str:
            try:
                await channel.queue_declare(name, durable=True, arguments=marker_arguments(value))
            except amqp.ChannelPreconditionFailed as exc:
                held = stored_value(exc)
                if held is None:
                    raise
                return held
            return value

        return await self.admin(declare)

    async def partitions(self, topology: Topology) -> int:
        """The queue's partition count as stored on the server (the first creator's)."""
        key = topology.queue
        fut = self._partitions.get(key)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            fut = asyncio.ensure_future(self._read_partitions(topology))
            self._partitions[key] = fut
        return await asyncio.shield(fut)

    async def _read_partitions(self, topology: Topology) -> int:
        held = await self.marker(topology.meta, f"{PARTITIONS_MARK}{self.options.partitions}")
        number = held[len(PARTITIONS_MARK) :] if held.startswith(PARTITIONS_MARK) else ""
        if not number.isdigit() or int(number) < 1:
            raise ConfigError(
                f"queue {topology.meta!r} on {self.where()} was not made by brokerkit"
            )
        return int(number)

    async def claim_group(self, topology: Topology, group: str, dead_letters: bool) -> str:
        """Record ``group`` as the queue's one consumer group; return the group on record."""
        held = await self.marker(topology.owner(dead_letters), f"{GROUP_MARK}{group}")
        return held[len(GROUP_MARK) :] if held.startswith(GROUP_MARK) else held


def _done_ok(fut: asyncio.Future[None] | None) -> bool:
    return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None


def main_queues(topology: Topology, partitions: int) -> list[tuple[str, dict[str, Any]]]:
    """The free queue, every partition, and the DLQ, with their arguments."""
    return [
        (topology.free, quorum_arguments(single_active=False)),
        *((topology.partition(i), quorum_arguments(single_active=True)) for i in range(partitions)),
        (topology.dlq, quorum_arguments(single_active=False)),
    ]


async def close_channel_quietly(channel: aiormq.abc.AbstractChannel) -> None:
    """Close a channel, ignoring a broker or connection already gone (bounded: 5 s)."""
    if channel.is_closed:
        return
    try:
        await asyncio.wait_for(channel.close(), 5)
    except (amqp.AMQPError, amqp.ChannelInvalidStateError, OSError, TimeoutError, RuntimeError):
        pass


async def _close_quietly(connection: aio_pika.abc.AbstractConnection) -> None:
    try:
        await asyncio.wait_for(connection.close(), 5)
    except (amqp.AMQPError, OSError, TimeoutError, RuntimeError):
        pass
