"""Keeping ``attempt`` honest on top of ``ApproximateReceiveCount``.

SQS counts every receive, also of messages the caller never saw: followers of a group
held back behind their batch's head and given back when the head is nacked, read-ahead
given back when a consumer closes, a receive cancelled in flight. Each such give-back is
recorded here (process-wide, so every connection of the process shares it) and
subtracted from the count: ``attempt = ApproximateReceiveCount - unseen receives``.

The record is memory, not SQS: a process that dies forgets its corrections, and a
message given back unseen by one process and received by another counts that receive.
The count then runs ahead (a message reaches the DLQ early), never behind.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["attempt_of", "count_unseen", "forget", "nacked_here", "note_nacked"]

_MAX_ENTRIES = 100_000
_lock = threading.Lock()
_unseen: OrderedDict[tuple[str, str], int] = OrderedDict()
_nacked: OrderedDict[tuple[str, str], None] = OrderedDict()


def count_unseen(queue_url: str, message_id: str) -> None:
    """One receive of this message was given back without the caller seeing it."""
    key = (queue_url, message_id)
    with _lock:
        _unseen[key] = _unseen.get(key, 0) + 1
        _unseen.move_to_end(key)
        while len(_unseen) > _MAX_ENTRIES:
            _unseen.popitem(last=False)


def attempt_of(queue_url: str, message_id: str, receive_count: int) -> int:
    """The 1-based attempt of a delivery whose ApproximateReceiveCount is ``receive_count``."""
    if not _unseen:
        return max(receive_count, 1)
    with _lock:
        unseen = _unseen.get((queue_url, message_id), 0)
    return max(receive_count - unseen, 1)


def note_nacked(queue_url: str, message_id: str) -> None:
    """This process nacked the message: its next delivery is explained (no crash)."""
    with _lock:
        _nacked[(queue_url, message_id)] = None
        while len(_nacked) > _MAX_ENTRIES:
            _nacked.popitem(last=False)


def nacked_here(queue_url: str, message_id: str) -> bool:
    """True if this process nacked the message since it was last settled."""
    return bool(_nacked) and (queue_url, message_id) in _nacked


def forget(queue_url: str, message_id: str) -> None:
    """The message was settled: nothing to correct any more."""
    if _unseen or _nacked:
        with _lock:
            _unseen.pop((queue_url, message_id), None)
            _nacked.pop((queue_url, message_id), None)
