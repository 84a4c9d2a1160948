"""A Kafka publish while the broker is down raises BrokerUnavailable within a bound.

librdkafka keeps an unconfirmed record for ``message.timeout.ms`` (300 s by default):
a publish during an outage used to block for the whole outage. The backend sets it
from ``?publish_timeout=`` (10 s, the retry budget of the other backends), so a publish
the broker cannot confirm fails with BrokerUnavailable naming host:port, never
reports success, and the producer works again once the broker is back.

On a throwaway single-node KRaft broker of this test's own (``test_kafka_restart``'s
``kafka_node``: free loopback ports, data under a tmp dir; SIGKILLed, never the shared
one). Every wait is a polling deadline.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from test_kafka_restart import WAIT, KafkaNode, kafka_node  # noqa: F401 (the fixture)

import brokerkit
from contract_tests._helpers import SCALE, fresh, receive

BOUND = 10.0
"""The default ``publish_timeout``."""
ALLOWANCE = 5.0 * SCALE
"""On top of the bound: the delivery report's way back to the loop on a loaded box."""


async def test_publish_during_outage_raises_within_the_bound_then_recovers(
    kafka_node: KafkaNode,  # noqa: F811
) -> None:
    url = f"kafka://{kafka_node.bootstrap}?partitions=2"
    queue, group = fresh("outage"), "workers"
    async with brokerkit.connect(url) as broker:
        first = await asyncio.wait_for(broker.publish(queue, b"before"), WAIT)
        assert first.id

        await asyncio.to_thread(kafka_node.kill)  # SIGKILL: no goodbye to the client
        figures = []
        for body in (b"down-1", b"down-2"):  # a second one too: no stale state between them
            started = time.monotonic()
            with pytest.raises(brokerkit.BrokerUnavailable) as caught:
                await asyncio.wait_for(broker.publish(queue, body), BOUND + ALLOWANCE)
            took = time.monotonic() - started
            figures.append(round(took, 2))
            exc = caught.value
            assert (exc.host, exc.port) == ("127.0.0.1", kafka_node.port), exc
            assert kafka_node.bootstrap in str(exc), str(exc)
            assert took >= BOUND - 1.0, f"gave up after {took:.1f}s, before the bound"
        many = [brokerkit.Outgoing(f"down-many-{i}".encode()) for i in range(5)]
        with pytest.raises(brokerkit.BrokerUnavailable):
            await asyncio.wait_for(broker.publish_many(queue, many), BOUND + ALLOWANCE)
        print(f"\npublish during the outage: BrokerUnavailable after {figures} s")

        kafka_node.start()
        await kafka_node.wait_ready()
        # the same connection publishes again by itself (its producer reconnects)
        deadline = time.monotonic() + WAIT
        after: list[bytes] = []
        while len(after) < 10:
            body = f"after-{len(after)}".encode()
            try:
                await asyncio.wait_for(broker.publish(queue, body), BOUND + ALLOWANCE)
            except brokerkit.BrokerUnavailable:
                # only while the restarted broker is still settling (leaders, metadata)
                assert time.monotonic() < deadline, "publishes still fail after the restart"
                continue
            after.append(body)

        confirmed = {b"before", *after}
        async with broker.consumer(queue, group, ack_timeout=30.0) as consumer:
            got: set[bytes] = set()
            while not confirmed <= got:
                msg = await receive(consumer, WAIT)
                got.add(msg.body)
                await msg.ack()
        unknown = got - confirmed - {b"down-1", b"down-2", *(m.body for m in many)}
        assert not unknown, unknown
