"""``amqp://user:pass@host:5672/vhost`` and ``amqps://``: RabbitMQ through aio-pika.

How the contract maps (topology, invariants and crash analysis: docs/backends/rabbitmq.md):

* queue -> quorum queues (``x-delivery-limit`` 2**31-1, so the broker never drops or
  dead-letters behind the facade and returns go to the head): ``P.Q`` for messages
  without a fifo_group, ``P.Q.p.<i>`` (single active consumer) for partition ``i`` of N,
  ``P.Q.dlq``; N is stored on the server (marker ``P.Q.meta``);
* publish -> ``basic.publish`` persistent + mandatory on a confirm channel, a sliding
  window of confirms (``?max_in_flight=``); unroutable is an error;
* receive -> ``basic.consume`` on a channel per receiver, ``basic.qos`` = ``?prefetch=``;
  a per-group ``GroupGate`` inside each partition;
* ack -> ``basic.ack``; nack(delay) -> held unacked, then ``basic.reject(requeue=True)``;
  lease expiry -> the receiver rejects at ``ack_timeout``; attempt -> 1 for a first
  delivery, a redelivery's from the attempt book ``P.Q.attempts`` (``_attempts``:
  hand-outs, not what the broker pushed to a consumer that died);
* dead_letter -> copy to ``P.Q.dlq`` with a confirm, then ``basic.ack``;
* dedup -> the first record of an id in the stream ``P.Q.ledger`` wins (``_ledger``);
* consumer groups -> one per queue (``fan_out=False``): the first group is recorded on
  the server (marker ``P.Q.owner``) and another one is refused with UnsupportedFeature.
"""

from brokerkit.backends.rabbitmq._backend import RabbitBackend
from brokerkit.backends.rabbitmq._options import RabbitOptions

__all__ = ["RabbitBackend", "RabbitOptions"]
