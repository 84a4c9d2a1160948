"""Concurrent ``publish()`` calls are gathered into backend batches, each caller keeping its
own result or error (pure facade logic: a scripted backend, and memory://)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

import brokerkit
from brokerkit._coalesce import MAX_BATCH, MAX_IN_FLIGHT
from brokerkit.backends import (
    Backend,
    BrokerUnavailable,
    BrokerURL,
    Capabilities,
    Outgoing,
    PublishResult,
    QueueRef,
    ReceiverSettings,
)


class RecordingBackend(Backend):
    """Publishes nothing anywhere: records each call's batch, optionally failing some."""

    capabilities = Capabilities(
        max_message_bytes=1 << 20, dedup_window=300.0, dedup_window_configurable=False, fan_out=True
    )

    def __init__(self, fail_if: bytes | None = None) -> None:
        self.calls: list[list[bytes]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_if = fail_if

    @classmethod
    def from_url(cls, url: BrokerURL) -> RecordingBackend:
        return cls()

    async def publish(self, queue: QueueRef, messages: Sequence[Outgoing]) -> list[PublishResult]:
        self.calls.append([m.body for m in messages])
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.001)  # a broker round trip
            if self.fail_if is not None and any(m.body == self.fail_if for m in messages):
                raise BrokerUnavailable("the batch with the poison body failed")
            return [PublishResult(m.body.decode()) for m in messages]
        finally:
            self.in_flight -= 1

    async def subscribe(self, queue: QueueRef, group: str, settings: ReceiverSettings) -> Any:
        raise NotImplementedError


async def test_a_lone_publish_goes_straight_to_the_backend() -> None:
    backend = RecordingBackend()
    async with brokerkit.from_backend(backend) as broker:
        for i in range(3):
            assert (await broker.publish("q", str(i).encode())).id == str(i)
    assert backend.calls == [[b"0"], [b"1"], [b"2"]]


async def test_concurrent_publishes_are_batched_in_call_order_with_their_own_results() -> None:
    backend = RecordingBackend()
    bodies = [str(i).encode() for i in range(2000)]
    async with brokerkit.from_backend(backend) as broker:
        results = await asyncio.gather(*(broker.publish("q", b) for b in bodies))
    assert [r.id for r in results] == [b.decode() for b in bodies]
    sent = [body for call in backend.calls for body in call]
    assert sent == bodies  # each exactly once, in call order
    assert len(backend.calls) <= 2 + len(bodies) // MAX_BATCH * 2
    assert max(len(c) for c in backend.calls) <= MAX_BATCH
    assert backend.most_in_flight <= MAX_IN_FLIGHT


async def test_a_failed_batch_fails_its_callers_only() -> None:
    backend = RecordingBackend(fail_if=b"poison")
    async with brokerkit.from_backend(backend) as broker:
        first = asyncio.ensure_future(broker.publish("q", b"first"))  # goes alone, at once
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(broker.publish("q", b)) for b in (b"a", b"poison", b"b")]
        done = await asyncio.gather(first, *rest, return_exceptions=True)
        assert done[0] == PublishResult("first")
        assert all(isinstance(r, BrokerUnavailable) for r in done[1:])
        # the next publish is not held up by the failure
        assert (await broker.publish("q", b"later")).id == "later"


async def test_a_caller_cancelled_before_its_batch_left_is_not_sent() -> None:
    backend = RecordingBackend()
    async with brokerkit.from_backend(backend) as broker:
        first = asyncio.ensure_future(broker.publish("q", b"first"))
        await asyncio.sleep(0)  # first is in flight: the next ones wait to be gathered
        kept = asyncio.ensure_future(broker.publish("q", b"kept"))
        dropped = asyncio.ensure_future(broker.publish("q", b"dropped"))
        await asyncio.sleep(0)
        dropped.cancel()
        await asyncio.gather(first, kept)
    sent = [body for call in backend.calls for body in call]
    assert b"dropped" not in sent and sent.count(b"kept") == 1


async def test_ten_thousand_concurrent_publishes_on_memory_all_arrive() -> None:
    n = 10_000
    async with brokerkit.connect("memory://coalesce") as broker:
        results = await asyncio.gather(*(broker.publish("q", b"%d" % i) for i in range(n)))
        assert len({r.id for r in results}) == n
        seen = 0
        async with broker.consumer("q", prefetch=500) as consumer:
            async for msg in consumer:
                await msg.ack()
                seen += 1
                if seen == n:
                    break
        await broker.delete_queue("q")
    assert seen == n


async def test_validation_still_happens_before_any_io() -> None:
    backend = RecordingBackend()
    broker = brokerkit.from_backend(backend)
    with pytest.raises(brokerkit.InvalidName):
        await broker.publish("bad.name", b"x")
    with pytest.raises(brokerkit.InvalidMessage):
        await broker.publish("q", "not bytes")  # type: ignore[arg-type]
    assert backend.calls == []
    await broker.aclose()
    with pytest.raises(brokerkit.ResourceClosed):
        await broker.publish("q", b"x")


async def test_callers_woken_by_a_batch_are_gathered_again_not_sent_alone() -> None:
    backend = RecordingBackend()

    async def caller(i: int) -> None:
        for j in range(4):
            await broker.publish("q", b"%d-%d" % (i, j))

    async with brokerkit.from_backend(backend) as broker:
        await asyncio.gather(*(caller(i) for i in range(50)))
    assert sum(len(c) for c in backend.calls) == 200
    # the very first call goes alone (nothing in flight); after that, the callers a
    # finished batch woke publish together instead of the first of them going alone
    assert [len(c) for c in backend.calls].count(1) <= 2, [len(c) for c in backend.calls]


async def test_validation_still_happens_once_the_queue_has_a_coalescer() -> None:
    backend = RecordingBackend()
    broker = brokerkit.from_backend(backend)
    await broker.publish("q", b"ok")
    with pytest.raises(brokerkit.InvalidMessage):
        await broker.publish("q", "not bytes")  # type: ignore[arg-type]
    with pytest.raises(brokerkit.MessageTooLarge):
        await broker.publish("q", b"x" * ((1 << 20) + 1))
    with pytest.raises(brokerkit.InvalidName):
        await broker.publish("q", b"x", fifo_group="has space")
    assert backend.calls == [[b"ok"]]
    await broker.aclose()
    with pytest.raises(brokerkit.ResourceClosed):
        await broker.publish("q", b"x")
