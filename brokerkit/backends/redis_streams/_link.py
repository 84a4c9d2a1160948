"""RedisLink: the connection that the backend and its receivers share (neither owns the other).

It holds the client, the options, the key names and the Lua scripts, runs every command
and script through the one error path (``Runner``: errors mapped, bounded retry), and
remembers which consumer groups this connection has already declared.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from redis import exceptions as rex
from redis.asyncio import Redis

from brokerkit.backends import HostPort
from brokerkit.backends.redis_streams import _lua
from brokerkit.backends.redis_streams._errors import Runner, refusal_code
from brokerkit.backends.redis_streams._keys import Keys, Script, command, run_script
from brokerkit.backends.redis_streams._options import RedisOptions

__all__ = ["SCRIPTS", "RedisLink", "Scripts"]


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


class RedisLink:
    """One Redis connection (a ``redis.asyncio.Redis`` and its pool) and what goes with it."""

    __slots__ = ("_groups", "client", "hosts", "keys", "options", "run", "scripts")

    def __init__(self, client: Redis, options: RedisOptions, hosts: Sequence[HostPort]) -> None:
        self.client = client
        self.options = options
        self.hosts = tuple(hosts)
        self.keys = Keys(options.prefix)
        self.run = Runner(self.hosts, options.socket_timeout)
        self.scripts = SCRIPTS
        self._groups: set[tuple[str, str]] = set()

    def where(self) -> str:
        return ", ".join(str(h) for h in self.hosts) or "redis"

    async def command(self, *args: Any, patient: bool = False, wait: float = 0.0) -> Any:
        """Run one Redis command through the one error-mapping path (``Runner``); ``wait``:
        how long it may block server-side (``XREAD BLOCK``), on top of ``socket_timeout``."""
        return await self.run(lambda: command(self.client, *args), patient=patient, wait=wait)

    async def script(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], *, patient: bool = False
    ) -> Any:
        """Run a Lua script through the one error-mapping path (``Runner``)."""
        return await self.run(lambda: run_script(self.client, script, keys, args), patient=patient)

    async def declare_group(self, stream: str, group: str) -> None:
        """``XGROUP CREATE <s> group 0 MKSTREAM`` on the stream and its fifo twin, once per
        connection; BUSYGROUP (already there) is fine. A new group starts at the oldest entry."""
        if (stream, group) in self._groups:
            return
        await self.run(lambda: self._create_group(stream, group))
        self._groups.add((stream, group))

    async def _create_group(self, stream: str, group: str) -> None:
        for name in (stream, Keys.fifo(stream)):
            try:
                await command(self.client, "XGROUP", "CREATE", name, group, "0", "MKSTREAM")
            except rex.ResponseError as exc:
                if refusal_code(exc) != "BUSYGROUP":
                    raise

    def forget_group(self, stream: str, group: str) -> None:
        """The group vanished on the server (FLUSHDB, DEL): the next declare recreates it."""
        self._groups.discard((stream, group))

    def forget_streams(self, streams: Collection[str]) -> None:
        """Every group of these streams (the queue was deleted)."""
        self._groups = {g for g in self._groups if g[0] not in streams}
