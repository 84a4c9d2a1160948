"""Batched frame writes (``rabbitmq/_frames.py``) wait for room in aiormq's write queue.

aiormq's connection write queue holds 10 frames. Batches queued faster than its writer
drains them (many publishers or ack flushes in one loop turn, a loaded machine) must
wait, not fail: with ``put_nowait`` the 11th raised ``QueueFull`` (seen in a soak run).
Against the shared RabbitMQ (``BROKERKIT_RABBITMQ_URL``), on a fresh queue deleted after.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

aiormq = pytest.importorskip("aiormq", reason="aio-pika is not installed")

from pamqp.commands import Basic  # noqa: E402 - after the skip

from brokerkit.backends.rabbitmq import _frames as frames  # noqa: E402

URL = os.environ.get("BROKERKIT_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
BATCHES = 40


async def test_batches_queued_faster_than_the_writer_drains_them_all_go_out() -> None:
    try:
        connection = await aiormq.connect(URL)
    except (aiormq.exceptions.AMQPConnectionError, OSError):
        pytest.fail(f"no RabbitMQ at {URL}", pytrace=False)  # mandatory: never a skip
    queue = f"frames-{uuid.uuid4().hex[:12]}"
    try:
        channel = await connection.channel(publisher_confirms=True)
        assert frames.supported(channel)
        await channel.queue_declare(queue, auto_delete=False)
        confirms = []
        for i in range(BATCHES):  # no other await: the writer task never gets to run
            props = Basic.Properties(message_id=f"m{i}", delivery_mode=2)
            confirms += await frames.publish_batch(channel, [(queue, b"x", props)])
        results = await asyncio.wait_for(asyncio.gather(*confirms), 30)
        assert all(isinstance(r, Basic.Ack) for r in results)
        declared = await channel.queue_declare(queue, passive=True)
        assert declared.message_count == BATCHES
        await channel.queue_delete(queue)
    finally:
        await connection.close()
