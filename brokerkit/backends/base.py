"""The seam between the facade and a backend: two ABCs and the values they exchange.

A backend moves bytes and settles receipts; the facade (``brokerkit.Broker``,
``Consumer``, ``Message``) owns every policy: validation of names, sizes and
arguments, when a nack becomes a dead letter (``attempt >= max_attempts``), the DLQ
envelope, lease bookkeeping on the caller's side, settling twice, use after close,
and redrive. Seven methods are required (``Backend.from_url``, ``publish``,
``subscribe``; ``Receiver.receive``, ``ack``, ``nack``, ``extend``); the rest have
defaults a backend overrides only when its broker does better.

Import everything from ``brokerkit.backends`` (the toolkit: these ABCs plus the option
parser, the bounded connect retry, the error map, the FIFO gate, the dedup memory and
the lease scheduler). What a backend must guarantee is stated on each method below and
proven by ``brokerkit check yourscheme://...``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Generic, TypeVar

from brokerkit._errors import UnsupportedFeature
from brokerkit._message import Outgoing, PublishResult, QueueStats
from brokerkit._url import BrokerURL

__all__ = [
    "NO_EXTRAS",
    "NO_HEADERS",
    "Backend",
    "Capabilities",
    "Delivery",
    "PublishCopy",
    "QueueRef",
    "Receiver",
    "ReceiverSettings",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})
NO_HEADERS: Mapping[str, str] = _EMPTY
"""The headers of every delivery without any: one shared, read-only mapping (no dict to
allocate, and so none for the garbage collector to scan, per message)."""
NO_EXTRAS: Mapping[str, Any] = _EMPTY
"""The extras of every delivery without any (the same shared, read-only mapping)."""

R = TypeVar("R")
"""A backend's receipt type: what it needs to settle one delivery."""

PublishCopy = Callable[[Outgoing], Awaitable[PublishResult]]
"""Publishes one message to a queue's DLQ: handed to ``Receiver.dead_letter``."""


@dataclass(frozen=True, slots=True)
class QueueRef:
    """Which log of a queue: the queue itself or its dead-letter queue (``.dlq``).

    ``name`` is the user's queue name (validated); a backend derives its broker-side
    names (stream, topic, FIFO queue) from it and from ``dead_letters``.
    """

    name: str
    dead_letters: bool = False

    @property
    def dlq(self) -> QueueRef:
        """The DLQ of this queue."""
        return QueueRef(self.name, True)

    @property
    def main(self) -> QueueRef:
        """The queue itself (for a DLQ ref: the queue it belongs to)."""
        return QueueRef(self.name, False)

    def __str__(self) -> str:
        return f"{self.name} (DLQ)" if self.dead_letters else self.name


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend offers, as data: read by the facade and by the contract suite.

    Fixed when the backend is constructed (before any I/O): the facade validates input
    against it before connecting. The suite sizes its tests from these values; it never
    skips a mandatory behaviour because of them. A unit test pins each backend's values.
    """

    max_message_bytes: int
    """Largest body accepted; at least 256 KiB for every backend."""
    dedup_window: float
    """Dedup window in force for this connection, in seconds."""
    dedup_window_configurable: bool
    """True when ``?dedup_window=SECONDS`` is honoured."""
    fan_out: bool
    """True when each consumer group receives every message of the queue. When False, a
    second consumer group on a queue is refused with UnsupportedFeature."""
    max_headers: int = 32
    max_header_bytes: int = 8192
    max_nack_delay: float = 12 * 3600.0
    """Longest ``nack(delay=)`` honoured exactly."""
    redelivery_slack: float = 1.0
    """How late after its due time a redelivery or lease expiry may be noticed."""
    ack_flush_interval: float = 0.0
    """Longest time an ``ack()`` may be coalesced before the broker records it (≤ 0.1 s)."""
    browse: bool = False
    """True when ``Backend.browse`` reads without side effects (no lease, no attempt
    counted, no order or broker state changed)."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Broker-specific read-outs, documented by the backend."""


