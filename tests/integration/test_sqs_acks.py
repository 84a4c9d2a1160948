"""SQS: a coalesced ack reaches SQS within its window even while the event loop is held up.

The contract lets ``ack()`` return before the broker recorded it only within a bounded,
documented window (``capabilities.ack_flush_interval``, 0.1 s on SQS). The window's
DeleteMessageBatch used to go from a loop timer, which fires only when the loop runs: a
loop held up for a while (a blocking handler, a busy process) stretched the window by as
much, and a crash in it lost an ack that had returned long before (seen in the broker
restart behaviour: an ack 0.19 s before the kill came back, the loop 0.1 s late).

Run with ``BROKERKIT_SMOKE=sqs`` (or ``all``); the URL is ``BROKERKIT_SQS_URL`` or
scripts/services' ElasticMQ. The queue gets a fresh name and is deleted after.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

import brokerkit
from brokerkit.backends import QueueRef, ReceiverSettings

pytest.importorskip("boto3", reason="boto3 is not installed (brokerkit-mq[sqs])")

from _sqs import SELECTED, URL, raw_client

from brokerkit.backends.sqs import SqsBackend

pytestmark = SELECTED


def _held(client: Any, name: str) -> int:
    """Messages SQS still holds in the queue (visible or not)."""
    urls = [
        u for u in client.list_queues().get("QueueUrls", []) if u.split("/")[-1].startswith(name)
    ]
    url = next(u for u in urls if "_dlq_" not in u)
    attrs = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(
        attrs["ApproximateNumberOfMessagesNotVisible"]
    )


def _held_up_until_deleted(client: Any, name: str, limit: float) -> tuple[int, float]:
    """Hold the event loop up (this blocks it, on purpose: a handler that blocks) while
    polling SQS until it holds nothing or ``limit`` s passed; (held, seconds waited)."""
    started = time.monotonic()
    left = _held(client, name)
    while left and time.monotonic() < started + limit:
        time.sleep(0.02)
        left = _held(client, name)
    return left, time.monotonic() - started


async def test_a_coalesced_ack_is_deleted_within_its_window_while_the_loop_is_held_up() -> None:
    queue = QueueRef(f"t-sqs-acks-{uuid.uuid4().hex[:10]}")
    backend = SqsBackend.from_url(brokerkit.BrokerURL.parse(URL))
    await backend.open()
    client = raw_client(URL)
    try:
        window = backend.capabilities.ack_flush_interval
        assert 0 < window <= 0.1
        await backend.publish(queue, [brokerkit.Outgoing(b"acked")])
        receiver = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
        got = []
        deadline = time.monotonic() + 20.0
        while not got and time.monotonic() < deadline:
            got = await receiver.receive(1, 1.0)
        assert [d.body for d in got] == [b"acked"]
        assert _held(client, queue.name) == 1
        await receiver.ack(got[0])  # coalesced: far from the end of its 30 s lease
        # from here the loop is held up until the check ends: no loop timer can fire
        left, waited = _held_up_until_deleted(client, queue.name, 2.0)
        assert left == 0, (
            f"the ack returned {waited:.1f} s ago and SQS still holds the message: the "
            f"coalescing window ({window} s) waited for the held-up event loop"
        )
        await receiver.aclose()
    finally:
        await backend.aclose()
        async with brokerkit.connect(URL) as broker:
            await broker.delete_queue(queue.name)
