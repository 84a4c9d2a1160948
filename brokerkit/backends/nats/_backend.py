"""NatsBackend: the connection, stream and consumer creation, and publishing."""

from __future__ import annotations

import asyncio
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
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    PubAck,
    ReplayPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from pydantic import ValidationError

from brokerkit._errors import BrokerkitError, ConfigError
from brokerkit._message import Outgoing, PublishResult
from brokerkit._options import parse_options
from brokerkit._retry import retry_unavailable
from brokerkit._url import BrokerURL, HostPort
from brokerkit.backends.base import Backend, Capabilities, Receiver, ReceiverSettings
from brokerkit.backends.nats._errors import is_transient, mapped
from brokerkit.backends.nats._layout import HEADER_ROOM, QueueLayout, encode_headers
from brokerkit.backends.nats._options import NatsOptions

__all__ = ["NatsBackend"]

_log = logging.getLogger("brokerkit.nats")

DEFAULT_PORT = 4222
_PARTITIONS_RE = re.compile(r"partitions=(\d+)")
_MIN_BODY = 256 * 1024
_CLEAN_PULL_INTEREST = (2, 10, 0)
_STREAM_EXISTS = 10058  # "stream name already in use with a different configuration"


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
        self._hosts: tuple[HostPort, ...] = url.hosts if url and url.hosts else ()
        if url is not None and not self._hosts:
            self._hosts = (HostPort("127.0.0.1", DEFAULT_PORT),)
        self._nc: NATS | None = client
        self._owns_client = client is None
        self._js: JetStreamContext | None = None
        self._layouts: dict[tuple[str, bool], asyncio.Task[QueueLayout]] = {}
        self._receivers: set[Receiver] = set()
        self.server_version: tuple[int, int, int] | None = None
        self.drain_pulls = False
        """Server before 2.10: never drop an inbox with pull requests outstanding (see receiver)."""
        self.capabilities = Capabilities(
            max_message_bytes=options.max_message_bytes,
            dedup_window=options.dedup_window,
            dedup_window_configurable=True,
            fan_out=True,
            redelivery_slack=1.0,
            ack_flush_interval=0.0 if options.confirm_acks else 0.1,
            extras={"partitions": options.partitions, "storage": options.storage},
        )

    def __repr__(self) -> str:
        where = self._url.redacted() if self._url else "<user client>"
        return f"<NatsBackend {where}>"

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
        (``partitions=16``, ``dedup_window=60`` ...). Use it with
        ``brokerkit.from_backend(NatsBackend.from_client(nc))``.
        """
        try:
            parsed = NatsOptions.model_validate(options)
        except ValidationError as exc:
            names = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})
            raise ConfigError(f"invalid NATS options: {', '.join(names) or 'see docs'}") from None
        return cls(parsed, client=client)

    # -- lifecycle ----------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (bounded retry, then BrokerUnavailable); check JetStream; read server limits."""
        if self._nc is None:
            self._nc = await retry_unavailable(
                self._connect_once, what="NATS", hosts=self._hosts, is_transient=is_transient
            )
        nc = self._nc
        if not self._hosts and nc.connected_url is not None:
            u = nc.connected_url
            self._hosts = (HostPort(u.hostname or "localhost", u.port),)
        self._js = nc.jetstream(timeout=self.options.request_timeout)
        with self._mapped("check JetStream"):
            try:
                await self._js.account_info()
            except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as exc:
                raise ConfigError(
                    f"NATS at {self._where()} has no JetStream (start nats-server with -js)"
                ) from exc
        v = nc.connected_server_version
        self.server_version = (v.major, v.minor, v.patch)
        # nats-server 2.9 miscounts a redelivery that finds only a pull request whose inbox is
        # gone: it rolls the delivery back and the next one reports num_delivered 1 again, so
        # attempt would not grow. 2.10+ drops such requests cleanly (verified 2.9.10, 2.15.1).
        self.drain_pulls = self.server_version < _CLEAN_PULL_INTEREST
        room = int(nc.max_payload) - HEADER_ROOM
        if room < _MIN_BODY:
            raise ConfigError(
                f"NATS at {self._where()} has max_payload {nc.max_payload}; brokerkit needs "
                f"{_MIN_BODY + HEADER_ROOM} (256 KiB bodies plus header room)"
            )
        self.capabilities = dataclasses.replace(
            self.capabilities,
            max_message_bytes=min(self.options.max_message_bytes, room),
            # on 2.9 a nack waits for this receiver's outstanding pull (<= 1 s linger) to end
            redelivery_slack=2.0 if self.drain_pulls else self.capabilities.redelivery_slack,
            extras={
                **self.capabilities.extras,
                "server_version": f"{v.major}.{v.minor}.{v.patch}",
                "max_payload": int(nc.max_payload),
            },
        )

    async def _connect_once(self) -> NATS:
        opts = self.options
        url = self._url
        assert url is not None
        servers = [f"{url.scheme}://{h}" for h in self._hosts]
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
        for receiver in list(self._receivers):
            await receiver.aclose()
        for task in self._layouts.values():
            task.cancel()
        self._layouts.clear()
        nc, self._nc = self._nc, None
        if nc is None or nc.is_closed:
            return
        if self._owns_client:
            await _close_quietly(nc)
        else:
            try:
                await nc.flush(timeout=int(self.options.request_timeout))
            except (nats.errors.Error, OSError, TimeoutError):
                pass

    # -- helpers shared with the receiver -----------------------------------------------

    def _where(self) -> str:
        return ", ".join(str(h) for h in self._hosts) or "the NATS server"

    def _mapped(self, what: str) -> Any:
        return mapped(what, self._hosts)

    @property
    def client(self) -> NATS:
        if self._nc is None:
            raise BrokerkitError("the NATS backend is not open")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise BrokerkitError("the NATS backend is not open")
        return self._js

    # -- streams and consumers ----------------------------------------------------------

    async def layout(self, queue: str, dead_letters: bool) -> QueueLayout:
        """The queue's (or DLQ's) stream, created on first use; cached per connection."""
        key = (queue, dead_letters)
        task = self._layouts.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.ensure_future(self._ensure_stream(queue, dead_letters))
            self._layouts[key] = task
        return await asyncio.shield(task)

    def forget_layout(self, queue: str, dead_letters: bool) -> None:
        """Drop a cached stream (it vanished on the server): the next use recreates it."""
        self._layouts.pop((queue, dead_letters), None)

    async def delete_queue(self, queue: str) -> None:
        """``delete_stream`` of the queue's stream and its DLQ's (their durable consumers go
        with them); a stream that is not there is fine."""
        for dead_letters in (False, True):
            self.forget_layout(queue, dead_letters)
            opts = self.options
            layout = QueueLayout.of(
                opts.prefix, queue, dead_letters=dead_letters, partitions=opts.partitions
            )
            with self._mapped(f"delete stream {layout.stream!r}"):
                try:
                    await self.js.delete_stream(layout.stream)
                except nats.js.errors.NotFoundError:
                    pass

    async def _ensure_stream(self, queue: str, dead_letters: bool) -> QueueLayout:
        """add_stream is idempotent for an identical config; another config means it exists.

        The partition count lives in the stream description, so every client
        agrees with the one that created the stream.
        """
        opts = self.options
        wanted = QueueLayout.of(
            opts.prefix, queue, dead_letters=dead_letters, partitions=opts.partitions
        )
        kind = "dead letters of" if dead_letters else "queue"
        config = StreamConfig(
            name=wanted.stream,
            description=f"brokerkit {kind} {queue}; partitions={opts.partitions}",
            subjects=[wanted.wildcard],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE if opts.storage == "file" else StorageType.MEMORY,
            num_replicas=opts.replicas,
            max_age=opts.max_age,
            duplicate_window=opts.dedup_window,
            discard=DiscardPolicy.OLD,
        )
        with self._mapped(f"create stream for {kind} {queue!r}"):
            try:
                info = await self.js.add_stream(config)
            except nats.js.errors.BadRequestError as exc:
                if getattr(exc, "err_code", None) != _STREAM_EXISTS:
                    raise
                info = await self.js.stream_info(wanted.stream)
        found = _PARTITIONS_RE.search(info.config.description or "")
        if found is None:
            raise BrokerkitError(
                f"stream {wanted.stream!r} exists but was not created by brokerkit (no partitions=)"
            )
        return dataclasses.replace(wanted, partitions=int(found.group(1)))

    async def ensure_consumers(self, layout: QueueLayout, group: str, ack_wait: float) -> None:
        """One durable pull consumer per slot, created (or updated) concurrently.

        Creating a durable is idempotent for an identical config and updates
        ``ack_wait`` otherwise: the newest subscriber's ack_timeout holds for the
        whole consumer group.
        """
        names = [layout.consumer(group, s) for s in range(layout.partitions + 1)]
        filters = layout.filters()
        with self._mapped(f"create consumer group {group!r} on {layout.stream!r}"):
            await asyncio.gather(
                *(
                    self._ensure_consumer(layout.stream, name, subject, ack_wait, slot > 0)
                    for slot, (name, subject) in enumerate(zip(names, filters, strict=True))
                )
            )

    async def _ensure_consumer(
        self, stream: str, name: str, subject: str, ack_wait: float, fifo: bool
    ) -> None:
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
            await self.js.add_consumer(stream, config)
        except nats.js.errors.BadRequestError:
            # an existing durable whose config this server cannot update in place: use it
            await self.js.consumer_info(stream, name)

    # -- publishing ---------------------------------------------------------------------

    async def publish(self, queue: str, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """publish -> js.publish_async each (Nats-Msg-Id = dedup_id), one wait for all PubAcks."""
        layout = await self.layout(queue, False)
        items = [
            (
                layout.subject(m.fifo_group),
                m.body,
                encode_headers(m.headers, m.fifo_group, m.dedup_id),
            )
            for m in messages
        ]
        try:
            acks = await self.publish_raw(items, what=f"publish to {queue!r}")
        except BrokerkitError as exc:
            if isinstance(exc.__cause__, nats.js.errors.NoStreamResponseError):
                self.forget_layout(queue, False)
            raise
        return [PublishResult(str(a.seq), duplicate=bool(a.duplicate)) for a in acks]

    async def publish_raw(
        self, items: Sequence[tuple[str, bytes, dict[str, str] | None]], *, what: str
    ) -> list[PubAck]:
        """Pipelined JetStream publishes in order; returns once every PubAck is in."""
        js = self.js
        futures: list[asyncio.Future[PubAck]] = []
        with self._mapped(what):
            try:
                for subject, body, headers in items:
                    futures.append(await js.publish_async(subject, body, headers=headers))
                pending: set[asyncio.Future[PubAck]] = set(futures)
                while pending:
                    # the timeout restarts whenever acks make progress: big batches are fine
                    done, pending = await asyncio.wait(
                        pending, timeout=self.options.request_timeout
                    )
                    if not done:
                        raise nats.errors.TimeoutError
                return [f.result() for f in futures]
            finally:
                for f in futures:
                    if not f.done():
                        f.cancel()

    async def subscribe(
        self, queue: str, group: str, settings: ReceiverSettings, *, dead_letters: bool = False
    ) -> Receiver:
        """Ensure stream (and DLQ) and the group's durables, then start a pull receiver."""
        from brokerkit.backends.nats._receiver import NatsReceiver

        layout = await self.layout(queue, dead_letters)
        if not dead_letters:
            await self.layout(queue, True)
        await self.ensure_consumers(layout, group, settings.ack_timeout)
        receiver = NatsReceiver(self, queue, group, layout, settings, dead_letters=dead_letters)
        await receiver.start()
        self._receivers.add(receiver)
        return receiver

    def discard(self, receiver: Receiver) -> None:
        self._receivers.discard(receiver)


async def _quiet_error(exc: Exception) -> None:
    # nats-py logs every transport hiccup at ERROR by default; reconnects are routine here.
    _log.debug("NATS client error: %s", type(exc).__name__)


async def _close_quietly(nc: NATS) -> None:
    try:
        await nc.close()
    except (nats.errors.Error, OSError, TimeoutError):
        pass