@dataclass(slots=True)
class Delivery(Generic[R]):
    """A message leased to a receiver, as a backend hands it to the facade.

    The facade never reads ``receipt``: it hands the delivery back to the receiver that
    made it. Treat a delivery as immutable once handed out.
    """

    id: str
    """The broker's id of the message (the same id publish returned)."""
    body: bytes
    headers: Mapping[str, str]
    """The user's headers byte-exact, plus the DLQ envelope on dead letters (read-only)."""
    fifo_group: str | None
    dedup_id: str | None
    attempt: int
    """1-based delivery count; durable across consumer restarts and crashes."""
    receipt: R
    """The backend's own handle for settling (a lease token, an offset, a receipt handle)."""
    extras: Mapping[str, Any] = field(default_factory=lambda: NO_EXTRAS)
    """Typed broker read-outs (Kafka offset, SQS receipt) documented per backend."""
    defect: str | None = None
    """What makes this message corrupt (a brokerkit field present but undecodable, a header
    value of a type brokerkit never writes, fields that disagree), or None. Set by the
    receiver that decoded it, never raised: ``body`` and ``headers`` hold what could be
    decoded. The facade dead-letters such a delivery, reason ``corrupt: <defect>``,
    instead of handing it out (from a DLQ it is handed out as it is); ``browse`` shows it.
    A body over ``capabilities.max_message_bytes`` is found by the facade itself."""


@dataclass(frozen=True, slots=True)
class ReceiverSettings:
    """Per-consumer settings the facade passes to ``Backend.subscribe``."""

    ack_timeout: float
    """Lease length in seconds; unsettled longer than this means redelivery."""
    max_unsettled: int | None = None
    """Most deliveries the consumer holds unsettled at once: fetched ahead (its prefetch)
    plus handed out (its max_in_flight); None when unknown. A backend whose broker caps
    unacknowledged deliveries (a ``basic.qos``, a ``max_ack_pending``) must allow this
    many, or the iterator stalls below the caller's max_in_flight."""


class Receiver(ABC, Generic[R]):
    """One consumer's lease-holding link to a queue (or its DLQ) for one group."""

    release_uncounted: ClassVar[bool] = False
    """True when ``release`` gives deliveries back without counting an attempt. The
    facade then gives back what it fetched ahead before it hands out a redelivered
    message (attempt > 1, perhaps the one that crashed a consumer), so that a crash
    while handling it counts no attempt for its neighbours."""

    wants_handing_out: ClassVar[bool] = False
    """True when ``handing_out`` does something: the facade then calls it."""

    @abstractmethod
    async def receive(self, max_messages: int, wait: float) -> list[Delivery[R]]:
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
    async def ack(self, delivery: Delivery[R]) -> None:
        """Settle: the message is not delivered to this group again.

        May coalesce for at most ``capabilities.ack_flush_interval``; ``flush_acks``
        and ``aclose`` flush. Raises LeaseExpired when the backend knows the lease was lost.
        """

    @abstractmethod
    async def nack(self, delivery: Delivery[R], delay: float) -> None:
        """Deliver again (attempt + 1) no sooner than ``delay`` seconds from now.

        A nacked fifo_group message is delivered again before any later message
        of its group, and the group stays held until then.
        """

    @abstractmethod
    async def extend(self, delivery: Delivery[R], ack_timeout: float) -> None:
        """Renew the lease for another ``ack_timeout`` seconds from now."""

    async def dead_letter(
        self, delivery: Delivery[R], copy: Outgoing, publish: PublishCopy
    ) -> None:
        """Move the message to the queue's DLQ and settle the original.

        ``copy`` is the DLQ copy the facade built (body, the user's headers plus the
        envelope, fifo_group; no dedup id). The default checks the lease
        (``check_lease``), copies through ``publish`` (the backend's own ``publish`` to
        the queue's DLQ), then acks, so a crash in between leaves a copy in both, never
        in neither, and a lease known lost leaves none. Override it where the broker can
        move atomically. Raises LeaseExpired when the lease was lost.
        """
        self.check_lease(delivery)
        await publish(copy)
        await self.ack(delivery)

    def check_lease(self, delivery: Delivery[R]) -> None:
        """Raise LeaseExpired when this receiver knows the lease on ``delivery`` is lost
        (ran out, or the broker took it back). The default ``dead_letter`` calls it before
        it copies, so a delivery already given to another holder is not also copied to
        the DLQ. The default knows nothing; a backend whose ``ack`` checks a lease of its
        own overrides it with that check."""

    async def handing_out(self, delivery: Delivery[R], unseen: Sequence[Delivery[R]]) -> None:
        """The facade hands this redelivered message (attempt > 1) to its caller now;
        ``unseen`` is what it fetched ahead and holds (not yet handed out).

        It may be the message that killed its last consumers, and may kill this one. A
        broker that counts an attempt for every message it hands over, seen or not, and
        cannot always take one back (SQS: a fifo group's message), can make what is held
        unseen come back apart from it, so that repeated crashes do not count those
        neighbours again each time. Called only if ``wants_handing_out``.
        """

    async def flush_acks(self) -> None:
        """Return once every ack that returned so far is recorded by the broker: coalesced
        acks sent and confirmed (a barrier where the broker's ack has no reply). May raise
        BrokerUnavailable when the broker does not confirm within the request timeout.

        The facade calls it before it hands out any redelivery (``attempt > 1``) and after
        the ack of a last attempt: the next hand-out may be a poison, and a crash that lost
        a coalesced ack would count an attempt for a message already done. The default does nothing,
        which is right for a backend whose ``ack`` returns recorded; one that coalesces
        (``capabilities.ack_flush_interval`` > 0) overrides it, else the facade waits the
        interval out instead.
        """

    async def release(self, deliveries: Sequence[Delivery[R]]) -> None:
        """Give back deliveries the caller never saw (fetched ahead, then the consumer closed).

        They must be redelivered promptly, in order for fifo groups. The
        default nacks each with no delay; a backend that can avoid counting an
        attempt for them should (unsettled messages the caller did see are
        nacked by the facade, which counts).
        """
        for delivery in deliveries:
            await self.nack(delivery, 0.0)

    async def aclose(self) -> None:
        """Stop fetching and flush coalesced acks. Idempotent. The default does nothing."""


