"""An ack that meets a rebalance on Kafka is recorded, not lost (issue 16, the lease test).

A consumer holds messages of two partitions; a second consumer joins the group, and the
cooperative rebalance revokes one of those partitions from the first. The revoke waits
for the partition's leased records to settle, on the consumer thread. The acks come
while it waits, after the stream was idle (so they commit synchronously): they must
return, recorded by the revoke's final commit, and nothing acked may come back.

Before the fix the synchronous ack sent its commit to the thread that sat in the revoke
waiting for that same ack: it raised LeaseExpired ("its partition moved before the ack
was recorded") after 10 s, and the message went to the joining consumer.

    BROKERKIT_KAFKA_URL=kafka://127.0.0.1:9092 pytest tests/integration/test_kafka_rebalance_ack.py
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

import brokerkit
from brokerkit.backends import QueueRef, ReceiverSettings
from brokerkit.backends.kafka import KafkaBackend
from brokerkit.backends.kafka._produce import MESSAGE_SET
from brokerkit.backends.kafka._receiver import KafkaReceiver
from contract_tests._helpers import nothing_within

URL = os.environ.get("BROKERKIT_KAFKA_URL", "kafka://127.0.0.1:9092")
MESSAGES = 40
DEADLINE = 60.0


def _revoking(consumer: brokerkit.Consumer) -> bool:
    receiver = consumer._receiver
    assert isinstance(receiver, KafkaReceiver)
    return any(part.revoking for part in receiver._parts.values())


def _partitions(consumer: brokerkit.Consumer) -> set[int]:
    receiver = consumer._receiver
    assert isinstance(receiver, KafkaReceiver)
    return set(receiver._parts)


async def test_acks_during_a_revoke_are_recorded_by_its_final_commit() -> None:
    queue, group = f"rebal-{uuid.uuid4().hex[:8]}", "g"
    async with (
        brokerkit.connect(f"{URL}?partitions=2") as first_broker,
        brokerkit.connect(f"{URL}?partitions=2") as second_broker,
    ):
        # two calls, one per partition: plain records go to one partition while they fit
        # in its message set (PartitionTurn), so the first call's set is filled by hand
        backend = first_broker.backend
        for half in range(2):
            await first_broker.publish_many(
                queue, [brokerkit.Outgoing(f"m{half}-{i}".encode()) for i in range(MESSAGES // 2)]
            )
            assert isinstance(backend, KafkaBackend)
            backend._turns[backend.link.topic(QueueRef(queue))].next(2, MESSAGE_SET - MESSAGES // 2)
        async with first_broker.consumer(queue, group, ack_timeout=60.0, prefetch=1) as first:
            held: list[brokerkit.Message] = []
            end = time.monotonic() + DEADLINE
            iterator = first.__aiter__()
            while len(held) < MESSAGES and time.monotonic() < end:
                held.append(await asyncio.wait_for(iterator.__anext__(), end - time.monotonic()))
            assert len(held) == MESSAGES
            assert _partitions(first) == {0, 1}, "the first consumer owns both partitions"
            held_in = {m.extras["partition"] for m in held}
            assert held_in == {0, 1}, f"the held messages are all in partition {held_in}"

            async with second_broker.consumer(queue, group, ack_timeout=60.0) as second:
                end = time.monotonic() + DEADLINE  # the join starts a rebalance
                while not _revoking(first):
                    assert time.monotonic() < end, "no revoke came within the deadline"
                    await asyncio.sleep(0.02)
                started = time.monotonic()
                results = await asyncio.gather(*(m.ack() for m in held), return_exceptions=True)
                took = time.monotonic() - started
                failed = [r for r in results if isinstance(r, BaseException)]
                assert not failed, f"{len(failed)} acks failed during the revoke: {failed[:2]!r}"
                assert all(m.settled for m in held)
                assert took < 8.0, f"the acks took {took:.1f} s"
                # the revoke ended: the joining consumer owns a partition, and nothing acked
                # comes to it (the committed state carries every ack)
                end = time.monotonic() + DEADLINE
                while not _partitions(second):
                    assert time.monotonic() < end, "the joining consumer got no partition"
                    await asyncio.sleep(0.05)
                again = await nothing_within(second, 3.0)
                assert again is None, f"an acked message came back: {again!r}"


async def _subscribe_and_take_m0(
    broker: brokerkit.Broker, queue: str, lease: float
) -> tuple[KafkaReceiver, list[Any]]:
    """A receiver of group "g" (through the seam) and its delivery of the one message m0."""
    receiver = await broker.backend.subscribe(QueueRef(queue), "g", ReceiverSettings(lease))
    assert isinstance(receiver, KafkaReceiver)
    end = time.monotonic() + DEADLINE
    got: list[Any] = []
    while not got and time.monotonic() < end:
        got = await receiver.receive(1, 1.0)
    assert [d.body for d in got] == [b"m0"]
    return receiver, got


async def test_a_refused_ack_commit_then_a_revoke_is_recorded_by_the_final_commit() -> None:
    """docs/reliability.md item 8. A synchronous ack whose commit the group refused (a
    rebalance in progress) pauses, then commits again. If the revoke begins in that pause,
    it settles the record and hands the ack its final commit; the ack then built its next
    snapshot "as it will be once the record is settled" from a record settled already:
    ``KeyError`` out of ``ack()`` (which the suite's stream reported as its iterator's
    error: it acks inside its ``async for``).

    The refusal and the revoke are the ones the consumer thread would meet and make,
    injected so that the revoke begins in that pause; the records, the commits and the
    committed offset are the real broker's."""
    queue = f"rebal-refused-{uuid.uuid4().hex[:8]}"
    async with brokerkit.connect(f"{URL}?partitions=1") as broker:
        await broker.publish(queue, b"m0")
        receiver, got = await _subscribe_and_take_m0(broker, queue, 60.0)
        try:
            [key] = [part.key for part in receiver._parts.values()]
            real_commit = receiver._thread.commit
            revoke: list[asyncio.Task[list[Any]]] = []

            def start_revoke() -> None:  # as the thread's on_revoke does
                revoke.append(asyncio.ensure_future(receiver.revoke([key])))

            async def refused(snaps: Any) -> set[Any]:
                if not revoke:  # the first commit: refused, and the revoke begins 20 ms
                    asyncio.get_running_loop().call_later(0.02, start_revoke)  # into the pause
                    return set()
                return await real_commit(snaps)

            receiver._thread.commit = refused  # type: ignore[method-assign]
            receiver._contact = 0.0  # not heard from lately: the ack commits synchronously
            ack = asyncio.ensure_future(receiver.ack(got[0]))
            end = time.monotonic() + DEADLINE
            while not revoke or not revoke[0].done():
                assert time.monotonic() < end, "the revoke did not end"
                if ack.done() and ack.exception() is not None:
                    raise AssertionError(f"the ack raised {ack.exception()!r}")
                await asyncio.sleep(0.01)
            snaps = revoke[0].result()
            committed = await real_commit(snaps)  # the thread's final commit
            receiver.revoked([key], committed)
            await asyncio.wait_for(ack, DEADLINE)  # recorded by the final commit: returns
            assert committed == {key}
            assert [s[2] for s in snaps] == [1], snaps  # m0 settled: the commit point moved
        finally:
            await receiver.aclose()
            await broker.delete_queue(queue)


