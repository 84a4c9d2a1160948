"""The NATS backend's own attempt count (``_attempts``), through the Receiver API.

JetStream counts every message it sends (``num_delivered``), so the backend keeps the
attempt of a redelivery in a stream beside the queue's: a release counts no attempt, a
nack counts one. Runs against the shared test server (``BROKERKIT_NATS_URL``, default
nats://127.0.0.1:4222) with fresh random queue names; skipped when none answers there.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any
from unittest import mock

import nats.js.errors
import pytest
from _nats import URL, nats_backend  # noqa: F401  (the fixture ``backend``)

import brokerkit
from brokerkit.backends import Delivery, QueueRef, Receiver, ReceiverSettings
from brokerkit.backends.nats import NatsBackend


async def take(r: Receiver[Any], n: int) -> list[Delivery[Any]]:
    got: list[Delivery[Any]] = []
    while len(got) < n:
        batch = await r.receive(n - len(got), 2.0)
        assert batch, f"only {len(got)} of {n} arrived"
        got += batch
    return got


async def test_release_counts_no_attempt_and_nack_counts_one(backend: NatsBackend) -> None:
    queue = QueueRef(f"t-attempts-{uuid.uuid4().hex[:10]}")
    try:
        await backend.publish(queue, [brokerkit.Outgoing(b"m%d" % i) for i in range(3)])
        r = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
        first = await take(r, 3)
        assert [d.attempt for d in first] == [1, 1, 1]
        await r.release(first)  # fetched, never shown: JetStream counted them, we do not
        again = await take(r, 3)
        assert sorted(d.id for d in again) == sorted(d.id for d in first)
        assert [d.attempt for d in again] == [1, 1, 1]
        target, *rest = sorted(again, key=lambda d: int(d.id))
        for d in rest:
            await r.ack(d)
        await r.nack(target, 0.0)
        [nacked] = await take(r, 1)
        assert (nacked.id, nacked.attempt) == (target.id, 2)
        await r.release([nacked])
        [released] = await take(r, 1)
        assert (released.id, released.attempt) == (target.id, 2)
        assert released.receipt.msg.metadata.num_delivered == 4  # what JetStream counted
        await r.nack(released, 0.0)
        [third] = await take(r, 1)
        assert third.attempt == 3
        await r.ack(third)
        await r.aclose()
        info = await backend.link.js.stream_info(f"brokerkit_a_{queue.name}")
        assert info.state.messages == 3  # one record per message released or redelivered
    finally:
        await backend.delete_queue(queue.name)
    with pytest.raises(nats.js.errors.NotFoundError):
        await backend.link.js.stream_info(f"brokerkit_a_{queue.name}")


@pytest.mark.parametrize("then", ["close", "receive"])
async def test_fetched_ahead_whose_lease_ran_out_in_the_buffer_count_no_attempt(
    backend: NatsBackend, then: str
) -> None:
    """docs/reliability.md item 6: the consumer's loop lags past the give-back of what it
    fetched ahead, so those leases run out in its buffer. Whether the consumer then
    closes or hands out its next message, they are given back (the book takes back the
    count it wrote at the take), not dropped: no handler saw them, so they come back as
    attempt 1. Dropped, JetStream's ``num_delivered`` of 2 made them attempt 2."""
    queue = f"t-lag-{uuid.uuid4().hex[:10]}"
    ack_timeout = 2.0
    async with brokerkit.connect(URL) as broker:
        try:
            await broker.publish_many(queue, [brokerkit.Outgoing(b"%d" % i) for i in range(6)])
            async with broker.consumer(queue, "g", ack_timeout=ack_timeout, prefetch=6) as slow:
                first = await slow.__anext__()
                await first.ack()
                # the fault: a loop blocked past every lease the read-ahead holds (a
                # handler that hogs the CPU); nothing waits here for a result
                time.sleep(ack_timeout * 1.5)  # noqa: ASYNC251 (blocking is the fault)
                if then == "receive":
                    rest = [await asyncio.wait_for(slow.__anext__(), 30.0) for _ in range(5)]
                    for msg in rest:
                        await msg.ack()
            if then == "close":
                async with broker.consumer(queue, "g", ack_timeout=10.0) as other:
                    rest = [await asyncio.wait_for(other.__anext__(), 30.0) for _ in range(5)]
                    for msg in rest:
                        await msg.ack()
            assert [m.attempt for m in rest] == [1] * 5, [(m.body, m.attempt) for m in rest]
        finally:
            await broker.delete_queue(queue)


def _wait_until_sent_again(stream: str, durable: str, deliveries: int) -> None:
    """From a thread with its own connection: until JetStream has sent ``durable``'s
    messages ``deliveries`` times in all (its delivered consumer sequence)."""

    async def poll() -> None:
        nc = await nats.connect(URL)
        try:
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                info = await nc.jetstream().consumer_info(stream, durable)
                if info.delivered.consumer_seq >= deliveries:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"{durable} never sent its message again")
        finally:
            await nc.close()

    asyncio.run(poll())


async def _hold_the_loop_until_sent(backend: NatsBackend, queue: QueueRef, sent: int) -> None:
    """Hold the event loop (a thread polls with its own connection) until the group's
    durable has sent ``sent`` messages in all: what arrives meanwhile stays unread."""
    layout = await backend._existing(queue)  # the stream's name
    assert layout is not None
    waiter = threading.Thread(
        target=_wait_until_sent_again, args=(layout.stream, layout.consumer("g", 0), sent)
    )
    waiter.start()
    waiter.join()  # the loop is held on purpose


