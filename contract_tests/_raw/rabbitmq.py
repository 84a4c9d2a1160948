"""Raw writer for RabbitMQ: messages a foreign producer publishes into a brokerkit queue.

It publishes with aiormq (the driver brokerkit's backend runs on; a channel of a
connection of its own, publisher confirms on, ``mandatory``) to the default exchange
with the queue's quorum queue ``<prefix>.<queue>`` (the one without fifo groups) as the
routing key. brokerkit writes every header as an AMQP long string; its own are
``x-brokerkit-fifo-group``, ``x-brokerkit-dedup-id`` and ``x-brokerkit-dedup-stamp``.

Kinds: ``bare`` (no brokerkit header, no message id; the foreign headers ``X-Foreign``, an
int ``X-Count`` and a binary ``X-Blob``), ``corrupt`` (a dedup id that is binary and not
UTF-8), ``wrong_type`` (the dedup stamp as an int), ``oversize`` (a body over
``max_message_bytes``, which the broker's own ``max_message_size`` still takes, else
NotApplicable) and ``misrouted_group`` (a fifo_group header on a message of the queue
without fifo groups: fields that disagree with where the message is).
"""

from __future__ import annotations

from typing import Any

from pamqp.commands import Basic

from brokerkit import BrokerURL
from brokerkit.backends import DEDUP_ID_HEADER, FIFO_GROUP_HEADER
from brokerkit.backends.rabbitmq import RabbitBackend
from brokerkit.backends.rabbitmq._codec import DEDUP_STAMP_HEADER
from brokerkit.backends.rabbitmq._topology import Topology

from . import NotApplicable

__all__ = ["RabbitRawWriter", "writer"]

BROKER_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
"""RabbitMQ's own ``max_message_size`` (its default, and what the test broker runs)."""


class RabbitRawWriter:
    """Writes raw messages with aiormq through a connection of its own."""

    extra_kinds: tuple[str, ...] = ("misrouted_group",)

    def __init__(self, url: str) -> None:
        self._backend = RabbitBackend.from_url(BrokerURL.parse(url))
        self._opened = False

    async def write(self, queue: str, kind: str, body: bytes) -> None:
        backend = self._backend
        headers: dict[str, Any]
        if kind == "bare":
            headers = {"X-Foreign": "yes", "X-Count": 7, "X-Blob": bytearray(b"\xff\xfe")}
        elif kind == "corrupt":
            headers = {DEDUP_ID_HEADER: bytearray(b"\xff\xfe")}
        elif kind == "wrong_type":
            headers = {"ok": "kept", DEDUP_STAMP_HEADER: 12345}
        elif kind == "oversize":
            size = backend.capabilities.max_message_bytes + 1024
            if size > BROKER_MAX_MESSAGE_SIZE:
                raise NotApplicable(f"RabbitMQ's max_message_size {BROKER_MAX_MESSAGE_SIZE}")
            body = body + b"x" * (size - len(body))
            headers = {}
        elif kind == "misrouted_group":
            headers = {FIFO_GROUP_HEADER: "stray-group"}
        else:
            raise ValueError(f"unknown kind {kind!r}")
        if not self._opened:
            await backend.open()
            self._opened = True
        channel = await backend._link.publisher()
        props = Basic.Properties(delivery_mode=2, headers=headers or None)
        target = Topology(backend.options.prefix, queue).free
        confirm = await channel.basic_publish(
            body, routing_key=target, properties=props, mandatory=True
        )
        if not isinstance(confirm, Basic.Ack):
            raise RuntimeError(f"RabbitMQ did not take the raw message: {confirm!r}")

    async def aclose(self) -> None:
        await self._backend.aclose()


def writer(url: str) -> RabbitRawWriter:
    return RabbitRawWriter(url)
