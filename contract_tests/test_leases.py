"""Leases, attempts, dead letters and redrive (CONTRACT sections 4 and 5)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest

import brokerkit

from ._helpers import (
    EARLY,
    WAIT,
    Child,
    absence_window,
    in_process,
    latest,
    lease_for,
    nothing_within,
    receive,
    receive_n,
    redelivery_deadline,
)
from .conftest import Connect


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
    a, b = await connect(), await connect()
    ack_timeout = lease_for(a, 2.0)
    await a.publish(queue, b"hung")
    async with (
        a.consumer(queue, group, ack_timeout=ack_timeout, close_timeout=0) as hung,
        b.consumer(queue, group, ack_timeout=ack_timeout, close_timeout=0) as other,
    ):
        _, held = await _first_of(hung, other, timeout=WAIT)
        received = time.monotonic()
        assert held.attempt == 1
        # the holder never settles; the message must come back to some consumer of the group
        _, again = await _first_of(hung, other, timeout=redelivery_deadline(a, ack_timeout))
        after = time.monotonic() - received
        assert (again.id, again.body, again.attempt) == (held.id, b"hung", 2)
        assert after >= ack_timeout - EARLY, f"redelivered {after:.2f}s in, before the lease ended"
        assert after <= latest(a, ack_timeout), (
            f"redelivered {after:.2f}s after a {ack_timeout}s lease began; "
            f"redelivery_slack is {a.capabilities.redelivery_slack}s"
        )
        with pytest.raises(brokerkit.LeaseExpired):
            await held.ack()
        await again.ack()


@pytest.mark.behaviour("lease expiry")
async def test_lease_expiry_of_a_fifo_message_frees_its_group(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    ack_timeout = lease_for(broker, 1.0)
    await broker.publish_many(
        queue, [brokerkit.Outgoing(f"{i}".encode(), fifo_group="lease.g") for i in range(2)]
    )
    async with broker.consumer(queue, group, ack_timeout=ack_timeout) as consumer:
        first = await receive(consumer)
        assert (first.body, first.attempt) == (b"0", 1)  # never settled
        again = await receive(consumer, redelivery_deadline(broker, ack_timeout))
        assert (again.body, again.attempt) == (b"0", 2), "the group's head did not come back"
        await again.ack()
        nxt = await receive(consumer)
        assert (nxt.body, nxt.attempt) == (b"1", 1)
        await nxt.ack()


@pytest.mark.behaviour("lease expiry")
async def test_lease_extend_keeps_the_message_away_from_others(
    connect: Connect, queue: str, group: str
) -> None:
    a, b = await connect(), await connect()
    ack_timeout = lease_for(a, 2.0)
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


async def _expect_dead_after(
    broker: brokerkit.Broker, queue: str, group: str, sent_id: str, max_attempts: int
) -> None:
    """The next delivery would be attempt max_attempts + 1: it must reach the DLQ instead."""
    leaked: list[brokerkit.Message] = []

    async def drain(consumer: brokerkit.Consumer) -> None:
        async for msg in consumer:  # the next delivery is beyond max_attempts: dead-lettered
            leaked.append(msg)

    lease = lease_for(broker, _CRASH_LEASE)
    async with (
        broker.consumer(
            queue, group, max_attempts=max_attempts, ack_timeout=lease, close_timeout=0
        ) as c,
        broker.dead_letters(queue) as dead,
    ):
        reader = asyncio.ensure_future(drain(c))
        try:
            corpse = await receive(dead, redelivery_deadline(broker, lease))
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        assert not leaked, f"delivered beyond max_attempts: {leaked!r}"
        assert corpse.body == b"kills-its-consumer"
        assert corpse.dead_letter_info is not None
        assert corpse.dead_letter_info.reason == "max_attempts"
        assert corpse.dead_letter_info.attempts == max_attempts
        assert corpse.dead_letter_info.original_id == sent_id
        await corpse.ack()


_CRASH_LEASE = 2.0
"""The ack_timeout of a consumer that is killed: its lease is how the broker learns of it
(``lease_for`` sizes it to the broker)."""


@pytest.mark.behaviour("attempt durability")
async def test_attempt_survives_consumer_crashes_and_ends_in_the_dlq(
    broker_url: str, connect: Connect, queue: str, group: str
) -> None:
    """Each delivery kills its consumer (SIGKILL of a child process on the real URL).

    No close, no nack, no flush: only the broker's own record can count the attempts.
    ``memory://`` lives inside this process, so no other process can hold its messages;
    there the consumer is abandoned in-process (never closed, never settled, its lease
    runs out), which still never takes the facade's nack path.
    """
    max_attempts = 2
    producer = await connect()
    lease = lease_for(producer, _CRASH_LEASE)
    sent = await producer.publish(queue, b"kills-its-consumer")
    for attempt in range(1, max_attempts + 1):
        if in_process(broker_url):
            conn = await connect()  # abandoned below: never closed while the test runs
            consumer = conn.consumer(queue, group, max_attempts=max_attempts, ack_timeout=lease)
            msg = await receive(consumer, redelivery_deadline(conn, lease))
            assert (msg.id, msg.attempt) == (sent.id, attempt)
            continue
        child = await Child.start("hold", broker_url, queue, group, str(max_attempts), str(lease))
        try:
            line = await child.line(redelivery_deadline(producer, lease) + WAIT)
        finally:
            await child.reap()  # SIGKILL while it holds the message
        assert line == f"got {sent.id} {attempt}", line
    await _expect_dead_after(await connect(), queue, group, sent.id, max_attempts)


@pytest.mark.behaviour("attempt durability")
async def test_attempt_counts_lease_expiries_too(connect: Connect, queue: str, group: str) -> None:
    conn = await connect()
    ack_timeout = lease_for(conn, 1.0)
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


@pytest.mark.behaviour("attempt durability")
async def test_messages_fetched_ahead_and_never_handed_out_count_no_attempt(
    connect: Connect, queue: str, group: str
) -> None:
    """A consumer reads ahead (``prefetch``), then its handler works past every lease the
    read-ahead holds. No handler saw those messages: they come back as attempt 1, or a
    slow (or crashing) handler would drag its neighbours toward the DLQ."""
    conn = await connect()
    ack_timeout = lease_for(conn, 2.0)
    await conn.publish_many(queue, [brokerkit.Outgoing(b"%d" % i) for i in range(6)])
    async with conn.consumer(queue, group, ack_timeout=ack_timeout, prefetch=6) as slow:
        first = await receive(slow)
        await first.ack()
        # the handler of the first message works this long: the fault is time passing,
        # nothing waits for a result here
        await asyncio.sleep(ack_timeout * 1.5)
    async with (await connect()).consumer(queue, group, ack_timeout=10.0) as other:
        rest = await receive_n(other, 5, timeout=redelivery_deadline(conn, ack_timeout) + WAIT)
    assert [m.attempt for m in rest] == [1] * 5, [(m.body, m.attempt) for m in rest]


@pytest.mark.behaviour("DLQ")
async def test_dlq_dead_letter_moves_with_body_headers_and_envelope(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    body = bytes(range(256)) * 4
    headers = {"trace": "abc", "unicode": "żółw ✓"}
    sent = await broker.publish(queue, body, headers=headers, fifo_group="cust-1", dedup_id="ev-1")
    ack_timeout = lease_for(broker, 1.0)
    async with (
        broker.consumer(queue, group, ack_timeout=ack_timeout) as consumer,
        broker.dead_letters(queue, ack_timeout=ack_timeout) as dead,
    ):
        msg = await receive(consumer)
        await msg.dead_letter("bad input: field x")
        with pytest.raises(brokerkit.AlreadySettled):
            await msg.ack()
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
        # gone from the queue (not even a copy leased until the lease ends), and acked
        # in the DLQ: one lease-sized window watches both
        await _gone_from(broker, ack_timeout, queue=consumer, dlq=dead)


async def _gone_from(
    broker: brokerkit.Broker, ack_timeout: float, **where: brokerkit.Consumer
) -> None:
    window = absence_window(broker, ack_timeout)
    late = await asyncio.gather(*(nothing_within(c, window) for c in where.values()))
    left = {name: msg for name, msg in zip(where, late, strict=True) if msg is not None}
    assert not left, f"a copy was left behind: {left!r}"


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


@pytest.mark.behaviour("redrive")
async def test_redrive_is_oldest_first_across_groups_and_leaves_no_copy(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """One message at a time (``limit=1``): each redrive moves the oldest dead letter.

    Grouped and ungrouped messages die in one known order; the headers and a dedup id
    (inside its window) travel with them, and neither the DLQ nor the queue keeps a copy.
    """
    ack_timeout = lease_for(broker, 1.0)
    outs = [
        brokerkit.Outgoing(b"u0", headers={"n": "0"}),
        brokerkit.Outgoing(b"a0", fifo_group="rd.a", headers={"n": "1"}),
        brokerkit.Outgoing(b"u1", dedup_id="rd-dedup", headers={"n": "2"}),
        brokerkit.Outgoing(b"b0", fifo_group="rd.b", dedup_id="rd-b0", headers={"n": "3"}),
        brokerkit.Outgoing(b"a1", fifo_group="rd.a", headers={"n": "4"}),
    ]
    async with broker.consumer(queue, group, ack_timeout=ack_timeout) as consumer:
        for out in outs:  # published and killed one by one: the order of death is known
            await broker.publish(
                queue, out.body, fifo_group=out.fifo_group, dedup_id=out.dedup_id,
                headers=dict(out.headers),
            )  # fmt: skip
            msg = await receive(consumer)
            assert msg.body == out.body
            await msg.dead_letter(f"died {out.body.decode()}")
        redriven = []
        for out in outs:
            assert await broker.redrive(queue, limit=1) == 1
            msg = await receive(consumer)
            redriven.append(msg.body)
            assert (msg.body, dict(msg.headers)) == (out.body, dict(out.headers))
            assert msg.fifo_group == out.fifo_group
            assert msg.attempt == 1 and msg.dead_letter_info is None
            await msg.ack()
        assert redriven == [out.body for out in outs], "redrive was not oldest first"
        assert await broker.redrive(queue) == 0
        async with broker.dead_letters(queue, ack_timeout=ack_timeout) as dead:
            await _gone_from(broker, ack_timeout, queue=consumer, dlq=dead)


@pytest.mark.behaviour("redrive")
async def test_redrive_moves_only_what_dead_letters_still_holds(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """``dead_letters()`` and ``redrive`` share one view of the DLQ: acked there, gone."""
    await broker.publish_many(queue, [brokerkit.Outgoing(b"keep"), brokerkit.Outgoing(b"drop")])
    async with broker.consumer(queue, group) as consumer:
        for msg in await receive_n(consumer, 2, ack=False):
            await msg.dead_letter("x")
    async with broker.dead_letters(queue) as dead:
        for msg in await receive_n(dead, 2, ack=False):
            if msg.body == b"drop":
                await msg.ack()  # handled in the DLQ: settled for good
            else:
                await msg.nack()  # left there
    assert await broker.redrive(queue) == 1
    lease = lease_for(broker, 1.0)
    async with (
        broker.consumer(queue, group, ack_timeout=lease) as consumer,
        broker.dead_letters(queue, ack_timeout=lease) as dead,
    ):
        msg = await receive(consumer)
        assert msg.body == b"keep"
        await msg.ack()
        # nothing acked in the DLQ was moved, nothing moved is still in dead_letters()
        await _gone_from(broker, lease, queue=consumer, dlq=dead)
