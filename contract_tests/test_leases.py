"""Leases, attempts, dead letters and redrive (CONTRACT sections 4 and 5)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

import brokerkit
from contract_tests._helpers import WAIT, nothing_within, receive, receive_n, redelivery_deadline
from contract_tests.conftest import Connect


async def _first_of(
    *consumers: brokerkit.Consumer, timeout: float
) -> tuple[brokerkit.Consumer, brokerkit.Message]:
    """The first message any of ``consumers`` yields, and which one yielded it.

    Which consumer of a group gets a message is the broker's choice (Kafka hands
    a partition to one member), so tests never assume it. The other pending
    reads are cancelled, which loses nothing.
    """
    tasks = {asyncio.ensure_future(c.__anext__()): c for c in consumers}
    try:
        done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            raise AssertionError(f"no delivery within {timeout:.1f}s")
        task = done.pop()
        return tasks[task], task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.behaviour("lease expiry")
async def test_lease_expiry_redelivers_to_the_group_and_late_settle_raises(
    connect: Connect, queue: str, group: str
) -> None:
    ack_timeout = 2.0
    a, b = await connect(), await connect()
    await a.publish(queue, b"hung")
    async with (
        a.consumer(queue, group, ack_timeout=ack_timeout, close_timeout=0) as hung,
        b.consumer(queue, group, ack_timeout=ack_timeout, close_timeout=0) as other,
    ):
        _, held = await _first_of(hung, other, timeout=WAIT)
        assert held.attempt == 1
        # the holder never settles; the message must come back to some consumer of the group
        _, again = await _first_of(hung, other, timeout=redelivery_deadline(a, ack_timeout))
        assert (again.id, again.body, again.attempt) == (held.id, b"hung", 2)
        with pytest.raises(brokerkit.LeaseExpired):
            await held.ack()
        await again.ack()


@pytest.mark.behaviour("lease expiry")
async def test_lease_extend_keeps_the_message_away_from_others(
    connect: Connect, queue: str, group: str
) -> None:
    ack_timeout = 2.0
    a, b = await connect(), await connect()
    await a.publish(queue, b"long-job")
    async with (
        a.consumer(queue, group, ack_timeout=ack_timeout) as first,
        b.consumer(queue, group, ack_timeout=ack_timeout) as second,
    ):
        worker, msg = await _first_of(first, second, timeout=WAIT)
        other = second if worker is first else first
        loop = asyncio.get_running_loop()
        until = loop.time() + ack_timeout * 3
        while loop.time() < until:  # work three leases long, renewing at half the lease
            stolen = await nothing_within(other, ack_timeout / 2)
            assert stolen is None, f"extended message was redelivered: {stolen!r}"
            await msg.extend()
        await msg.ack()
        assert msg.settled


@pytest.mark.behaviour("attempt durability")
async def test_attempt_survives_consumer_restarts_and_ends_in_the_dlq(
    connect: Connect, queue: str, group: str
) -> None:
    max_attempts = 3
    producer = await connect()
    sent = await producer.publish(queue, b"kills-its-consumer")
    for attempt in range(1, max_attempts + 1):
        conn = await connect()  # a new process, as far as the broker can tell
        async with conn.consumer(queue, group, max_attempts=max_attempts, close_timeout=0) as c:
            msg = await receive(c, redelivery_deadline(conn, 0))
            assert (msg.id, msg.attempt) == (sent.id, attempt)
        await conn.aclose()  # "crash": never settled
    last = await connect()
    leaked: list[brokerkit.Message] = []

    async def drain(consumer: brokerkit.Consumer) -> None:
        async for msg in consumer:  # the next delivery is attempt 4: the facade dead-letters it
            leaked.append(msg)

    async with (
        last.consumer(queue, group, max_attempts=max_attempts, close_timeout=0) as c,
        last.dead_letters(queue) as dead,
    ):
        reader = asyncio.ensure_future(drain(c))
        try:
            corpse = await receive(dead)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        assert not leaked, f"delivered beyond max_attempts: {leaked!r}"
        assert corpse.body == b"kills-its-consumer"
        assert corpse.dead_letter_info is not None
        assert corpse.dead_letter_info.reason == "max_attempts"
        assert corpse.dead_letter_info.attempts == max_attempts
        assert corpse.dead_letter_info.original_id == sent.id
        await corpse.ack()


@pytest.mark.behaviour("attempt durability")
async def test_attempt_counts_lease_expiries_too(connect: Connect, queue: str, group: str) -> None:
    ack_timeout = 1.0
    conn = await connect()
    await conn.publish(queue, b"hangs")
    async with conn.consumer(queue, group, ack_timeout=ack_timeout, max_attempts=5) as c:
        attempts = []
        for _ in range(3):
            msg = await receive(c, redelivery_deadline(conn, ack_timeout))
            attempts.append(msg.attempt)  # never settled: the lease runs out
        assert attempts == [1, 2, 3]
        final = await receive(c, redelivery_deadline(conn, ack_timeout))
        assert final.attempt == 4
        await final.ack()


@pytest.mark.behaviour("DLQ")
async def test_dlq_dead_letter_moves_with_body_headers_and_envelope(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    body = bytes(range(256)) * 4
    headers = {"trace": "abc", "unicode": "żółw ✓"}
    sent = await broker.publish(queue, body, headers=headers, fifo_group="cust-1", dedup_id="ev-1")
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        await msg.dead_letter("bad input: field x")
        with pytest.raises(brokerkit.AlreadySettled):
            await msg.ack()
        assert await nothing_within(consumer, 1.0) is None  # not in the queue any more
    async with broker.dead_letters(queue) as dead:
        corpse = await receive(dead)
        info = corpse.dead_letter_info
        assert info is not None
        assert corpse.body == body and dict(corpse.headers) == headers
        assert info.queue == queue and info.original_id == sent.id
        assert info.reason == "bad input: field x" and info.attempts == 1
        assert abs(datetime.now(UTC) - info.died_at) < timedelta(minutes=5)
        assert (info.fifo_group, info.dedup_id) == ("cust-1", "ev-1")
        assert (corpse.fifo_group, corpse.dedup_id) == ("cust-1", "ev-1")
        with pytest.raises(brokerkit.UnsupportedFeature):
            await corpse.dead_letter("again")
        await corpse.ack()
        assert await nothing_within(dead, 1.0) is None


@pytest.mark.behaviour("redrive")
async def test_redrive_moves_dead_messages_back_oldest_first_keeping_group_order(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    bodies = [f"r{i}".encode() for i in range(5)]
    await broker.publish_many(queue, [brokerkit.Outgoing(b, fifo_group="grp") for b in bodies])
    async with broker.consumer(queue, group) as consumer:
        for expected in bodies:
            msg = await receive(consumer)
            assert msg.body == expected
            await msg.dead_letter("to be redriven")
    moved = await broker.redrive(queue)
    assert moved == 5
    async with broker.consumer(queue, group) as consumer:
        again = await receive_n(consumer, 5)
        assert [m.body for m in again] == bodies
        assert all(m.fifo_group == "grp" for m in again)
    assert await broker.redrive(queue) == 0  # the DLQ is empty now


@pytest.mark.behaviour("redrive")
async def test_redrive_limit_moves_at_most_limit(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish_many(queue, [brokerkit.Outgoing(f"{i}".encode()) for i in range(3)])
    async with broker.consumer(queue, group) as consumer:
        for msg in await receive_n(consumer, 3, ack=False):
            await msg.dead_letter("x")
    assert await broker.redrive(queue, limit=2) == 2
    assert await broker.redrive(queue) == 1
    async with broker.consumer(queue, group) as consumer:
        assert len(await receive_n(consumer, 3, timeout=WAIT)) == 3
