"""Kafka broker-side input beyond the contract suite: a tombstone, a record over
``max_message_bytes`` and one with a null header, written by confluent-kafka's own
producer between brokerkit's records, are dead-lettered with their defect, and the
group's commit point then passes them (nothing pinned: the partition's commit reaches
its end). One partition, so the order is the log's.

    BROKERKIT_KAFKA_URL=kafka://127.0.0.1:9092 pytest tests/integration/test_kafka_broker_side.py
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest

pytest.importorskip("confluent_kafka")

import confluent_kafka

import brokerkit
from brokerkit.backends import QueueRef
from brokerkit.backends.kafka import KafkaBackend
from brokerkit.backends.kafka._codec import TOMBSTONE
from contract_tests._helpers import eventually
from contract_tests._raw.kafka import MARKER_HEADER, KafkaRawWriter

URL = os.environ.get("BROKERKIT_KAFKA_URL", "kafka://127.0.0.1:9092") + "?partitions=1"
DEADLINE = 60.0


async def _drain(consumer: brokerkit.Consumer, into: list[brokerkit.Message], n: int) -> None:
    async with consumer:
        deadline = time.monotonic() + DEADLINE
        while len(into) < n and time.monotonic() < deadline:
            try:
                msg = await asyncio.wait_for(consumer.__anext__(), 1.0)
            except TimeoutError:
                continue
            into.append(msg)
            await msg.ack()


def _commit_and_end(backend: KafkaBackend, queue: str) -> tuple[int, int]:
    """(the default group's committed offset, the high watermark) of partition 0."""
    link = backend.link
    topic = link.topic(QueueRef(queue))
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": link.admin_config()["bootstrap.servers"],
            "group.id": link.group_id(QueueRef(queue), "default"),
            "enable.auto.commit": False,  # never joins the group, never commits
            "log_level": 0,
        }
    )
    try:
        tp = confluent_kafka.TopicPartition(topic, 0)
        (committed,) = consumer.committed([tp], timeout=10)
        _, high = consumer.get_watermark_offsets(tp, timeout=10)
        return committed.offset, high
    finally:
        consumer.close()


async def test_tombstone_oversize_and_null_header_are_dead_lettered_and_not_pinned() -> None:
    queue = f"t-side-{uuid.uuid4().hex[:10]}"
    writer = KafkaRawWriter(URL)
    async with brokerkit.connect(URL) as broker:
        backend = broker.backend
        assert isinstance(backend, KafkaBackend)
        try:
            await broker.declare(queue)
            await broker.publish(queue, b"good-0")
            for kind in ("tombstone", "oversize", "wrong_type"):
                await writer.write(queue, kind, f"raw-{kind}".encode())
            await broker.publish(queue, b"good-1")
            good: list[brokerkit.Message] = []
            dead: list[brokerkit.Message] = []
            await asyncio.gather(
                _drain(broker.consumer(queue), good, 2), _drain(broker.dead_letters(queue), dead, 3)
            )
            assert [(m.body, m.attempt) for m in good] == [(b"good-0", 1), (b"good-1", 1)]
            reasons = {}
            for m in dead:  # the oversize copy has no body (the reason says so)
                assert m.dead_letter_info is not None
                name = m.headers.get(MARKER_HEADER) or m.body.decode() or "oversize"
                reasons[name] = m.dead_letter_info.reason
            assert reasons["raw-tombstone"] == f"corrupt: {TOMBSTONE}"
            assert reasons["raw-wrong_type"] == "corrupt: header 'x-user' is null, not a string"
            oversize = next(
                r for k, r in reasons.items() if k not in ("raw-tombstone", "raw-wrong_type")
            )
            assert "max_message_bytes" in oversize and "without its body" in oversize

            async def passed() -> bool:
                committed, high = await asyncio.to_thread(_commit_and_end, backend, queue)
                return committed == high

            await eventually(passed, timeout=DEADLINE, what="the commit point passing them")
        finally:
            await writer.aclose()
            await broker.delete_queue(queue)