async def _next_receiver_gets(backend: NatsBackend, queue: QueueRef, body: bytes) -> None:
    """A new receiver of the group gets ``body`` at once, as attempt 1, and acks it."""
    again = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
    got = await again.receive(1, 5.0)
    assert [(x.body, x.attempt) for x in got] == [(body, 1)]
    await again.ack(got[0])
    await again.aclose()


async def test_released_just_before_the_close_is_not_lost_in_the_closing_inbox(
    backend: NatsBackend,
) -> None:
    """docs/reliability.md item 7: a pull request outlives the ``receive`` that issued it,
    and a ``release`` makes the server redeliver at once, to that request. Here the
    redelivery reaches the receiver while it closes (the loop is held until the server
    has sent it, so it waits unread in the socket). A plain unsubscribe dropped it on
    arrival: the server held it for ``ack_wait`` (30 s) and counted it, and a limited
    redrive moved a younger dead letter first. The close drains the inbox and gives it
    back: the next receiver gets it at once, as attempt 1."""
    for _ in range(3):  # how soon the server sends it varies: the old close lost 3 in 5
        await _release_then_close_then_receive(backend)


async def _release_then_close_then_receive(backend: NatsBackend) -> None:
    queue = QueueRef(f"t-close-{uuid.uuid4().hex[:10]}")
    try:
        await backend.publish(queue, [brokerkit.Outgoing(b"m")])
        r = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
        [d] = await r.receive(5, 5.0)  # the request (batch 5) stays open for 5 s
        await r.release([d])
        await _hold_the_loop_until_sent(backend, queue, 2)  # the redelivery stays unread
        await r.aclose()
        await _next_receiver_gets(backend, queue, b"m")
    finally:
        await backend.delete_queue(queue.name)


async def test_a_close_after_a_nak_unsubscribes_only_once_its_pull_requests_ended(
    backend: NatsBackend,
) -> None:
    """docs/reliability.md item 7, second cause: the server routes a ``-NAK``ed message
    on its own time, and one routed to a pull request of the closing receiver after its
    UNSUB was dropped and waited out ``ack_wait`` (a limited redrive then moved a younger
    dead letter first: 1 in 20 runs beside three CPU burners). The close now keeps the
    inbox after an immediate ``-NAK`` until its requests have ended; the old close
    unsubscribed with the request still open."""
    queue = QueueRef(f"t-naked-{uuid.uuid4().hex[:10]}")
    try:
        await backend.publish(queue, [brokerkit.Outgoing(b"m")])
        r = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
        [d] = await r.receive(5, 5.0)  # the request (batch 5) stays open
        await r.release([d])  # an immediate -NAK: the server may route it to that request
        open_at_unsub: list[list[object]] = []
        link = r._link  # type: ignore[attr-defined]
        drain = link.drain_inbox

        async def watched(_link: object, sub: object, timeout: float) -> None:
            open_at_unsub.append([p for p in r._pulls if p is not None])  # type: ignore[attr-defined]
            await drain(sub, timeout)

        with mock.patch.object(type(link), "drain_inbox", watched):  # the link has __slots__
            await r.aclose()
        assert [len(x) for x in open_at_unsub] == [0], "unsubscribed with requests open"
        await _next_receiver_gets(backend, queue, b"m")
    finally:
        await backend.delete_queue(queue.name)


async def test_first_delivery_in_the_closing_inbox_counts_no_attempt(
    backend: NatsBackend,
) -> None:
    """A pull request outlives its ``receive``: a message published after the receive
    returned is sent to it and waits in the receiver's inbox, never handed out. The
    close gives it back. JetStream counted that send (``num_delivered`` 1), and a
    redelivery is attempt ``record + 2``: unless the close writes the record down to
    -1, the next receiver gets a message nobody saw as attempt 2."""
    queue = QueueRef(f"t-close1-{uuid.uuid4().hex[:10]}")
    try:
        await backend.publish(queue, [brokerkit.Outgoing(b"first")])
        r = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
        [d] = await r.receive(5, 5.0)  # the request (batch 5) stays open for 5 s
        await r.ack(d)
        await backend.publish(queue, [brokerkit.Outgoing(b"unseen")])
        await _hold_the_loop_until_sent(backend, queue, 2)  # sent to the open request
        await r.aclose()
        await _next_receiver_gets(backend, queue, b"unseen")
    finally:
        await backend.delete_queue(queue.name)


async def test_first_delivery_gone_stale_in_the_inbox_counts_no_attempt(
    backend: NatsBackend,
) -> None:
    """A first delivery that waited in the receiver's inbox past half its lease (a
    lagging loop) is not handed out: its server lease is nearly over. It is given back
    at once, uncounted, so it comes back as attempt 1 (left to run out, JetStream
    counted it and it came back as attempt 2, after the whole ``ack_wait``)."""
    queue = QueueRef(f"t-stale1-{uuid.uuid4().hex[:10]}")
    ack_timeout = 2.0
    try:
        await backend.publish(queue, [brokerkit.Outgoing(b"first")])
        r = await backend.subscribe(queue, "g", ReceiverSettings(ack_timeout))
        [d] = await r.receive(5, 5.0)  # the request (batch 5) stays open for 5 s
        await r.ack(d)
        await backend.publish(queue, [brokerkit.Outgoing(b"stale")])
        await _hold_the_loop_until_sent(backend, queue, 2)
        # the fault: the loop lags past half the lease before the next receive
        time.sleep(ack_timeout * 0.6)  # noqa: ASYNC251 (blocking is the fault)
        got: list[Delivery[Any]] = []
        deadline = time.monotonic() + 3 * ack_timeout
        while not got and time.monotonic() < deadline:
            got = await r.receive(1, 0.5)
        assert [(x.body, x.attempt) for x in got] == [(b"stale", 1)]
        await r.ack(got[0])
        await r.aclose()
    finally:
        await backend.delete_queue(queue.name)
