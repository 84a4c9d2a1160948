"""An ack that meets a rebalance on Kafka is recorded, not lost (issue 16, the lease test).

A consumer holds messages of two partitions; a second consumer joins the group, and the
cooperative rebalance revokes one of those partitions from the first. The revoke waits
for the partition's leased records to settle, on the consumer thread. The acks come
while it waits, after the stream was idle (so they commit synchronously): they must
return, recorded by the revoke's final commit, and nothing acked may come back.

Before the fix the synchronous ack sent its commit to the thread that sat in the revoke
waiting for that same ack: it raised LeaseExpired ("its partition moved before the ack
was recorded") after 10 s, and the message went to the joining consumer.

    BROKERKIT_KAFKA_URL=kafka://127.0.0.1:9092 pytest tests/integration/test_kafka_rebalance_ack.py
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest

pytest.importorskip("confluent_kafka")

import brokerkit
from brokerkit.backends.kafka._receiver import KafkaReceiver
from contract_tests._helpers import nothing_within

URL = os.environ.get("BROKERKIT_KAFKA_URL", "kafka://127.0.0.1:9092")
MESSAGES = 40
DEADLINE = 60.0


def _revoking(consumer: brokerkit.Consumer) -> bool:
    receiver = consumer._receiver
    assert isinstance(receiver, KafkaReceiver)
    return any(part.revoking for part in receiver._parts.values())


def _partitions(consumer: brokerkit.Consumer) -> set[int]:
    receiver = consumer._receiver
    assert isinstance(receiver, KafkaReceiver)
    return set(receiver._parts)


async def test_acks_during_a_revoke_are_recorded_by_its_final_commit() -> None:
    queue, group = f"rebal-{uuid.uuid4().hex[:8]}", "g"
    async with (
        brokerkit.connect(f"{URL}?partitions=2") as first_broker,
        brokerkit.connect(f"{URL}?partitions=2") as second_broker,
    ):
        await first_broker.publish_many(
            queue, [brokerkit.Outgoing(f"m{i}".encode()) for i in range(MESSAGES)]
        )
        async with first_broker.consumer(queue, group, ack_timeout=60.0, prefetch=1) as first:
            held: list[brokerkit.Message] = []
            end = time.monotonic() + DEADLINE
            iterator = first.__aiter__()
            while len(held) < MESSAGES and time.monotonic() < end:
                held.append(await asyncio.wait_for(iterator.__anext__(), end - time.monotonic()))
            assert len(held) == MESSAGES
            assert _partitions(first) == {0, 1}, "the first consumer owns both partitions"

            async with second_broker.consumer(queue, group, ack_timeout=60.0) as second:
                end = time.monotonic() + DEADLINE  # the join starts a rebalance
                while not _revoking(first):
                    assert time.monotonic() < end, "no revoke came within the deadline"
                    await asyncio.sleep(0.02)
                started = time.monotonic()
                results = await asyncio.gather(*(m.ack() for m in held), return_exceptions=True)
                took = time.monotonic() - started
                failed = [r for r in results if isinstance(r, BaseException)]
                assert not failed, f"{len(failed)} acks failed during the revoke: {failed[:2]!r}"
                assert all(m.settled for m in held)
                assert took < 8.0, f"the acks took {took:.1f} s"
                # the revoke ended: the joining consumer owns a partition, and nothing acked
                # comes to it (the committed state carries every ack)
                end = time.monotonic() + DEADLINE
                while not _partitions(second):
                    assert time.monotonic() < end, "the joining consumer got no partition"
                    await asyncio.sleep(0.05)
                again = await nothing_within(second, 3.0)
                assert again is None, f"an acked message came back: {again!r}"
