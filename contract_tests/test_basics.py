"""Connecting, publishing, acking and nacking (CONTRACT sections 1, 3, 4)."""

from __future__ import annotations

import asyncio
import time

import pytest

import brokerkit

from ._helpers import (
    EARLY,
    LATE,
    WAIT,
    absence_window,
    eventually,
    latest,
    lease_for,
    nothing_within,
    receive,
    receive_n,
    redelivery_deadline,
    unsupported,
)
from .conftest import Connect


@pytest.mark.behaviour("connect")
async def test_connect_opens_a_usable_broker_with_capabilities(broker: brokerkit.Broker) -> None:
    caps = broker.capabilities
    assert caps.max_message_bytes >= 256 * 1024
    assert caps.dedup_window > 0
    assert caps.max_headers >= 32 and caps.max_header_bytes >= 8192
    assert 0 <= caps.ack_flush_interval <= 0.1


@pytest.mark.behaviour("connect")
async def test_connect_two_connections_see_the_same_queues(
    connect: Connect, queue: str, group: str
) -> None:
    producer, reader = await connect(), await connect()
    sent = await producer.publish(queue, b"shared")
    async with reader.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert (msg.body, msg.id, msg.queue) == (b"shared", sent.id, queue)
        await msg.ack()


@pytest.mark.behaviour("connect")
async def test_connect_async_with_closes_and_use_after_close_raises(broker_url: str) -> None:
    async with brokerkit.connect(broker_url) as broker:
        assert "broker" in repr(broker).lower()
    with pytest.raises(brokerkit.ResourceClosed):
        await broker.publish("q-closed", b"x")


