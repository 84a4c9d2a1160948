"""``broker.stats`` on SQS against a real endpoint: GetQueueAttributes' counts, given (not
None) and right through publish, lease, nack with a delay, dead-letter and ack.

Run with ``BROKERKIT_SMOKE=sqs`` (or ``all``); the URL is ``BROKERKIT_SQS_URL`` or
scripts/services' ElasticMQ. contract_tests/test_operations.py accepts None for a figure
a backend cannot tell; this asserts the figures SQS can tell are there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import brokerkit

pytest.importorskip("boto3", reason="boto3 is not installed (brokerkit-mq[sqs])")

from _sqs import SELECTED, URL, raw_client

pytestmark = SELECTED
WAIT = 20.0


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[brokerkit.Broker]:
    async with brokerkit.connect(URL) as b:
        yield b


@pytest_asyncio.fixture
async def queue() -> AsyncIterator[str]:
    name = f"it-{uuid.uuid4().hex[:16]}"
    yield name
    async with brokerkit.connect(URL) as cleaner:
        await cleaner.delete_queue(name)


async def _expect(broker: brokerkit.Broker, queue: str, want: brokerkit.QueueStats) -> None:
    """Poll until ``broker.stats`` is ``want`` (SQS's counts are approximate: they settle)."""
    deadline = time.monotonic() + WAIT
    while True:
        got = await broker.stats(queue)
        if got == want:
            return
        assert time.monotonic() < deadline, f"stats {got}, want {want}"
        await asyncio.sleep(0.1)


def _stats(ready: int, in_flight: int, dead: int) -> brokerkit.QueueStats:
    return brokerkit.QueueStats(ready=ready, in_flight=in_flight, delayed=None, dead=dead)


async def test_stats_are_the_queue_and_dlq_counts_of_sqs(
    broker: brokerkit.Broker, queue: str
) -> None:
    await _expect(broker, queue, _stats(0, 0, 0))
    for i in range(4):
        await broker.publish(queue, b"m%d" % i, fifo_group="g" if i < 2 else None)
    await _expect(broker, queue, _stats(4, 0, 0))
    async with broker.consumer(queue, prefetch=1, ack_timeout=30) as consumer:
        first = await asyncio.wait_for(consumer.__anext__(), WAIT)
        second = await asyncio.wait_for(consumer.__anext__(), WAIT)
        await _expect(broker, queue, _stats(2, 2, 0))
        await first.nack(delay=600)  # SQS: invisible like a lease, not told apart
        await second.dead_letter("poison")
        await _expect(broker, queue, _stats(2, 1, 1))
    async with brokerkit.connect(URL) as other:  # another connection sees the same
        await _expect(other, queue, _stats(2, 1, 1))


async def test_stats_never_create_a_queue(broker: brokerkit.Broker, queue: str) -> None:
    assert await broker.stats(queue) == _stats(0, 0, 0)
    raw = raw_client(URL)
    names = raw.list_queues(QueueNamePrefix=queue).get("QueueUrls") or []
    names += raw.list_queues(QueueNamePrefix=f"_dlq_{queue}").get("QueueUrls") or []
    assert names == []
