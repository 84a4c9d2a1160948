"""memory:// answers an idle receive within its short poll, so nothing that waits a
fetch out (a closing consumer, redrive choosing the oldest dead letter) waits long.

Planted and caught: a receive that waits the whole ``wait`` the facade gives it (1 s):
the close and the empty redrive below then take about a second each.
"""

from __future__ import annotations

import asyncio
import time

import brokerkit
from brokerkit.testing import memory_url

QUICK = 0.5
"""Well under the facade's 1 s poll, well over memory's own."""


async def test_an_idle_consumer_closes_without_waiting_out_its_fetch() -> None:
    async with brokerkit.connect(memory_url()) as broker:
        consumer = broker.consumer("q-poll", "g")
        await consumer.open()
        waiting = asyncio.ensure_future(consumer.__anext__())
        await asyncio.sleep(0.05)  # blocked in its fetch on an empty queue
        waiting.cancel()
        started = time.monotonic()
        await consumer.aclose()
        assert time.monotonic() - started < QUICK


async def test_redrive_of_an_empty_dlq_and_of_one_dead_letter_answers_promptly() -> None:
    async with brokerkit.connect(memory_url()) as broker:
        started = time.monotonic()
        assert await broker.redrive("q-poll") == 0
        assert time.monotonic() - started < QUICK
        await broker.publish("q-poll", b"x")
        async with broker.consumer("q-poll", "g") as consumer:
            msg = await asyncio.wait_for(consumer.__anext__(), 5)
            await msg.dead_letter("to redrive")
        started = time.monotonic()
        assert await broker.redrive("q-poll") == 1
        assert time.monotonic() - started < QUICK + QUICK  # a fill, then an empty refill


async def test_a_publish_still_wakes_a_waiting_receive_at_once() -> None:
    async with brokerkit.connect(memory_url()) as broker:
        async with broker.consumer("q-poll", "g") as consumer:
            waiting = asyncio.ensure_future(consumer.__anext__())
            await asyncio.sleep(0.25)  # past memory's poll: the consumer asked again
            await broker.publish("q-poll", b"now")
            published = time.monotonic()
            msg = await asyncio.wait_for(waiting, 5)
            assert time.monotonic() - published < 0.05
            await msg.ack()
