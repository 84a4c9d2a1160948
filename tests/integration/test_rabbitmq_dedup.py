"""RabbitMQ dedup beyond the contract suite: the ledger across connections and restarts.

Against the shared RabbitMQ (``BROKERKIT_RABBITMQ_URL``, default the scripts/services
one), fresh queues deleted after:

* a duplicate published after the first copy was acked and its consumer's connection
  closed is still suppressed for a consumer on a new connection (the ledger is rebuilt
  from the stream, not kept in a process);
* copies of one id raced onto two consumers of the free queue give one delivery;
* grouped dedup messages keep their group's order around a suppressed copy.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import brokerkit

pytest.importorskip("aiormq", reason="aio-pika is not installed (brokerkit-mq[rabbitmq])")

URL = os.environ.get("BROKERKIT_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")


@pytest_asyncio.fixture
async def queue() -> AsyncIterator[str]:
    name = f"dedup-{uuid.uuid4().hex[:12]}"
    try:
        async with brokerkit.connect(URL) as probe:
            await probe.open()
    except brokerkit.BrokerUnavailable:
        pytest.fail(f"no RabbitMQ at {URL}", pytrace=False)  # mandatory: never a skip
    yield name
    async with brokerkit.connect(URL) as broker:
        await broker.delete_queue(name)


async def _drain(consumer: brokerkit.Consumer, quiet: float = 1.5) -> list[bytes]:
    got: list[bytes] = []
    while True:
        try:
            msg = await asyncio.wait_for(consumer.__anext__(), quiet)
        except TimeoutError:
            return got
        got.append(msg.body)
        await msg.ack()


async def test_ledger_survives_consumer_connections(queue: str) -> None:
    async with brokerkit.connect(URL) as first:
        await first.publish(queue, b"one", dedup_id="ev-1")
        async with first.consumer(queue) as consumer:
            assert await _drain(consumer) == [b"one"]
    async with brokerkit.connect(URL) as publisher:
        await publisher.publish(queue, b"again", dedup_id="ev-1")  # after ack and close
        await publisher.publish(queue, b"other", dedup_id="ev-2")
    async with brokerkit.connect(URL) as second, second.consumer(queue) as consumer:
        assert await _drain(consumer) == [b"other"]


async def test_racing_copies_on_two_consumers_give_one_delivery(queue: str) -> None:
    async with brokerkit.connect(URL) as a, brokerkit.connect(URL) as b:
        copies = [brokerkit.Outgoing(b"copy-%d" % i, dedup_id="race") for i in range(20)]
        await asyncio.gather(*(a.publish_many(queue, [c]) for c in copies))
        async with a.consumer(queue, prefetch=2) as ca, b.consumer(queue, prefetch=2) as cb:
            got = await asyncio.gather(_drain(ca), _drain(cb))
        assert len(got[0]) + len(got[1]) == 1, got


async def test_grouped_dedup_keeps_group_order(queue: str) -> None:
    async with brokerkit.connect(URL) as broker:
        batch = [
            brokerkit.Outgoing(b"g1", fifo_group="g", dedup_id="a"),
            brokerkit.Outgoing(b"dup", fifo_group="g", dedup_id="a"),
            brokerkit.Outgoing(b"g2", fifo_group="g"),
            brokerkit.Outgoing(b"g3", fifo_group="g", dedup_id="b"),
        ]
        await broker.publish_many(queue, batch)
        async with broker.consumer(queue) as consumer:
            assert await _drain(consumer) == [b"g1", b"g2", b"g3"]
