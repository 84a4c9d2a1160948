"""SQS: a message given back unseen comes back with its attempt corrected, in any process.

SQS counts every receive (``ApproximateReceiveCount``). A receiver that gives back a
message its caller never saw (read-ahead at close, before a last attempt goes out alone)
copies a message without a fifo_group back (``brokerkit/backends/sqs/_copies.py``), so
the correction lives in SQS, not in the memory of a process that may die next. Each
receive-and-give-back here runs in a child process of its own, which exits after it:
the next receiver knows nothing of it but what SQS tells.

Run with ``BROKERKIT_SMOKE=sqs`` (or ``all``); the URL is ``BROKERKIT_SQS_URL`` or
scripts/services' ElasticMQ. Queues get fresh names and are deleted after.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import brokerkit
from brokerkit.backends import Delivery, QueueRef, Receiver, ReceiverSettings

pytest.importorskip("boto3", reason="boto3 is not installed (brokerkit-mq[sqs])")

from _sqs import SELECTED, URL

from brokerkit.backends.sqs import SqsBackend

pytestmark = SELECTED
WAIT = 20.0

_CHILD = """
import asyncio, json, sys
import brokerkit
from brokerkit.backends import QueueRef, ReceiverSettings
from brokerkit.backends.sqs import SqsBackend

async def main(url, queue, count):
    backend = SqsBackend.from_url(brokerkit.BrokerURL.parse(url))
    await backend.open()
    receiver = await backend.subscribe(QueueRef(queue), "g", ReceiverSettings(30.0))
    got = []
    for _ in range(40):
        got += await receiver.receive(count - len(got), 1.0)
        if len(got) >= count:
            break
    print(json.dumps(sorted([d.body.decode("latin-1"), d.attempt] for d in got)))
    await receiver.release(got)
    await receiver.aclose()
    await backend.aclose()

asyncio.run(main(*sys.argv[1:3], int(sys.argv[3])))
"""


async def receive_and_give_back_in_a_child(queue: QueueRef, count: int) -> list[list[Any]]:
    """A process of its own receives ``count`` messages, gives them all back, exits."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        URL,
        queue.name,
        str(count),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, "the child failed"
    seen: list[list[Any]] = json.loads(out)
    return seen


@pytest_asyncio.fixture
async def queue() -> AsyncIterator[QueueRef]:
    ref = QueueRef(f"t-sqs-attempts-{uuid.uuid4().hex[:10]}")
    yield ref
    async with brokerkit.connect(URL) as broker:
        await broker.delete_queue(ref.name)


async def take(receiver: Receiver[Any], n: int) -> list[Delivery[Any]]:
    got: list[Delivery[Any]] = []
    deadline = asyncio.get_running_loop().time() + WAIT
    while len(got) < n and asyncio.get_running_loop().time() < deadline:
        got += await receiver.receive(n - len(got), 1.0)
    assert len(got) == n, f"only {len(got)} of {n} arrived"
    return sorted(got, key=lambda d: d.body)


async def test_a_message_given_back_unseen_counts_no_attempt_in_the_next_process(
    queue: QueueRef,
) -> None:
    outgoing = [
        brokerkit.Outgoing(b"a plain text"),
        brokerkit.Outgoing(b"b\xff binary", headers={"k": "v"}, dedup_id="dedup-b"),
        brokerkit.Outgoing(b""),
    ]
    async with brokerkit.connect(URL) as broker:
        sent = await broker.publish_many(queue.name, outgoing)
    ids = {m.body: r.id for m, r in zip(outgoing, sent, strict=True)}

    # two processes in turn receive all three and give them back unseen, then exit
    for _ in range(2):
        seen = await receive_and_give_back_in_a_child(queue, 3)
        assert [attempt for _, attempt in seen] == [1, 1, 1], seen

    backend = SqsBackend.from_url(brokerkit.BrokerURL.parse(URL))
    await backend.open()
    try:
        receiver = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
        got = await take(receiver, 3)
        assert [d.attempt for d in got] == [1, 1, 1], (
            "SQS counted the receives of processes that gave the messages back unseen: "
            f"{[(d.body, d.attempt) for d in got]}"
        )
        # the copy is the message its publisher sent: id, body, headers, dedup id
        assert [(d.body, d.id) for d in got] == sorted(ids.items())
        by_body = {d.body: d for d in got}
        assert dict(by_body[b"b\xff binary"].headers) == {"k": "v"}
        assert by_body[b"b\xff binary"].dedup_id == "dedup-b"
        assert [d.fifo_group for d in got] == [None, None, None]
        # the dedup id still deduplicates within SQS's window
        async with brokerkit.connect(URL) as broker:
            again = await broker.publish(queue.name, b"b\xff binary", dedup_id="dedup-b")
        assert again.duplicate is not False, again
        for delivery in got:
            await receiver.ack(delivery)
        await receiver.aclose()
        receiver = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
        left = await receiver.receive(10, 2.0)  # nothing copied twice, nothing left over
        assert left == [], [(d.body, d.attempt) for d in left]
        await receiver.aclose()
    finally:
        await backend.aclose()


async def test_what_a_receiver_holds_beside_a_redelivery_comes_back_apart_from_it(
    queue: QueueRef,
) -> None:
    """docs/reliability.md item 10: SQS counts every message of a received batch. A
    consumer killed while it handles a redelivery (perhaps the poison that killed the
    last one) held neighbours unseen; they came back at the same moment, in the same
    batches, and each further crash counted them again (innocents of other fifo groups
    dead-lettered). When the facade hands out a redelivery, the receiver makes what it
    holds besides come back after that message's lease: the first receive after the
    lease brings the redelivery alone."""
    async with brokerkit.connect(URL) as broker:
        await broker.publish_many(
            queue.name,
            [
                brokerkit.Outgoing(b"suspect", fifo_group="gs"),
                brokerkit.Outgoing(b"neighbour", fifo_group="gn"),
            ],
        )
    backend = SqsBackend.from_url(brokerkit.BrokerURL.parse(URL))
    await backend.open()
    try:
        settings = ReceiverSettings(1.0)
        crashed = await backend.subscribe(queue, "g", settings)
        await take(crashed, 2)  # leased and never settled: a consumer killed
        again = await backend.subscribe(queue, "g", settings)
        got = await take(again, 2)  # back once the leases end
        assert [(d.body, d.attempt) for d in got] == [(b"neighbour", 2), (b"suspect", 2)]
        await again.handing_out(got[1], [got[0]])  # the facade, as it hands it out
        # ... and this one is killed too: the suspect comes back first, and alone
        last = await backend.subscribe(queue, "g", settings)
        first: list[Delivery[Any]] = []
        deadline = asyncio.get_running_loop().time() + WAIT
        while not first and asyncio.get_running_loop().time() < deadline:
            first = await last.receive(10, 1.0)
        assert [(d.body, d.attempt) for d in first] == [(b"suspect", 3)], (
            f"the neighbour came back with it: {[(d.body, d.attempt) for d in first]}"
        )
        # settled at once, as a handler would (its 1 s lease ends before the neighbour,
        # kept apart until 2 s after it, comes back: acking both at the end raced it)
        await last.ack(first[0])
        [neighbour] = await take(last, 1)
        assert (neighbour.body, neighbour.attempt) == (b"neighbour", 3)
        await last.ack(neighbour)
        await last.aclose()
    finally:
        await backend.aclose()
