"""``RabbitBackend.from_client``: brokerkit around the user's own aio-pika connection.

Against the shared RabbitMQ (``BROKERKIT_RABBITMQ_URL``, default the scripts/services
one), on a fresh queue deleted after. The connection stays the user's: closing the
broker leaves it open.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

import brokerkit

aio_pika = pytest.importorskip("aio_pika", reason="aio-pika is not installed")

from brokerkit.backends.rabbitmq import RabbitBackend  # noqa: E402 - after the skip

URL = os.environ.get("BROKERKIT_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")


@pytest.mark.parametrize("robust", [False, True], ids=["connect", "connect_robust"])
async def test_from_client_uses_and_keeps_the_users_connection(robust: bool) -> None:
    factory = aio_pika.connect_robust if robust else aio_pika.connect
    try:
        connection = await factory(URL)
    except (aio_pika.exceptions.AMQPConnectionError, OSError):
        pytest.fail(f"no RabbitMQ at {URL}", pytrace=False)  # mandatory: never a skip
    queue = f"client-{uuid.uuid4().hex[:12]}"
    try:
        backend = RabbitBackend.from_client(connection, partitions=2)
        async with brokerkit.from_backend(backend) as broker:
            sent = await broker.publish(queue, b"mine", fifo_group="g", headers={"k": "v"})
            async with broker.consumer(queue) as consumer:
                msg = await asyncio.wait_for(consumer.__anext__(), 10)
                assert (msg.id, msg.body, msg.fifo_group) == (sent.id, b"mine", "g")
                assert dict(msg.headers) == {"k": "v"}
                await msg.ack()
            await broker.delete_queue(queue)
        assert not connection.is_closed
    finally:
        await connection.close()


async def test_stats_counts_ready_and_dead_and_creates_nothing() -> None:
    queue = f"stats-{uuid.uuid4().hex[:12]}"
    try:
        broker = brokerkit.connect(URL)
        await broker.open()
    except brokerkit.BrokerUnavailable:
        pytest.fail(f"no RabbitMQ at {URL}", pytrace=False)  # mandatory: never a skip
    async with broker:
        assert (await broker.stats(queue)).ready == 0  # never declared, still not
        with pytest.raises(brokerkit.UnsupportedFeature):  # no read without side effects
            async for _ in broker.browse(queue):
                pass
        await broker.publish_many(
            queue, [brokerkit.Outgoing(b"a"), brokerkit.Outgoing(b"b", fifo_group="g")]
        )
        async with broker.consumer(queue) as consumer:
            msg = await asyncio.wait_for(consumer.__anext__(), 10)
            await msg.dead_letter("for the stats")
        stats = await broker.stats(queue)
        assert (stats.ready, stats.dead, stats.in_flight) == (1, 1, None)
        await broker.delete_queue(queue)
