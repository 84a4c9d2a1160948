"""Concurrent single publishes against publish_many, on any URL (issue: throughput where
services feel it).

    python benchmarks/bench_concurrent_publish.py URL [--messages 20000] [--rounds 5]
        [--concurrency 500] [--size 100]

Per round, interleaved: ``publish_many`` in batches of 500 (one caller), then
``--concurrency`` tasks each making single ``await broker.publish()`` calls one after
the other, then one task making single calls (the latency a lone caller sees), each on
a queue of its own (see ``_queue``; deleted outside the clock). Every publish is
broker-confirmed.
Prints medians and each round's figures, the ratio of concurrent single publishes to
``publish_many``, and how many calls raised (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import AsyncIterator

import brokerkit
from brokerkit._bench import concurrent_publish_rate, publish_rate, round_line, summary


async def sequential_latency(
    broker: brokerkit.Broker, queue: str, count: int, body: bytes
) -> float:
    """Median microseconds of one awaited publish with nothing else in flight."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await broker.publish(queue, body)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


@contextlib.asynccontextmanager
async def _queue(
    broker: brokerkit.Broker, contender: str, kept: dict[str, str]
) -> AsyncIterator[str]:
    """The queue ``contender`` publishes to: never another contender's.

    memory:// gets a new one per round, deleted at once (its messages stay in this
    process and would make every later garbage collection slower). A real broker keeps
    one per contender for all rounds (``kept``, deleted after the last): a new Kafka
    topic per round, and the deletion of the last one, kept the broker busy during the
    next clock (publish_many fell from 125k to 40k msgs/s over three rounds; on one
    topic it held 210k-250k).
    """
    if broker.url.scheme != "memory":
        yield kept.setdefault(contender, f"bench-cp-{uuid.uuid4().hex[:12]}")
        return
    queue = f"bench-cp-{uuid.uuid4().hex[:12]}"
    try:
        yield queue
    finally:
        await _delete(broker, queue)


async def _delete(broker: brokerkit.Broker, queue: str) -> None:
    with contextlib.suppress(brokerkit.UnsupportedFeature):
        await broker.delete_queue(queue)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--latency-samples", type=int, default=300)
    args = parser.parse_args()
    body = b"x" * args.size
    rates: dict[str, list[float]] = {"publish_many": [], f"single x{args.concurrency}": []}
    latency: list[float] = []
    errors = 0
    kept: dict[str, str] = {}
    async with brokerkit.connect(args.url) as broker:
        try:
            for round_no in range(args.rounds):
                async with _queue(broker, "publish_many", kept) as queue:
                    rates["publish_many"].append(
                        await publish_rate(broker, queue, args.messages, body)
                    )
                try:
                    async with _queue(broker, "single", kept) as queue:
                        rate = await concurrent_publish_rate(
                            broker, queue, args.messages, body, concurrency=args.concurrency
                        )
                    rates[f"single x{args.concurrency}"].append(rate)
                except brokerkit.BrokerkitError as exc:
                    errors += 1
                    print(f"round {round_no + 1}: concurrent publishes raised {type(exc).__name__}")
                async with _queue(broker, "lone", kept) as queue:
                    latency.append(
                        await sequential_latency(broker, queue, args.latency_samples, body)
                    )
                print(round_line(round_no, rates) + f", lone publish {latency[-1]:.0f} us")
        finally:  # outside every clock
            for queue in kept.values():
                await _delete(broker, queue)
    title = (
        f"{broker.url.redacted()}: {args.messages} x {args.size} B, {args.rounds} rounds, "
        f"rounds that raised: {errors}"
    )
    if all(rates.values()):
        print(
            summary(
                rates,
                [("single/publish_many", f"single x{args.concurrency}", "publish_many")],
                title=title,
            )
        )
    lat = ", ".join(f"{v:.0f}" for v in latency)
    print(f"  lone publish median {statistics.median(latency):.0f} us  ({lat})")


if __name__ == "__main__":
    asyncio.run(main())
