"""Second steps, failure paths and aliasing: each behaviour taken past its first step.

A test of one step passes on code that breaks at the second: the second read-ahead
batch, a group created while another holds the message, an extend and then nothing, a
slot freed by a nack or by a lost lease, a publish after the first. Failure paths are
driven, not hoped for: a publish refused on demand (``_wrap.wrapped(refuse=...)``, on
every broker) and a lease lost on demand (its ``ack_timeout`` running out, on every
broker). And what a caller hands over is copied: a header dict changed after the call
changes no message.

Each test names, in its docstring, the planted bug it was seen to catch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

import brokerkit
from brokerkit.backends import QueueRef, ReceiverSettings

from ._helpers import (
    EARLY,
    WAIT,
    absence_window,
    eventually,
    latest,
    nothing_within,
    receive,
    receive_n,
    redelivery_deadline,
)
from ._wrap import wrapped

LEASE = 1.0


# -- publish: the second call to a queue ----------------------------------------------------


@pytest.mark.behaviour("publish")
async def test_a_second_publish_to_a_queue_is_validated_and_refused_once_closed(
    broker_url: str, queue: str, group: str
) -> None:
    """The first publish to a queue made its fast path; the second must still be checked.

    Planted: ``Broker.publish``'s known-queue path skipping ``check_outgoing`` (each bad
    message is then accepted), and skipping the closed check (publish after aclose).
    """
    broker = brokerkit.connect(broker_url)
    async with broker:
        await broker.publish(queue, b"first")
        too_big = b"x" * (broker.capabilities.max_message_bytes + 1)
        bad: list[tuple[type[Exception], dict[str, object]]] = [
            (brokerkit.MessageTooLarge, {"body": too_big}),
            (brokerkit.InvalidMessage, {"body": "text, not bytes"}),
            (brokerkit.InvalidName, {"fifo_group": "has space"}),
            (brokerkit.InvalidName, {"dedup_id": ""}),
            (brokerkit.InvalidMessage, {"headers": {"X-Brokerkit-dlq-reason": "forged"}}),
            (brokerkit.InvalidMessage, {"headers": {"k": 1}}),
        ]
        for error, args in bad:
            body = args.pop("body", b"bad")
            with pytest.raises(error):
                await broker.publish(queue, body, **args)  # type: ignore[arg-type]
            with pytest.raises(error):  # and publish_many after publish
                await broker.publish_many(queue, [brokerkit.Outgoing(body, **args)])  # type: ignore[arg-type]
        await broker.publish(queue, b"second")
    with pytest.raises(brokerkit.ResourceClosed):
        await broker.publish(queue, b"after close")
    with pytest.raises(brokerkit.ResourceClosed):
        await broker.publish_many(queue, [brokerkit.Outgoing(b"after close")])
    async with brokerkit.connect(broker_url) as reader:
        async with reader.consumer(queue, group, ack_timeout=5.0) as consumer:
            got = await receive_n(consumer, 2)
            assert sorted(m.body for m in got) == [b"first", b"second"]
            extra = await nothing_within(consumer, 1.0)
            assert extra is None, f"a refused publish was sent: {extra.body[:40]!r}"


# -- aliasing: what the caller hands over is copied ----------------------------------------


@pytest.mark.behaviour("publish")
async def test_headers_changed_after_publish_change_no_message(
    broker_url: str, queue: str, group: str
) -> None:
    """The caller's dict is copied at the call: changing it after (or while the publish
    is still pending, as ``gather`` does) changes nothing delivered; a delivered
    message's headers are read-only, or a copy that no redelivery shares.

    Planted: memory:// storing ``msg.headers`` by reference (``_Hub.new_entry``); the
    delivered headers one shared mutable dict; the check of a coalesced publish run on
    a dict sent later (the forged reserved header travels).
    """
    async with wrapped(broker_url, pause=0.01) as broker:  # gathered: publishes pend
        await _headers_are_copied(broker, queue, group)


async def _headers_are_copied(broker: brokerkit.Broker, queue: str, group: str) -> None:
    one, many = {"k": "publish"}, {"k": "publish_many"}
    await broker.publish(queue, b"one", headers=one)
    await broker.publish_many(queue, [brokerkit.Outgoing(b"many", headers=many)])
    one["k"], many["k"] = "changed", "changed"
    one["added"] = many["added"] = "later"
    # pending: the publish calls gathered behind a first one, their dict changed meanwhile
    # (an empty one too: the fast path of a publish without headers)
    pending: list[dict[str, str]] = [{"k": f"p{i}"} for i in range(7)] + [{}]
    before = [dict(h) for h in pending]
    tasks = [
        asyncio.ensure_future(broker.publish(queue, f"p{i}".encode(), headers=h))
        for i, h in enumerate(pending)
    ]
    await asyncio.sleep(0)  # every call made and checked; most wait for their batch
    for h in pending:
        h["k"] = "changed"
        h["x-brokerkit-dlq-reason"] = "forged after the check"
    await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
    want = {b"one": {"k": "publish"}, b"many": {"k": "publish_many"}}
    want.update({f"p{i}".encode(): dict(pending_was) for i, pending_was in enumerate(before)})
    async with broker.consumer(queue, group, ack_timeout=10.0, max_attempts=10) as consumer:
        got = await receive_n(consumer, len(want), ack=False)
        assert {m.body: dict(m.headers) for m in got} == want
        first = got[0]
        try:
            first.headers["k"] = "changed by a handler"  # type: ignore[index]
        except TypeError:
            pass  # read-only: nothing to share
        for msg in got[1:]:
            await msg.ack()
        await first.nack()
        again = await receive(consumer, redelivery_deadline(broker, 0.0))
        assert (again.body, dict(again.headers)) == (first.body, want[first.body])
        await again.ack()


# -- ack: the second read-ahead batch, a second consumer group --------------------------------


@pytest.mark.behaviour("ack")
async def test_every_read_ahead_batch_is_delivered_once(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """prefetch=4 over 14 messages: four read-ahead fetches after the first, each message
    handed out once, attempt 1, and once acked never again.

    Planted: the read-ahead fetch's batch replacing what is still buffered
    (``FetchBuffer``), and the read-ahead asking for ``prefetch`` more every time.
    """
    count = 14
    await broker.publish_many(queue, [brokerkit.Outgoing(f"r{i}".encode()) for i in range(count)])
    async with broker.consumer(queue, group, prefetch=4, ack_timeout=LEASE * 5) as consumer:
        got = await receive_n(consumer, count)
        assert sorted(m.body for m in got) == sorted(f"r{i}".encode() for i in range(count))
        assert [m.attempt for m in got] == [1] * count
        extra = await nothing_within(consumer, absence_window(broker, 0.0))
        assert extra is None, f"acked, delivered again: {extra!r}"


@pytest.mark.behaviour("ack")
async def test_a_group_created_while_another_holds_a_message_gets_it_and_keeps_it(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """Group B is created while group A holds the message: B gets it (attempt 1); A's ack
    settles nothing of B's, B's nack redelivers it to B only, and once both acked it is
    gone from both. Where ``fan_out`` is False the second group is refused instead.

    Planted: memory:// giving a new group only the entries nobody holds (``_Log.group``),
    and an ack that drops the entry from the log while another group still has it.
    """
    await broker.publish(queue, b"shared")
    other = f"{group}-b"
    async with broker.consumer(queue, group, ack_timeout=10.0) as first:
        held = await receive(first)
        if not broker.capabilities.fan_out:
            with pytest.raises(brokerkit.UnsupportedFeature):
                async with broker.consumer(queue, other) as second:
                    await receive(second, 2.0)
            await held.ack()
            return
        async with broker.consumer(queue, other, ack_timeout=10.0) as second:
            theirs = await receive(second)
            assert (theirs.body, theirs.attempt) == (b"shared", 1)
            await held.ack()
            await theirs.nack()
            again = await receive(second, redelivery_deadline(broker, 0.0))
            assert (again.body, again.attempt) == (b"shared", 2)
            await again.ack()
            window = absence_window(broker, 0.0)
            for consumer in (first, second):
                extra = await nothing_within(consumer, window)
                assert extra is None, f"acked in both groups, delivered again: {extra!r}"


# -- lease expiry: an extend, then nothing --------------------------------------------------


@pytest.mark.behaviour("lease expiry")
async def test_an_extended_then_abandoned_message_comes_back_one_lease_after_the_extend(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """Extended half-way through its lease and then left alone, the message comes back
    ``ack_timeout`` after the extend: not at the old lease's end, not never.

    Planted: memory:// ``extend`` a no-op at the broker (back at the first lease's end:
    early), and an extend that makes the lease endless (never back).
    """
    lease = 2.0
    await broker.publish(queue, b"extended")
    async with broker.consumer(queue, group, ack_timeout=lease) as consumer:
        msg = await receive(consumer)
        received = time.monotonic()
        await eventually(lambda: time.monotonic() > received + lease / 2, what="half a lease")
        extended = time.monotonic()
        await msg.extend()
        due = extended + lease
        again = await receive(consumer, latest(broker, due - time.monotonic()) + 1.0)
        arrived = time.monotonic()
        assert again.body == b"extended" and again.attempt == 2
        assert arrived >= due - EARLY, (
            f"back {due - arrived:.2f}s before the extended lease ended: the extend was lost"
        )
        assert arrived <= due + broker.capabilities.redelivery_slack + 0.25 + 1.0
        await again.ack()


# -- max_in_flight=1: the slot after a nack, after a lost lease --------------------------------


@pytest.mark.behaviour("nack")
async def test_a_nack_frees_the_only_slot_at_once(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """max_in_flight=1: a nack frees the slot, so the next message comes without waiting
    for any lease (60 s here), twice over.

    Planted: ``Message.nack`` not telling the consumer its message settled
    (``Consumer.settled``), so the iterator waits with the slot taken.
    """
    await broker.publish_many(queue, [brokerkit.Outgoing(b"a"), brokerkit.Outgoing(b"b")])
    async with broker.consumer(
        queue, group, max_in_flight=1, prefetch=1, ack_timeout=60.0, max_attempts=10
    ) as consumer:
        seen = []
        for _ in range(3):
            msg = await receive(consumer, redelivery_deadline(broker, 0.0))
            seen.append(msg)  # held: only the settle may free the slot
            await msg.nack()
        last = await receive(consumer, redelivery_deadline(broker, 0.0))
        await last.ack()
        for msg in seen:
            with pytest.raises(brokerkit.AlreadySettled):
                await msg.ack()


@pytest.mark.behaviour("lease expiry")
async def test_a_lost_lease_holds_the_only_slot_until_the_caller_settles(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """max_in_flight=1: a held message whose lease ran out still counts (the caller may
    be working on it); the settle that raises LeaseExpired frees the slot, and the
    message comes back with attempt 2.

    Planted: the slot freed by the lease's end alone (the old rule: a second message is
    handed out while the first is held), and ``_check_settleable`` not freeing it on
    LeaseExpired (the iterator then waits for good).
    """
    await broker.publish(queue, b"held")
    async with broker.consumer(
        queue, group, max_in_flight=1, prefetch=1, ack_timeout=LEASE
    ) as consumer:
        msg = await receive(consumer)
        received = time.monotonic()
        extra = await nothing_within(consumer, absence_window(broker, LEASE))
        assert time.monotonic() > received + LEASE
        assert extra is None, f"handed out past max_in_flight=1 while one is held: {extra!r}"
        assert consumer.in_flight == 1
        with pytest.raises(brokerkit.LeaseExpired):
            await msg.ack()
        assert consumer.in_flight == 0
        again = await receive(consumer, redelivery_deadline(broker, LEASE))
        assert (again.body, again.attempt) == (b"held", 2)
        await again.ack()


# -- FIFO order: the group's second message ------------------------------------------------


@pytest.mark.behaviour("FIFO order")
async def test_fifo_the_second_message_nacked_or_lost_comes_back_before_the_third(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """After the group's first message is acked, its second is nacked, then left until
    its lease runs out: each time it comes back before the third.

    Planted: a head whose lease ran out sent to the back of its group (``LeaseBook``'s
    ``_unlease``: ``GroupGate.done`` and a push instead of ``give_back``); a nack that
    moves the group on (``requeue_token`` likewise).
    """
    await broker.publish_many(
        queue, [brokerkit.Outgoing(f"{i}".encode(), fifo_group="g.2") for i in range(4)]
    )
    async with broker.consumer(
        queue, group, ack_timeout=LEASE, prefetch=1, max_attempts=10
    ) as consumer:
        first = await receive(consumer)
        assert first.body == b"0"
        await first.ack()
        second = await receive(consumer, redelivery_deadline(broker, 0.0))
        assert (second.body, second.attempt) == (b"1", 1)
        await second.nack(0.5)
        again = await receive(consumer, redelivery_deadline(broker, 0.5))
        assert (again.body, again.attempt) == (b"1", 2)
        lost = await receive(consumer, redelivery_deadline(broker, LEASE))  # again ran out
        assert (lost.body, lost.attempt) == (b"1", 3)
        await lost.ack()
        rest = await receive_n(consumer, 2, timeout=redelivery_deadline(broker, 0.0))
        assert [m.body for m in rest] == [b"2", b"3"]


# -- failure paths: a refused publish --------------------------------------------------------


@pytest.mark.behaviour("redrive")
async def test_a_redrive_whose_republish_fails_keeps_the_dead_letter(
    broker_url: str, queue: str, group: str
) -> None:
    """The republish of a redrive fails: redrive raises, the dead letter stays in the DLQ,
    and a redrive right after moves it (not a lease later).

    Planted: ``redrive`` acking the dead letter before its republish (lost), and
    leaving the dead letter leased when the move fails (the next redrive finds nothing
    for a minute).
    """
    refusing = {"on": False}

    def refuse(ref: QueueRef, messages: Sequence[brokerkit.Outgoing]) -> str | None:
        return "main queue down" if refusing["on"] and not ref.dead_letters else None

    async with wrapped(broker_url, refuse=refuse) as broker:
        await broker.publish(queue, b"dead")
        async with broker.consumer(queue, group, ack_timeout=10.0) as consumer:
            msg = await receive(consumer)
            await msg.dead_letter("for redrive")
        refusing["on"] = True
        with pytest.raises(brokerkit.BrokerUnavailable):
            await asyncio.wait_for(broker.redrive(queue), WAIT)
        refusing["on"] = False
        moved = await asyncio.wait_for(broker.redrive(queue), WAIT)
        assert moved == 1, f"the dead letter was not kept for the next redrive: moved {moved}"
        async with broker.consumer(queue, group, ack_timeout=10.0) as consumer:
            back = await receive(consumer)
            assert back.body == b"dead"
            await back.ack()
            extra = await nothing_within(consumer, 1.0)
            assert extra is None, f"redriven twice: {extra!r}"


@pytest.mark.behaviour("publish")
async def test_one_failed_batch_of_gathered_publishes_fails_its_callers_only(
    broker_url: str, queue: str, group: str
) -> None:
    """60 publishes at once, gathered into batches; the backend call carrying ``p29``
    fails. Its callers get the error, every other caller its result, nobody hangs, and
    exactly the messages reported published are delivered.

    Planted: ``PublishCoalescer`` failing only the first caller of a failed batch (the
    rest hang), and giving the others a result though nothing was sent.
    """

    def refuse(ref: QueueRef, messages: Sequence[brokerkit.Outgoing]) -> str | None:
        return "a batch lost" if any(m.body == b"p29" for m in messages) else None

    count = 60
    async with wrapped(broker_url, refuse=refuse, pause=0.01) as broker:
        await broker.publish(queue, b"warm")  # the queue exists: the rest go gathered
        calls = []
        for i in range(count):  # in waves of 10, while earlier batches are in flight
            calls.append(asyncio.ensure_future(broker.publish(queue, f"p{i}".encode())))
            if i % 10 == 9:
                await asyncio.sleep(0.002)
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), WAIT)
        failed = {f"p{i}".encode() for i, o in enumerate(outcomes) if isinstance(o, Exception)}
        assert all(
            isinstance(o, brokerkit.PublishResult | brokerkit.BrokerUnavailable) for o in outcomes
        ), outcomes
        assert b"p29" in failed and 1 < len(failed) <= count // 2, sorted(failed)
        published = {f"p{i}".encode() for i in range(count)} - failed | {b"warm"}
        async with broker.consumer(queue, group, ack_timeout=10.0) as consumer:
            got = await receive_n(consumer, len(published))
            assert {m.body for m in got} == published
            extra = await nothing_within(consumer, 1.0)
            assert extra is None, f"reported failed, delivered: {extra.body!r}"


# -- DLQ: dead-lettering a delivery whose lease was lost -----------------------------------


@pytest.mark.behaviour("DLQ")
async def test_seam_dead_letter_of_a_lost_lease_leaves_the_message_in_one_place(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """``Receiver.dead_letter`` of a delivery whose lease ran out (and which was then
    delivered again) raises LeaseExpired and writes no DLQ copy: the message is not in
    two places without a crash. The live delivery is settled as usual.

    Planted: memory:// ``dead_letter`` appending the copy before checking the lease.
    """
    await broker.publish(queue, b"lost")
    backend = broker.backend
    receiver = await backend.subscribe(QueueRef(queue), group, ReceiverSettings(LEASE))
    dlq = QueueRef(queue).dlq
    try:
        deadline = time.monotonic() + WAIT
        stale = None
        while stale is None and time.monotonic() < deadline:
            got = await receiver.receive(1, 0.5)
            stale = got[0] if got else None
        assert stale is not None, "no delivery through the seam"
        live = None
        deadline = time.monotonic() + redelivery_deadline(broker, LEASE)
        while live is None and time.monotonic() < deadline:
            got = await receiver.receive(1, 0.5)
            live = got[0] if got else None
        assert live is not None and (live.id, live.attempt) == (stale.id, 2)

        async def publish(copy: brokerkit.Outgoing) -> brokerkit.PublishResult:
            return (await backend.publish(dlq, [copy]))[0]

        copy = brokerkit.Outgoing(stale.body, None, None, {"x-copy": "stale"})
        with pytest.raises(brokerkit.LeaseExpired):
            await receiver.dead_letter(stale, copy, publish)
        await receiver.ack(live)
    finally:
        await receiver.aclose()
    async with broker.dead_letters(queue, ack_timeout=5.0) as dead:
        copied = await nothing_within(dead, absence_window(broker, 0.0))
        assert copied is None, f"a lost lease was dead-lettered and redelivered: {copied!r}"
