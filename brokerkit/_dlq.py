"""The dead-letter envelope, written once: DLQ fields travel as reserved headers.

A backend stores a dead letter like any other message (body, the user's
headers plus these, fifo_group); the facade splits them off again on receipt,
so the user's headers come back byte-exact and the fields become a
``DeadLetterInfo``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from brokerkit._errors import BrokerkitError, InvalidArgument, MessageTooLarge
from brokerkit._message import DeadLetterInfo, Outgoing, PublishResult
from brokerkit._validate import RESERVED_HEADER_PREFIX
from brokerkit.backends.base import Backend, Delivery, QueueRef, Receiver

_log = logging.getLogger("brokerkit.consumer")

REASON_MAX_ATTEMPTS = "max_attempts"
CORRUPT = "corrupt: "
"""The reason of a message dead-lettered because it could not be decoded starts so."""

_P = RESERVED_HEADER_PREFIX + "dlq-"
_FIELDS = ("queue", "id", "reason", "attempts", "died-at", "fifo-group", "dedup-id")


def build_envelope(
    *,
    queue: str,
    original_id: str,
    reason: str,
    attempts: int,
    fifo_group: str | None,
    dedup_id: str | None,
    died_at: datetime | None = None,
) -> dict[str, str]:
    """The reserved headers that describe a death. Values are ASCII-safe (percent-encoded)."""
    when = (died_at or datetime.now(UTC)).isoformat()
    values = {
        "queue": queue,
        "id": original_id,
        "reason": reason,
        "attempts": str(attempts),
        "died-at": when,
        "fifo-group": fifo_group or "",
        "dedup-id": dedup_id or "",
    }
    return {_P + k: quote(v, safe="") for k, v in values.items()}


def dlq_copy(
    delivery: Delivery[Any],
    *,
    queue: str,
    reason: str,
    attempts: int,
    max_bytes: int,
    bare: str = "",
) -> Outgoing:
    """The DLQ copy of ``delivery``: body, headers and the envelope.

    A body over ``max_bytes`` (which the DLQ would refuse) is left out, and so is every
    header but the envelope when ``bare`` names why a full copy was refused; the reason
    says what the copy lacks.
    """
    body, headers = delivery.body, delivery.headers
    if len(body) > max_bytes:
        reason += f" (DLQ copy without its body of {len(body)} bytes: over {max_bytes})"
        body = b""
    if bare:
        reason += f" (DLQ copy without body and headers: {bare})"
        body, headers = b"", {}
    envelope = build_envelope(
        queue=queue,
        original_id=delivery.id,
        reason=reason,
        attempts=attempts,
        fifo_group=delivery.fifo_group,
        dedup_id=delivery.dedup_id,
    )
    return Outgoing(body, delivery.fifo_group, None, {**headers, **envelope})


async def move(
    backend: Backend | None,
    receiver: Receiver[Any],
    ref: QueueRef,
    delivery: Delivery[Any],
    reason: str,
    attempts: int,
) -> None:
    """Dead-letter ``delivery`` (of queue ``ref``) through its receiver.

    Should the DLQ refuse the copy itself (too large for it, a header it cannot carry),
    one without the message's own body and headers goes instead: a message is never
    redelivered forever because its DLQ copy cannot be written.
    """
    assert backend is not None  # the consumer's, set together with its receiver
    dlq = ref.dlq

    async def publish(message: Outgoing) -> PublishResult:
        return (await backend.publish(dlq, [message]))[0]

    limit = backend.capabilities.max_message_bytes
    copy = dlq_copy(delivery, queue=ref.name, reason=reason, attempts=attempts, max_bytes=limit)
    try:
        await receiver.dead_letter(delivery, copy, publish)
    except (MessageTooLarge, InvalidArgument) as exc:
        why = f"the DLQ refused it, {type(exc).__name__}"
        bare = dlq_copy(
            delivery, queue=ref.name, reason=reason, attempts=attempts, max_bytes=limit, bare=why
        )
        await receiver.dead_letter(delivery, bare, publish)


async def dead_letter_corrupt(
    move_to_dlq: Callable[[Delivery[Any], str], Awaitable[None]],
    delivery: Delivery[Any],
    consumer: object,
) -> None:
    """A message that could not be decoded goes to the DLQ, never to the caller of
    ``consumer``; should that fail now, its lease runs out and it comes back, to be
    dead-lettered then (a warning on the ``brokerkit.consumer`` logger)."""
    defect = delivery.defect or f"body of {len(delivery.body)} bytes over max_message_bytes"
    try:
        await move_to_dlq(delivery, CORRUPT + defect)
    except BrokerkitError as exc:
        _log.warning("%r: corrupt message %r not dead-lettered yet: %s", consumer, delivery.id, exc)


def split_envelope(headers: Mapping[str, str]) -> tuple[dict[str, str], DeadLetterInfo | None]:
    """Split reserved DLQ headers off; return the user's headers and the info (or None)."""
    if not any(k.startswith(_P) for k in headers):
        return dict(headers), None
    user = {k: v for k, v in headers.items() if not k.startswith(_P)}
    raw = {k: unquote(headers.get(_P + k, "")) for k in _FIELDS}
    try:
        attempts = int(raw["attempts"])
        died_at = datetime.fromisoformat(raw["died-at"])
    except ValueError:
        attempts, died_at = 0, datetime.fromtimestamp(0, UTC)
    info = DeadLetterInfo(
        queue=raw["queue"],
        original_id=raw["id"],
        reason=raw["reason"],
        attempts=attempts,
        died_at=died_at,
        fifo_group=raw["fifo-group"] or None,
        dedup_id=raw["dedup-id"] or None,
    )
    return user, info