@pytest.mark.behaviour("publish")
async def test_publish_returns_broker_id_and_message_arrives_intact(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    result = await broker.publish(queue, b"hello", headers={"k": "v"})
    assert isinstance(result.id, str) and result.id
    assert result.duplicate in (False, None)
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"hello"
        assert dict(msg.headers) == {"k": "v"}
        assert msg.id == result.id
        assert msg.attempt == 1
        assert msg.fifo_group is None and msg.dedup_id is None
        await msg.ack()


@pytest.mark.behaviour("publish")
async def test_publish_many_returns_one_result_per_message_in_order(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    batch = [brokerkit.Outgoing(f"m{i}".encode()) for i in range(10)]
    batch += [brokerkit.Outgoing(f"g{i}".encode(), fifo_group="pm.1") for i in range(10)]
    results = await broker.publish_many(queue, batch)
    assert len(results) == 20 and len({r.id for r in results}) == 20
    async with broker.consumer(queue, group) as consumer:
        got = await receive_n(consumer, 20)
    body_of = {m.id: m.body for m in got}
    assert len(body_of) == 20, "a message was delivered twice"
    for i, (out, result) in enumerate(zip(batch, results, strict=True)):
        assert body_of.get(result.id) == out.body, f"results[{i}] is not the result of batch[{i}]"
    grouped = [m.body for m in got if m.fifo_group == "pm.1"]
    assert grouped == [out.body for out in batch[10:]], "a group's list order was not kept"


@pytest.mark.behaviour("publish")
async def test_publish_returns_once_the_message_is_due(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """A message is due when its publish returns: a waiting consumer has it within the slack.

    ``capabilities.redelivery_slack`` bounds how late anything due is noticed. (On a real
    broker a publish that returns too early, before the broker has the message, shows
    only under a fault: the "broker restart" behaviour kills the broker right after the
    return; on ``memory://`` it shows here.)
    """
    await broker.publish(queue, b"warm-up")
    lateness = []
    async with broker.consumer(queue, group) as consumer:
        await (await receive(consumer)).ack()  # joined, assigned, fetching
        for i in range(3):
            waiting = asyncio.ensure_future(receive(consumer))
            await asyncio.sleep(0.05)  # let it block in a fetch (if not, it only fetches later)
            await broker.publish(queue, f"due-{i}".encode())
            returned = time.monotonic()
            msg = await waiting
            lateness.append(time.monotonic() - returned)
            assert msg.body == f"due-{i}".encode()
            await msg.ack()
    # the best of three: a loaded machine delays some, a late publish delays all (measured:
    # at most 0.003 s on memory, redis, nats and kafka, whose slack is 0.05 s to 2.5 s)
    slack = broker.capabilities.redelivery_slack
    assert min(lateness) <= slack, (
        f"delivered {min(lateness):.3f}s (at best) after publish returned; "
        f"redelivery_slack is {slack}s"
    )


@pytest.mark.behaviour("ack")
async def test_ack_settles_so_the_group_never_sees_it_again(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish(queue, b"once")
    ack_timeout = lease_for(broker, 1.0)
    async with broker.consumer(queue, group, ack_timeout=ack_timeout) as consumer:
        msg = await receive(consumer)
        await msg.ack()
        assert msg.settled
        slack = broker.capabilities.redelivery_slack
        again = await nothing_within(consumer, (ack_timeout + slack) * 1.5 + 0.5)
        assert again is None, f"acked message was delivered again: {again!r}"


@pytest.mark.behaviour("ack")
async def test_ack_late_in_the_lease_is_recorded_within_the_flush_window(
    connect: Connect, queue: str, group: str
) -> None:
    """An ack coalesced for up to ``ack_flush_interval`` still beats a lease that ends after it.

    Measured: the ack is sent ``ack_flush_interval`` (plus a round trip) before the lease
    ends; a backend that holds acks longer than it declares lets the lease run out, and
    the broker delivers the acked message again.
    """
    a, b = await connect(), await connect()
    ack_timeout = lease_for(a, 2.0)
    await a.publish(queue, b"acked-late")
    async with a.consumer(queue, group, ack_timeout=ack_timeout) as holder:
        msg = await receive(holder)
        received = time.monotonic()
        flush = a.capabilities.ack_flush_interval
        ack_at = received + ack_timeout - flush - LATE
        await eventually(lambda: time.monotonic() >= ack_at, what="late in the lease")
        await msg.ack()
        async with b.consumer(queue, group, ack_timeout=ack_timeout) as other:
            again = await nothing_within(other, absence_window(b, ack_timeout))
            assert again is None, f"acked {flush}s-window ack was lost to the lease: {again!r}"


@pytest.mark.behaviour("ack")
async def test_ack_then_close_flushes_the_ack(connect: Connect, queue: str, group: str) -> None:
    a, b = await connect(), await connect()
    ack_timeout = lease_for(a, 1.0)
    await a.publish(queue, b"acked-then-closed")
    async with a.consumer(queue, group, ack_timeout=ack_timeout) as consumer:
        await (await receive(consumer)).ack()
    # closed at once: a coalesced ack still pending must have been flushed by the close
    async with b.consumer(queue, group, ack_timeout=ack_timeout) as other:
        again = await nothing_within(other, absence_window(b, ack_timeout))
        assert again is None, f"an ack was lost on close: {again!r}"


@pytest.mark.behaviour("ack")
async def test_ack_competing_consumers_share_work_without_duplicates(
    connect: Connect, queue: str, group: str
) -> None:
    producer = await connect()
    seen: dict[str, list[bytes]] = {"a": [], "b": []}
    stop = asyncio.Event()

    async def work(name: str, conn: brokerkit.Broker) -> None:
        async with conn.consumer(queue, group, prefetch=1) as consumer:
            while not stop.is_set():
                msg = await nothing_within(consumer, 0.2)
                if msg is not None:
                    seen[name].append(msg.body)
                    await asyncio.sleep(0.02)  # the handler's work: the other one gets a turn
                    await msg.ack()

    workers = [asyncio.ensure_future(work(n, await connect())) for n in seen]
    published: list[bytes] = []
    try:
        # publish until both consumers have had work (a group join takes its time), then more
        deadline = time.monotonic() + WAIT * 2
        while not (seen["a"] and seen["b"]) or len(published) < 30:
            assert time.monotonic() < deadline, (
                f"work was not shared: {len(seen['a'])}/{len(seen['b'])}"
            )
            body = str(len(published)).encode()
            await producer.publish(queue, body)
            published.append(body)
            if len(published) % 10 == 0:
                await asyncio.sleep(0.1)
        await eventually(
            lambda: len(seen["a"]) + len(seen["b"]) >= len(published), what="every message"
        )
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), WAIT)
    everything = seen["a"] + seen["b"]
    assert sorted(everything) == sorted(published), "a message was lost or delivered twice"
    assert seen["a"] and seen["b"], "one consumer did all the work"


@pytest.mark.behaviour("ack")
async def test_ack_iterator_yields_while_earlier_messages_are_unsettled(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish_many(queue, [brokerkit.Outgoing(b"a"), brokerkit.Outgoing(b"b")])
    async with broker.consumer(queue, group) as consumer:
        first = await receive(consumer)
        second = await receive(consumer)  # first is still unsettled
        assert {first.body, second.body} == {b"a", b"b"}
        await asyncio.gather(first.ack(), second.ack())


@pytest.mark.behaviour("ack")
async def test_ack_cancelled_iteration_loses_no_message(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    async with broker.consumer(queue, group) as consumer:
        for _ in range(5):  # cancel pending __anext__ calls, as wait_for does
            assert await nothing_within(consumer, 0.05) is None
        await broker.publish(queue, b"after-cancel")
        msg = await receive(consumer)
        assert msg.body == b"after-cancel"
        await msg.ack()


@pytest.mark.behaviour("ack")
async def test_ack_cancelled_while_a_fetch_holds_leased_messages_loses_none(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """Cancel ``__anext__`` at every point of a fetch that is leasing messages: none is lost.

    A lost one would only come back after its lease (60 s), far beyond the deadline here.
    """
    count = 40
    got: list[brokerkit.Message] = []
    async with broker.consumer(queue, group, prefetch=8, ack_timeout=60.0) as consumer:
        await consumer.open()
        publisher = asyncio.ensure_future(
            broker.publish_many(queue, [brokerkit.Outgoing(f"c{i}".encode()) for i in range(count)])
        )
        deadline = time.monotonic() + WAIT
        turns = 0
        while len(got) < count:
            assert time.monotonic() < deadline, f"{len(got)} of {count}: a message was lost"
            task = asyncio.ensure_future(consumer.__anext__())
            for _ in range(turns % 7):  # cancel 0..6 loop turns into the fetch
                await asyncio.sleep(0)
            turns += 1
            task.cancel()
            try:
                got.append(await task)  # it finished before the cancel landed
            except asyncio.CancelledError:
                pass
            if turns % 5 == 0:  # and sometimes let a fetch finish, wherever it got to
                msg = await nothing_within(consumer, 0.2)
                if msg is not None:
                    got.append(msg)
        await publisher
        for msg in got:
            await msg.ack()
    bodies = sorted(m.body for m in got)
    assert bodies == sorted(f"c{i}".encode() for i in range(count))
    assert all(m.attempt == 1 for m in got), "a message came back only after its lease"


@pytest.mark.behaviour("ack")
async def test_ack_fan_out_each_group_gets_every_message(
    broker: brokerkit.Broker, queue: str
) -> None:
    if not broker.capabilities.fan_out:
        unsupported("fan_out", "capabilities.fan_out is False: one group per queue")
    async with broker.consumer(queue, "fan-a") as a, broker.consumer(queue, "fan-b") as b:
        await a.open()
        await b.open()
        await broker.publish(queue, b"to-all")
        for consumer in (a, b):
            msg = await receive(consumer)
            assert msg.body == b"to-all"  # each group has its own copy
            await msg.ack()


@pytest.mark.behaviour("nack")
async def test_nack_redelivers_with_attempt_plus_one(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish(queue, b"retry-me")
    async with broker.consumer(queue, group, max_attempts=5) as consumer:
        first = await receive(consumer)
        assert first.attempt == 1
        await first.nack()
        second = await receive(consumer, redelivery_deadline(broker, 0))
        assert (second.id, second.body, second.attempt) == (first.id, b"retry-me", 2)
        await second.ack()


@pytest.mark.behaviour("nack")
async def test_nack_at_max_attempts_dead_letters_with_reason_max_attempts(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    ack_timeout = lease_for(broker, 1.0)
    await broker.publish(queue, b"doomed", headers={"h": "1"})
    async with broker.consumer(queue, group, max_attempts=2, ack_timeout=ack_timeout) as consumer:
        for attempt in (1, 2):
            msg = await receive(consumer, redelivery_deadline(broker, 0))
            assert msg.attempt == attempt
            await msg.nack()
        # the final nack itself moves it: the DLQ has it while nobody reads the queue
        async with broker.dead_letters(queue, ack_timeout=ack_timeout) as dead:
            corpse = await receive(dead)
            assert corpse.body == b"doomed" and dict(corpse.headers) == {"h": "1"}
            assert corpse.dead_letter_info is not None
            assert corpse.dead_letter_info.reason == "max_attempts"
            assert corpse.dead_letter_info.attempts == 2
            await corpse.ack()
        # and no copy stays in the queue, not even one leased until a lease ends
        left = await nothing_within(consumer, absence_window(broker, ack_timeout))
        assert left is None, f"a dead-lettered message is still in the queue: {left!r}"


@pytest.mark.behaviour("nack")
async def test_nack_close_gives_unsettled_messages_back(
    connect: Connect, queue: str, group: str
) -> None:
    first_conn, second_conn = await connect(), await connect()
    await first_conn.publish(queue, b"held")
    async with first_conn.consumer(queue, group, close_timeout=0) as consumer:
        held = await receive(consumer)
        assert held.attempt == 1
    # closed without settling: redeliverable to the group, nothing lost, nothing acked
    async with second_conn.consumer(queue, group) as consumer:
        again = await receive(consumer, redelivery_deadline(second_conn, 0))
        assert (again.id, again.body) == (held.id, b"held")
        assert again.attempt == 2
        await again.ack()
    with pytest.raises(brokerkit.LeaseExpired):
        await held.ack()


@pytest.mark.behaviour("nack")
async def test_nack_close_waits_for_the_messages_the_caller_holds(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish(queue, b"finishing")
    consumer = broker.consumer(queue, group, close_timeout=10.0)
    await consumer.open()
    msg = await receive(consumer)
    closing = asyncio.ensure_future(consumer.aclose())
    await asyncio.sleep(0.3)  # the caller is still working on what it holds
    assert not closing.done(), "aclose did not wait for the held message (close_timeout=10)"
    await msg.ack()  # still its lease: close gave nothing back yet
    await asyncio.wait_for(closing, WAIT)
    lease = lease_for(broker, 1.0)
    async with broker.consumer(queue, group, ack_timeout=lease) as again:
        late = await nothing_within(again, absence_window(broker, lease))
        assert late is None, f"acked while closing, delivered again: {late!r}"


@pytest.mark.behaviour("nack delay")
async def test_nack_delay_redelivers_no_sooner_than_the_delay(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    delay = lease_for(broker, 2.0)  # a bound measured against capabilities: any length will do
    held = delay / 2
    await broker.publish(queue, b"later")
    async with broker.consumer(queue, group, ack_timeout=10.0) as consumer:
        msg = await receive(consumer)
        received = time.monotonic()
        # a slow handler: the delay counts from the nack, not from the receipt
        await eventually(lambda: time.monotonic() >= received + held, what="handler's work")
        nacked_at = time.monotonic()
        await msg.nack(delay=delay)
        again = await receive(consumer, redelivery_deadline(broker, delay))
        waited = time.monotonic() - nacked_at
        assert again.id == msg.id and again.attempt == 2
        assert waited >= delay - EARLY, (
            f"redelivered after {waited:.2f}s, before the {delay}s delay"
        )
        assert waited <= latest(broker, delay), (
            f"redelivered {waited:.2f}s after a {delay}s nack delay; "
            f"redelivery_slack is {broker.capabilities.redelivery_slack}s"
        )
        await again.ack()


@pytest.mark.behaviour("nack delay")
async def test_nack_delay_does_not_hold_back_other_messages(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish(queue, b"slow")
    async with broker.consumer(queue, group) as consumer:
        slow = await receive(consumer)
        await slow.nack(delay=30.0)
        await broker.publish(queue, b"fast")
        fast = await receive(consumer, WAIT)
        assert fast.body == b"fast"
        await fast.ack()
