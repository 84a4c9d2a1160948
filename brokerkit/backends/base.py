"""The interface for backend authors.

A backend moves bytes and settles receipts; the facade (``brokerkit._broker`` and
``brokerkit._consumer``) owns every policy: validation of names, sizes and
arguments, when a nack becomes a dead letter (``attempt >= max_attempts``), the
DLQ envelope (``brokerkit._dlq``), lease bookkeeping on the caller's side,
settling twice, use after close, redrive, and the bounded retry before
``BrokerUnavailable`` (``brokerkit._retry``).

What the core gives a backend for free:

* validated input: names match the portable rules, bodies are ``bytes`` within
  ``capabilities.max_message_bytes``, headers are ``str -> str`` within limits
  and never use the reserved ``x-brokerkit-`` prefix;
* ``brokerkit._options.parse_options`` for typed URL query options;
* ``brokerkit._retry.retry_unavailable`` for connecting with a bounded retry;
* ``brokerkit._fifo.GroupGate`` (per-fifo_group exclusivity bookkeeping) and
  ``brokerkit._dedup.DedupWindow`` (an expiring id memory), for backends that
  must emulate FIFO groups or deduplication;
* ``brokerkit._dlq.build_envelope`` / ``split_envelope``: the DLQ fields as
  reserved headers, so a backend stores a dead letter like any message.

What a backend must guarantee is stated on each method below. Every driver
exception is mapped to a brokerkit error in one place per backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from brokerkit._errors import UnsupportedFeature
from brokerkit._message import Outgoing, PublishResult
from brokerkit._url import BrokerURL

__all__ = [
    "NO_EXTRAS",
    "NO_HEADERS",
    "Backend",
    "Capabilities",
    "Delivery",
    "Receiver",
    "ReceiverSettings",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})
NO_HEADERS: Mapping[str, str] = _EMPTY
"""The headers of every delivery without any: one shared, read-only mapping (no dict to
allocate, and so none for the garbage collector to scan, per message)."""
NO_EXTRAS: Mapping[str, Any] = _EMPTY
"""The extras of every delivery without any (the same shared, read-only mapping)."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend offers, as data: read by the facade and by the contract suite.

    The suite sizes its tests from these values; it never skips a mandatory
    behaviour because of them. A unit test pins each backend's values.
    """

    max_message_bytes: int
    """Largest body accepted; at least 256 KiB for every backend."""
    dedup_window: float
    """Dedup window in force for this connection, in seconds."""
    dedup_window_configurable: bool
    """True when ``?dedup_window=SECONDS`` is honoured."""
    fan_out: bool
    """True when each consumer group receives every message of the queue."""
    max_headers: int = 32
    max_header_bytes: int = 8192
    max_nack_delay: float = 12 * 3600.0
    """Longest ``nack(delay=)`` honoured exactly."""
    lease_granularity: float = 0.0
    """``ack_timeout`` is rounded up to a multiple of this (SQS: whole seconds)."""
    redelivery_slack: float = 1.0
    """How late after its due time a redelivery or lease expiry may be noticed."""
    ack_flush_interval: float = 0.0
    """Longest time an ``ack()`` may be coalesced before the broker records it (≤ 0.1 s)."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Broker-specific read-outs, documented by the backend."""


@dataclass(slots=True)
class Delivery:
    """A message leased to a receiver, as a backend hands it to the facade."""

    id: str
    """The broker's id of the message (the same id publish returned)."""
    body: bytes
    headers: Mapping[str, str]
    """The user's headers byte-exact, plus the DLQ envelope on dead letters (read-only)."""
    fifo_group: str | None
    dedup_id: str | None
    attempt: int
    """1-based delivery count; durable across consumer restarts and crashes."""
    receipt: Any = None
    """The backend's own handle for settling (receipt handle, offset, entry id)."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Typed broker read-outs (Kafka offset, SQS receipt) documented per backend."""


@dataclass(frozen=True, slots=True)
class ReceiverSettings:
    """Per-consumer settings the facade passes to ``Backend.subscribe``."""

    ack_timeout: float
    """Lease length in seconds; unsettled longer than this means redelivery."""
    max_attempts: int
    """For information: the facade dead-letters at this count, not the backend."""
    prefetch: int
    """Most deliveries the facade will ask for in one ``receive``."""


