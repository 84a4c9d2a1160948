"""SQS: an ack made just before a redelivery goes out survives the crash it causes.

Reliability item 14: a fifo-group innocent was acked, then dead-lettered. The chain: a
consumer acked it (coalesced: the delete goes out within ``ack_flush_interval``), took
the poison's second delivery next, and was SIGKILLed a few ms later; the delete died
with it, the innocent came back with an attempt counted, and SQS counted it again in
the next consumer killed while it sat there unseen: past ``max_attempts``, to the DLQ.
The facade now records the acks made so far (``flush_acks``) before it hands out any
redelivery, not only a last attempt.

Driven here on the real broker: X (group ``a-innocent``) and P (group ``z-poison``)
are nacked to attempt 2 by this process, then a child consumer (``_crash_child``,
prefetch 32) gets both in one fetch, hands out X, acks it, hands out P and holds it; it
is SIGKILLed at once. X must not come back. Before the fix it came back with attempt 3
(the kill came 4-7 ms after X's ack). The emulator hands out the two groups in the
order of their names; the test checks that order happened (X acked before P went out),
so it cannot pass without the interleaving it is about.

Run with ``BROKERKIT_SMOKE=sqs`` (or ``all``); the URL is ``BROKERKIT_SQS_URL`` or
scripts/services' ElasticMQ.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

import brokerkit
from contract_tests._crash_pool import START_WAIT, Pool
from contract_tests._helpers import nothing_within, receive

pytest.importorskip("boto3", reason="boto3 is not installed (brokerkit-mq[sqs])")

from _sqs import SELECTED, URL

pytestmark = SELECTED
ACK_TIMEOUT = 2.0
NACK_DELAY = 1.0


async def test_an_ack_before_a_redelivered_poison_is_not_lost_with_the_crash() -> None:
    queue, group = f"q-{uuid.uuid4().hex[:12]}", f"g-{uuid.uuid4().hex[:8]}"
    async with brokerkit.connect(URL) as broker:
        try:
            await broker.publish(queue, b"X", fifo_group="a-innocent")
            await broker.publish(queue, b"P", fifo_group="z-poison")
            async with broker.consumer(
                queue, group, max_attempts=3, ack_timeout=ACK_TIMEOUT, prefetch=2
            ) as first:
                for _ in range(2):
                    msg = await receive(first)
                    assert msg.attempt == 1
                    await msg.nack(NACK_DELAY)
            # the condition is the nack delay itself: both due again, attempt 2 of 3
            await asyncio.sleep(NACK_DELAY + 0.5)
            pool = Pool(
                URL,
                {
                    "queue": queue,
                    "group": group,
                    "max_attempts": 3,
                    "ack_timeout": ACK_TIMEOUT,
                    "prefetch": 32,
                    "poison": ["P"],
                    "lifetime": 120.0,
                },
            )
            seen: list[tuple[str, str | None, int | None]] = []
            try:
                child = await pool.spawn()
                await pool.ready(child)
                while True:
                    _, event = await pool.next(START_WAIT, "the child to hold the poison")
                    seen.append((event["ev"], event.get("body"), event.get("attempt")))
                    assert event["ev"] in ("ready", "got", "ack", "hold"), seen
                    if event["ev"] == "hold":
                        pool.kill(child)
                        break
            finally:
                await pool.close()
            assert seen[-3:] == [("ack", "X", 2), ("got", "P", 2), ("hold", "P", 2)], (
                f"not the interleaving under test (X acked, then P handed out): {seen}"
            )
            # P comes back (attempt 3) once its lease ran out; X was acked: never again
            back: list[tuple[bytes, int]] = []
            async with broker.consumer(
                queue, group, max_attempts=3, ack_timeout=ACK_TIMEOUT
            ) as rest:
                while not back or back[-1][0] != b"P":
                    msg = await receive(rest, 30.0)
                    back.append((msg.body, msg.attempt))
                    await msg.ack()
                late = await nothing_within(rest, ACK_TIMEOUT * 2 + 1.0)
                if late is not None:
                    back.append((late.body, late.attempt))
            assert back == [(b"P", 3)], f"X, acked before the crash, delivered again: {back}"
        finally:
            await broker.delete_queue(queue)
