"""What a receiver holds: the RabbitMQ queues it consumes, each delivery, each lease."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from brokerkit.backends.rabbitmq._codec import Incoming

__all__ = [
    "DELAYED",
    "GONE",
    "LEASED",
    "READY",
    "RETURNING",
    "Held",
    "Lease",
    "Source",
    "held_room",
    "size",
]

READY, LEASED, DELAYED, RETURNING, GONE = range(5)
"""READY: deliverable (a grouped one only as its group's head); LEASED: handed out;
DELAYED: nacked, kept unacked here until due; RETURNING: ``basic.reject`` sent, the copy
not back yet; GONE: acked or given back."""


@dataclass(eq=False, slots=True)
class Source:
    """One RabbitMQ queue a receiver consumes."""

    name: str
    ordered: bool
    """A single-active-consumer partition: its groups are gated and held here."""
    prefetch: int = 0
    """``basic.qos`` of this queue's consumer (set when consuming starts)."""
    consumer_tag: str | None = None
    staging: deque[Held] = field(default_factory=deque)
    """Deliveries waiting for a dedup verdict (and whatever arrived behind them)."""


class Held:
    """One delivery, unacked on the receiver's channel."""

    __slots__ = (
        "attempt",
        "body",
        "booked",
        "deadline",
        "generation",
        "group",
        "incoming",
        "seen",
        "source",
        "state",
        "tag",
        "token",
    )

    def __init__(
        self, source: Source, tag: int, generation: int, incoming: Incoming, body: bytes
    ) -> None:
        self.source = source
        self.tag = tag
        self.generation = generation
        self.incoming = incoming
        self.body = body
        self.group = incoming.fifo_group if source.ordered else None
        self.state = READY
        self.token = 0
        self.deadline = 0.0
        self.seen = False
        """Handed out at least once: giving it back is a failed attempt (reject)."""
        self.booked = False
        """This hand-out of a redelivery is recorded in the attempt book (``_attempts``)."""
        self.attempt = incoming.attempt
        """The attempt handed out: the broker's count, or the book's for a redelivery."""

    @property
    def key(self) -> str:
        """This message's key in the attempt book."""
        return f"{self.source.name}/{self.incoming.id}"


class Lease:
    """A delivery's receipt: the held delivery and the token of this lease."""

    __slots__ = ("held", "token")

    def __init__(self, held: Held, token: int) -> None:
        self.held = held
        self.token = token


QOS_MAX = 65535
"""``basic.qos`` prefetch-count is a 16-bit field."""


def held_room(max_held: int, explicit: bool, max_unsettled: int | None, fetch: int) -> int:
    """What the caller may hold unsettled, for ``basic.qos``: ``?max_held=`` when given;
    otherwise the consumer's ``max_in_flight`` (``max_unsettled`` minus its prefetch
    ``fetch``) plus ``max_held``'s default as room for deliveries waiting out a nack
    delay, so that with nothing settled the consumer is handed its whole max_in_flight."""
    if explicit or max_unsettled is None:
        return max_held
    return max(max_unsettled - fetch, 0) + max_held


def size(sources: Sequence[Source], ahead: int, held: int, *, shared: bool = True) -> None:
    """Set each source's ``basic.qos``: what may be fetched ahead (``ahead``: ``?prefetch=``
    or the consumer's prefetch) plus what the caller may hold unsettled (``held``, see
    ``held_room``), RabbitMQ counting every unacked delivery; with ``shared`` each
    partition gets a share of both, at least 1 (``?max_held=`` given), otherwise each
    gets the whole (everything held may be of one partition: a partition has one
    consumer, so the extra room only bounds what it may push to it). At most QOS_MAX."""
    ahead = max(1, ahead)
    ordered = sum(1 for s in sources if s.ordered) or 1
    for source in sources:
        if source.ordered and shared:
            qos = -(-ahead // ordered) + -(-held // ordered)
        else:
            qos = ahead + held
        source.prefetch = min(qos, QOS_MAX)