class Receiver(ABC):
    """One consumer's lease-holding link to a queue (or its DLQ) for one group."""

    @abstractmethod
    async def receive(self, max_messages: int, wait: float) -> list[Delivery]:
        """Lease up to ``max_messages`` messages, waiting at most ``wait`` s for the first.

        Must guarantee: within a consumer group a message is leased to one
        receiver at a time; a lease not settled within ``ack_timeout`` (or
        renewed by ``extend``) ends and the message is delivered again with
        ``attempt + 1``; for one fifo_group at most one message is leased or
        waiting out a nack delay at any time, across every receiver of the
        group, and the group's messages come in publish order. May return an
        empty list. Must be cancellation-safe (a cancelled call loses nothing:
        whatever it leased comes back after ``ack_timeout`` at the latest).
        """

    @abstractmethod
    async def ack(self, delivery: Delivery) -> None:
        """Settle: the message is not delivered to this group again.

        May coalesce for at most ``capabilities.ack_flush_interval``; ``aclose``
        flushes. Raises LeaseExpired when the broker knows the lease was lost.
        """

    @abstractmethod
    async def nack(self, delivery: Delivery, delay: float) -> None:
        """Deliver again (attempt + 1) no sooner than ``delay`` seconds from now.

        A nacked fifo_group message is delivered again before any later message
        of its group, and the group stays held until then.
        """

    @abstractmethod
    async def dead_letter(self, delivery: Delivery, envelope: Mapping[str, str]) -> None:
        """Move the message to the queue's DLQ and settle the original.

        The DLQ copy keeps body, headers (plus ``envelope``) and fifo_group.
        Atomic where the broker allows it; otherwise copy first, then settle,
        so a crash in between leaves a copy in both, never in neither.
        """

    @abstractmethod
    async def extend(self, delivery: Delivery, ack_timeout: float) -> None:
        """Renew the lease for another ``ack_timeout`` seconds from now."""

    async def release(self, deliveries: Sequence[Delivery]) -> None:
        """Give back deliveries the caller never saw (fetched ahead, then the consumer closed).

        They must be redelivered promptly, in order for fifo groups. The
        default nacks each with no delay; a backend that can avoid counting an
        attempt for them should (unsettled messages the caller did see are
        nacked by the facade, which counts).
        """
        for delivery in deliveries:
            await self.nack(delivery, 0.0)

    @abstractmethod
    async def aclose(self) -> None:
        """Stop fetching and flush coalesced acks. Idempotent."""


class Backend(ABC):
    """A broker connection. Registered under the entry-point group ``brokerkit.backends``."""

    schemes: ClassVar[tuple[str, ...]] = ()
    capabilities: Capabilities

    @classmethod
    @abstractmethod
    def from_url(cls, url: BrokerURL) -> Backend:
        """Build an unopened backend from a parsed URL; ConfigError for bad options.

        Must do no I/O.
        """

    @abstractmethod
    async def open(self) -> None:
        """Connect; raise BrokerUnavailable (after a bounded retry) when nobody answers."""

    @abstractmethod
    async def aclose(self) -> None:
        """Close the connection and everything opened through it. Idempotent."""

    @abstractmethod
    async def publish(self, queue: str, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """Publish in order; return once the broker accepted every message durably.

        Creates the queue (and its DLQ) on first use, idempotently and safely
        under concurrent first use. Honours ``dedup_id`` for
        ``capabilities.dedup_window`` seconds, race-free across publishers and
        whether or not the first copy was already consumed; a duplicate returns
        the original id where the broker can tell it. ``fifo_group`` messages
        are later delivered in this order. Inputs are already validated.
        """

    async def delete_queue(self, queue: str) -> None:
        """Delete ``queue`` and its DLQ on the broker: messages, consumer-group state, all.

        Idempotent (a queue that was never created is fine); the facade has closed this
        connection's consumers of the queue first. A backend that cannot delete queues
        keeps this default.
        """
        raise UnsupportedFeature(f"{type(self).__name__} cannot delete queues")

    @abstractmethod
    async def subscribe(
        self, queue: str, group: str, settings: ReceiverSettings, *, dead_letters: bool = False
    ) -> Receiver:
        """Open a receiver for ``group`` on ``queue`` (or on its DLQ).

        Creates the queue, DLQ and group on first use; a new group starts with
        the oldest message still retained, so messages published before the
        first consumer existed are delivered.
        """
