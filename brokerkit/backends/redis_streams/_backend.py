"""RedisBackend: the connection, publishing, declaring and subscribing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from brokerkit.backends import (
    Backend,
    BrokerURL,
    Capabilities,
    ConfigError,
    Delivery,
    HostPort,
    Outgoing,
    PublishResult,
    QueueRef,
    QueueStats,
    ReceiverSettings,
    parse_options,
)
from brokerkit.backends.redis_streams._inspect import browse_pair, stats_pair
from brokerkit.backends.redis_streams._keys import (
    FIFO_ID_PREFIX,
    Keys,
    encode_outgoing,
    public_id,
)
from brokerkit.backends.redis_streams._link import RedisLink
from brokerkit.backends.redis_streams._options import RedisOptions
from brokerkit.backends.redis_streams._receiver import RedisReceiver

__all__ = ["RedisBackend"]

DEFAULT_PORT = 6379
_PIPELINE_CHUNK = 2000


class RedisBackend(Backend):
    """Redis Streams (Redis >= 7.0) through ``redis.asyncio``.

    Verbs -> Redis (all multi-step verbs are one Lua script, see ``_lua``):

    * publish -> ``XADD`` to ``<prefix>{queue}:s``, or to its fifo twin ``…:sf`` for a
      message with a fifo_group (pipelined for ``publish_many``); with a dedup_id ->
      script ``GET``/``XADD``/``SET PX`` on ``<prefix>{queue}:dd:<id>``;
    * subscribe / declare -> ``XGROUP CREATE <stream> <group> 0 MKSTREAM`` on both (new
      groups start at the oldest retained entry);
    * receive -> ``XREADGROUP >`` on ``:s`` (no script), and script TAKE: ``XCLAIM``
      expired leases and due entries, ``XREADGROUP >`` on ``:sf`` with fifo routing; then
      ``XREAD BLOCK`` to wait. A lease is the PEL entry's delivery time + the consumer's
      ack_timeout (carried in its name);
    * ack -> script ``XACK`` (+ the next fifo entry becomes due), coalesced;
    * nack -> script ``XCLAIM JUSTID`` to the park consumer + ``ZADD due now+delay``;
    * dead_letter -> script ``XADD <prefix>{queue}:d`` (or ``:df``) + ``XACK``;
    * extend -> script ``XCLAIM JUSTID`` to the same consumer (restarts the delivery time).

    Build it from a URL, or around your own client with :meth:`from_client`.
    """

    schemes = ("redis", "rediss")

    def __init__(
        self,
        client: Redis,
        options: RedisOptions,
        hosts: Sequence[HostPort],
        *,
        owns_client: bool,
    ) -> None:
        self.link = RedisLink(client, options, hosts)
        self.client = client
        self.options = options
        self.hosts = self.link.hosts
        self.keys = self.link.keys
        self.server_version: str | None = None
        """The server's ``redis_version``, read by ``open`` (None before)."""
        self._owns_client = owns_client
        self._closed = False
        self.capabilities = Capabilities(
            max_message_bytes=options.max_message_bytes,
            dedup_window=options.dedup_window,
            dedup_window_configurable=True,
            fan_out=True,
            max_nack_delay=30 * 86400.0,
            redelivery_slack=options.poll_interval + 0.25,
            ack_flush_interval=options.ack_flush_interval,
            browse=True,
            extras={"server": "redis"},
        )

    def __repr__(self) -> str:
        return f"<RedisBackend {', '.join(str(h) for h in self.hosts)}>"

    @classmethod
    def from_url(cls, url: BrokerURL) -> RedisBackend:
        """``redis://[[user]:password@]host[:port][/db]?options``; ``rediss://`` for TLS. No I/O."""
        options = parse_options(url, RedisOptions)
        if len(url.hosts) > 1:
            raise ConfigError(f"{url.scheme}:// URL takes one host (use a Redis proxy for more)")
        host = url.hosts[0] if url.hosts else HostPort("127.0.0.1")
        port = host.port or DEFAULT_PORT
        db_text = url.path.strip("/") or "0"
        if not db_text.isdigit():
            raise ConfigError(f"{url.scheme}:// URL path must be a database number, like /0")
        tls = url.scheme == "rediss"
        tls_set = {"ssl_ca_certs", "ssl_cert_reqs", "ssl_check_hostname"} & options.model_fields_set
        if tls_set and not tls:
            raise ConfigError(f"{', '.join(sorted(tls_set))} need a rediss:// URL")
        tls_kwargs: dict[str, Any] = {}
        if tls:
            tls_kwargs = {
                "ssl": True,
                "ssl_ca_certs": options.ssl_ca_certs,
                "ssl_cert_reqs": options.ssl_cert_reqs,
                "ssl_check_hostname": options.ssl_check_hostname,
            }
        client = Redis(
            host=host.host,
            port=port,
            db=int(db_text),
            username=url.username,
            password=url.password,
            # no per-read timeout: one event-loop timer per reply cost half the time of a
            # pipeline of 500; every call is bounded by socket_timeout instead (Runner)
            socket_timeout=None,
            socket_connect_timeout=options.connect_timeout,
            retry=Retry(NoBackoff(), 0),  # brokerkit's bounded retry decides, in one place
            decode_responses=False,
            **tls_kwargs,
        )
        return cls(client, options, (HostPort(host.host, port),), owns_client=True)

    @classmethod
    def from_client(cls, client: Redis, **options: Any) -> RedisBackend:
        """A backend around your own ``redis.asyncio.Redis`` (``decode_responses=False``).

        ``options`` are the URL query options as keywords (ConfigError naming a bad one).
        The client stays yours: closing the broker does not close it. Wrap with
        ``brokerkit.from_backend``.
        """
        parsed = parse_options(options, RedisOptions, scheme="redis")
        kwargs = client.connection_pool.connection_kwargs
        if kwargs.get("decode_responses"):
            raise ConfigError("RedisBackend.from_client needs a client with decode_responses=False")
        host = HostPort(str(kwargs.get("host", "localhost")), int(kwargs.get("port", DEFAULT_PORT)))
        return cls(client, parsed, (host,), owns_client=False)

    async def open(self) -> None:
        """``PING`` with a bounded retry (BrokerUnavailable naming host:port), then ``INFO``
        for ``server_version`` (capabilities stay as constructed)."""
        link = self.link
        await link.run(self.client.ping)
        info = await link.command("INFO", "server")
        self.server_version = str(info.get("redis_version", "")) or None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            try:
                await self.client.aclose()
            except (rex.RedisError, OSError):
                pass

    async def publish(self, queue: QueueRef, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """``XADD`` each (pipelined, in order) to the queue's stream (or its DLQ's), or to its
        fifo twin for a message with a fifo_group; one with a dedup_id goes through the
        dedup script (a DLQ keeps its own dedup ids).

        A retry after a lost connection may publish a message without dedup_id twice
        (at-least-once); messages with a dedup_id never are.
        """
        stream = self.keys.stream(queue.name, queue.dead_letters)
        if len(messages) == 1 and messages[0].dedup_id is None:
            msg = messages[0]
            fifo = msg.fifo_group is not None
            target = Keys.fifo(stream) if fifo else stream
            entry_id = await self.link.command("XADD", target, "*", *encode_outgoing(msg))
            return [PublishResult(public_id(entry_id, fifo), duplicate=False)]
        results: list[PublishResult] = []
        for start in range(0, len(messages), _PIPELINE_CHUNK):
            chunk = messages[start : start + _PIPELINE_CHUNK]
            replies = await self._publish_chunk(queue, stream, chunk)
            for msg, reply in zip(chunk, replies, strict=True):
                if isinstance(reply, list):
                    results.append(PublishResult(reply[0].decode(), duplicate=bool(reply[1])))
                else:
                    results.append(
                        PublishResult(public_id(reply, msg.fifo_group is not None), False)
                    )
        return results

    async def _publish_chunk(
        self, queue: QueueRef, stream: str, chunk: Sequence[Outgoing]
    ) -> list[Any]:
        return await self.link.run(lambda: self._pipeline(queue, stream, chunk))

    async def _pipeline(self, queue: QueueRef, stream: str, chunk: Sequence[Outgoing]) -> list[Any]:
        window_ms = max(1, round(self.options.dedup_window * 1000))
        fifo_stream = Keys.fifo(stream)
        keys = self.keys
        script = self.link.scripts.publish_dedup.text
        pipe = self.client.pipeline(transaction=False)
        for msg in chunk:
            fields = encode_outgoing(msg)
            fifo = msg.fifo_group is not None
            target = fifo_stream if fifo else stream
            if msg.dedup_id is None:
                pipe.execute_command("XADD", target, "*", *fields)
            else:
                # EVAL, not EVALSHA: a pipeline cannot recover from NOSCRIPT midway
                dedup_key = keys.dedup(queue.name, msg.dedup_id, queue.dead_letters)
                prefix = FIFO_ID_PREFIX if fifo else ""
                pipe.execute_command(
                    "EVAL", script, 2, target, dedup_key, window_ms, prefix, *fields
                )
        return list(await pipe.execute())

    async def declare(self, queue: QueueRef, group: str | None = None) -> None:
        """Create consumer ``group`` on the queue's (or DLQ's) stream pair now:
        ``XGROUP CREATE … 0 MKSTREAM``. Streams need no declaring (the first ``XADD`` makes
        them, and a group created later still starts at the oldest entry)."""
        if group is not None:
            await self.link.declare_group(self.keys.stream(queue.name, queue.dead_letters), group)

    async def browse(self, queue: QueueRef, limit: int) -> list[Delivery[None]]:
        """Script BROWSE (``XRANGE`` + ``XINFO GROUPS`` + ``XPENDING``, nothing written) on
        the plain stream and its fifo twin, merged by entry id; ``attempt`` is 0."""
        return await browse_pair(self.link, self.keys.stream(queue.name, queue.dead_letters), limit)

    async def stats(self, queue: QueueRef, group: str | None) -> QueueStats:
        """Script STATS per stream: ready = the group's lag + expired leases + due and parked
        entries, in flight = live leases (PEL by consumer, ``XPENDING IDLE``), delayed = the
        due ZSET after now; the oldest age from the first entry's id. Without a group: ready
        is every entry some group still needs (in flight and delayed None)."""
        return await stats_pair(self.link, self.keys.stream(queue.name, queue.dead_letters), group)

    async def delete_queue(self, queue: str) -> None:
        """``DEL`` every key of the queue, found by ``SCAN MATCH <prefix>{queue}:*``: both
        streams and their fifo twins (with their consumer groups), the groups' due sets,
        bells and fifo lists, and the dedup keys."""
        pattern = _glob_escape(self.keys.base(queue)) + ":*"
        client = self.client

        async def delete() -> None:
            found: list[Any] = []
            async for key in client.scan_iter(match=pattern, count=1000):
                found.append(key)
                if len(found) >= 500:
                    await client.delete(*found)
                    found.clear()
            if found:
                await client.delete(*found)

        await self.link.run(delete)
        self.link.forget_streams(
            {self.keys.stream(queue), self.keys.stream(queue, dead_letters=True)}
        )

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> RedisReceiver:
        """Declare the group on the queue's (or DLQ's) stream pair, then a receiver on it."""
        stream = self.keys.stream(queue.name, queue.dead_letters)
        await self.link.declare_group(stream, group)
        dlq = self.keys.stream(queue.name, dead_letters=True)
        return RedisReceiver(self.link, stream, dlq, group, settings)


def _glob_escape(text: str) -> str:
    """``text`` as a literal inside a ``SCAN MATCH`` pattern (the prefix is the user's)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
