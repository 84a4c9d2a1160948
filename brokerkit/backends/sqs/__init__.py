"""``sqs://?region=...&endpoint=...``: AWS SQS FIFO queues through boto3.

How the contract maps (details, limits and emulator differences: docs/backends/sqs.md):

* queue -> FIFO queue ``<prefix><queue>.fifo``, its DLQ -> ``<prefix>_dlq_<queue>.fifo``
  (created on first use: CreateQueue is idempotent for equal attributes);
* publish -> SendMessage / SendMessageBatch (chunks of 10); every message has a
  MessageGroupId (its fifo_group, or a unique one) and a MessageDeduplicationId (its
  dedup_id, or a unique one); headers, flags and binary bodies packed into two attributes;
* receive -> ReceiveMessage (10 at most), lease = visibility timeout; ack -> coalesced
  DeleteMessageBatch; nack(delay) / extend -> ChangeMessageVisibility;
* attempt -> ApproximateReceiveCount, minus receives given back unseen;
* dead_letter -> SendMessage of the envelope copy to the DLQ, then DeleteMessage;
* dedup -> SQS's own fixed 300 s window, queue scope;
* consumer group -> one per queue (fan_out=False), recorded in a queue tag.
"""

from brokerkit.backends.sqs._backend import SqsBackend
from brokerkit.backends.sqs._options import SqsOptions

__all__ = ["SqsBackend", "SqsOptions"]
