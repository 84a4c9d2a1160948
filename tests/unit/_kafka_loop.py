"""The Kafka receiver on the event-loop side only, for unit tests: no consumer thread and
no broker. Records are fed to ``_ingest`` as stand-ins of confluent-kafka messages, the
way the consumer thread posts them."""

from __future__ import annotations

from brokerkit._url import BrokerURL
from brokerkit.backends.base import ReceiverSettings
from brokerkit.backends.kafka import KafkaBackend
from brokerkit.backends.kafka._receiver import KafkaReceiver

TOPIC = "brokerkit.q"


class StubMessage:
    """What ``_ingest`` reads of a confluent-kafka ``Message``; the body is the offset."""

    def __init__(self, offset: int, partition: int = 0) -> None:
        self._offset, self._partition = offset, partition

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000)

    def value(self) -> bytes:
        return str(self._offset).encode()


async def make_receiver(partitions: int = 1, ack_timeout: float = 30.0) -> KafkaReceiver:
    """A receiver owning ``partitions`` partitions of TOPIC, all starting at offset 0."""
    backend = KafkaBackend.from_url(BrokerURL.parse("kafka://127.0.0.1:9092"))
    settings = ReceiverSettings(ack_timeout=ack_timeout, max_attempts=5, prefetch=500)
    receiver = KafkaReceiver(backend, "q", TOPIC, "brokerkit.q.g", settings)
    keys = [(TOPIC, p) for p in range(partitions)]
    receiver._assigned.update(keys)
    receiver._assigned_on_loop([(key, 0, 0, None) for key in keys])
    return receiver


def close(receiver: KafkaReceiver) -> None:
    """Cancel the pending commit flush (nothing to commit to)."""
    if receiver._flush_handle is not None:
        receiver._flush_handle.cancel()
