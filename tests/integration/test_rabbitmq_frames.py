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
from contract_tests._proxy import through_proxy  # noqa: E402

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


async def test_confirms_awaited_when_the_connection_drops_fail_at_once() -> None:
    """A publish in flight when the broker dies learns it at once (and is resent on the next
    connection) instead of waiting ``request_timeout`` (30 s) for a confirm that cannot
    come: aiormq fails the futures it made when the connection closes, so each confirm
    must be one of them (in a broker restart run the publish in flight waited 30.0 s)."""
    queue = f"frames-{uuid.uuid4().hex[:12]}"
    path = through_proxy(URL)
    try:
        connection = await aiormq.connect(path.url)
        channel = await connection.channel(publisher_confirms=True)
        await channel.queue_declare(queue, auto_delete=False)
        path.cut()  # the publish goes nowhere, and no confirm comes back
        props = Basic.Properties(message_id="m", delivery_mode=2)
        confirms = await frames.publish_batch(channel, [(queue, b"x", props)])
        path.close()  # then the connection drops (the proxy closes its sockets)
        done, waiting = await asyncio.wait(confirms, timeout=10)
        assert not waiting, "a confirm was still awaited 10 s after its connection closed"
        assert all(f.exception() is not None for f in done)
    finally:
        path.close()
        direct = await aiormq.connect(URL)
        try:
            cleanup = await direct.channel()
            await cleanup.queue_delete(queue)
        finally:
            await direct.close()
