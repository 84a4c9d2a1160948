"""``kafka://host1:9092,host2:9092?partitions=6``: Apache Kafka through confluent-kafka.

A queue is a topic, a consumer group a Kafka consumer group; per-message
settling, FIFO groups, attempts, leases, the DLQ and dedup are emulated on top
of cumulative offset commits (the state above the commit point rides in the
commit metadata). Every mechanism, invariant and crash case: docs/backends/kafka.md.
"""

from brokerkit.backends.kafka._backend import KafkaBackend
from brokerkit.backends.kafka._options import KafkaOptions

__all__ = ["KafkaBackend", "KafkaOptions"]
