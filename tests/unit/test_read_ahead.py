"""The consumer's read-ahead: how much it fetches, when, and that close gives back the rest.

Pure facade logic, so a scripted in-process backend stands in for a broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import brokerkit
from brokerkit.backends import (
    Backend,
    BrokerURL,
    Capabilities,
    Delivery,
    QueueRef,
    Receiver,
    ReceiverSettings,
)


class CountingReceiver(Receiver[int]):
    """Hands out numbered deliveries; records every receive and what was given back."""

    def __init__(self, available: int) -> None:
        self.available = available
        self.next = 0
        self.calls: list[tuple[int, float]] = []
        self.acked: list[int] = []
        self.released: list[int] = []

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[int]]:
        self.calls.append((max_messages, wait))
        n = min(max_messages, self.available - self.next)
        out = [
            Delivery(str(i), b"m", {}, None, None, 1, i) for i in range(self.next, self.next + n)
        ]
        self.next += n
        if not out and wait > 0:
            await asyncio.sleep(0)
        return out

    async def ack(self, delivery: Delivery[int]) -> None:
        self.acked.append(delivery.receipt)

    async def nack(self, delivery: Delivery[int], delay: float) -> None:
        raise AssertionError("not used")

    async def extend(self, delivery: Delivery[int], ack_timeout: float) -> None:
        raise AssertionError("not used")

    async def release(self, deliveries: Sequence[Delivery[int]]) -> None:
        self.released += [d.receipt for d in deliveries]


class ScriptedBackend(Backend):
    schemes = ("scripted",)
    capabilities = Capabilities(
        max_message_bytes=1 << 20, dedup_window=300.0, dedup_window_configurable=False, fan_out=True
    )

    def __init__(self, receiver: CountingReceiver) -> None:
        self.receiver = receiver

    @classmethod
    def from_url(cls, url: BrokerURL) -> ScriptedBackend:
        raise AssertionError("not used")

    async def publish(self, queue: QueueRef, messages: Sequence[Any]) -> list[Any]:
        raise AssertionError("not used")

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> CountingReceiver:
        return self.receiver


async def consume(receiver: CountingReceiver, prefetch: int, take: int) -> None:
    async with brokerkit.from_backend(ScriptedBackend(receiver)) as broker:
        async with broker.consumer("q", prefetch=prefetch) as consumer:
            got = 0
            async for msg in consumer:
                await msg.ack()
                got += 1
                # never more fetched-but-not-handed-out than prefetch
                assert receiver.next - got <= prefetch
                if got == take:
                    break


async def test_reads_ahead_half_the_prefetch_without_waiting() -> None:
    receiver = CountingReceiver(available=1000)
    await consume(receiver, prefetch=8, take=40)
    first_max, first_wait = receiver.calls[0]
    assert (first_max, first_wait > 0) == (8, True)  # the caller's own fetch waits
    ahead = receiver.calls[1:]
    # every later fetch was a read-ahead (started before the buffer ran dry) and none
    # blocks; how much each asks for is bounded by consume()'s prefetch assertion
    assert len(ahead) >= 40 // 8 and all(wait == 0 for _, wait in ahead)


async def test_close_gives_back_what_was_read_ahead_and_not_handed_out() -> None:
    receiver = CountingReceiver(available=1000)
    await consume(receiver, prefetch=8, take=5)
    handed = sorted(receiver.acked)
    assert handed == list(range(5))
    # everything fetched was either acked or released; nothing twice, nothing lost
    assert sorted(receiver.acked + receiver.released) == list(range(receiver.next))


async def test_prefetch_one_fetches_only_when_asked() -> None:
    receiver = CountingReceiver(available=10)
    await consume(receiver, prefetch=1, take=10)
    assert all(n == 1 and wait > 0 for n, wait in receiver.calls)
    assert receiver.released == []


async def _lag_past_the_leases(then_take: int) -> CountingReceiver:
    """Hand out one of 6 read ahead, block the loop past every lease (a handler that hogs
    the CPU: the give-back timer cannot run), then take ``then_take`` more and close."""
    receiver = CountingReceiver(available=7)  # 6 read ahead, 1 for a later fetch
    async with brokerkit.from_backend(ScriptedBackend(receiver)) as broker:
        async with broker.consumer("q", prefetch=6, ack_timeout=0.2) as consumer:
            await (await consumer.__anext__()).ack()
            time.sleep(0.3)  # noqa: ASYNC251 (the fault itself: a blocked loop)
            if then_take:
                got = await asyncio.wait_for(consumer.__anext__(), 5.0)
                await got.ack()
    return receiver


async def test_what_ran_out_in_the_buffer_is_given_back_at_close_not_dropped() -> None:
    receiver = await _lag_past_the_leases(then_take=0)
    # released (a receiver that counted them at the take takes the count back), not dropped
    assert receiver.acked == [0] and sorted(receiver.released) == [1, 2, 3, 4, 5]


async def test_what_ran_out_in_the_buffer_is_given_back_when_met_at_hand_out() -> None:
    receiver = await _lag_past_the_leases(then_take=1)
    # the hand-out met 1 run out: 1-5 given back together; the caller got the next fetch's
    assert receiver.acked == [0, 6] and sorted(receiver.released) == [1, 2, 3, 4, 5]


class WatchingReceiver(CountingReceiver):
    """Hands out deliveries whose attempt is their number (0 and 1: first deliveries,
    then redeliveries); records every ``handing_out`` with what was held unseen then."""

    wants_handing_out = True

    def __init__(self, available: int) -> None:
        super().__init__(available)
        self.handed: list[tuple[int, list[int]]] = []

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[int]]:
        out = await super().receive(max_messages, wait)
        return [Delivery(d.id, d.body, {}, None, None, max(d.receipt, 1), d.receipt) for d in out]

    async def handing_out(self, delivery: Delivery[int], unseen: Sequence[Delivery[int]]) -> None:
        self.handed.append((delivery.receipt, [d.receipt for d in unseen]))


async def test_each_redelivery_is_shown_to_the_receiver_with_what_is_held_unseen() -> None:
    receiver = WatchingReceiver(4)
    async with brokerkit.from_backend(ScriptedBackend(receiver)) as broker:
        async with broker.consumer("q", prefetch=4, max_attempts=10) as consumer:
            seen = []
            async for msg in consumer:
                seen.append(msg.attempt)
                await msg.ack()
                if len(seen) == 4:
                    break
    assert seen == [1, 1, 2, 3]
    # first deliveries are not shown; each redelivery is, with the rest of the buffer
    assert receiver.handed == [(2, [3]), (3, [])]
