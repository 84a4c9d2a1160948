"""``redis://`` and ``rediss://``: Redis Streams (Redis >= 7.0) through ``redis.asyncio``.

Every contract behaviour maps to a Redis mechanism (docs/backends/redis.md has the
key layout, the Lua scripts' invariants and the crash analysis):

* queue -> stream ``<prefix>{queue}:s``; its DLQ -> stream ``<prefix>{queue}:d``;
* consumer group -> Redis consumer group created at ``0`` (sees retained history);
* lease / attempt -> the group's PEL (durable delivery count) plus a ``due`` ZSET of
  lease deadlines; any consumer claims due entries with ``XCLAIM`` (count + 1);
* nack(delay) -> the entry stays pending, due ``delay`` ms later (server clock);
* DLQ -> one script: ``XADD`` the copy + ``XACK`` the original;
* dedup -> one script: ``GET``/``XADD``/``SET PX`` on a per-queue dedup key;
* FIFO groups -> per (consumer group, fifo_group) lists: only the head is deliverable;
* growth -> consumers ``XTRIM MINID`` below what every consumer group still needs.

``RedisBackend.from_client(client, **options)`` wraps your own ``redis.asyncio.Redis``.
"""

from brokerkit.backends.redis_streams._backend import RedisBackend
from brokerkit.backends.redis_streams._options import RedisOptions

__all__ = ["RedisBackend", "RedisOptions"]
