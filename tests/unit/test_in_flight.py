"""The consumer's in-flight bound: waiting for a slot, cancelling, closing, lost leases.

Facade logic, on ``memory://`` (the contract suite proves the bound on every broker).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

import brokerkit


def _url() -> str:
    return f"memory://inflight{uuid.uuid4().hex[:12]}"


async def test_the_iterator_waits_for_a_settle_and_a_cancelled_wait_loses_nothing() -> None:
    async with brokerkit.connect(_url()) as broker:
        await broker.publish_many("q", [brokerkit.Outgoing(b"%d" % i) for i in range(3)])
        async with broker.consumer("q", max_in_flight=2) as consumer:
            first, second = await consumer.__anext__(), await consumer.__anext__()
            waiting = asyncio.ensure_future(consumer.__anext__())
            await asyncio.sleep(0.05)
            assert not waiting.done()  # two unsettled: no third
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await first.ack()
            third = await asyncio.wait_for(consumer.__anext__(), 2.0)
            assert (third.body, third.attempt) == (b"2", 1)  # the cancelled wait took nothing
            await second.ack()
            await third.ack()


async def test_two_tasks_waiting_for_slots_each_get_one() -> None:
    async with brokerkit.connect(_url()) as broker:
        await broker.publish_many("q", [brokerkit.Outgoing(b"%d" % i) for i in range(4)])
        async with broker.consumer("q", max_in_flight=2) as consumer:
            held = [await consumer.__anext__(), await consumer.__anext__()]
            a = asyncio.ensure_future(consumer.__anext__())
            b = asyncio.ensure_future(consumer.__anext__())
            await asyncio.sleep(0.02)
            await held[0].ack()
            done, _ = await asyncio.wait({a, b}, timeout=2.0, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.sleep(0.02)
            assert len(done) == 1 and not (a.done() and b.done())  # one slot, one message
            await held[1].ack()
            rest = await asyncio.wait_for(asyncio.gather(a, b), 2.0)
            assert sorted(m.body for m in rest) == [b"2", b"3"]
            for m in rest:
                await m.ack()


async def test_close_ends_an_iteration_that_waits_for_a_slot() -> None:
    async with brokerkit.connect(_url()) as broker:
        await broker.publish_many("q", [brokerkit.Outgoing(b"x"), brokerkit.Outgoing(b"y")])
        consumer = broker.consumer("q", max_in_flight=1, close_timeout=0.0)
        await consumer.open()
        held = await consumer.__anext__()
        waiting = asyncio.ensure_future(consumer.__anext__())
        await asyncio.sleep(0.02)
        await asyncio.wait_for(consumer.aclose(), 2.0)
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiting, 2.0)
        with pytest.raises(brokerkit.LeaseExpired):
            await held.ack()  # given back on close, unsettled


async def test_a_held_message_whose_lease_ran_out_counts_until_its_settle_raises() -> None:
    # The rule: a message counts against max_in_flight from its hand-out until the caller
    # settles it (here: tries to, and LeaseExpired is raised) or drops it; a lease that ran
    # out frees no slot by itself, so the caller never holds more than max_in_flight.
    async with brokerkit.connect(_url()) as broker:
        await broker.publish_many("q", [brokerkit.Outgoing(b"held"), brokerkit.Outgoing(b"n")])
        async with broker.consumer("q", ack_timeout=0.2, max_in_flight=1) as consumer:
            held = await consumer.__anext__()  # a slow handler: it still holds it
            waiting = asyncio.ensure_future(consumer.__anext__())
            await asyncio.sleep(0.2 * 4 + 1.0)  # well past the lease and one slot poll
            assert not waiting.done(), "a second message while the first is still held"
            assert consumer.in_flight == 1
            with pytest.raises(brokerkit.LeaseExpired):
                await held.ack()
            assert consumer.in_flight == 0
            nxt = await asyncio.wait_for(waiting, 5.0)
            assert nxt.body in (b"n", b"held")  # the next one, or the redelivery
            await nxt.ack()


async def test_a_message_dropped_unsettled_frees_its_slot() -> None:
    async with brokerkit.connect(_url()) as broker:
        await broker.publish_many("q", [brokerkit.Outgoing(b"dropped"), brokerkit.Outgoing(b"n")])
        async with broker.consumer("q", ack_timeout=0.2, max_in_flight=1) as consumer:
            dropped = await consumer.__anext__()  # a lost handler: no reference is left
            assert consumer.in_flight == 1
            del dropped
            nxt = await asyncio.wait_for(consumer.__anext__(), 5.0)
            assert nxt.body in (b"n", b"dropped")
            assert consumer.in_flight == 1
            await nxt.ack()
            assert consumer.in_flight == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_max_in_flight_is_validated_before_io(bad: object) -> None:
    broker = brokerkit.connect(_url())
    with pytest.raises(brokerkit.InvalidArgument, match="max_in_flight"):
        broker.consumer("q", max_in_flight=bad)  # type: ignore[arg-type]


def test_default_is_max_of_prefetch_and_100() -> None:
    broker = brokerkit.connect(_url())
    assert broker.consumer("q").max_in_flight == 100
    assert broker.consumer("q", prefetch=500).max_in_flight == 500
    assert broker.consumer("q", prefetch=500, max_in_flight=7).max_in_flight == 7
