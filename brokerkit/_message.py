"""Messages: what a producer sends, what publish returns, what a dead letter carries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish (see ``Broker.publish_many``)."""

    body: bytes
    fifo_group: str | None = None
    dedup_id: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What the broker said about one accepted message.

    ``id`` is the broker's id. ``duplicate`` is True/False where the backend can
    tell that the publish was suppressed by deduplication, else None.
    """

    id: str
    duplicate: bool | None = None


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """Why and when a message died; present on messages read from a DLQ."""

    queue: str
    original_id: str
    reason: str
    attempts: int
    died_at: datetime
    fifo_group: str | None
    dedup_id: str | None
