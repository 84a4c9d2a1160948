"""Publishing from many tasks at once (CONTRACT section 3): a service publishes one message
per request, from thousands of requests at once. Every call must succeed on a healthy
broker, each returning its own id, and every message must be delivered exactly once."""

from __future__ import annotations

import asyncio

import pytest

import brokerkit

from ._helpers import WAIT, receive_n

CONCURRENT = 10_000


@pytest.mark.behaviour("publish")
async def test_ten_thousand_concurrent_publishes_succeed_and_all_arrive(
    broker: brokerkit.Broker, queue: str
) -> None:
    bodies = [b"c-%05d" % i for i in range(CONCURRENT)]
    results = await asyncio.gather(*(broker.publish(queue, body) for body in bodies))
    assert len({r.id for r in results}) == CONCURRENT  # no failure, one id each
    async with broker.consumer(queue, prefetch=500) as consumer:
        got = await receive_n(consumer, CONCURRENT, timeout=WAIT * 6)
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
