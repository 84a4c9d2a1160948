"""Raw writer for Redis Streams: entries a foreign producer ``XADD``s to a brokerkit queue.

It writes with redis-py (the backend's own client, built from the URL) straight into the
queue's streams: ``<prefix>{queue}:s`` (messages without a fifo_group) and its fifo twin
``…:sf``. brokerkit's entry fields are ``b`` body, ``g`` fifo_group, ``d`` dedup_id and
``h`` headers (one JSON object of strings).

Kinds: ``bare`` (no brokerkit field at all: ``X-Foreign`` and ``data``, the marker),
``corrupt`` (``h`` is not JSON), ``wrong_type`` (``h`` holds an int value), ``oversize``
(a ``b`` over ``max_message_bytes``, which Redis takes), ``mismatch`` (a ``g`` on an entry
of the plain stream), ``mismatch_fifo`` (an entry of the fifo twin without ``g``),
``no_body`` (``h`` but no ``b``), ``bad_group`` (a ``g`` that is not UTF-8, in the twin).
"""

from __future__ import annotations

from typing import Any

from brokerkit import BrokerURL
from brokerkit.backends.redis_streams import RedisBackend
from brokerkit.backends.redis_streams._keys import Keys

__all__ = ["RedisRawWriter", "writer"]


class RedisRawWriter:
    """Writes raw entries with a redis-py client of its own."""

    extra_kinds: tuple[str, ...] = ("mismatch", "mismatch_fifo", "no_body", "bad_group")

    def __init__(self, url: str) -> None:
        self._backend = RedisBackend.from_url(BrokerURL.parse(url))

    async def write(self, queue: str, kind: str, body: bytes) -> None:
        stream = self._backend.keys.stream(queue)
        fields: dict[Any, Any]
        if kind == "bare":
            fields = {"X-Foreign": "yes", "data": body}
        elif kind == "corrupt":
            fields = {"b": body, "h": b'{"a": '}
        elif kind == "wrong_type":
            fields = {"b": body, "h": b'{"ok":"kept","X-Count":7}'}
        elif kind == "oversize":
            size = self._backend.capabilities.max_message_bytes + 1024
            fields = {"b": body + b"x" * (size - len(body))}
        elif kind == "mismatch":
            fields = {"b": body, "g": "stray-group"}
        elif kind == "mismatch_fifo":
            stream, fields = Keys.fifo(stream), {"b": body}
        elif kind == "no_body":
            fields = {"h": b'{"X-Marker":"%s"}' % body}
        elif kind == "bad_group":
            stream, fields = Keys.fifo(stream), {"b": body, "g": b"\xff\xfe"}
        else:
            raise ValueError(f"unknown kind {kind!r}")
        await self._backend.client.xadd(stream, fields)

    async def aclose(self) -> None:
        await self._backend.aclose()


def writer(url: str) -> RedisRawWriter:
    return RedisRawWriter(url)