async def test_a_refused_ack_commit_whose_record_its_next_holder_acked_raises_lease_expired() -> (
    None
):
    """The same pause, met by the lease's end: the record went out again and its next
    holder acked it. The first ack must end with LeaseExpired (its lease was lost), not
    ``KeyError`` from a snapshot "once the record is settled" of a record settled already.
    The group's refusals are injected (every commit of the first ack); the rest is real."""
    queue = f"rebal-lost-{uuid.uuid4().hex[:8]}"
    lease = 1.0
    async with brokerkit.connect(f"{URL}?partitions=1") as broker:
        await broker.publish(queue, b"m0")
        receiver, got = await _subscribe_and_take_m0(broker, queue, lease)
        try:
            real_commit = receiver._thread.commit

            async def refused(snaps: Any) -> set[Any]:
                if [s[2] for s in snaps] == [1]:  # the first ack's: m0 settled
                    return set()
                return await real_commit(snaps)  # the receive's count commits

            receiver._thread.commit = refused  # type: ignore[method-assign]
            receiver._contact = 0.0  # not heard from lately: the ack commits synchronously
            first_ack = asyncio.ensure_future(receiver.ack(got[0]))
            again: list[Any] = []
            end = time.monotonic() + DEADLINE
            while not again and time.monotonic() < end:
                assert not first_ack.done(), first_ack
                again = await receiver.receive(1, 0.2)  # the lease ran out: out again
            assert [(d.body, d.attempt) for d in again] == [(b"m0", 2)]
            receiver._contact = time.monotonic()  # the next holder's ack is coalesced
            await receiver.ack(again[0])
            with pytest.raises(brokerkit.LeaseExpired):
                await asyncio.wait_for(first_ack, DEADLINE)
        finally:
            await receiver.aclose()
            await broker.delete_queue(queue)
