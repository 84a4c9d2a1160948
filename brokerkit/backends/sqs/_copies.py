"""Giving back a message without a fifo_group so that SQS's count of its receives is corrected.

SQS counts every receive (``ApproximateReceiveCount``), also one whose message the
caller never saw and that is given back. ``_attempts`` subtracts such receives, but only
in the process that made them. That is not enough where it matters most: before a
consumer hands out a message that may be the poison that killed its last consumers
(its last attempt, ``brokerkit/_alone.py``), it gives back what it fetched ahead; when
the poison then kills it, each of those neighbours would carry one counted receive more
to the next process, and after a few such crashes be dead-lettered with it.

A copy keeps the correction in SQS itself: the message is sent again (``encode_copy``:
same body and headers, the id its publisher was given, the attempts counted so far minus
this unseen receive) and the received one is deleted. Only for messages without a
fifo_group: each has a group of its own, so a copy overtakes nothing and nothing
overtakes it, where the copy of a user group's message would go behind the rest of
its group.

Send first, then delete: a crash between the two leaves both (one delivered twice, the
contract's at-least-once), never neither. A message whose lease has less than
``COPY_MARGIN`` left, or whose copy SQS refused, is returned to the caller, which gives
it back the usual way (visibility 0, corrected in this process only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from brokerkit.backends import Delivery
from brokerkit.backends.sqs._codec import encode_copy
from brokerkit.backends.sqs._link import Link, batches

__all__ = ["COPY_MARGIN", "copy_back"]

_log = logging.getLogger(__name__)

COPY_MARGIN = 1.0
"""Seconds of lease a delivery must have left to be copied (the send and the delete)."""


def copyable(delivery: Delivery[Any], now: float) -> bool:
    """True for a delivery without a user fifo_group whose lease has time for a copy.
    Never a corrupt one: its copy would be a well-formed message made of what could be
    decoded (the defect lost); it is given back as it is."""
    receipt = delivery.receipt
    if delivery.defect is not None:
        return False
    return receipt.group is None and receipt.deadline - now > COPY_MARGIN


async def copy_back(
    link: Link, queue_url: str, deliveries: Sequence[Delivery[Any]]
) -> list[Delivery[Any]]:
    """Copy each delivery and delete it; return those that were not copied."""
    left: list[Delivery[Any]] = []
    for chunk in batches(deliveries):
        entries = []
        for i, delivery in enumerate(chunk):
            prior = delivery.attempt - 1  # this receive was not seen: it does not count
            entry = encode_copy(
                delivery.body, delivery.headers, delivery.dedup_id, delivery.id, prior
            )
            entry["Id"] = str(i)
            entries.append(entry)
        try:
            reply = await link.call("send_message_batch", QueueUrl=queue_url, Entries=entries)
        except Exception as exc:  # nothing known to be copied: all given back the usual way
            _log.warning("SQS could not copy %d messages back: %s", len(chunk), exc)
            left += chunk
            continue
        sent = sorted(int(ok["Id"]) for ok in reply.get("Successful") or ())
        copied = set(sent)
        left += [d for i, d in enumerate(chunk) if i not in copied]
        if not sent:
            continue
        deletes = [{"Id": str(i), "ReceiptHandle": chunk[i].receipt.handle} for i in sent]
        try:
            reply = await link.call("delete_message_batch", QueueUrl=queue_url, Entries=deletes)
            failed = len(reply.get("Failed") or ())
        except Exception as exc:
            _log.warning("SQS could not delete %d copied messages: %s", len(deletes), exc)
            failed = len(deletes)
        if failed:  # the originals come back when their leases end: delivered twice
            _log.warning("%d messages copied back but not deleted: delivered twice", failed)
        now = time.monotonic()
        late = [i for i in sent if chunk[i].receipt.deadline < now]
        if late:
            _log.warning("%d messages copied back after their leases ended", len(late))
    return left
