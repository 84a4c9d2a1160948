"""Publishing from many tasks at once (CONTRACT section 3): a service publishes one message
per request, from thousands of requests at once. Every call must succeed on a healthy
broker, each returning its own id, and every message must be delivered exactly once."""

from __future__ import annotations

import asyncio

import pytest

import brokerkit

from ._helpers import WAIT, receive_n

CONCURRENT = 10_000
SLOWEST_RATE = 40.0
"""Messages per second the slowest broker we run delivers a 10 000-message backlog at: the
SQS emulator (ElasticMQ 1.7.1) scans its queue on every receive, ~0.4 s per 10 messages
with 10 000 queued and some in flight (raw boto3: 0.1 s with none in flight), so it takes
about 3 minutes to drain; real SQS does not. The deadline is a bound, not a wait."""


@pytest.mark.behaviour("publish")
async def test_ten_thousand_concurrent_publishes_succeed_and_all_arrive(
    broker: brokerkit.Broker, queue: str
) -> None:
    bodies = [b"c-%05d" % i for i in range(CONCURRENT)]
    results = await asyncio.gather(*(broker.publish(queue, body) for body in bodies))
    assert len({r.id for r in results}) == CONCURRENT  # no failure, one id each
    async with broker.consumer(queue, prefetch=500) as consumer:
        got = await receive_n(consumer, CONCURRENT, timeout=WAIT * 6 + CONCURRENT / SLOWEST_RATE)
    assert sorted(m.body for m in got) == bodies  # each exactly once


@pytest.mark.behaviour("FIFO order")
async def test_concurrent_publishes_keep_each_awaiting_callers_order(
    broker: brokerkit.Broker, queue: str
) -> None:
    # 50 tasks, each publishing its own fifo_group in order, all at once: within a group
    # the order is that of the awaited calls, whatever was gathered with what
    async def one_group(g: int) -> None:
        for i in range(10):
            await broker.publish(queue, b"%d:%d" % (g, i), fifo_group=f"g{g}")

    await asyncio.gather(*(one_group(g) for g in range(50)))
    async with broker.consumer(queue, prefetch=100) as consumer:
        got = await receive_n(consumer, 500, timeout=WAIT * 3)
    seen: dict[bytes, list[int]] = {}
    for msg in got:
        group, index = msg.body.split(b":")
        seen.setdefault(group, []).append(int(index))
    assert seen == {b"%d" % g: list(range(10)) for g in range(50)}
