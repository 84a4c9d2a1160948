"""The facade's own cost per message, in front of a receiver that does nothing.

    python benchmarks/bench_facade.py [--rounds 15] [--messages 50000]

No broker: a stand-in ``Receiver`` hands out ready-made deliveries (500 per receive)
and settles nothing. Two loops, interleaved round by round:

* bare: the stand-in's own loop, ``receive`` then ``await ack(d)`` per delivery;
* facade: ``brokerkit``'s ``Consumer`` over the same stand-in, ``async for msg`` +
  ``await msg.ack()`` (read-ahead, a ``Message`` per delivery, the settle state machine).

Prints the medians in microseconds per message and the facade's overhead (the median of
the per-round differences). A backend cannot be faster per message than the facade loop:
this is the floor under every ``consume+ack`` ratio of the other scripts.
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
        raise NotImplementedError

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> _NoOpReceiver:
        return _NoOpReceiver()


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
    args = parser.parse_args()
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
