"""The dead-letter envelope, written once: DLQ fields travel as reserved headers.

A backend stores a dead letter like any other message (body, the user's
headers plus these, fifo_group); the facade splits them off again on receipt,
so the user's headers come back byte-exact and the fields become a
``DeadLetterInfo``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import quote, unquote

from brokerkit._message import DeadLetterInfo
from brokerkit._validate import RESERVED_HEADER_PREFIX

REASON_MAX_ATTEMPTS = "max_attempts"

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
