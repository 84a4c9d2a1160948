"""A last attempt keeps its lease while it waits to go out alone (issue 16, ``_alone.py``).

Before a message's last attempt is handed out, what the caller holds is settled first,
which may take as long as those messages' leases (and the wait is polled, so a little
longer). The last attempt was fetched meanwhile, and its own lease ran on: the facade
dropped it as lost, the broker redelivered it past ``max_attempts``, and it went to the
DLQ never tried (before: this test timed out waiting for it).
Pure facade logic, on memory://.
"""

from __future__ import annotations

import asyncio

import brokerkit
from brokerkit.testing import fresh_broker

LEASE = 1.0


async def _next(consumer: brokerkit.Consumer, timeout: float = 10.0) -> brokerkit.Message:
    return await asyncio.wait_for(consumer.__anext__(), timeout)


async def _renew_then_ack(message: brokerkit.Message, seconds: float) -> None:
    """A slow handler: renews its lease for ``seconds`` (three of the last attempt's)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        await asyncio.sleep(LEASE / 4)
        await message.extend()
    await message.ack()


async def test_a_last_attempt_waiting_for_a_slow_handler_is_still_tried() -> None:
    async with fresh_broker() as broker:
        await broker.publish("q", b"last")
        async with broker.consumer("q", "g", max_attempts=2, ack_timeout=LEASE) as first:
            once = await _next(first)
            await once.nack(delay=0.5)  # attempt 2 (the last) is due in half a second
        await broker.publish("q", b"slow")
        async with broker.consumer("q", "g", max_attempts=2, ack_timeout=LEASE) as consumer:
            slow = await _next(consumer)
            assert slow.body == b"slow"
            handler = asyncio.ensure_future(_renew_then_ack(slow, 3 * LEASE))
            last = await _next(consumer)  # fetched while `slow` is held: waits for it
            assert (last.body, last.attempt) == (b"last", 2)
            await last.ack()  # its lease was renewed while it waited: not LeaseExpired
            await handler
        stats = await broker.stats("q", "g")
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)
