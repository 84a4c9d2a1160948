"""Bounded in-flight (CONTRACT section 4): ``broker.consumer(..., max_in_flight=N)``.

The obvious concurrent pattern, one task per message, must never hold more than N
unsettled messages of a consumer, however large the backlog: otherwise leases expire en
masse and a redelivery storm follows. Every message still arrives exactly once.
"""

from __future__ import annotations

import asyncio
import random

import pytest

import brokerkit

from ._helpers import WAIT

BACKLOG = 3_000


async def _backlog(broker: brokerkit.Broker, queue: str) -> list[bytes]:
    bodies = [b"f-%05d" % i for i in range(BACKLOG)]
    for start in range(0, BACKLOG, 500):
        chunk = bodies[start : start + 500]
        await broker.publish_many(queue, [brokerkit.Outgoing(b) for b in chunk])
    return bodies


async def _task_per_message(
    consumer: brokerkit.Consumer, count: int, bound: int
) -> tuple[list[bytes], int]:
    """Spawn one handler task per message, as a naive service does; the highest number of
    messages handed out and not yet settled, seen at each hand-out, and the bodies.

    The handlers hold their messages until ``bound`` are unsettled at once (so the bound is
    reached on a broker that delivers slower than handlers finish, too), then settle in
    random order and time."""
    unsettled = peak = 0
    bodies: list[bytes] = []
    tasks: set[asyncio.Task[None]] = set()
    rng = random.Random(17)
    full = asyncio.Event()
    errors: list[Exception] = []

    async def handle(msg: brokerkit.Message) -> None:
        nonlocal unsettled
        await full.wait()
        await asyncio.sleep(rng.random() * 0.004)  # out-of-order completion
        try:
            await msg.ack()
        except Exception as exc:
            errors.append(exc)
        finally:
            unsettled -= 1  # settled (or lost): no other task has run since the consumer saw it

    async def run() -> None:
        nonlocal unsettled, peak
        async for msg in consumer:
            unsettled += 1
            peak = max(peak, unsettled)
            if unsettled >= bound:
                full.set()
            bodies.append(msg.body)
            task = asyncio.ensure_future(handle(msg))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if len(bodies) == count:
                break
        await asyncio.gather(*tasks)

    await asyncio.wait_for(run(), WAIT * 6)
    assert not errors, f"{len(errors)} acks failed, the first: {errors[0]!r}"
    return bodies, peak


@pytest.mark.behaviour("ack")
async def test_ack_max_in_flight_bounds_unsettled_messages_over_a_backlog(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    bodies = await _backlog(broker, queue)
    async with broker.consumer(queue, group, prefetch=32, max_in_flight=20) as consumer:
        got, peak = await _task_per_message(consumer, BACKLOG, 20)
    assert peak <= 20, f"{peak} unsettled messages with max_in_flight=20"
    assert peak == 20, f"the bound was never reached (peak {peak}): the test proved nothing"
    assert sorted(got) == bodies  # each exactly once


@pytest.mark.behaviour("ack")
async def test_ack_default_in_flight_bound_is_max_of_prefetch_and_100(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    bodies = await _backlog(broker, queue)
    async with broker.consumer(queue, group, prefetch=32) as consumer:
        got, peak = await _task_per_message(consumer, BACKLOG, 100)
    assert peak <= 100, f"{peak} unsettled messages with the default bound"
    assert peak == 100, f"the bound was never reached (peak {peak}): the test proved nothing"
    assert sorted(got) == bodies


@pytest.mark.behaviour("ack")
async def test_ack_a_sequential_loop_is_unchanged_by_max_in_flight_1(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish_many(queue, [brokerkit.Outgoing(b"s-%d" % i) for i in range(50)])
    got = []
    async with broker.consumer(queue, group, max_in_flight=1) as consumer:
        async for msg in consumer:
            got.append(msg.body)
            await msg.ack()
            if len(got) == 50:
                break
    assert sorted(got) == sorted(b"s-%d" % i for i in range(50))
