"""A delivery's lease on RabbitMQ starts when it is handed out, not when the receive began.

A receive that has to subscribe first (the first one, or the first after a broker
restart) may wait a long time for the channel: the broker is still starting, or the path
is slow. The deliveries that arrive with the subscription used to be leased from the
clock reading taken *before* that wait: with a wait longer than ``ack_timeout`` they were
handed out with a lease already run out, so their ``ack()`` raised ``LeaseExpired`` (the
flake of ``test_rabbitmq_restart.py``: a held message redelivered after the restart,
acked at once, refused) and the janitor gave them back as failed attempts. Here the path
to the shared RabbitMQ is cut by the suite's TCP proxy while the consumer's first receive
subscribes, for longer than ``ack_timeout``, then restored.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

import brokerkit
from contract_tests._helpers import nothing_within, receive
from contract_tests._proxy import through_proxy

pytest.importorskip("aiormq", reason="aio-pika is not installed (brokerkit-mq[rabbitmq])")

URL = os.environ.get("BROKERKIT_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
ACK_TIMEOUT = 1.5
CUT_FOR = 3.0  # longer than ACK_TIMEOUT, shorter than any client timeout in play


async def test_a_delivery_after_a_slow_subscribe_has_its_whole_lease() -> None:
    queue = f"t-lease-clock-{uuid.uuid4().hex[:10]}"
    path = through_proxy(URL)
    try:
        async with brokerkit.connect(path.url) as broker:
            await broker.publish(queue, b"a")  # the proxied connection is open and declared
            async with broker.consumer(queue, "g", ack_timeout=ACK_TIMEOUT, prefetch=1) as consumer:
                path.cut()
                first = asyncio.ensure_future(receive(consumer, 30.0))
                # the receive must be waiting for its channel when the cut ends: a fixed
                # precondition (the cut's length), not a wait for something to happen
                await asyncio.sleep(CUT_FOR)
                assert not first.done()
                path.restore()
                msg = await first
                assert msg.body == b"a"
                assert msg.attempt == 1
                await msg.ack()  # the old code: LeaseExpired (leased from before the wait)
                again = await nothing_within(consumer, ACK_TIMEOUT + 1.0)
                assert again is None, f"{again!r} came back after it was acked"
    finally:
        path.close()
        async with brokerkit.connect(URL) as broker:
            await broker.delete_queue(queue)
