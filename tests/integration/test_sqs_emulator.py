"""SQS-specific behaviour against a real SQS endpoint (the emulator of scripts/services).

Run with ``BROKERKIT_SMOKE=sqs`` (or ``all``; scripts/test-all sets it for every running
broker); the URL is ``BROKERKIT_SQS_URL`` or scripts/services' ElasticMQ. A selected
endpoint that does not answer fails. Queues get fresh names and are deleted after.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import brokerkit

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed (brokerkit-mq[sqs])")

from _sqs import SELECTED, URL, raw_client  # noqa: E402

from brokerkit.backends.sqs import SqsBackend  # noqa: E402

pytestmark = SELECTED
WAIT = 20.0


def _raw() -> Any:
    return raw_client(URL)


def _not_visible(raw: Any, queue: str) -> int:
    url = raw.get_queue_url(QueueName=f"{queue}.fifo")["QueueUrl"]
    attrs = raw.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessagesNotVisible"])


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[brokerkit.Broker]:
    async with brokerkit.connect(URL) as b:
        yield b


@pytest_asyncio.fixture
async def queue(broker: brokerkit.Broker) -> AsyncIterator[str]:
    name = f"it-{uuid.uuid4().hex[:16]}"
    yield name
    async with brokerkit.connect(URL) as cleaner:
        await cleaner.delete_queue(name)


async def test_a_batch_of_one_group_is_handed_out_one_by_one_and_nack_sends_it_back(
    broker: brokerkit.Broker, queue: str
) -> None:
    await broker.publish_many(
        queue, [brokerkit.Outgoing(f"{i}".encode(), fifo_group="g") for i in range(5)]
    )
    raw = _raw()
    backend = broker.backend
    ref = brokerkit.backends.QueueRef(queue)
    receiver = await backend.subscribe(ref, "it", brokerkit.backends.ReceiverSettings(30.0))
    try:
        got = await receiver.receive(10, 1.0)
        # one ReceiveMessage leased all five (SQS does that), only the head is handed out
        assert [d.body for d in got] == [b"0"]
        assert _not_visible(raw, queue) == 5
        assert await receiver.receive(10, 0.0) == []  # the rest wait behind the head
        await receiver.nack(got[0], 0.0)  # the four behind it go back too
        again = await receiver.receive(10, 1.0)
        assert [(d.body, d.attempt) for d in again] == [(b"0", 2)]
        await receiver.ack(again[0])
        rest: list[tuple[bytes, int]] = []
        while len(rest) < 4:
            batch = await receiver.receive(10, 1.0)
            assert len(batch) <= 1  # still one at a time
            for d in batch:
                rest.append((d.body, d.attempt))
                await receiver.ack(d)
        # received twice by SQS, seen once by the caller: attempt stays honest
        assert rest == [(b"1", 1), (b"2", 1), (b"3", 1), (b"4", 1)]
    finally:
        await receiver.aclose()


async def test_a_second_consumer_group_on_a_queue_is_unsupported(
    broker: brokerkit.Broker, queue: str
) -> None:
    await broker.publish(queue, b"one")
    async with broker.consumer(queue, "first") as first:
        with pytest.raises(brokerkit.UnsupportedFeature, match="first"):
            async with broker.consumer(queue, "second"):
                pass
        msg = await asyncio.wait_for(first.__anext__(), WAIT)
        assert msg.body == b"one"
        await msg.ack()
    other = brokerkit.connect(URL)  # another connection sees the claim too
    try:
        with pytest.raises(brokerkit.UnsupportedFeature):
            await other.consumer(queue, "third").open()
    finally:
        await other.aclose()


async def test_bodies_of_every_kind_round_trip_byte_exact(
    broker: brokerkit.Broker, queue: str
) -> None:
    bodies = [b"", b"crlf\r\n", b"nul\0", "żółw ✓".encode(), os.urandom(1000), b"x" * 300_000]
    await broker.publish_many(queue, [brokerkit.Outgoing(b, fifo_group="k") for b in bodies])
    async with broker.consumer(queue, "it") as consumer:
        for expected in bodies:
            msg = await asyncio.wait_for(consumer.__anext__(), WAIT)
            assert msg.body == expected
            await msg.ack()


async def test_existing_queue_with_other_attributes_is_a_clear_error(queue: str) -> None:
    raw = _raw()
    raw.create_queue(
        QueueName=f"{queue}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )
    async with brokerkit.connect(URL) as broker:
        with pytest.raises(brokerkit.backends.BrokerRefused) as info:
            await broker.publish(queue, b"x")
    assert "ContentBasedDeduplication" in str(info.value)


async def test_from_client_uses_the_callers_boto3_client(queue: str) -> None:
    client = _raw()
    broker = brokerkit.from_backend(SqsBackend.from_client(client, wait=1))
    async with broker:
        sent = await broker.publish(queue, b"mine", headers={"h": "v"})
        async with broker.consumer(queue, "it") as consumer:
            msg = await asyncio.wait_for(consumer.__anext__(), WAIT)
            assert (msg.id, msg.body, dict(msg.headers)) == (sent.id, b"mine", {"h": "v"})
            await msg.ack()
    client.list_queues(MaxResults=1)  # the caller's client is still open


async def test_delete_queue_removes_the_queue_and_its_dlq(
    broker: brokerkit.Broker, queue: str
) -> None:
    await broker.publish(queue, b"dies")
    async with broker.consumer(queue, "it") as consumer:
        msg = await asyncio.wait_for(consumer.__anext__(), WAIT)
        await msg.dead_letter("for the test")
    raw = _raw()
    names = (f"{queue}.fifo", f"_dlq_{queue}.fifo")
    for name in names:
        raw.get_queue_url(QueueName=name)  # both exist
    await broker.delete_queue(queue)
    for name in names:
        with pytest.raises(raw.exceptions.QueueDoesNotExist):
            raw.get_queue_url(QueueName=name)


async def test_an_endpoint_nobody_serves_is_broker_unavailable_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = (
        f"sqs://?endpoint=http://127.0.0.1:{port}&region=us-east-1&connect_timeout=1&max_attempts=2"
    )
    broker = brokerkit.connect(url)
    with pytest.raises(brokerkit.BrokerUnavailable) as info:
        await asyncio.wait_for(broker.open(), 60)
    assert f"127.0.0.1:{port}" in str(info.value)
    await broker.aclose()


async def test_from_client_takes_a_boto3_session_too(queue: str) -> None:
    params = brokerkit.BrokerURL.parse(URL).params
    session = boto3.Session(
        aws_access_key_id="brokerkit",
        aws_secret_access_key="brokerkit",
        region_name=params.get("region", "us-east-1"),
    )
    backend = SqsBackend.from_client(session, endpoint=params.get("endpoint"))
    async with brokerkit.from_backend(backend) as broker:
        await broker.publish(queue, b"via-session")
        async with broker.consumer(queue, "it") as consumer:
            msg = await asyncio.wait_for(consumer.__anext__(), WAIT)
            assert msg.body == b"via-session"
            await msg.ack()


async def test_publish_recreates_a_queue_deleted_by_another_connection(
    broker: brokerkit.Broker, queue: str
) -> None:
    await broker.publish(queue, b"before")  # this connection caches the queue's URL
    async with brokerkit.connect(URL) as other:
        await other.delete_queue(queue)
    await broker.publish(queue, b"after")
    async with broker.consumer(queue, "it") as consumer:
        msg = await asyncio.wait_for(consumer.__anext__(), WAIT)
        assert msg.body == b"after"
        await msg.ack()