class Backend(ABC):
    """A broker connection. Registered under the entry-point group ``brokerkit.backends``."""

    schemes: ClassVar[tuple[str, ...]] = ()
    capabilities: Capabilities
    """Set in ``__init__`` and never replaced (see ``Capabilities``)."""

    @classmethod
    @abstractmethod
    def from_url(cls, url: BrokerURL) -> Backend:
        """Build an unopened backend from a parsed URL; ConfigError for bad options.

        Must do no I/O.
        """

    async def open(self) -> None:  # noqa: B027 - a default, not an abstract method
        """Connect; raise BrokerUnavailable (after a bounded retry) when nobody answers.

        The default does nothing (a backend without a connection of its own).
        """

    async def aclose(self) -> None:  # noqa: B027 - a default, not an abstract method
        """Close the connection and everything opened through it. Idempotent."""

    @abstractmethod
    async def publish(self, queue: QueueRef, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """Publish in order to ``queue`` (or its DLQ); return once the broker accepted
        every message durably.

        Creates the queue (and its DLQ) on first use, idempotently and safely
        under concurrent first use. Honours ``dedup_id`` for
        ``capabilities.dedup_window`` seconds, race-free across publishers and
        whether or not the first copy was already consumed; a duplicate returns
        the original id where the broker can tell it. ``fifo_group`` messages
        are later delivered in this order. Inputs are already validated.
        """

    @abstractmethod
    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> Receiver[Any]:
        """Open a receiver for consumer group ``group`` on ``queue`` (or its DLQ).

        Creates the queue, DLQ and group on first use; a new group starts with
        the oldest message still retained, so messages published before the
        first consumer existed are delivered.
        """

    async def declare(self, queue: QueueRef, group: str | None = None) -> None:  # noqa: B027
        """Create ``queue``, its DLQ and (if given) consumer ``group`` now, idempotently.

        The separate least-privilege step of CONTRACT section 3: an operator declares,
        services then run with publish/consume rights only. The default does nothing,
        for backends that create everything on first use anyway.
        """

    async def browse(self, queue: QueueRef, limit: int) -> list[Delivery[None]]:
        """Up to ``limit`` of the oldest messages still in ``queue`` (or its DLQ), oldest
        first, read without any side effect: no lease, no attempt counted, nothing moved.

        ``attempt`` is 0 where the backend does not know a count without a delivery.
        Only where ``capabilities.browse`` is True; the default refuses.
        """
        raise UnsupportedFeature(f"{type(self).__name__} cannot browse without side effects")

    async def stats(self, queue: QueueRef, group: str | None) -> QueueStats:
        """What the broker can tell about ``queue`` (or its DLQ) for ``group``; the facade
        fills ``dead`` from the DLQ's own figures. The default knows nothing."""
        return QueueStats()

    async def delete_queue(self, queue: str) -> None:
        """Delete ``queue`` and its DLQ on the broker: messages, consumer-group state, all.

        Idempotent (a queue that was never created is fine); the facade has closed this
        connection's consumers of the queue first. A backend that cannot delete queues
        keeps this default.
        """
        raise UnsupportedFeature(f"{type(self).__name__} cannot delete queues")
