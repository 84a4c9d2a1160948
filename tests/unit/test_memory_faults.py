"""memory://'s fault injection points (``fail_publishes``, ``lose_lease``), and what the
facade does with the faults they make: the failure paths the contract suite drives.

Planted and caught: ``fail_publishes`` storing the refused message anyway; a lost lease
that the facade's settle still treats as held (``Message.ack`` returns); a lost lease
keeping the only ``max_in_flight`` slot after LeaseExpired; memory://'s ``dead_letter``
copying a delivery whose lease was lost.
"""

from __future__ import annotations

import asyncio

import pytest

import brokerkit
from brokerkit.backends.memory import fail_publishes, lose_lease
from brokerkit.testing import memory_url


def _name(url: str) -> str:
    return url.removeprefix("memory://")


async def _none_within(consumer: brokerkit.Consumer, seconds: float) -> bool:
    try:
        await asyncio.wait_for(consumer.__anext__(), seconds)
    except TimeoutError:
        return True
    return False


async def test_fail_publishes_refuses_the_next_calls_and_stores_nothing() -> None:
    url = memory_url()
    async with brokerkit.connect(url) as broker:
        fail_publishes(_name(url), "q", 2)
        for body in (b"one", b"many"):
            with pytest.raises(brokerkit.BrokerUnavailable, match="injected"):
                await broker.publish_many("q", [brokerkit.Outgoing(body)])
        await broker.publish("q", b"kept")
        fail_publishes(_name(url), "q", 5)
        fail_publishes(_name(url), "q", 0)  # ended
        await broker.publish("q", b"kept too")
        async with broker.consumer("q", ack_timeout=5.0) as consumer:
            got = [await asyncio.wait_for(consumer.__anext__(), 1.0) for _ in range(2)]
            assert [m.body for m in got] == [b"kept", b"kept too"]
            assert await _none_within(consumer, 0.3)


async def test_a_lost_lease_is_redelivered_at_once_and_its_settle_raises() -> None:
    url = memory_url()
    async with brokerkit.connect(url) as broker:
        await broker.publish("q", b"x")
        async with broker.consumer(
            "q", "g", ack_timeout=30.0, max_in_flight=1, prefetch=1
        ) as consumer:
            msg = await asyncio.wait_for(consumer.__anext__(), 1.0)
            assert lose_lease(_name(url), "q", "g", msg.id)
            assert not lose_lease(_name(url), "q", "g", msg.id)  # no live lease now
            assert consumer.in_flight == 1  # held: the caller has not let go of it
            with pytest.raises(brokerkit.LeaseExpired):
                await msg.ack()
            assert consumer.in_flight == 0
            again = await asyncio.wait_for(consumer.__anext__(), 1.0)  # not 30 s later
            assert (again.id, again.attempt) == (msg.id, 2)
            await again.ack()


async def test_a_dead_letter_of_a_lost_lease_leaves_no_copy() -> None:
    url = memory_url()
    async with brokerkit.connect(url) as broker:
        await broker.publish("q", b"x")
        async with broker.consumer("q", "g", ack_timeout=30.0) as consumer:
            msg = await asyncio.wait_for(consumer.__anext__(), 1.0)
            assert lose_lease(_name(url), "q", "g", msg.id)
            with pytest.raises(brokerkit.LeaseExpired):
                await msg.dead_letter("too late")
            again = await asyncio.wait_for(consumer.__anext__(), 1.0)
            await again.ack()
        async with broker.dead_letters("q") as dead:
            assert await _none_within(dead, 0.3), "a lost lease was copied to the DLQ"
