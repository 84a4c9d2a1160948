"""Raw writer for NATS JetStream: messages a foreign producer puts into a brokerkit queue.

It publishes with nats-py (``JetStreamContext.publish``, awaiting the PubAck) onto the
queue's stream, on the subjects brokerkit's layout names (``<prefix>.q.<queue>.u``), so
the server stores each message as it would any other producer's.

Kinds: ``bare`` (no brokerkit header; a foreign NATS header ``X-Foreign``), ``corrupt``
(``x-brokerkit-headers`` is not JSON), ``wrong_type`` (``x-brokerkit-headers`` is JSON
but not an object: ``[1,2]``), ``oversize`` (a body over ``max_message_bytes`` that the
server's ``max_payload`` still takes), ``unfiltered_subject`` (a subject inside the
queue's stream that no durable consumer filters: ``<prefix>.q.<queue>.stray``) and
``group_subject`` (a fifo_group header on a message of ``.u``, not its partition's).
"""

from __future__ import annotations

from brokerkit import BrokerURL
from brokerkit.backends import FIFO_GROUP_HEADER
from brokerkit.backends.nats import NatsBackend
from brokerkit.backends.nats._layout import USER_HEADERS, QueueLayout

from . import NotApplicable

__all__ = ["NatsRawWriter", "writer"]

FOREIGN_HEADER = "X-Foreign"
"""The NATS header every ``bare`` message carries (kept as ``msg.headers`` on delivery)."""


class NatsRawWriter:
    """Writes raw messages with nats-py through a connection of its own."""

    extra_kinds: tuple[str, ...] = ("unfiltered_subject", "group_subject")

    def __init__(self, url: str) -> None:
        self._backend = NatsBackend.from_url(BrokerURL.parse(url))
        self._opened = False

    async def write(self, queue: str, kind: str, body: bytes) -> None:
        backend = self._backend
        if not self._opened:
            await backend.open()
            self._opened = True
        opts = backend.options
        root = QueueLayout.of(opts.prefix, queue, dead_letters=False, partitions=1).subject_root
        subject = f"{root}.u"
        headers: dict[str, str] | None = None
        if kind == "bare":
            headers = {FOREIGN_HEADER: "yes"}
        elif kind == "corrupt":
            headers = {USER_HEADERS: '{"a": '}
        elif kind == "wrong_type":
            headers = {USER_HEADERS: "[1,2]"}
        elif kind == "oversize":
            max_payload = backend.max_payload or 0
            size = backend.capabilities.max_message_bytes + 1024
            if size > max_payload - 1024:
                raise NotApplicable(f"the server's max_payload {max_payload} refuses it")
            body = body + b"x" * (size - len(body))
        elif kind == "unfiltered_subject":
            subject = f"{root}.stray"
        elif kind == "group_subject":  # a fifo_group on the subject of messages without one
            headers = {FIFO_GROUP_HEADER: "raw-group"}
        else:
            raise ValueError(f"unknown kind {kind!r}")
        await backend.link.js.publish(subject, body, headers=headers)

    async def aclose(self) -> None:
        await self._backend.aclose()


def writer(url: str) -> NatsRawWriter:
    """The raw writer for a ``nats://`` / ``tls://`` URL (connects on the first write)."""
    return NatsRawWriter(url)
