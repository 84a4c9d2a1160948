"""A fifo partition changes hands between consumers without breaking its group's order.

Against the shared RabbitMQ (``BROKERKIT_RABBITMQ_URL``, default the scripts/services
one), fresh queue names, deleted after. Consumer A holds the head of a group unsettled
and closes; consumer B, already waiting as the partition's next single active consumer,
must get that head before anything later of the group (a ``basic.cancel`` before giving
the head back would let RabbitMQ hand B the second message while A still held the
first). Also: what A fetched ahead and never showed is not lost.
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
    name = f"handover-{uuid.uuid4().hex[:12]}"
    yield name
    async with brokerkit.connect(URL) as broker:
        await broker.delete_queue(name)


async def test_partition_handover_keeps_group_order(queue: str) -> None:
    try:
        a, b = brokerkit.connect(URL), brokerkit.connect(URL)
        await a.open()
        await b.open()
    except brokerkit.BrokerUnavailable:
        pytest.fail(f"no RabbitMQ at {URL}", pytrace=False)  # mandatory: never a skip
    async with a, b:
        bodies = [b"m%d" % i for i in range(6)]
        await a.publish_many(queue, [brokerkit.Outgoing(x, fifo_group="g") for x in bodies])
        first = a.consumer(queue, "workers", prefetch=4, close_timeout=0)
        second = b.consumer(queue, "workers", prefetch=4)
        async with second:
            async with first:
                head = await asyncio.wait_for(first.__anext__(), 10)
                assert head.body == b"m0" and head.attempt == 1
                waiting = asyncio.ensure_future(second.__anext__())
                await asyncio.sleep(0.5)  # B is subscribed and waiting behind A
                assert not waiting.done(), "B got a message while A was the active consumer"
            # A closed holding m0 unsettled: B must start with m0, then the rest in order
            got = [await asyncio.wait_for(waiting, 10)]
            await got[0].ack()
            while len(got) < len(bodies):
                msg = await asyncio.wait_for(second.__anext__(), 10)
                await msg.ack()
                got.append(msg)
        assert [m.body for m in got] == bodies
        assert got[0].attempt == 2  # A's unsettled delivery counted
