"""The facade's own cost per message, in front of a receiver that does nothing.

    python benchmarks/bench_facade.py [--rounds 15] [--messages 50000] [--publish]

No broker: a stand-in ``Receiver`` hands out ready-made deliveries (500 per receive)
and settles nothing. Two loops, interleaved round by round:

* bare: the stand-in's own loop, ``receive`` then ``await ack(d)`` per delivery;
* facade: ``brokerkit``'s ``Consumer`` over the same stand-in, ``async for msg`` +
  ``await msg.ack()`` (read-ahead, a ``Message`` per delivery, the settle state machine).

Prints the medians in microseconds per message and the facade's overhead (the median of
the per-round differences). A backend cannot be faster per message than the facade loop:
this is the floor under every ``consume+ack`` ratio of the other scripts.

``--publish``: the publish side instead, in front of a backend whose ``publish`` yields
to the loop once and returns ready-made results: ``publish_many(500)`` from one task,
against 500 tasks each awaiting single ``publish()`` calls (gathered by the coalescer).
The difference is what the core adds per single call (building and validating the
message, the caller's future and its wake-up, the caller's own loop): with a backend
that costs ``c`` µs per message in batches, concurrent single publishes reach at most
about ``c / (c + difference)`` of ``publish_many`` while the loop is the limit
(``bench_concurrent_publish.py`` measures that ratio on a real broker).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

import brokerkit
from brokerkit._bench import drain_rate
from brokerkit.backends import (
    NO_EXTRAS,
    NO_HEADERS,
    Backend,
    BrokerURL,
    Capabilities,
    Delivery,
    QueueRef,
    Receiver,
    ReceiverSettings,
)

BODY = b"x" * 100


class _NoOpReceiver(Receiver[int]):
    async def receive(self, max_messages: int, wait: float) -> list[Delivery[int]]:
        await asyncio.sleep(0)  # a fetch yields to the loop once, as a real one would
        return [
            Delivery(str(i), BODY, NO_HEADERS, None, None, 1, i, NO_EXTRAS)
            for i in range(max_messages)
        ]

    async def ack(self, delivery: Delivery[int]) -> None:
        pass

    async def nack(self, delivery: Delivery[int], delay: float) -> None:
        pass

    async def extend(self, delivery: Delivery[int], ack_timeout: float) -> None:
        pass

    async def release(self, deliveries: Sequence[Delivery[int]]) -> None:
        pass


class _NoOpBackend(Backend):
    """Subscribing hands out the no-op receiver; nothing is ever published."""

    capabilities = Capabilities(
        max_message_bytes=1 << 20, dedup_window=300.0, dedup_window_configurable=False, fan_out=True
    )

    @classmethod
    def from_url(cls, url: BrokerURL) -> _NoOpBackend:
        return cls()

    async def publish(self, queue: QueueRef, messages: Sequence[Any]) -> list[Any]:
        await asyncio.sleep(0)  # a broker call yields to the loop once
        return _RESULTS[: len(messages)]  # calls here carry at most 500

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> _NoOpReceiver:
        return _NoOpReceiver()


_RESULTS = [brokerkit.PublishResult(str(i)) for i in range(500)]


async def publish_many_loop(count: int) -> float:
    batch = [brokerkit.Outgoing(BODY) for _ in range(500)]
    async with brokerkit.from_backend(_NoOpBackend()) as broker:
        started = time.perf_counter()
        for _ in range(count // 500):
            await broker.publish_many("q", batch)
        return (time.perf_counter() - started) / (count // 500 * 500) * 1e6


async def single_publish_loop(count: int, tasks: int = 500) -> float:
    async with brokerkit.from_backend(_NoOpBackend()) as broker:
        await broker.publish("q", BODY)  # the queue's coalescer made outside the clock

        async def caller(n: int) -> None:
            for _ in range(n):
                await broker.publish("q", BODY)

        started = time.perf_counter()
        await asyncio.gather(*(caller(count // tasks) for _ in range(tasks)))
        return (time.perf_counter() - started) / (count // tasks * tasks) * 1e6


async def publish_main(rounds: int, messages: int) -> None:
    many: list[float] = []
    single: list[float] = []
    for _ in range(rounds):
        many.append(await publish_many_loop(messages))
        single.append(await single_publish_loop(messages))
    over = statistics.median(s - m for s, m in zip(single, many, strict=True))
    print(f"{rounds} rounds, {messages} messages, us per message (medians)")
    print(f"  publish_many(500)        {statistics.median(many):6.2f}")
    print(f"  500 tasks x publish()    {statistics.median(single):6.2f}")
    print(f"  added per single call    {over:6.2f}")
    print(f"  a backend needs >= {4 * over:.1f} us per message in batches for 0.8")


async def facade_loop(count: int) -> float:
    async with brokerkit.from_backend(_NoOpBackend()) as broker:
        consumer = broker.consumer("q", "g", ack_timeout=60.0, prefetch=500, close_timeout=0.0)
        async with consumer:
            rate = await drain_rate(consumer, count)
    return 1e6 / rate


async def bare_loop(count: int) -> float:
    receiver = _NoOpReceiver()
    started = time.perf_counter()
    got = 0
    while got < count:
        for delivery in await receiver.receive(500, 0.0):
            await receiver.ack(delivery)
            got += 1
    return (time.perf_counter() - started) / got * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--publish", action="store_true", help="the publish side instead")
    args = parser.parse_args()
    if args.publish:
        await publish_main(args.rounds, args.messages)
        return
    facade: list[float] = []
    bare: list[float] = []
    for _ in range(args.rounds):
        facade.append(await facade_loop(args.messages))
        bare.append(await bare_loop(args.messages))
    over = statistics.median(f - b for f, b in zip(facade, bare, strict=True))
    f_med = statistics.median(facade)
    print(f"{args.rounds} rounds, {args.messages} messages, us per message (medians)")
    print(f"  bare loop   {statistics.median(bare):6.2f}")
    print(f"  facade loop {f_med:6.2f}  (at most {1e6 / f_med:,.0f} msgs/s on one core)")
    print(f"  overhead    {over:6.2f}")


if __name__ == "__main__":
    asyncio.run(main())
