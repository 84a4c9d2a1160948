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

from brokerkit._errors import LeaseExpired
from brokerkit._url import BrokerURL
from brokerkit.backends.base import Delivery, ReceiverSettings
from brokerkit.backends.kafka import KafkaBackend
from brokerkit.backends.kafka._receiver import WINDOW, KafkaReceiver

TOPIC = "brokerkit.q"


class _Msg:
    """What ``_ingest`` reads of a confluent-kafka ``Message``."""

    def __init__(self, offset: int, partition: int = 0) -> None:
        self._offset, self._partition = offset, partition

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000)

    def value(self) -> bytes:
        return str(self._offset).encode()


async def _receiver(ack_timeout: float = 30.0) -> KafkaReceiver:
    backend = KafkaBackend.from_url(BrokerURL.parse("kafka://127.0.0.1:9092"))
    settings = ReceiverSettings(ack_timeout=ack_timeout, max_attempts=5, prefetch=500)
    receiver = KafkaReceiver(backend, "q", TOPIC, "brokerkit.q.g", settings)
    receiver._assigned.add((TOPIC, 0))
    receiver._assigned_on_loop([((TOPIC, 0), 0, 0, None)])
    return receiver


def _offsets(deliveries: list[Delivery]) -> list[int]:
    return [int(d.body) for d in deliveries]


def _close(receiver: KafkaReceiver) -> None:
    if receiver._flush_handle is not None:
        receiver._flush_handle.cancel()


async def test_records_past_the_window_wait_in_order_and_follow_the_commit_point() -> None:
    receiver = await _receiver()
    msgs: list[Any] = [_Msg(o) for o in range(1000)]
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
    _close(receiver)


async def test_a_lease_entry_frees_settled_records_and_expires_the_rest() -> None:
    receiver = await _receiver(ack_timeout=5.0)
    receiver._ingest([_Msg(o) for o in range(10)])
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
    _close(receiver)


async def test_extend_keeps_one_record_past_its_hand_outs_deadline() -> None:
    receiver = await _receiver(ack_timeout=5.0)
    receiver._ingest([_Msg(o) for o in range(3)])
    deliveries = receiver._deliveries(receiver._take(3))
    await receiver.extend(deliveries[1], 60.0)
    receiver._expire_leases(time.monotonic() + 6.0)
    assert list(receiver._leased.values()) == [receiver._held(deliveries[1])]
    with pytest.raises(LeaseExpired):
        receiver._held(deliveries[0])
    _close(receiver)
