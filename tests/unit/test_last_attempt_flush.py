"""A last attempt waits for recorded acks, not for a clock (issue 16, ``_alone.py``).

Before a message's last attempt is handed out, the acks made so far must be recorded by
the broker, and its own ack returns only once recorded: the next hand-out may be a
poison, and a crash that lost a coalesced ack would count an attempt for a message that
was done. A backend that coalesces acks says when they are recorded (``flush_acks``);
the facade used to sleep ``ack_flush_interval`` instead, which a delete still on its way
outlived (``brokerkit check sqs`` dead-lettered an innocent, 2026-12-02).

Pure facade logic: memory://'s receiver behind a coalescer that records acks only when
flushed, so the facade's waiting is all that stands between an ack and its record.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import brokerkit
from brokerkit.backends import Delivery, QueueRef, Receiver, ReceiverSettings
from brokerkit.backends.memory import MemoryBackend
from brokerkit.testing import ForwardingReceiver, memory_url

FLUSH_INTERVAL = 0.2
"""The coalescing window the backend declares: what the facade used to sleep."""


class _Coalescing(ForwardingReceiver):
    """memory://'s receiver whose acks are recorded only by ``flush_acks`` (or close),
    and which counts what it hands over unseen, as SQS does (``wants_handing_out``): the
    facade then records the acks before every redelivery, not only a last attempt."""

    wants_handing_out = True

    def __init__(self, inner: Receiver[Any]) -> None:
        super().__init__(inner)
        self.pending: list[Delivery[Any]] = []

    async def ack(self, delivery: Delivery[Any]) -> None:
        self.pending.append(delivery)

    async def flush_acks(self) -> None:
        pending, self.pending = self.pending, []
        for delivery in pending:
            await self.inner.ack(delivery)

    async def aclose(self) -> None:
        await self.flush_acks()
        await self.inner.aclose()


class _CoalescingBackend(MemoryBackend):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.capabilities = dataclasses.replace(
            self.capabilities, ack_flush_interval=FLUSH_INTERVAL
        )
        self.receivers: list[_Coalescing] = []

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> _Coalescing:
        receiver = _Coalescing(await super().subscribe(queue, group, settings))
        self.receivers.append(receiver)
        return receiver


async def _next(consumer: brokerkit.Consumer) -> brokerkit.Message:
    return await asyncio.wait_for(consumer.__anext__(), 5.0)


async def test_the_ack_of_a_last_attempt_returns_recorded() -> None:
    backend = _CoalescingBackend.from_url(brokerkit.BrokerURL.parse(memory_url()))
    async with brokerkit.from_backend(backend) as broker:
        await broker.publish("q", b"last")
        async with broker.consumer("q", "g", max_attempts=2, prefetch=1) as consumer:
            first = await _next(consumer)
            await first.nack()
            last = await _next(consumer)
            assert last.attempt == 2  # max_attempts: handed out alone
            await last.ack()
            [receiver] = backend.receivers
            assert receiver.pending == []  # recorded when ack returned, not a window later
            stats = await broker.stats("q", "g")
            assert (stats.ready, stats.in_flight) == (0, 0)


async def test_acks_made_before_a_last_attempt_are_recorded_before_it_goes_out() -> None:
    backend = _CoalescingBackend.from_url(brokerkit.BrokerURL.parse(memory_url()))
    async with brokerkit.from_backend(backend) as broker:
        await broker.publish("q", b"suspect")
        await broker.publish("q", b"innocent")
        async with broker.consumer("q", "g", max_attempts=2, prefetch=1) as consumer:
            suspect = await _next(consumer)
            await suspect.nack(delay=0.3)
            innocent = await _next(consumer)
            assert innocent.body == b"innocent"
            await innocent.ack()  # coalesced: pending until flushed
            [receiver] = backend.receivers
            assert [d.body for d in receiver.pending] == [b"innocent"]
            last = await _next(consumer)
            assert (last.body, last.attempt) == (b"suspect", 2)
            assert receiver.pending == []  # the innocent's ack was recorded before it came
            await last.ack()


async def test_acks_made_before_any_redelivery_are_recorded_before_it_goes_out() -> None:
    """Not only a last attempt: any redelivery may be the poison that killed its last
    consumer, and may kill this one. An ack coalesced just before it and lost in that
    crash brings an innocent back with an attempt counted (reliability item 14: after
    more crashes, into the DLQ). Before: only a last attempt waited for the record."""
    backend = _CoalescingBackend.from_url(brokerkit.BrokerURL.parse(memory_url()))
    async with brokerkit.from_backend(backend) as broker:
        await broker.publish("q", b"suspect")
        await broker.publish("q", b"innocent")
        async with broker.consumer("q", "g", max_attempts=3, prefetch=1) as consumer:
            suspect = await _next(consumer)
            await suspect.nack(delay=0.3)
            innocent = await _next(consumer)
            assert innocent.body == b"innocent"
            await innocent.ack()  # coalesced: pending until flushed
            [receiver] = backend.receivers
            assert [d.body for d in receiver.pending] == [b"innocent"]
            again = await _next(consumer)
            assert (again.body, again.attempt) == (b"suspect", 2)  # not its last attempt
            assert receiver.pending == []  # the innocent's ack was recorded before it came
            await again.ack()


class _StuckFlush(_Coalescing):
    """A flush that does not end until released (a Kafka consumer thread in a revoke)."""

    def __init__(self, inner: Receiver[Any]) -> None:
        super().__init__(inner)
        self.release_flush = asyncio.Event()
        self.flushes = 0

    async def flush_acks(self) -> None:
        self.flushes += 1
        await self.release_flush.wait()
        await super().flush_acks()


class _StuckBackend(_CoalescingBackend):
    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> _Coalescing:
        inner = await MemoryBackend.subscribe(self, queue, group, settings)
        receiver = _StuckFlush(inner)
        self.receivers.append(receiver)
        return receiver


async def test_a_redelivery_waits_for_a_stuck_flush_half_a_second_at_most() -> None:
    """The wait for the acks before a redelivery (not a last attempt) is bounded: it
    goes out with most of its lease, and the flush ends by itself later."""
    backend = _StuckBackend.from_url(brokerkit.BrokerURL.parse(memory_url()))
    async with brokerkit.from_backend(backend) as broker:
        await broker.publish("q", b"suspect")
        async with broker.consumer(
            "q", "g", max_attempts=3, prefetch=1, ack_timeout=5.0
        ) as consumer:
            first = await _next(consumer)
            await first.nack()
            loop = asyncio.get_running_loop()
            started = loop.time()
            again = await _next(consumer)
            waited = loop.time() - started
            assert (again.body, again.attempt) == (b"suspect", 2)
            [receiver] = backend.receivers
            assert isinstance(receiver, _StuckFlush) and receiver.flushes == 1
            assert 0.4 <= waited < 1.5, waited  # REDELIVERY_FLUSH_WAIT (0.5 s), not forever
            receiver.release_flush.set()
            await again.ack()
