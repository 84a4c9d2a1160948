"""An ack on RabbitMQ returns as done only with evidence that the broker processed it.

``basic.ack`` has no reply. An ack written into a connection that died unnoticed (a
broker killed mid-stream: issue 16's restart run saw one come back) must not return as
done: without word from the broker within ``_acks.EVIDENCE``, ``ack()`` waits for a
barrier (``basic.qos`` → ``qos-ok``) and raises ``BrokerUnavailable`` when none comes.
Here the path to the shared RabbitMQ is cut by the suite's TCP proxy (bytes held, nothing
closed: the client cannot tell), then restored.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest

import brokerkit
from contract_tests._helpers import receive
from contract_tests._proxy import through_proxy

pytest.importorskip("aiormq", reason="aio-pika is not installed (brokerkit-mq[rabbitmq])")

from brokerkit.backends.rabbitmq._acks import BARRIER_TIMEOUT, EVIDENCE

URL = os.environ.get("BROKERKIT_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")


async def test_an_ack_during_a_cut_raises_instead_of_returning_done() -> None:
    queue = f"t-barrier-{uuid.uuid4().hex[:10]}"
    path = through_proxy(URL)
    try:
        async with (
            brokerkit.connect(path.url) as broker,
            broker.consumer(queue, "g", ack_timeout=60.0, prefetch=1) as consumer,
        ):
            await broker.publish_many(queue, [brokerkit.Outgoing(b"a"), brokerkit.Outgoing(b"b")])
            first = await receive(consumer)
            await first.ack()  # the broker was just heard from (the delivery): no barrier
            second = await receive(consumer)
            path.cut()
            # the evidence must be older than EVIDENCE: a fixed precondition, not a wait
            # for something to happen
            await asyncio.sleep(EVIDENCE * 2)
            started = time.monotonic()
            with pytest.raises(brokerkit.BrokerUnavailable):
                await second.ack()
            took = time.monotonic() - started
            assert BARRIER_TIMEOUT - 0.5 <= took <= BARRIER_TIMEOUT + 2.0, took
            path.restore()
    finally:
        path.close()
        async with brokerkit.connect(URL) as broker:
            await broker.delete_queue(queue)
