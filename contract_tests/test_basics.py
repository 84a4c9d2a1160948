"""Connecting, publishing, acking and nacking (CONTRACT sections 1, 3, 4)."""

from __future__ import annotations

import asyncio
import time

import pytest

import brokerkit
from contract_tests._helpers import (
    WAIT,
    nothing_within,
    receive,
    receive_n,
    redelivery_deadline,
)
from contract_tests.conftest import Connect


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
    batch = [brokerkit.Outgoing(f"m{i}".encode()) for i in range(20)]
    results = await broker.publish_many(queue, batch)
    assert len(results) == 20 and len({r.id for r in results}) == 20
    async with broker.consumer(queue, group) as consumer:
        got = await receive_n(consumer, 20)
    assert {m.body for m in got} == {m.body for m in batch}
    assert {m.id for m in got} == {r.id for r in results}


@pytest.mark.behaviour("ack")
async def test_ack_settles_so_the_group_never_sees_it_again(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish(queue, b"once")
    ack_timeout = 1.0
    async with broker.consumer(queue, group, ack_timeout=ack_timeout) as consumer:
        msg = await receive(consumer)
        await msg.ack()
        assert msg.settled
        slack = broker.capabilities.redelivery_slack
        again = await nothing_within(consumer, (ack_timeout + slack) * 1.5 + 0.5)
        assert again is None, f"acked message was delivered again: {again!r}"


@pytest.mark.behaviour("ack")
async def test_ack_competing_consumers_share_work_without_duplicates(
    connect: Connect, queue: str, group: str
) -> None:
    producer = await connect()
    await producer.publish_many(queue, [brokerkit.Outgoing(str(i).encode()) for i in range(30)])
    seen: list[bytes] = []

    async def work(conn: brokerkit.Broker) -> None:
        async with conn.consumer(queue, group, prefetch=4) as consumer:
            while len(seen) < 30:
                msg = await nothing_within(consumer, 1.0)
                if msg is not None:
                    seen.append(msg.body)
                    await msg.ack()

    a, b = await connect(), await connect()
    await asyncio.wait_for(asyncio.gather(work(a), work(b)), WAIT * 2)
    assert sorted(seen) == sorted(str(i).encode() for i in range(30))


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
async def test_ack_fan_out_each_group_gets_every_message(
    broker: brokerkit.Broker, queue: str
) -> None:
    if not broker.capabilities.fan_out:
        pytest.skip("capabilities.fan_out is False: one group per queue")  # optional feature
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
    await broker.publish(queue, b"doomed", headers={"h": "1"})
    async with broker.consumer(queue, group, max_attempts=2) as consumer:
        for attempt in (1, 2):
            msg = await receive(consumer, redelivery_deadline(broker, 0))
            assert msg.attempt == attempt
            await msg.nack()
        assert await nothing_within(consumer, 1.0) is None
    async with broker.dead_letters(queue) as dead:
        corpse = await receive(dead)
        assert corpse.body == b"doomed" and dict(corpse.headers) == {"h": "1"}
        assert corpse.dead_letter_info is not None
        assert corpse.dead_letter_info.reason == "max_attempts"
        assert corpse.dead_letter_info.attempts == 2
        await corpse.ack()


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


@pytest.mark.behaviour("nack delay")
async def test_nack_delay_redelivers_no_sooner_than_the_delay(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    delay = 2.0
    await broker.publish(queue, b"later")
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        nacked_at = time.monotonic()
        await msg.nack(delay=delay)
        again = await receive(consumer, redelivery_deadline(broker, delay))
        waited = time.monotonic() - nacked_at
        assert again.id == msg.id and again.attempt == 2
        assert waited >= delay - 0.05, f"redelivered after {waited:.2f}s, before the {delay}s delay"
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
