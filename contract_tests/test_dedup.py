"""Deduplication (CONTRACT section 6)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

import brokerkit
from contract_tests._helpers import WAIT, eventually, nothing_within, receive, receive_n, with_param
from contract_tests.conftest import Connect


@pytest.mark.behaviour("dedup")
async def test_dedup_same_id_is_delivered_once_even_after_ack(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    first = await broker.publish(queue, b"event", dedup_id="order-42")
    again = await broker.publish(queue, b"event", dedup_id="order-42")
    assert first.duplicate in (False, None)
    assert again.duplicate in (True, None)
    if again.duplicate:
        assert again.id == first.id
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert (msg.id, msg.dedup_id) == (first.id, "order-42")
        await msg.ack()
        late = await broker.publish(queue, b"event", dedup_id="order-42")  # after the ack
        assert late.duplicate in (True, None)
        await broker.publish(queue, b"sentinel")
        nxt = await receive(consumer)
        assert nxt.body == b"sentinel", f"duplicate delivered: {nxt!r}"
        await nxt.ack()
        assert await nothing_within(consumer, 1.0) is None


@pytest.mark.behaviour("dedup")
async def test_dedup_ids_are_per_queue_and_absent_ids_never_dedup(
    broker: brokerkit.Broker, queue: str, group: str, new_queue: Callable[[str | None], str]
) -> None:
    other = new_queue(queue + "-other")  # a name that starts with the other's
    await broker.publish(queue, b"a", dedup_id="same")
    await broker.publish(other, b"b", dedup_id="same")
    await broker.publish(queue, b"plain")
    await broker.publish(queue, b"plain")
    async with broker.consumer(other, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"b"
        await msg.ack()
    async with broker.consumer(queue, group) as consumer:
        bodies = sorted(m.body for m in await receive_n(consumer, 3))
        assert bodies == [b"a", b"plain", b"plain"]


@pytest.mark.behaviour("dedup window")
async def test_dedup_window_expires_and_the_id_is_delivered_again(
    broker_url: str, connect: Connect, queue: str, group: str
) -> None:
    probe = await connect()
    if not probe.capabilities.dedup_window_configurable:
        pytest.skip("fixed window: covered by the slow test")
    window = 2.0
    broker = await connect(with_param(broker_url, "dedup_window", "2"))
    assert broker.capabilities.dedup_window == window
    published = time.monotonic()
    await broker.publish(queue, b"one", dedup_id="tick")
    await broker.publish(queue, b"dup", dedup_id="tick")  # inside the window
    await _expect_redelivery_after(broker, queue, group, published, window)


@pytest.mark.slow
@pytest.mark.behaviour("dedup window")
async def test_dedup_window_fixed_by_the_broker_expires(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    if broker.capabilities.dedup_window_configurable:
        pytest.skip("configurable window: proven fast by the test above")
    window = broker.capabilities.dedup_window
    published = time.monotonic()
    await broker.publish(queue, b"one", dedup_id="tick")
    await broker.publish(queue, b"dup", dedup_id="tick")
    await _expect_redelivery_after(broker, queue, group, published, window)


async def _expect_redelivery_after(
    broker: brokerkit.Broker, queue: str, group: str, published: float, window: float
) -> None:
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"one"
        await msg.ack()
        # the condition is the clock itself: the window must have passed
        await eventually(
            lambda: time.monotonic() > published + window + 0.5,
            timeout=window + WAIT,
            what="the dedup window to pass",
        )
        again = await broker.publish(queue, b"two", dedup_id="tick")
        assert again.duplicate in (False, None)
        msg = await receive(consumer)
        assert msg.body == b"two" and msg.dedup_id == "tick"
        await msg.ack()


@pytest.mark.behaviour("dedup race")
async def test_dedup_race_concurrent_publishers_give_one_delivery(
    connect: Connect, queue: str, group: str
) -> None:
    conns = [await connect() for _ in range(3)]
    tasks = [
        conns[i % 3].publish(queue, b"raced", dedup_id="race-1", headers={"n": str(i)})
        for i in range(12)
    ]
    results = await asyncio.gather(*tasks)
    assert sum(1 for r in results if r.duplicate is False) <= 1
    async with conns[0].consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"raced"
        await msg.ack()
        await conns[0].publish(queue, b"sentinel")
        nxt = await receive(consumer)
        assert nxt.body == b"sentinel", f"a raced duplicate was delivered: {nxt!r}"
        await nxt.ack()
        assert await nothing_within(consumer, 1.0) is None
