"""The RabbitMQ backend's own attempt count (``_attempts``), through the Receiver API.

A quorum queue counts every unacked delivery of a channel that goes away, including the
ones its receiver never handed out (on 3.x even ``basic.nack`` counts), so the backend
keeps a redelivery's attempt in the stream ``P.Q.attempts``: only hand-outs count, a
release takes its hand-out back, and a closing receiver takes back the broker's count of
each first delivery it gives back unseen. Each "consumer" here is a backend of its own
whose close gives everything back to the broker.
Against the shared RabbitMQ (``BROKERKIT_RABBITMQ_URL``), fresh queue names, deleted after.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import brokerkit
from brokerkit.backends import Delivery, QueueRef, Receiver, ReceiverSettings

pytest.importorskip("aiormq", reason="aio-pika is not installed (brokerkit-mq[rabbitmq])")

from brokerkit.backends.rabbitmq import RabbitBackend

URL = os.environ.get("BROKERKIT_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")


@pytest_asyncio.fixture
async def queue() -> AsyncIterator[QueueRef]:
    ref = QueueRef(f"t-attempts-{uuid.uuid4().hex[:10]}")
    yield ref
    async with brokerkit.connect(URL) as broker:
        await broker.delete_queue(ref.name)


async def consumer(queue: QueueRef) -> tuple[RabbitBackend, Receiver[Any]]:
    backend = RabbitBackend.from_url(brokerkit.BrokerURL.parse(URL))
    await backend.open()
    return backend, await backend.subscribe(queue, "g", ReceiverSettings(30.0))


async def take(r: Receiver[Any], n: int) -> list[Delivery[Any]]:
    got: list[Delivery[Any]] = []
    while len(got) < n:
        batch = await r.receive(n - len(got), 5.0)
        assert batch, f"only {len(got)} of {n} arrived"
        got += batch
    return sorted(got, key=lambda d: d.body)


async def test_only_hand_outs_count_not_what_a_dead_consumer_was_sent(queue: QueueRef) -> None:
    bodies = [b"m0", b"m1", b"m2", b"m3"]
    sent = await _publish(queue, bodies)

    # 1st consumer: everything handed out, three released unseen, then it goes away
    backend, r = await consumer(queue)
    first = await take(r, 4)
    assert [(d.body, d.attempt) for d in first] == [(b, 1) for b in bodies]
    await r.release(first[1:])
    await backend.aclose()  # RabbitMQ counts all four (x-delivery-count 1); the book
    # takes the count of the three given back unseen back

    # 2nd: m0 was handed out once before (attempt 2), the three released ones never
    # (attempt 1); the three are released again
    backend, r = await consumer(queue)
    second = await take(r, 4)
    assert [(d.id, d.attempt) for d in second] == list(zip(sent, [2, 1, 1, 1], strict=True))
    await r.release(second[1:])
    await backend.aclose()

    # 3rd: m0 was handed out to both consumers before; the rest never
    backend, r = await consumer(queue)
    try:
        third = await take(r, 4)
        assert [d.attempt for d in third] == [3, 1, 1, 1], (
            "a redelivery's attempt must count hand-outs, not what the broker had sent to "
            f"consumers that went away: {[(d.body, d.attempt) for d in third]}"
        )
        await r.nack(third[1], 0.0)  # a nack is a failed attempt: it counts
        for d in (third[0], *third[2:]):
            await r.ack(d)
        [again] = await take(r, 1)
        assert (again.body, again.attempt) == (b"m1", 2)
        await r.ack(again)
    finally:
        await backend.aclose()


async def _publish(queue: QueueRef, bodies: list[bytes]) -> list[str]:
    async with brokerkit.connect(URL) as broker:
        results = await broker.publish_many(queue.name, [brokerkit.Outgoing(b) for b in bodies])
    return [r.id for r in results]
