"""``broker.stats`` on SQS: the queue's (or its DLQ's) own counts, from GetQueueAttributes.

* ready = ``ApproximateNumberOfMessages``: visible, deliverable now (a message behind a
  leased one of its fifo group counts too: SQS does not tell them apart);
* in_flight = ``ApproximateNumberOfMessagesNotVisible``: leased by a ReceiveMessage, which
  includes a message nacked with a delay (a nack sets its visibility timeout: SQS counts
  it as not visible, like a lease) and those a receiver fetched ahead;
* delayed = None: SQS cannot tell a nack's delay from a lease (its
  ``ApproximateNumberOfMessagesDelayed`` counts only a queue's ``DelaySeconds``, which
  brokerkit's queues do not have);
* oldest_age = None: SQS gives the oldest message's age only as a CloudWatch metric.

SQS has one consumer group per queue (``Link.claim_group``), so the figures are that
group's. Stats never creates a queue: one that does not exist (yet) has 0 and 0.
"""

from __future__ import annotations

from brokerkit.backends import BrokerRefused, QueueRef, QueueStats
from brokerkit.backends.sqs._errors import NOT_FOUND
from brokerkit.backends.sqs._link import Link, sqs_name

__all__ = ["queue_stats"]

_READY = "ApproximateNumberOfMessages"
_NOT_VISIBLE = "ApproximateNumberOfMessagesNotVisible"
_NONE = QueueStats(ready=0, in_flight=0)


async def queue_stats(link: Link, queue: QueueRef) -> QueueStats:
    url = await link.existing_url(sqs_name(link.prefix, queue))
    if url is None:
        return _NONE
    try:
        reply = await link.call(
            "get_queue_attributes", QueueUrl=url, AttributeNames=[_READY, _NOT_VISIBLE]
        )
    except BrokerRefused as exc:
        if exc.code not in NOT_FOUND:
            raise
        return _NONE  # deleted since its URL was looked up
    attributes = reply.get("Attributes") or {}
    return QueueStats(
        ready=int(attributes.get(_READY, 0)), in_flight=int(attributes.get(_NOT_VISIBLE, 0))
    )
