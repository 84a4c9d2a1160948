"""Raw writers: each broker's OWN client writing into brokerkit's queues, as a foreign
producer, an older version or a bug would. Used by test_broker_side_input.

``raw_writer(url)`` picks the module by the URL's scheme and imports it only then (its
driver with it); a URL of a backend without a module here (a third party's) has none,
and the test reports the behaviour as not run for it, never as a pass.

Generic kinds every writer supports: ``bare`` (no brokerkit fields at all), ``corrupt``
(a brokerkit header, attribute or field present but undecodable), ``wrong_type`` (a
header value of a type brokerkit never writes), ``oversize`` (a body over
``capabilities.max_message_bytes``; where the broker itself refuses it the writer raises
NotApplicable, the only NotApplicable allowed among the generic kinds). ``extra_kinds``
names each broker's own traps.
"""

from __future__ import annotations

import importlib
from typing import Protocol

__all__ = ["GENERIC_KINDS", "NotApplicable", "RawWriter", "raw_writer"]

GENERIC_KINDS = ("bare", "corrupt", "wrong_type", "oversize")

_MODULES = {
    "memory": "memory",
    "redis": "redis",
    "rediss": "redis",
    "amqp": "rabbitmq",
    "amqps": "rabbitmq",
    "nats": "nats",
    "tls": "nats",
    "kafka": "kafka",
    "sqs": "sqs",
}


class NotApplicable(Exception):
    """The broker itself refuses this kind of raw message (said by ``write``)."""


class RawWriter(Protocol):
    extra_kinds: tuple[str, ...]
    """Broker-specific kinds beyond the generic ones."""

    async def write(self, queue: str, kind: str, body: bytes) -> None:
        """Write one raw message of ``kind`` into brokerkit's main queue ``queue`` (already
        created by brokerkit: the test publishes or declares first) with the broker's OWN
        client, as a foreign producer would. ``body`` marks it for the test."""

    async def aclose(self) -> None: ...


def raw_writer(url: str) -> RawWriter | None:
    """The raw writer for ``url`` by its scheme, or None (no module for that backend)."""
    module = _MODULES.get(url.partition("://")[0].lower())
    if module is None:
        return None
    found = importlib.import_module(f"{__name__}.{module}")
    made: RawWriter = found.writer(url)
    return made
