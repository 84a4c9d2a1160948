"""Where things live on the server: stream, subject and consumer names, and the header codec.

Layout for queue ``Q`` (``P`` = the stream's fixed partition count)::

    stream <prefix>_q_Q   subjects <prefix>.q.Q.>   the queue
        <prefix>.q.Q.u          messages without a fifo_group
        <prefix>.q.Q.p.<n>      fifo_group messages, n = crc32(fifo_group) % P
    stream <prefix>_d_Q   subjects <prefix>.d.Q.>   its dead-letter queue (same shape)

    durable consumers of consumer group G on each stream:
        u_G       filter .u,     max_ack_pending = options.max_ack_pending
        p<n>_G    filter .p.<n>, max_ack_pending = 1   (one unsettled per partition)

Queue and group names are portable names (``[A-Za-z0-9][A-Za-z0-9_-]*``), so
they are valid stream, subject-token and consumer names as they are; a
fifo_group never appears in a subject (it may hold ``.``, ``*`` or ``>``), only
its hash does. The prefix has no ``_``, so the first ``_`` ends it and no two
(prefix, kind, queue) triples share a stream name.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from brokerkit.backends import FIFO_GROUP_HEADER, HEADER_PREFIX, json_headers, valid_token

__all__ = [
    "DEDUP_HEADER",
    "USER_HEADERS",
    "QueueLayout",
    "decode_headers",
    "encode_headers",
    "partition_of",
]

DEDUP_HEADER = "Nats-Msg-Id"
"""The server's own dedup field: the user's ``dedup_id`` on a queue, a derived id on a DLQ
(NATS has a native field, so the toolkit's ``DEDUP_ID_HEADER`` is not used)."""
USER_HEADERS = HEADER_PREFIX + "headers"
"""The user's headers as one ASCII JSON object (byte-exact for any str -> str). The
message's fifo_group travels in the toolkit's ``FIFO_GROUP_HEADER`` (printable ASCII
without spaces: a safe header value)."""
_LEGACY_USER_HEADERS, _LEGACY_GROUP = HEADER_PREFIX + "h", HEADER_PREFIX + "g"
"""The names brokerkit used before the toolkit's: still read, so messages stored by an
earlier version keep their headers and fifo_group."""
_PREFIX_LEN = len(HEADER_PREFIX)
HEADER_ROOM = 64 * 1024
"""Bytes of ``max_payload`` kept for encoded headers: the worst case of 8 KiB of user headers."""


def partition_of(fifo_group: str, partitions: int) -> int:
    """The partition of a fifo_group: stable across processes and client versions."""
    return zlib.crc32(fifo_group.encode("ascii")) % partitions


@dataclass(frozen=True, slots=True)
class QueueLayout:
    """Names of one stream (a queue or its DLQ) and of its consumers."""

    stream: str
    subject_root: str
    partitions: int

    @classmethod
    def of(cls, prefix: str, queue: str, *, dead_letters: bool, partitions: int) -> QueueLayout:
        kind = "d" if dead_letters else "q"
        return cls(f"{prefix}_{kind}_{queue}", f"{prefix}.{kind}.{queue}", partitions)

    @property
    def wildcard(self) -> str:
        return f"{self.subject_root}.>"

    def subject(self, fifo_group: str | None) -> str:
        if fifo_group is None:
            return f"{self.subject_root}.u"
        return f"{self.subject_root}.p.{partition_of(fifo_group, self.partitions)}"

    def filters(self) -> list[str]:
        """Filter subject of each consumer slot: slot 0 unordered, slot n+1 partition n."""
        root = self.subject_root
        return [f"{root}.u"] + [f"{root}.p.{n}" for n in range(self.partitions)]

    @staticmethod
    def consumer(group: str, slot: int) -> str:
        return f"u_{group}" if slot == 0 else f"p{slot - 1}_{group}"


def encode_headers(
    user: Mapping[str, str], fifo_group: str | None, dedup_id: str | None
) -> dict[str, str] | None:
    """NATS headers for a message; None when there is nothing to carry."""
    out: dict[str, str] = {}
    if user:
        # ensure_ascii escapes non-ASCII and control characters (no CR/LF reaches the wire);
        # DEL is the one ASCII control json leaves alone.
        out[USER_HEADERS] = json.dumps(dict(user), separators=(",", ":")).replace("\x7f", "\\u007f")
    if fifo_group is not None:
        out[FIFO_GROUP_HEADER] = fifo_group
    if dedup_id is not None:
        out[DEDUP_HEADER] = dedup_id
    return out or None


def decode_headers(
    raw: Mapping[str, str] | None, subject: str | None = None, layout: QueueLayout | None = None
) -> tuple[dict[str, str], str | None, str | None, str | None]:
    """(user headers, fifo_group, dedup id, defect) of a stored message; never raises.

    A message without any ``x-brokerkit-`` header is foreign (or brokerkit's without user
    headers and fifo_group): its NATS headers but ``Nats-Msg-Id`` are its user headers.
    ``Nats-Msg-Id`` is the dedup id when it is a valid one (else it stays a header). The
    defect names what makes a brokerkit message corrupt: a headers field that is not a
    JSON object of strings, a fifo_group that brokerkit would refuse, or one whose
    partition is not ``subject``'s (given with ``layout``).
    """
    if not raw:
        return {}, None, None, None
    msg_id = raw.get(DEDUP_HEADER)
    dedup = msg_id if msg_id is not None and valid_token(msg_id) else None
    if not any(k[:_PREFIX_LEN].lower() == HEADER_PREFIX for k in raw):
        user = {k: v for k, v in raw.items() if k != DEDUP_HEADER or dedup is None}
        return user, None, dedup, None
    blob = raw.get(USER_HEADERS)
    if blob is None:
        blob = raw.get(_LEGACY_USER_HEADERS)
    user, defect = json_headers(blob) if blob is not None else ({}, None)
    group = raw.get(FIFO_GROUP_HEADER)
    if group is None:
        group = raw.get(_LEGACY_GROUP)
    if group is not None and not valid_token(group):
        group, defect = None, defect or "fifo_group header is not a valid fifo_group"
    elif group is not None and layout is not None and subject != layout.subject(group):
        defect = defect or f"fifo_group header disagrees with the subject {subject!r}"
    return user, group, dedup, defect
