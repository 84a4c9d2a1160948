"""RedisBackend: the connection, publishing and subscribing."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from redis import exceptions as rex
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from brokerkit._errors import ConfigError
from brokerkit._message import Outgoing, PublishResult
from brokerkit._options import parse_options
from brokerkit._url import BrokerURL, HostPort
from brokerkit.backends.base import Backend, Capabilities, Receiver, ReceiverSettings
from brokerkit.backends.redis_streams import _lua
from brokerkit.backends.redis_streams._errors import Runner
from brokerkit.backends.redis_streams._keys import (
    FIFO_ID_PREFIX,
    Keys,
    Script,
    command,
    encode_outgoing,
    public_id,
    run_script,
)
from brokerkit.backends.redis_streams._options import RedisOptions

__all__ = ["RedisBackend"]

DEFAULT_PORT = 6379
_PIPELINE_CHUNK = 2000


class Scripts:
    """The Lua scripts of ``_lua``, each with its SHA."""

    def __init__(self) -> None:
        self.take = Script.of(_lua.TAKE)
        self.ack = Script.of(_lua.ACK)
        self.ack_bare = Script.of(_lua.ACK_BARE)
        self.nack = Script.of(_lua.NACK)
        self.dead = Script.of(_lua.DEAD)
        self.extend = Script.of(_lua.EXTEND)
        self.publish_dedup = Script.of(_lua.PUBLISH_DEDUP)
        self.trim = Script.of(_lua.TRIM)
        self.forget_consumer = Script.of(_lua.FORGET_CONSUMER)


SCRIPTS = Scripts()


class RedisBackend(Backend):
    """Redis Streams (Redis >= 7.0) through ``redis.asyncio``.

    Verbs -> Redis (all multi-step verbs are one Lua script, see ``_lua``):

    * publish -> ``XADD`` to ``<prefix>{queue}:s``, or to its fifo twin ``…:sf`` for a
      message with a fifo_group (pipelined for ``publish_many``); with a dedup_id ->
      script ``GET``/``XADD``/``SET PX`` on ``<prefix>{queue}:dd:<id>``;
    * subscribe -> ``XGROUP CREATE <stream> <group> 0 MKSTREAM`` on both (new groups start
      at the oldest retained entry);
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
        self.client = client
        self.options = options
        self.hosts = tuple(hosts)
        self.keys = Keys(options.prefix)
        self.run = Runner(self.hosts)
        self.scripts = SCRIPTS
        self._owns_client = owns_client
        self._groups: set[tuple[str, str]] = set()
        self._closed = False
        self.capabilities = Capabilities(
            max_message_bytes=options.max_message_bytes,
            dedup_window=options.dedup_window,
            dedup_window_configurable=True,
            fan_out=True,
            max_nack_delay=30 * 86400.0,
            lease_granularity=0.001,
            redelivery_slack=options.poll_interval + 0.25,
            ack_flush_interval=options.ack_flush_interval,
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
            socket_timeout=options.socket_timeout,
            socket_connect_timeout=options.connect_timeout,
            retry=Retry(NoBackoff(), 0),  # brokerkit's bounded retry decides, in one place
            decode_responses=False,
            **tls_kwargs,
        )
        return cls(client, options, (HostPort(host.host, port),), owns_client=True)

    @classmethod
    def from_client(cls, client: Redis, **options: Any) -> RedisBackend:
        """A backend around your own ``redis.asyncio.Redis`` (``decode_responses=False``).

        ``options`` are the URL query options as keywords. The client stays yours:
        closing the broker does not close it. Wrap with ``brokerkit.from_backend``.
        """
        try:
            parsed = RedisOptions(**options)
        except ValidationError as exc:
            names = ", ".join(sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]}))
            raise ConfigError(f"bad RedisBackend option(s): {names}") from None
        kwargs = client.connection_pool.connection_kwargs
        if kwargs.get("decode_responses"):
            raise ConfigError("RedisBackend.from_client needs a client with decode_responses=False")
        host = HostPort(str(kwargs.get("host", "localhost")), int(kwargs.get("port", DEFAULT_PORT)))
        return cls(client, parsed, (host,), owns_client=False)

    async def open(self) -> None:
        """``PING`` with a bounded retry (BrokerUnavailable naming host:port), then ``INFO``."""
        await self.run(self.client.ping)
        info = await self.command("INFO", "server")
        version = str(info.get("redis_version", ""))
        self.capabilities = dataclasses.replace(
            self.capabilities, extras={"server": "redis", "server_version": version}
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            try:
                await self.client.aclose()
            except (rex.RedisError, OSError):
                pass

    async def publish(self, queue: str, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """``XADD`` each (pipelined, in order) to the queue's stream, or to its fifo twin for
        a message with a fifo_group; one with a dedup_id goes through the dedup script.

        A retry after a lost connection may publish a message without dedup_id twice
        (at-least-once); messages with a dedup_id never are.
        """
        stream = self.keys.stream(queue)
        if len(messages) == 1 and messages[0].dedup_id is None:
            msg = messages[0]
            fifo = msg.fifo_group is not None
            target = Keys.fifo(stream) if fifo else stream
            entry_id = await self.command("XADD", target, "*", *encode_outgoing(msg))
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

    async def _publish_chunk(self, queue: str, stream: str, chunk: Sequence[Outgoing]) -> list[Any]:
        return await self.run(lambda: self._pipeline(queue, stream, chunk))

    async def _pipeline(self, queue: str, stream: str, chunk: Sequence[Outgoing]) -> list[Any]:
        window_ms = max(1, round(self.options.dedup_window * 1000))
        fifo_stream = Keys.fifo(stream)
        pipe = self.client.pipeline(transaction=False)
        for msg in chunk:
            fields = encode_outgoing(msg)
            fifo = msg.fifo_group is not None
            target = fifo_stream if fifo else stream
            if msg.dedup_id is None:
                pipe.execute_command("XADD", target, "*", *fields)
            else:
                # EVAL, not EVALSHA: a pipeline cannot recover from NOSCRIPT midway
                dedup_key = self.keys.dedup(queue, msg.dedup_id)
                script = self.scripts.publish_dedup.text
                prefix = FIFO_ID_PREFIX if fifo else ""
                pipe.execute_command(
                    "EVAL", script, 2, target, dedup_key, window_ms, prefix, *fields
                )
        return list(await pipe.execute())

    async def ensure_group(self, stream: str, group: str) -> None:
        """``XGROUP CREATE <s> group 0 MKSTREAM`` on the stream and its fifo twin; BUSYGROUP
        (already there) is fine."""
        if (stream, group) in self._groups:
            return

        async def create() -> None:
            for name in (stream, Keys.fifo(stream)):
                try:
                    await command(self.client, "XGROUP", "CREATE", name, group, "0", "MKSTREAM")
                except rex.ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise

        await self.run(create)
        self._groups.add((stream, group))

    async def delete_queue(self, queue: str) -> None:
        """``DEL`` every key of the queue, found by ``SCAN MATCH <prefix>{queue}:*``: both
        streams and their fifo twins (with their consumer groups), the groups' due sets,
        bells and fifo lists, and the dedup keys."""
        pattern = _glob_escape(self.keys.base(queue)) + ":*"

        async def delete() -> None:
            found: list[Any] = []
            async for key in self.client.scan_iter(match=pattern, count=1000):
                found.append(key)
                if len(found) >= 500:
                    await self.client.delete(*found)
                    found.clear()
            if found:
                await self.client.delete(*found)

        await self.run(delete)
        streams = {self.keys.stream(queue), self.keys.stream(queue, dead_letters=True)}
        self._groups = {g for g in self._groups if g[0] not in streams}

    def forget_group(self, stream: str, group: str) -> None:
        self._groups.discard((stream, group))

    async def command(self, *args: Any, patient: bool = False) -> Any:
        """Run one Redis command through the one error-mapping path (``Runner``)."""
        return await self.run(lambda: command(self.client, *args), patient=patient)

    async def script(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], *, patient: bool = False
    ) -> Any:
        """Run a Lua script through the one error-mapping path (``Runner``)."""
        return await self.run(lambda: run_script(self.client, script, keys, args), patient=patient)

    async def subscribe(
        self, queue: str, group: str, settings: ReceiverSettings, *, dead_letters: bool = False
    ) -> Receiver:
        from brokerkit.backends.redis_streams._receiver import RedisReceiver

        stream = self.keys.stream(queue, dead_letters)
        await self.ensure_group(stream, group)
        return RedisReceiver(self, stream, self.keys.stream(queue, True), group, settings)


def _glob_escape(text: str) -> str:
    """``text`` as a literal inside a ``SCAN MATCH`` pattern (the prefix is the user's)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
