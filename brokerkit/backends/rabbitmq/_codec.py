"""Messages on the wire: brokerkit's Outgoing -> AMQP properties, a delivery -> its fields.

* body -> the AMQP body, byte-exact; ``delivery_mode=2`` (persistent);
* id -> ``message_id`` (a process-unique token made here; publish returns it);
* user headers -> the AMQP ``headers`` table, as long strings;
* fifo_group -> ``FIFO_GROUP_HEADER``; dedup_id -> ``DEDUP_ID_HEADER``, and the
  publisher's clock and window -> ``DEDUP_STAMP_HEADER`` (``<published_ms>:<until_ms>``);
* attempt <- 1 + ``x-delivery-count``, the quorum queue's count of earlier returns:
  up to 4.2 every return (reject, nack, a channel or connection closing); from 4.3
  ``basic.reject`` and a consumer gone with the message unacked, not ``basic.nack``.
  Above 1 it only marks a redelivery: the receiver takes a redelivery's attempt from the
  attempt book (``_attempts``), which counts hand-outs.

Headers RabbitMQ sets itself are not the user's and are dropped on the way in.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from typing import Any, TypeVar

from pamqp.commands import Basic

from brokerkit.backends import (
    DEDUP_ID_HEADER,
    FIFO_GROUP_HEADER,
    HEADER_PREFIX,
    NO_HEADERS,
    Delivery,
    Outgoing,
    header_defect,
)

__all__ = [
    "DEDUP_STAMP_HEADER",
    "Incoming",
    "new_id",
    "parse",
    "properties",
]

DEDUP_STAMP_HEADER = HEADER_PREFIX + "dedup-stamp"
"""``<published epoch ms>:<dedup window end, epoch ms>`` on messages with a dedup_id."""

_BROKER_HEADERS = frozenset(
    {
        "x-delivery-count",
        "x-acquired-count",
        "x-death",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
        "x-stream-offset",
    }
)
_OURS = frozenset({FIFO_GROUP_HEADER, DEDUP_ID_HEADER, DEDUP_STAMP_HEADER})

R = TypeVar("R")

_process = os.urandom(6).hex()
_serial = itertools.count(1)


def new_id() -> str:
    """A message id unique across processes: 48 random bits per process, then a counter."""
    return f"{_process}-{next(_serial):x}"


def properties(message: Outgoing, message_id: str, dedup_window_ms: int) -> Basic.Properties:
    """The AMQP properties of one outgoing message (persistent, with our id)."""
    headers: dict[str, Any] | None = dict(message.headers) if message.headers else None
    if message.fifo_group is not None:
        headers = headers if headers is not None else {}
        headers[FIFO_GROUP_HEADER] = message.fifo_group
    if message.dedup_id is not None:
        headers = headers if headers is not None else {}
        now_ms = int(time.time() * 1000)
        headers[DEDUP_ID_HEADER] = message.dedup_id
        headers[DEDUP_STAMP_HEADER] = f"{now_ms}:{now_ms + dedup_window_ms}"
    return Basic.Properties(delivery_mode=2, message_id=message_id, headers=headers)


class Incoming:
    """What brokerkit reads from one AMQP delivery."""

    __slots__ = ("attempt", "dedup_id", "defect", "fifo_group", "headers", "id", "stamp")

    def __init__(
        self,
        id: str,
        headers: Mapping[str, str],
        fifo_group: str | None,
        dedup_id: str | None,
        stamp: tuple[int, int] | None,
        attempt: int,
        defect: str | None = None,
    ) -> None:
        self.id = id
        self.headers = headers
        self.fifo_group = fifo_group
        self.dedup_id = dedup_id
        self.stamp = stamp
        self.attempt = attempt
        self.defect = defect
        """What makes the message corrupt (``Delivery.defect``), or None."""

    def delivery(self, body: bytes, attempt: int, receipt: R, dead_letters: bool) -> Delivery[R]:
        dedup_id = None if dead_letters else self.dedup_id
        return Delivery(
            self.id, body, self.headers, self.fifo_group, dedup_id, attempt, receipt,
            defect=self.defect,
        )  # fmt: skip


def _utf8(value: Any) -> str | None:
    """A header value as text: a long string, or bytes that are UTF-8; else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return None
    return None


def parse(props: Basic.Properties, fallback_id: str, grouped: bool = True) -> Incoming:
    """Read id, user headers, group, dedup id and attempt from a delivery's properties.

    brokerkit writes every header as a long string. A message with none of brokerkit's
    own headers (``x-brokerkit-...``) is foreign: its headers that are text (a long
    string, or bytes that are UTF-8) are kept, the rest (numbers, tables, binary) dropped.
    On one with brokerkit's headers a value of another type is a ``defect``, and so is a
    dedup stamp that is not ``<ms>:<ms>``, and a fifo_group on a message of a queue that
    holds no fifo groups (``grouped`` False: the main queue's queue beside the partitions).
    """
    raw = props.headers
    message_id = props.message_id or fallback_id
    if not raw:
        return Incoming(message_id, NO_HEADERS, None, None, None, 1)
    earlier = raw.get("x-delivery-count")
    attempt = 1 + int(earlier) if isinstance(earlier, int) else 1
    ours = any(k.startswith(HEADER_PREFIX) for k in raw)
    defect = None
    text: dict[str, str] = {}
    for key, value in raw.items():
        if key in _BROKER_HEADERS:
            continue
        decoded = value if type(value) is str else _utf8(value)
        if decoded is not None and (type(value) is str or not ours):
            text[key] = decoded
        elif ours and defect is None:
            defect = header_defect(key, f"is {type(value).__name__}, not a string")
    group = text.get(FIFO_GROUP_HEADER)
    dedup = text.get(DEDUP_ID_HEADER)
    stamp: tuple[int, int] | None = None
    if DEDUP_STAMP_HEADER in text:
        published, _, until = text[DEDUP_STAMP_HEADER].partition(":")
        if published.isdigit() and until.isdigit():
            stamp = (int(published), int(until))
        elif defect is None:
            defect = "dedup-stamp header is not <ms>:<ms>"
    if group is not None and not grouped:
        defect = defect or "fifo_group header on a message of the queue without fifo groups"
        group = None
    user: Mapping[str, str] = {k: v for k, v in text.items() if k not in _OURS} or NO_HEADERS
    return Incoming(message_id, user, group, dedup, stamp, attempt, defect)
