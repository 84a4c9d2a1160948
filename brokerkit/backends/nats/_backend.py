"""NatsBackend: the connection, stream and consumer declaration, and publishing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import ssl
from collections.abc import Sequence
from typing import Any, ClassVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    ReplayPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from brokerkit.backends import (
    Backend,
    BrokerRefused,
    BrokerUnavailable,
    BrokerURL,
    Capabilities,
    ConfigError,
    Delivery,
    HostPort,
    MessageTooLarge,
    Outgoing,
    PublishResult,
    QueueRef,
    QueueStats,
    ReceiverSettings,
    ResourceClosed,
    parse_options,
    retry_unavailable,
)
from brokerkit.backends.nats._attempts import attempts_stream, declare_attempts
from brokerkit.backends.nats._errors import is_transient
from brokerkit.backends.nats._inspect import browse_stream, stats_stream
from brokerkit.backends.nats._layout import HEADER_ROOM, QueueLayout, encode_headers
from brokerkit.backends.nats._link import NatsLink, survive_late_pongs
from brokerkit.backends.nats._options import NatsOptions
from brokerkit.backends.nats._publisher import Ack, Item, JetStreamPublisher
from brokerkit.backends.nats._receiver import NatsReceiver

__all__ = ["NatsBackend"]

_log = logging.getLogger(__name__)

DEFAULT_PORT = 4222
_PARTITIONS_RE = re.compile(r"partitions=(\d+)")
_MIN_BODY = 256 * 1024
_CLEAN_PULL_INTEREST = (2, 10, 0)
_STREAM_EXISTS = 10058  # "stream name already in use with a different configuration"
_DECLARE_ACK_WAIT = 30.0
"""ack_wait of a group's durables made by ``declare`` (the facade's default ack_timeout);
the first subscriber sets its own."""
_REDELIVERY_SLACK = 2.0
"""Before 2.10 a nack waits for this receiver's outstanding pull (<= 1 s linger) to end, so
a redelivery may come ~1 s later than on 2.10+; capabilities are fixed before the server
version is known, so they state the bound that holds on every supported server."""


class NatsBackend(Backend):
    """``nats://`` / ``tls://``: NATS JetStream through nats-py (see the package docstring)."""

    schemes: ClassVar[tuple[str, ...]] = ("nats", "tls")

    def __init__(
        self,
        options: NatsOptions,
        *,
        url: BrokerURL | None = None,
        client: NATS | None = None,
    ) -> None:
        self.options = options
        self._url = url
        hosts: tuple[HostPort, ...] = url.hosts if url and url.hosts else ()
        if url is not None and not hosts:
            hosts = (HostPort("127.0.0.1", DEFAULT_PORT),)
        self.link = NatsLink(options, hosts, client)
        self._owns_client = client is None
        self._streams: dict[QueueRef, asyncio.Task[QueueLayout]] = {}
        self.capabilities = Capabilities(
            max_message_bytes=options.max_message_bytes,
            dedup_window=options.dedup_window,
            dedup_window_configurable=True,
            fan_out=True,
            redelivery_slack=_REDELIVERY_SLACK,
            ack_flush_interval=0.0 if options.confirm_acks else 0.1,
            browse=True,
            extras={"partitions": options.partitions, "storage": options.storage},
        )

    def __repr__(self) -> str:
        where = self._url.redacted() if self._url else "<user client>"
        return f"<NatsBackend {where}>"

    @property
    def server_version(self) -> tuple[int, int, int] | None:
        """The server's version, read at ``open`` (None before)."""
        return self.link.server_version

    @property
    def max_payload(self) -> int | None:
        """The server's ``max_payload`` (bytes per message, headers included), read at ``open``."""
        nc = self.link.nc
        return int(nc.max_payload) if nc is not None and nc.is_connected else None

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: BrokerURL) -> NatsBackend:
        """Parse ``nats://[user:pass@|token@]host[:port][,host2...]?options``; no I/O."""
        if url.path not in ("", "/"):
            raise ConfigError(
                f"{url.scheme}:// URL takes no path (got one); options go in the query"
            )
        options = parse_options(url, NatsOptions)
        if url.scheme != "tls" and (options.tls_ca or options.tls_cert):
            raise ConfigError("tls_ca / tls_cert / tls_key need a tls:// URL")
        return cls(options, url=url)

    @classmethod
    def from_client(cls, client: NATS, **options: Any) -> NatsBackend:
        """Wrap the user's own connected ``nats.NATS`` client (it is not closed by ``aclose``).

        ``options`` are the URL query options as keyword arguments
        (``partitions=16``, ``dedup_window=60`` ...); ConfigError names a bad one. Use it
        with ``brokerkit.from_backend(NatsBackend.from_client(nc))``.
        """
        return cls(parse_options(options, NatsOptions, scheme="nats"), client=client)

    # -- lifecycle ----------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (bounded retry, then BrokerUnavailable); check JetStream; read the server's
        version and max_payload (capabilities stay as constructed: a body the server cannot
        take is refused by ``publish`` with MessageTooLarge)."""
        link = self.link
        if link.nc is None:
            link.nc = await retry_unavailable(
                self._connect_once, what="NATS", hosts=link.hosts, is_transient=is_transient
            )
        nc = link.nc
        survive_late_pongs(nc)
        link.publisher = JetStreamPublisher(nc)
        if not link.hosts and nc.connected_url is not None:
            u = nc.connected_url
            link.hosts = (HostPort(u.hostname or "localhost", u.port),)
        link.js_context = js = nc.jetstream(timeout=self.options.request_timeout)
        with link.errors("check JetStream"):
            try:
                await js.account_info()
            except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as exc:
                raise ConfigError(
                    f"NATS at {link.where()} has no JetStream (start nats-server with -js)"
                ) from exc
        room = int(nc.max_payload) - HEADER_ROOM
        if room < _MIN_BODY:
            raise ConfigError(
                f"NATS at {link.where()} has max_payload {nc.max_payload}; brokerkit needs "
                f"{_MIN_BODY + HEADER_ROOM} (256 KiB bodies plus header room)"
            )
        link.body_limit = room if room < self.options.max_message_bytes else None
        v = nc.connected_server_version
        # nats-server 2.9 miscounts a redelivery that finds only a pull request whose inbox is
        # gone: it rolls the delivery back and the next one reports num_delivered 1 again, so
        # attempt would not grow. 2.10+ drops such requests cleanly (verified 2.9.10, 2.15.1).
        link.drain_pulls = (v.major, v.minor, v.patch) < _CLEAN_PULL_INTEREST
        link.server_version = (v.major, v.minor, v.patch)

    async def _connect_once(self) -> NATS:
        opts = self.options
        url = self._url
        assert url is not None
        servers = [f"{url.scheme}://{h}" for h in self.link.hosts]
        auth: dict[str, Any] = {}
        if url.username is not None and url.password is not None:
            auth = {"user": url.username, "password": url.password}
        elif url.username is not None:
            auth = {"token": url.username}
        tls: ssl.SSLContext | None = None
        if url.scheme == "tls":
            tls = ssl.create_default_context(cafile=opts.tls_ca)
            if opts.tls_cert and opts.tls_key:
                tls.load_cert_chain(opts.tls_cert, opts.tls_key)
        nc = NATS()
        try:
            await nc.connect(
                servers=servers,
                tls=tls,
                name=opts.name,
                connect_timeout=int(max(1, round(opts.connect_timeout))),
                allow_reconnect=False,  # this attempt only: retry_unavailable bounds the retries
                reconnect_time_wait=opts.reconnect_wait,  # type: ignore[arg-type]
                max_reconnect_attempts=1,  # each server twice, then NoServersError
                error_cb=_quiet_error,
                dont_randomize=False,
                **auth,
            )
        except BaseException:
            await _close_quietly(nc)
            raise
        # Once connected, ride out server restarts: reconnect forever, resubscribe inboxes.
        nc.options["allow_reconnect"] = True
        nc.options["max_reconnect_attempts"] = -1
        return nc

    async def aclose(self) -> None:
        """Close receivers, flush, and close the connection if it is ours. Idempotent."""
        link = self.link
        for receiver in list(link.receivers):
            await receiver.aclose()
        for task in self._streams.values():
            task.cancel()
        self._streams.clear()
        nc, link.nc, link.js_context = link.nc, None, None
        publisher, link.publisher = link.publisher, None
        if publisher is not None:
            await publisher.aclose()
        if nc is None or nc.is_closed:
            return
        if self._owns_client:
            await _close_quietly(nc)
        else:
            try:
                await nc.flush(timeout=int(self.options.request_timeout))
            except (nats.errors.Error, OSError, TimeoutError):
                pass

    # -- streams and consumers (created on first use, or by declare) ----------------------

    async def _stream(self, queue: QueueRef) -> QueueLayout:
        """The queue's (or DLQ's) stream, declared on first use; cached per connection."""
        task = self._streams.get(queue)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.ensure_future(self._declare_stream(queue))
            self._streams[queue] = task
        return await asyncio.shield(task)

    def _forget_stream(self, queue: QueueRef) -> None:
        """Drop a cached stream (it vanished on the server): the next use recreates it."""
        self._streams.pop(queue, None)

    async def declare(self, queue: QueueRef, group: str | None = None) -> None:
        """Create the queue's, its DLQ's and its attempts streams now and, with ``group``,
        the group's durables on ``queue``'s stream (those missing: a live group's
        ``ack_wait`` is left as its subscribers set it)."""
        await self._stream(queue.main)
        await self._stream(queue.main.dlq)
        with self.link.errors(f"create the attempts stream of {queue.name!r}"):
            await declare_attempts(self.link, self.options.prefix, queue.name)
        if group is not None:
            layout = await self._stream(queue)
            await self._declare_group(layout, group, _DECLARE_ACK_WAIT, only_missing=True)

    async def delete_queue(self, queue: str) -> None:
        """``delete_stream`` of the queue's stream, its DLQ's (their durable consumers go
        with them) and its attempts stream; a stream that is not there is fine."""
        opts = self.options
        for ref in (QueueRef(queue), QueueRef(queue).dlq):
            self._forget_stream(ref)
            layout = QueueLayout.of(
                opts.prefix, queue, dead_letters=ref.dead_letters, partitions=opts.partitions
            )
            with self.link.errors(f"delete stream {layout.stream!r}"):
                try:
                    await self.link.js.delete_stream(layout.stream)
                except nats.js.errors.NotFoundError:
                    pass
        book = attempts_stream(opts.prefix, queue)
        with self.link.errors(f"delete stream {book!r}"):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await self.link.js.delete_stream(book)

    async def _existing(self, queue: QueueRef) -> QueueLayout | None:
        """The queue's (or DLQ's) stream as it is on the server; None when it is not there
        (browse and stats create nothing)."""
        opts = self.options
        layout = QueueLayout.of(
            opts.prefix, queue.name, dead_letters=queue.dead_letters, partitions=opts.partitions
        )
        with self.link.errors(f"stream info of {layout.stream!r}"):
            try:
                info = await self.link.js.stream_info(layout.stream)
            except nats.js.errors.NotFoundError:
                return None
        found = _PARTITIONS_RE.search(info.config.description or "")
        if found is None:
            raise ConfigError(
                f"stream {layout.stream!r} exists but was not created by brokerkit: use another "
                "?prefix="
            )
        return dataclasses.replace(layout, partitions=int(found.group(1)))

    async def browse(self, queue: QueueRef, limit: int) -> list[Delivery[None]]:
        """``STREAM.MSG.GET`` by sequence (no consumer: nothing counted or left behind),
        from the lowest ack floor of any group; see ``_inspect``. ``attempt`` is 0."""
        layout = await self._existing(queue)
        if layout is None:
            return []
        return await browse_stream(self.link, layout, limit, dead_letters=queue.dead_letters)

    async def stats(self, queue: QueueRef, group: str | None) -> QueueStats:
        """From ``STREAM.INFO`` and the group's durables' info; see ``_inspect``."""
        layout = await self._existing(queue)
        if layout is None:
            return QueueStats(ready=0)
        return await stats_stream(self.link, layout, group)

    async def _declare_stream(self, queue: QueueRef) -> QueueLayout:
        """add_stream is idempotent for an identical config; another config means it exists.

        The partition count lives in the stream description, so every client
        agrees with the one that created the stream.
        """
        opts = self.options
        dead_letters = queue.dead_letters
        wanted = QueueLayout.of(
            opts.prefix, queue.name, dead_letters=dead_letters, partitions=opts.partitions
        )
        kind = "dead letters of" if dead_letters else "queue"
        config = StreamConfig(
            name=wanted.stream,
            description=f"brokerkit {kind} {queue.name}; partitions={opts.partitions}",
            subjects=[wanted.wildcard],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE if opts.storage == "file" else StorageType.MEMORY,
            num_replicas=opts.replicas,
            max_age=opts.max_age,
            duplicate_window=opts.dedup_window,
            discard=DiscardPolicy.OLD,
        )
        js = self.link.js
        with self.link.errors(f"create stream for {kind} {queue.name!r}"):
            try:
                info = await js.add_stream(config)
            except nats.js.errors.BadRequestError as exc:
                if getattr(exc, "err_code", None) != _STREAM_EXISTS:
                    raise
                info = await js.stream_info(wanted.stream)
        found = _PARTITIONS_RE.search(info.config.description or "")
        if found is None:
            raise ConfigError(
                f"stream {wanted.stream!r} exists but was not created by brokerkit (no "
                "partitions= in its description): use another ?prefix="
            )
        return dataclasses.replace(wanted, partitions=int(found.group(1)))

    async def _declare_group(
        self, layout: QueueLayout, group: str, ack_wait: float, *, only_missing: bool = False
    ) -> None:
        """One durable pull consumer per slot, created (or updated) concurrently.

        Creating a durable is idempotent for an identical config and updates
        ``ack_wait`` otherwise: the newest subscriber's ack_timeout holds for the
        whole consumer group.
        """
        names = [layout.consumer(group, s) for s in range(layout.partitions + 1)]
        filters = layout.filters()
        with self.link.errors(f"create consumer group {group!r} on {layout.stream!r}"):
            await asyncio.gather(
                *(
                    self._declare_consumer(
                        layout.stream, name, subject, ack_wait, slot > 0, only_missing
                    )
                    for slot, (name, subject) in enumerate(zip(names, filters, strict=True))
                )
            )

    async def _declare_consumer(
        self, stream: str, name: str, subject: str, ack_wait: float, fifo: bool, only_missing: bool
    ) -> None:
        js = self.link.js
        if only_missing:
            try:
                await js.consumer_info(stream, name)
                return
            except nats.js.errors.NotFoundError:
                pass
        config = ConsumerConfig(
            durable_name=name,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            # unlimited: the facade dead-letters on attempt > max_attempts, so the server
            # must never stop redelivering (max_deliver would drop the message silently)
            max_deliver=-1,
            filter_subject=subject,
            max_ack_pending=1 if fifo else self.options.max_ack_pending,
            replay_policy=ReplayPolicy.INSTANT,
        )
        try:
            await js.add_consumer(stream, config)
        except nats.js.errors.BadRequestError:
            # an existing durable whose config this server cannot update in place: use it
            await js.consumer_info(stream, name)

    # -- publishing ---------------------------------------------------------------------

    async def publish(self, queue: QueueRef, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """publish -> pipelined JetStream publishes (Nats-Msg-Id = dedup_id), one wait for all
        PubAcks (``JetStreamPublisher``).

        MessageTooLarge before anything is sent when a body exceeds what the server takes
        (its max_payload minus header room, when that is below ``max_message_bytes``).
        """
        limit = self.link.body_limit
        if limit is not None:
            _check_sizes(messages, limit, self.link.where())
        layout = await self._stream(queue)
        items = [
            (
                layout.subject(m.fifo_group),
                m.body,
                encode_headers(m.headers, m.fifo_group, m.dedup_id),
            )
            for m in messages
        ]
        try:
            acks = await self._publish_raw(items, what=f"publish to {str(queue)!r}")
        except (BrokerUnavailable, BrokerRefused) as exc:
            if isinstance(exc.__cause__, nats.js.errors.NoStreamResponseError):
                self._forget_stream(queue)
            raise
        return [PublishResult(str(seq), duplicate=duplicate) for seq, duplicate in acks]

    async def _publish_raw(self, items: Sequence[Item], *, what: str) -> list[Ack]:
        """Pipelined JetStream publishes in order; returns once every PubAck is in."""
        publisher = self.link.publisher
        if publisher is None or self.link.nc is None:
            raise ResourceClosed("the NATS backend is not open")
        with self.link.errors(what):
            return await publisher.publish(items, self.options.request_timeout)

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> NatsReceiver:
        """Declare the streams (queue and DLQ) and the group's durables, then start a pull
        receiver."""
        layout = await self._stream(queue)
        if not queue.dead_letters:
            await self._stream(queue.dlq)
        await self._declare_group(layout, group, settings.ack_timeout)
        link = self.link
        receiver = NatsReceiver(link, group, layout, settings, dead_letters=queue.dead_letters)
        await receiver.start()
        link.receivers.add(receiver)
        return receiver


def _check_sizes(messages: Sequence[Outgoing], limit: int, where: str) -> None:
    for m in messages:
        if len(m.body) > limit:
            raise MessageTooLarge(
                f"message body is {len(m.body)} bytes; NATS at {where} takes at most {limit} "
                "(its max_payload minus room for headers)"
            )


async def _quiet_error(exc: Exception) -> None:
    # nats-py logs every transport hiccup at ERROR by default; reconnects are routine here.
    _log.debug("NATS client error: %s", type(exc).__name__)


async def _close_quietly(nc: NATS) -> None:
    try:
        await nc.close()
    except (nats.errors.Error, OSError, TimeoutError):
        pass
