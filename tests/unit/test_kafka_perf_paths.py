"""The receiver's batched bookkeeping: deferred window moves and staged hand-overs.

Event-loop side only, as in test_kafka_window.py: no consumer thread and no broker;
records are fed to ``_ingest`` as stand-ins of confluent-kafka messages.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from _kafka_loop import TOPIC, StubMessage, close, make_receiver

from brokerkit.backends.base import Delivery
from brokerkit.backends.kafka._receiver import RESUME_SPAN, WINDOW


async def _next_iteration() -> None:
    """Let the loop run the callbacks scheduled so far (call_soon: one iteration)."""
    await asyncio.sleep(0)


async def test_in_order_acks_move_the_window_once_on_the_next_loop_iteration() -> None:
    receiver = await make_receiver()
    part = receiver._parts[(TOPIC, 0)]
    receiver._ingest([StubMessage(o) for o in range(600)])
    deliveries = receiver._deliveries(receiver._take(500))
    assert len(deliveries) == WINDOW
    assert not receiver._ready and len(part.beyond) == 600 - WINDOW
    for delivery in deliveries[:50]:
        await receiver.ack(delivery)
    # settled in memory at once; the window walk is deferred, once for the whole run
    assert part.commit_point() == 50
    assert receiver._moved == [part]
    assert len(part.beyond) == 600 - WINDOW
    await _next_iteration()
    assert not receiver._moved and not part.moved
    assert [rec.offset for _, rec in receiver._ready] == list(range(WINDOW, WINDOW + 50))
    close(receiver)


async def test_a_take_right_after_acks_sees_the_moved_window() -> None:
    receiver = await make_receiver()
    receiver._ingest([StubMessage(o) for o in range(300)])
    deliveries = receiver._deliveries(receiver._take(500))
    for delivery in deliveries:
        await receiver.ack(delivery)
    taken = receiver._take(500)  # before the deferred callback ran
    assert [rec.offset for rec in taken] == list(range(WINDOW, 300))
    assert not receiver._moved
    await _next_iteration()  # the scheduled callback finds nothing left to do
    assert not receiver._ready
    close(receiver)


async def test_acks_below_the_resume_mark_kick_the_consumer_thread_promptly() -> None:
    receiver = await make_receiver()
    key = (TOPIC, 0)
    receiver._ingest([StubMessage(o) for o in range(RESUME_SPAN + 100)])
    assert receiver._backlog[key][0] == RESUME_SPAN + 100
    deliveries = receiver._deliveries(receiver._take(500))
    for delivery in deliveries:
        await receiver.ack(delivery)
    await _next_iteration()
    # (fetching may have been paused: the thread is told without waiting for a flush)
    assert receiver._kick.is_set()
    assert receiver._backlog[key][0] == RESUME_SPAN + 100 - WINDOW
    close(receiver)


async def test_staged_records_keep_their_tokens_and_a_gap_splits_the_lease_entry() -> None:
    receiver = await make_receiver(partitions=2, ack_timeout=5.0)
    # ready order p0 0-2, p1 0-2, p0 3-5: staged tokens 1-3 (p0), 4-6 (p1), 7-9 (p0)
    receiver._ingest([StubMessage(o, 0) for o in range(3)])
    receiver._ingest([StubMessage(o, 1) for o in range(3)])
    receiver._ingest([StubMessage(o, 0) for o in range(3, 6)])
    staged = receiver._take(9, staged=True)
    receiver._staged = staged
    assert [rec.token for rec in staged] == list(range(1, 10))
    assert not receiver._leases  # staged: no lease yet
    p1 = receiver._parts[(TOPIC, 1)]
    receiver._unstage([p1])  # e.g. p1 revoked: given back uncounted
    assert all(rec.token == 0 and rec.count == 0 for rec in staged[3:6])
    leased_before = dict(receiver._leased)
    out = receiver._hand_over_staged(10)
    assert [rec.token for rec in out] == [1, 2, 3, 7, 8, 9]
    assert receiver._leased == leased_before  # no re-keying
    assert sorted((first, end) for _, _, first, end in receiver._leases) == [(1, 4), (7, 10)]
    assert not receiver._staged
    deliveries: list[Delivery] = receiver._deliveries(out)
    assert [d.receipt for d in deliveries] == [1, 2, 3, 7, 8, 9]
    assert all(d.attempt == 1 for d in deliveries)
    await receiver.ack(deliveries[0])
    receiver._expire_leases(time.monotonic() + 6.0)
    assert not receiver._leased
    again: list[Any] = receiver._take(10)
    # p1's three (never counted) and p0's five unsettled ones are due again
    assert sorted((rec.part.partition, rec.offset, rec.count) for rec in again) == [
        (0, 1, 2),
        (0, 2, 2),
        (0, 3, 2),
        (0, 4, 2),
        (0, 5, 2),
        (1, 0, 1),
        (1, 1, 1),
        (1, 2, 1),
    ]
    close(receiver)


async def test_a_partial_hand_over_keeps_the_rest_staged_in_token_order() -> None:
    receiver = await make_receiver()
    receiver._ingest([StubMessage(o) for o in range(10)])
    receiver._staged = receiver._take(10, staged=True)
    first = receiver._hand_over_staged(4)
    rest = receiver._hand_over_staged(10)
    assert [rec.offset for rec in first] == [0, 1, 2, 3]
    assert [rec.offset for rec in rest] == list(range(4, 10))
    assert sorted((f, e) for _, _, f, e in receiver._leases) == [(1, 5), (5, 11)]
    close(receiver)


class _NoConsumer:
    """Commands in these tests never touch the Kafka consumer."""


async def test_a_call_to_a_hot_thread_hands_over_and_returns_the_result() -> None:
    receiver = await make_receiver()
    stop = threading.Event()

    def thread() -> None:  # the consumer thread's hot cycle, commands only
        while not stop.is_set():
            receiver._kick.wait(0.002)
            receiver._kick.clear()
            receiver._run_commands(_NoConsumer())  # type: ignore[arg-type]

    worker = threading.Thread(target=thread, daemon=True)
    worker.start()
    try:
        receiver._hot_until = 0.0  # cold: no hand-over wait
        assert await receiver._call(lambda consumer: 1) == 1
        assert receiver._hot_until > time.monotonic()  # the command made it hot
        assert await receiver._call(lambda consumer: 2) == 2  # hot: hand-over
        assert receiver._picked.is_set()
    finally:
        stop.set()
        worker.join(5.0)
    close(receiver)
