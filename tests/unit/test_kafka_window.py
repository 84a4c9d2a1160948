"""The receiver's hand-out bookkeeping (window, lease tokens) on the event-loop side only.

No consumer thread and no broker: records are fed to ``_ingest`` as stand-ins of
confluent-kafka messages, the way the consumer thread posts them. The behaviour over
a real broker is the contract suite's; this pins the in-memory invariants.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from _kafka_loop import TOPIC, StubMessage, close, make_receiver

from brokerkit._errors import LeaseExpired
from brokerkit.backends.base import Delivery
from brokerkit.backends.kafka._receiver import WINDOW


def _offsets(deliveries: list[Delivery]) -> list[int]:
    return [int(d.body) for d in deliveries]


async def test_records_past_the_window_wait_in_order_and_follow_the_commit_point() -> None:
    receiver = await make_receiver()
    msgs: list[Any] = [StubMessage(o) for o in range(1000)]
    receiver._ingest(msgs[:600])
    receiver._ingest(msgs[600:])
    part = receiver._parts[(TOPIC, 0)]
    assert len(part.beyond) == 1000 - WINDOW
    seen: list[int] = []
    while len(seen) < 1000:
        taken = receiver._take(500)
        assert taken, f"stalled at {len(seen)}"
        assert all(rec.offset < part.commit_point() + WINDOW for rec in taken)
        deliveries = receiver._deliveries(taken)
        seen.extend(_offsets(deliveries))
        for delivery in deliveries:
            receiver._settle(receiver._held(delivery))
    assert seen == list(range(1000))
    assert not part.records and not part.beyond and not receiver._leased
    assert part.commit_point() == 1000
    close(receiver)


async def test_a_lease_entry_frees_settled_records_and_expires_the_rest() -> None:
    receiver = await make_receiver(ack_timeout=5.0)
    receiver._ingest([StubMessage(o) for o in range(10)])
    deliveries = receiver._deliveries(receiver._take(10))
    assert _offsets(deliveries) == list(range(10))
    for delivery in deliveries[:4]:
        receiver._settle(receiver._held(delivery))
    assert len(receiver._leased) == 6  # the settled four are no longer referenced
    (_, _, first, end) = receiver._leases[0]
    assert end - first == 10
    receiver._expire_leases(time.monotonic() + 6.0)
    assert not receiver._leased
    with pytest.raises(LeaseExpired):
        receiver._held(deliveries[5])
    again = receiver._deliveries(receiver._take(10))
    assert _offsets(again) == list(range(4, 10))
    assert all(d.attempt == 2 for d in again)
    assert all(d.extras["offset"] == int(d.body) for d in again)
    close(receiver)


async def test_extend_keeps_one_record_past_its_hand_outs_deadline() -> None:
    receiver = await make_receiver(ack_timeout=5.0)
    receiver._ingest([StubMessage(o) for o in range(3)])
    deliveries = receiver._deliveries(receiver._take(3))
    await receiver.extend(deliveries[1], 60.0)
    receiver._expire_leases(time.monotonic() + 6.0)
    assert list(receiver._leased.values()) == [receiver._held(deliveries[1])]
    with pytest.raises(LeaseExpired):
        receiver._held(deliveries[0])
    close(receiver)
