"""KafkaLink: what a Kafka connection and its receivers share, handed to each receiver.

The settings and hosts, the broker-side names of a queue, the librdkafka configuration
of each client, the error table, and the registry of open receivers (so that closing
the connection closes them). The backend makes one; a receiver gets it and never sees
the backend.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError

from brokerkit.backends import HostPort, QueueRef, Receiver
from brokerkit.backends.kafka._errors import error_map
from brokerkit.backends.kafka._options import KafkaOptions
from brokerkit.backends.kafka._produce import MESSAGE_SET

__all__ = ["FETCH_QUEUE_BACKOFF_MS", "KafkaLink"]

LOG = logging.getLogger(__name__)

FETCH_QUEUE_BACKOFF_MS = 10
"""The consumers' ``fetch.queue.backoff.ms`` unless the client settings give one."""


def _on_error(err: KafkaError) -> None:
    LOG.debug("kafka client error: %s", err)


class KafkaLink:
    """One connection's settings, names and client configurations (no I/O)."""

    def __init__(
        self, conf: Mapping[str, Any], options: KafkaOptions, hosts: Sequence[HostPort]
    ) -> None:
        self.options = options
        self.hosts = tuple(hosts)
        self.errors = error_map(self.hosts)
        """The one error table (``with link.errors:`` around driver calls)."""
        self._conf = dict(conf)
        self._conf.setdefault("logger", LOG)  # librdkafka's own log lines
        self._conf.setdefault("error_cb", _on_error)
        self.receivers: set[Receiver[Any]] = set()
        """Open receivers: closed with the connection; each removes itself on close."""

    def topic(self, queue: QueueRef) -> str:
        """``<prefix>.<queue>``, or ``<prefix>-dlq.<queue>`` for its DLQ."""
        prefix = self.options.topic_prefix
        return f"{prefix}-dlq.{queue.name}" if queue.dead_letters else f"{prefix}.{queue.name}"

    def group_id(self, queue: QueueRef, group: str) -> str:
        return f"{self.topic(queue)}.{group}"

    def admin_config(self) -> dict[str, Any]:
        return dict(self._conf)

    def consumer_config(self, group_id: str) -> dict[str, Any]:
        conf = {k: v for k, v in self._conf.items() if k != "error_cb"}
        conf.update(
            {
                "group.id": group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": int(self.options.session_timeout * 1000),
                "heartbeat.interval.ms": int(self.options.heartbeat_interval * 1000),
                "fetch.wait.max.ms": 100,
                "enable.partition.eof": False,
                "error_cb": _on_error,
            }
        )
        # librdkafka stops fetching a partition whose local queue passed its thresholds
        # and tries again only after this (1 s by default); a busy consumer drains that
        # queue in well under a second and then waits out the rest of it (one stall of
        # 0.05-0.4 s about every 100 000 records read from a backlog). A given value wins.
        conf.setdefault("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS)
        return conf

    def producer_config(self) -> dict[str, Any]:
        """The client settings plus what the contract needs of the producer (durable,
        ordered, one partitioner for every brokerkit client) and the ``linger`` and
        ``publish_timeout`` options."""
        conf = dict(self._conf)
        conf.update(
            {
                "acks": "all",
                "enable.idempotence": True,
                "partitioner": "murmur2_random",
                "linger.ms": self.options.linger * 1000.0,
                # bounded: an unconfirmed record fails (BrokerUnavailable), never hangs
                "message.timeout.ms": int(self.options.publish_timeout * 1000),
                "message.max.bytes": 1_000_000,
                "batch.num.messages": MESSAGE_SET,
            }
        )
        return conf
