"""A damaged message inside a user's fifo group on SQS (beside contract_tests'
test_broker_side_input, whose raw messages have groups of their own): SQS blocks the
group while it is leased, so the receiver holds what follows it as its group's head; it
is dead-lettered and the group goes on in order, none of its neighbours paying an attempt.

Run with ``BROKERKIT_SMOKE=sqs`` (or ``all``); the URL is ``BROKERKIT_SQS_URL`` or
scripts/services' ElasticMQ.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

import brokerkit

pytest.importorskip("boto3", reason="boto3 is not installed (brokerkit-mq[sqs])")

from _sqs import SELECTED, URL, raw_client

pytestmark = SELECTED
WAIT = 20.0


@pytest_asyncio.fixture
async def queue() -> AsyncIterator[str]:
    name = f"it-{uuid.uuid4().hex[:16]}"
    yield name
    async with brokerkit.connect(URL) as cleaner:
        await cleaner.delete_queue(name)


@pytest.mark.parametrize("prefetch", [1, 10])
async def test_a_damaged_message_in_a_fifo_group_is_dead_lettered_in_its_turn(
    queue: str, prefetch: int
) -> None:
    group = "orders-1"
    async with brokerkit.connect(URL) as broker:
        for i in range(3):
            await broker.publish(queue, b"good-%d" % i, fifo_group=group)
        raw = raw_client(URL)
        url = raw.get_queue_url(QueueName=f"{queue}.fifo")["QueueUrl"]
        cut_short = b"\x01\x01" + struct.pack(">H", 300)  # flags: user's group; header cut
        raw.send_message(
            QueueUrl=url,
            MessageBody="damaged",
            MessageGroupId=group,
            MessageDeduplicationId=uuid.uuid4().hex,
            MessageAttributes={"brokerkit": {"DataType": "Binary", "BinaryValue": cut_short}},
        )
        for i in range(3, 6):
            await broker.publish(queue, b"good-%d" % i, fifo_group=group)
        got: list[tuple[bytes, int]] = []
        async with broker.consumer(queue, prefetch=prefetch) as consumer:
            deadline = time.monotonic() + WAIT
            while len(got) < 6:
                assert time.monotonic() < deadline, f"got {got}"
                msg = await asyncio.wait_for(consumer.__anext__(), WAIT)
                got.append((msg.body, msg.attempt))
                await msg.ack()
        assert got == [(b"good-%d" % i, 1) for i in range(6)]
        async with broker.dead_letters(queue) as dead:
            msg = await asyncio.wait_for(dead.__anext__(), WAIT)
            info = msg.dead_letter_info
            assert msg.body == b"damaged" and msg.fifo_group == group
            assert info is not None and info.reason.startswith("corrupt: brokerkit attribute")
            await msg.ack()
