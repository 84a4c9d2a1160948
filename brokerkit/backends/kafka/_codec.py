"""A consumed record's headers as a delivery carries them, and what makes a record corrupt.

One decoder for the receiver (``_partition.Partition.read``) and for browse
(``_inspect``); it never raises. brokerkit writes every header value as UTF-8 text, a
record's fifo_group and dedup id in ``FIFO_GROUP_HEADER`` / ``DEDUP_ID_HEADER`` (each
once, the record's key being the fifo_group, else the dedup id), and always a value. So
a record is corrupt (its defect named, for the facade to dead-letter it) when:

* a header's value is null (a type brokerkit never writes);
* a brokerkit header is not UTF-8, not a valid fifo_group / dedup id, or given twice with
  different values;
* its fifo_group is not its key (it may sit in another group's partition: no order);
* it has no value (a tombstone: ``TOMBSTONE``, found by the caller).

A header of a record without brokerkit fields (a foreign producer's) whose value is not
UTF-8 cannot be a ``str`` header: it is left out, and the record delivered as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from brokerkit.backends import (
    DEDUP_ID_HEADER,
    FIFO_GROUP_HEADER,
    HEADER_PREFIX,
    NO_HEADERS,
    header_defect,
    valid_token,
)

__all__ = ["TOMBSTONE", "decode_headers"]

TOMBSTONE = "record has no value (a tombstone)"
"""The defect of a record whose value is null."""

_OURS = (FIFO_GROUP_HEADER, DEDUP_ID_HEADER)
_PREFIX_LEN = len(HEADER_PREFIX)

Decoded = tuple[Mapping[str, str], str | None, str | None, str | None]
"""(user headers, fifo_group, dedup id, defect)"""


def decode_headers(
    raw: Sequence[tuple[str, bytes | None]], key: Callable[[], bytes | str | None]
) -> Decoded:
    """Decode a record's headers (``msg.headers()``, not empty); ``key`` is ``msg.key``."""
    decoded: dict[str, str] = {}
    defect: str | None = None
    dropped = ""  # a foreign header whose value is not UTF-8
    for name, value in raw:
        if value is None:
            defect = defect or header_defect(name, "is null, not a string")
            continue
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            if name[:_PREFIX_LEN].lower() == HEADER_PREFIX:
                defect = defect or header_defect(name, "is not UTF-8")
            else:
                dropped = dropped or name
            continue
        if name in _OURS and decoded.get(name, text) != text:
            defect = defect or header_defect(name, "is given twice, with different values")
        decoded[name] = text
    group = decoded.pop(FIFO_GROUP_HEADER, None)
    dedup = decoded.pop(DEDUP_ID_HEADER, None)
    if group is not None and not valid_token(group):
        group, defect = None, defect or "fifo_group header is not a valid fifo_group"
    if dedup is not None and not valid_token(dedup):
        dedup, defect = None, defect or "dedup id header is not a valid dedup id"
    if dropped and (group is not None or dedup is not None):
        defect = defect or header_defect(dropped, "is not UTF-8")
    if group is not None and defect is None:
        k = key()
        if (k.encode() if isinstance(k, str) else k) != group.encode():
            defect = "fifo_group header disagrees with the record's key"
    return decoded or NO_HEADERS, group, dedup, defect
