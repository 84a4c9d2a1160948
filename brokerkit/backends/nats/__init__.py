"""``nats://host:4222[,host2:4222]`` and ``tls://``: NATS JetStream through nats-py.

How the contract maps (details, layout and crash analysis: docs/backends/nats.md):

* queue -> a stream ``<prefix>_q_<queue>`` (Limits retention, ``max_age``), its DLQ
  -> ``<prefix>_d_<queue>``; created on first use (``add_stream`` is idempotent);
* consumer group -> durable pull consumers (``DeliverPolicy.ALL``, ``max_deliver=-1``,
  ``ack_wait`` = ack_timeout): one for messages without a fifo_group, one per partition;
* publish -> ``nc.publish`` with a reply subject per message + one wait for every PubAck
  (``_publisher.py``: pipelined, ~2x ``js.publish_async``);
  dedup_id -> ``Nats-Msg-Id`` with the stream's ``duplicate_window`` (``?dedup_window=``);
* receive -> pull requests (``$JS.API.CONSUMER.MSG.NEXT``), one outstanding per durable;
* ack -> ``+ACK``; nack(delay) -> ``-NAK {"delay"}``; extend -> ``+WPI`` (in_progress);
  lease expiry -> ``ack_wait``; attempt -> ``metadata.num_delivered`` (durable);
* dead_letter -> publish a copy to the DLQ stream (dedup id ``<group>:<seq>``), then ``+TERM``;
* FIFO groups -> crc32(fifo_group) % partitions picks a subject ``.p.<n>`` whose durable
  has ``max_ack_pending=1``: one unsettled message per partition, in stream order.
"""

from brokerkit.backends.nats._backend import NatsBackend
from brokerkit.backends.nats._options import NatsOptions

__all__ = ["NatsBackend", "NatsOptions"]
